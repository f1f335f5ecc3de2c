// Communication in words for the planner's explanations: which collectives of a plan cross the
// node boundary, how many bytes each GPU sends through them per step (SimResult::comm_bytes_by_kind,
// nccl-tests convention), and how long they run (from the trace when the result has one).
#pragma once
#include <string>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "program/plan.h"
#include "program/sim_result.h"

namespace fsdpsim::planner {

struct CollectiveUse {
  std::string kind;          // "all_gather", "reduce_scatter", "all_reduce"
  bool inter_node = false;   // its process group spans nodes
  std::int64_t bytes_per_gpu = 0;
  TimeNs busy_ns = -1;       // union of its spans in the trace; -1 without a trace
};

// Every collective kind the plan runs. The shard group (all-gathers, reduce-scatters) spans nodes
// when mesh_shard > gpus_per_node; the replicate group (all-reduce) when mesh_replicate > 1 on more
// than one node (program/plan.h: rank = replicate_index * shard + shard_index).
std::vector<CollectiveUse> collective_use(const sim::Plan& p, const sim::SimResult& r, const calibrate::Cluster& cl);

// "all-reduce across the 2 nodes: 3.37 GB per GPU per step (the node's 8 GPUs send 27.0 GB through its
// 1 NIC), busy 6.47 s" - the collectives that cross nodes, or "" on one node / when none does.
std::string inter_node_text(const sim::Plan& p, const sim::SimResult& r, const calibrate::Cluster& cl);

std::string gb_text(double bytes);   // "3.37 GB" (10^9: network volumes as nccl-tests print them)

}  // namespace fsdpsim::planner

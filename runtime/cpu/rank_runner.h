// One rank of the bundled FSDP runtime on the CPU backend: lowers the plan to the StepProgram the
// simulator executes (sim::lower), places its buffers with the caching-allocator model
// (device_memory.h), and executes it step after step (stream_executor.h) with real data: sharded
// fp32 parameters, real collectives through a Communicator, the transformer's kernels, gradient
// reduction and the optimizer step on the shards. This file gives each OpKind its FSDP meaning.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/model_spec.h"
#include "models/wrap_graph.h"
#include "runtime/communicator.h"
#include "runtime/cpu/device_memory.h"
#include "runtime/rank_program.h"
#include "runtime/cpu/segment_compute.h"
#include "runtime/cpu/stream_executor.h"
#include "runtime/unit_layout.h"
#include "runtime/model/dims.h"
#include "runtime/train/optimizer.h"
#include "sim/plan.h"
#include "sim/sim_result.h"
#include "sim/step_program.h"

namespace fsdpsim::runtime {

struct RunConfig {
  models::ModelSpec model;
  sim::Plan plan;                // resolved for the world size
  int gpus_per_node = 1;         // for the program's process-group shapes
  std::uint64_t seed = 1234;     // parameter init and data
  OptimizerConfig optimizer;     // lr etc.; adamw follows plan.optimizer
  Bytes address_space = 64 * kGiB;   // virtual address space reserved for the allocator's segments
};

// InputError if the CPU runtime cannot execute this plan/model (it computes in fp32 only, etc.).
void check_runtime_supports(const models::ModelSpec& m, const sim::Plan& plan);

struct StepOutcome {
  double loss = 0;               // mean token loss over the global batch (all ranks), before the update
  sim::SimResult measured;       // this rank's measured step (times, trace, memory so far)
};

class RankRunner : public OpRunner {
 public:
  RankRunner(const RunConfig& cfg, Communicator& comm);
  ~RankRunner() override;

  StepOutcome step();            // one optimizer step on the next global batch
  const sim::StepProgram& program() const { return rp_.program; }
  // Every parameter tensor of the model (registration order), assembled from all shards: valid on
  // every rank (collective: all ranks must call it).
  std::vector<std::pair<std::string, std::vector<float>>> gather_params();
  // The same for the reduced (sharded) gradients of the last step.
  std::vector<std::pair<std::string, std::vector<float>>> gather_grads();
  Bytes untracked_bytes() const { return compute_->untracked_bytes(); }
  std::vector<std::string> notes() const { return notes_; }

  void run(const sim::Op& op) override;

 private:
  void check_buffer(int buffer, std::int64_t numel, const char* what) const;
  std::vector<float*> segment_params(int seg, const sim::Op& op);
  std::vector<float*> segment_grads(int seg, const sim::Op& op);
  void run_compute(const sim::Op& op);
  void accumulate_grad(int unit, const float* src);
  std::vector<std::pair<std::string, std::vector<float>>> gather(const std::vector<const float*>& per_unit_shard);

  RunConfig cfg_;
  Communicator& comm_;
  RankProgram rp_;                                  // the program, layouts, segments and op roles
  std::unique_ptr<DeviceMemory> mem_;
  std::unique_ptr<SegmentCompute> compute_;
  int steps_done_ = 0;
  std::vector<float*> state_ptr_;                   // per unit optimizer states (in its optim_buf when it fits)
  std::vector<std::vector<float>> grad_scratch_;    // per unit: FSDP1 views' grads until the cat (flat layout)
  std::vector<std::vector<float>> side_state_;      // per unit, when the program's buffer is too small
  std::vector<std::vector<int>> act_buf_, recomp_buf_;   // [micro-batch][segment] -> buffer id
  std::vector<std::vector<float>> last_grads_;      // per unit: the sharded gradient the last step stepped on
  std::vector<std::string> notes_;
};

}  // namespace fsdpsim::runtime

// What one simulated step predicts for one rank (design.md "Contract": the JSON result keys).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/units.h"

namespace fsdpsim::sim {

// Memory categories of the breakdown (issue "simulator", Outputs). Keys in JSON are these names.
enum class MemCategory {
  ShardedParams, ShardedGrads, OptimizerState, UnshardedParams, UnshardedGrads,
  CommBuffers, Activations, Logits, AllocatorSlack, CudaContext
};
inline constexpr int kNumMemCategories = 10;
const char* mem_category_name(MemCategory c);   // "sharded_params", ... "cuda_context"

// One span on a track, for the timeline and the Perfetto trace.
struct TraceSpan {
  std::string name;      // "AG unit 3", "fwd layers.3", ...
  std::string track;     // "cpu", "compute", "all_gather", "reduce_scatter", "all_reduce", "copy_in", ...
  std::string kind;      // op kind: "forward", "backward", "recompute", "all_gather", ...
  int unit = -1;
  TimeNs start_ns = 0;
  TimeNs dur_ns = 0;
  Bytes bytes = 0;       // collective/copy bytes, 0 for compute
};

struct MemorySample {
  TimeNs t_ns = 0;
  Bytes allocated = 0;
  Bytes reserved = 0;
};

// Where a memory peak was reached: the op whose allocation set it, as the program names it (the
// executor fills `op`; the caller that has the program describes it, see sim/peak_location.h).
struct PeakLocation {
  int op = -1;             // -1: at the step's start (before its first allocation passed it)
  std::string kind;        // op_kind_name: "forward", "all_gather", "optimizer_step", ...
  std::string name;        // the op's name, when the program has names ("" otherwise)
  int unit = -1;           // FSDP unit, -1 for none
  int micro_batch = -1;    // -1 for an op outside the micro-batches (or op -1)
  std::string phase = "start";   // "forward", "backward", "optimizer", or "start" (op -1)
};

// What one simulate() call did (tests and benchmarks check that the stretch acted); not an output.
struct SimulateStats {
  bool stretched = false;            // the program was stretched from a shorter model's
  int source_layers = 0;             // that model's layers
  int source_micro_batches = 0;      // and micro-batches
  int sources = 0;                   // shorter models lowered and tried (refused ones included)
  std::string refused;               // why the stretch was not used ("" when it was, or was not tried)
  // What the engine's fast paths skipped (sim/executor.h ExecStats): timing jumps, the memory fold's
  // jumps, jumps that moved the memory replayed with the issues, the steady step's periods so skipped.
  int time_jumps = 0;
  int memory_fold_jumps = 0;
  int memory_shift_jumps = 0;
  int steady_periods_shifted = 0;
};

struct SimResult {
  // Peak memory per GPU (allocated = live tensors, reserved = caching-allocator segments), plus the
  // CUDA/NCCL context which neither includes (it is added to `total_device`).
  Bytes peak_allocated = 0;
  Bytes peak_reserved = 0;
  Bytes context_bytes = 0;
  Bytes peak_total_device = 0;     // peak_reserved + context (what nvidia-smi would show)
  Bytes capacity = 0;              // GPU memory
  Bytes host_memory_per_node = 0;  // host RAM the plan keeps on one node (CPU offload; sim/host_memory.h)
  Bytes host_capacity_per_node = 0; // host RAM of one node (0: unknown, not checked)
  bool fits = false;               // peak_total_device <= capacity and host_memory_per_node <= host capacity
  std::map<std::string, Bytes> breakdown_at_peak;   // category name -> bytes at the allocated peak (+slack, context)
  TimeNs step_time_ns = 0;         // one optimizer step (all micro-batches)
  TimeNs compute_ns = 0;           // busy time of the compute stream
  TimeNs comm_ns = 0;              // busy time of all collective streams (union)
  TimeNs exposed_comm_ns = 0;      // time the compute stream sits idle waiting on a collective
  TimeNs cpu_blocked_ns = 0;       // CPU time blocked (rate limiter, syncs; simulator: a full launch queue too)
  // CPU time issuing the step's ops: framework hooks and eager ops (profile overheads; a CPU optimizer step's own
  // compute not included). Near step_time_ns the step is CPU-bound. Simulated only (0 in a measured result).
  TimeNs cpu_issue_ns = 0;
  std::int64_t alloc_retries = 0;  // caching-allocator cudaMalloc retries (cache released at capacity)
  double tokens_per_step = 0;      // global tokens per optimizer step
  double tokens_per_s_per_gpu = 0;
  double mfu = 0;                  // model FLOPs / (step time * dense peak of the compute dtype)
  double peak_flops = 0;           // the dense peak used for MFU (FLOP/s), and its dtype
  std::string peak_flops_dtype;
  double model_flops_per_step_per_gpu = 0;  // 6N+attention convention, no recompute
  double hardware_flops_per_step_per_gpu = 0; // including recompute
  std::map<std::string, std::int64_t> comm_bytes_by_kind;  // all_gather / reduce_scatter / all_reduce: bytes each rank sends
  std::vector<TraceSpan> trace;
  std::vector<MemorySample> memory_timeline;
  std::vector<std::string> notes;  // approximations and warnings the user must see
  // ---- first and steady step (note "first and steady step", sim/memory_tracker.h) ----
  // peak_allocated / peak_reserved / breakdown_at_peak above are the steady-state step's (optimizer
  // state present from its start, the allocator's segments cached by the step before); these are the
  // first step's (optimizer state created lazily inside it). `fits` takes the larger reserved peak.
  Bytes first_step_peak_allocated = 0;
  Bytes first_step_peak_reserved = 0;
  // FSDP1's construction before the first step (StepProgram::init_flatten_world): its peak allocated and reserved
  // bytes, while each unit's original parameters, its flattened whole and its shard exist beside the shards made
  // before (0: not modelled: FSDP2, CPU offload, QLoRA, the bundled runtime). `fits` takes it too.
  Bytes construction_peak_allocated = 0;
  Bytes construction_peak_reserved = 0;
  PeakLocation peak_allocated_at, peak_reserved_at;                          // steady step
  PeakLocation first_step_peak_allocated_at, first_step_peak_reserved_at;    // first step
  // The memory timeline covers the first step, then the steady step from this time on (0: one step).
  TimeNs steady_step_start_ns = 0;
  // How simulate() obtained these figures (not written to any output).
  SimulateStats simulate_stats;
};

nlohmann::json sim_result_to_json(const SimResult& r, bool include_trace = false);

// The CPU issues ops for 90% of the step or more: the GPU waits on it (simulate's note, plan's explanation and
// diagnose's cpu_bound finding all use this rule).
inline bool cpu_bound(const SimResult& r) { return r.step_time_ns > 0 && r.cpu_issue_ns >= r.step_time_ns * 9 / 10; }

// Length of the intersection of two unions of intervals, each sorted and non-overlapping (exposed
// communication: compute-stream gaps ∩ collective busy time). The simulator's executor and the runtimes
// measure it the same way.
TimeNs intersect_length(const std::vector<std::pair<TimeNs, TimeNs>>& a,
                        const std::vector<std::pair<TimeNs, TimeNs>>& b);

}  // namespace fsdpsim::sim

// Cheap bounds that let the planner skip simulations (note "pruning bounds"):
//  * a LOWER bound on a plan's peak device memory (peak_total_device = reserved + context). A plan
//    whose bound exceeds the usable capacity cannot fit and is never simulated. The bound counts
//    only what must be alive at three moments of any FSDP step, with no allocator slack:
//      A. the head's backward: persistent sharded params + optimizer state, the saved activations
//         of every block (checkpointing mode per block), the logits (b x s x vocab in the compute
//         dtype, without the fp32 upcast), and the head's FSDP unit unsharded (shard > 1); with
//         reshard_after_forward false on every unit (FSDP1 SHARD_GRAD_OP / _HYBRID_SHARD_ZERO2, FSDP2 False)
//         every other unit unsharded too (gathered in its forward, resharded after its backward), and
//         with FSDP2's reshard_after_forward k a 1/k share of each (the post-forward shards); with
//         accumulation and every weight trained, the earlier micro-batches' gradients: sharded (a
//         reduction every micro-batch) or, inside no_sync, unsharded (the narrowest of the param, reduce
//         and master dtypes), on the GPU unless params are offloaded;
//      B. the optimizer step: sharded params + sharded grads + optimizer state;
//      C. the loss's backward (PyTorch's F.cross_entropy, unchunked): A's persistent state, activations,
//         kept units and carried gradients, with the loss's tensors as the lowering allocates them
//         (program/lower_context.h LossMemory: the logits unless the loop frees them, the saved
//         log-probabilities and both loss-backward gradients) instead of the logits and the head's unit.
//    plus the CUDA/NCCL context. Shards are floor(P / shard) (no padding), grads use the narrower of
//    the master and reduce dtypes, CPU offload keeps nothing persistent on the GPU. With frozen weights
//    (trainable_fraction < 1, models/trainable.h) grads and optimizer state count the rule's trainable
//    parameters (optimizer state none under FSDP1 with use_orig_params: rank 0's share of the trainable
//    tensors is not 1/shard) and saved activations none (what frozen blocks save depends on the FSDP
//    version and the wrap).
//  * a LOWER bound on step time: the compute stream must run every kernel of every micro-batch
//    (forward, backward, the recompute of fully checkpointed blocks; selective recompute counted as
//    zero) at the profile's kernel times, and an offloaded optimizer step on the CPU after it. With frozen
//    weights: no weight-gradient GEMM, and backward and recompute only for the blocks after the first one
//    with a trainable weight (their inputs require grad whatever the FSDP version). It
//    gives an UPPER bound on tokens/s per GPU, used to order the search and to skip candidates that
//    an already simulated plan dominates on both memory and throughput.
// Both are checked against exhaustive simulation in tests/planner/test_bounds.cpp.
#pragma once
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "calibrate/hardware_profile.h"
#include "common/units.h"
#include "models/kernels.h"
#include "models/model_spec.h"
#include "models/trainable.h"
#include "models/wrap_graph.h"
#include "program/plan.h"

namespace fsdpsim::planner {

struct MemoryBound {
  Bytes context = 0;
  Bytes sharded_params = 0;
  Bytes sharded_grads = 0;
  Bytes optimizer_state = 0;
  Bytes activations = 0;      // saved by all blocks for one micro-batch
  Bytes logits = 0;
  Bytes unsharded_unit = 0;   // the head's unit, all-gathered
  Bytes kept_unsharded = 0;   // reshard_after_forward false: every other unit still gathered from its forward
  Bytes carried_grads = 0;    // accumulation: the earlier micro-batches' gradients (sharded, or unsharded in no_sync)
  Bytes moment_a() const {
    return context + sharded_params + optimizer_state + activations + logits + unsharded_unit + kept_unsharded + carried_grads;
  }
  Bytes loss_backward = 0;    // F.cross_entropy's backward: the logits, the saved log-probabilities, two gradients
  Bytes moment_b() const { return context + sharded_params + sharded_grads + optimizer_state; }
  Bytes moment_c() const {
    return context + sharded_params + optimizer_state + activations + kept_unsharded + carried_grads + loss_backward;
  }
  Bytes total() const {
    Bytes t = moment_a() > moment_b() ? moment_a() : moment_b();
    return moment_c() > t ? moment_c() : t;
  }
  // "optimizer state alone needs 91.0 GiB" style: the largest single component and its name.
  std::pair<std::string, Bytes> largest_component() const;
};

class Bounds {
 public:
  // The wrap policy is the base plan's (the search does not vary it).
  Bounds(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const models::WrapPolicy& policy);
  MemoryBound memory(const sim::Plan& p) const;
  // Thread-safe (a mutex guards the per-(micro-batch, dtype, mode) cache).
  TimeNs step_time(const sim::Plan& p) const;
  double tokens_per_s_per_gpu_upper(const sim::Plan& p) const;

 private:
  TimeNs kernels_time(const std::vector<models::KernelDesc>& ks) const;
  // Forward of every part; backward of the blocks from `first_backward_block` on and of the head (dgrad
  // only unless `wgrad`), and of the embedding with `wgrad`.
  TimeNs micro_batch_compute(std::int64_t mb, std::int64_t seq, Dtype dtype, bool wgrad,
                             std::int64_t first_backward_block) const;
  // The plan's trainable set (models::trainable_set, or models::lora_trainable_set with plan.lora), per
  // (implementation, fraction) or (implementation, lora).
  const models::TrainableSet& trainable(const sim::Plan& p) const;

  const models::ModelSpec& model_;
  const calibrate::HardwareProfile& hw_;
  models::ParamCounts counts_;
  std::int64_t head_unit_params_ = 0;
  std::int64_t unit_params_ = 0;   // all units' parameters (the wrap graph's, without adapters)
  mutable std::mutex mu_;
  mutable std::map<std::tuple<std::int64_t, std::int64_t, int, std::string, bool>, TimeNs> cache_;
  mutable std::map<std::pair<int, double>, models::TrainableSet> trainable_;
  mutable std::map<std::pair<int, std::string>, models::TrainableSet> lora_;   // with plan.lora, per its text
};

}  // namespace fsdpsim::planner

// The cost model of the simulator: times a StepProgram's ops from a calibrated HardwareProfile.
//   compute ops      Σ over their kernels: GEMM gemm_time(m,n,k,dtype) × count, attention
//                    attention_time(...), elementwise / embedding / cross-entropy memory_bound_time(bytes)
//   collectives      collective_time(op, S, group size, nodes spanned)     (S as nccl-tests counts it)
//   copies, casts, pads, divides, GPU optimizer step   memory_bound_time(copy_bytes)
//   H2D / D2H        host_copy_time(copy_bytes)
//   CpuOptimizerStep cpu_optimizer_time(params)
//   CPU issue        cpu_hooks × framework_hook_ns + kernel_launches × kernel_launch_ns
// Kernel and collective times are memoized by their arguments (a program repeats the same shapes in
// every block), so an instance is cheap to query but NOT thread-safe: use one per thread.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "sim/executor.h"

namespace fsdpsim::sim {

class ProfileCostModel : public CostModel {
 public:
  // Keeps a reference: `hw` must outlive the model.
  explicit ProfileCostModel(const calibrate::HardwareProfile& hw);

  TimeNs op_time(const Op& op) const override;
  TimeNs cpu_issue_time(const Op& op) const override;
  double overlap_slowdown() const override { return slowdown_; }

  // Collective queries that fell outside the profile's measured/sourced range (extrapolated), as
  // readable lines ("all_gather 1.2 GiB over 1024 ranks on 128 nodes"), each distinct query once.
  const std::vector<std::string>& extrapolations() const { return extrapolations_; }

 private:
  TimeNs kernel_time(const models::KernelDesc& k) const;
  TimeNs collective(const Op& op) const;
  TimeNs memory_bound(Bytes bytes) const;

  const calibrate::HardwareProfile& hw_;
  double slowdown_ = 1.0;
  TimeNs hook_ns_ = 0, launch_ns_ = 0;
  // Memo tables keyed by a 64-bit mix of the arguments; the key's full arguments are stored and
  // compared, so a hash collision can never return another query's time.
  struct KernelKey {
    int kind;
    std::int64_t a, b, c, d, e, f;
    int dtype;
    bool backward;
    bool operator==(const KernelKey&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const KernelKey& k) const;
  };
  mutable std::unordered_map<KernelKey, TimeNs, KeyHash> memo_;
  mutable std::unordered_map<Bytes, TimeNs> memory_bound_memo_;
  mutable std::vector<std::string> extrapolations_;
  // Total time per shared kernel list (Op::shared_kernels), searched linearly: a program has at most
  // six lists (forward/backward of embedding, block, head). Holding the pointer keeps the list alive,
  // so an address can never be reused by another list while this memo exists.
  mutable std::vector<std::pair<std::shared_ptr<const std::vector<models::KernelDesc>>, TimeNs>> list_memo_;
};

}  // namespace fsdpsim::sim

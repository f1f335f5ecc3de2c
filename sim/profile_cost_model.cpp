#include "sim/profile_cost_model.h"

#include <cstdio>

#include "common/errors.h"

namespace fsdpsim::sim {

namespace {

enum KeyKind { kGemm = 0, kAttention, kMemoryBound, kCollective, kHostCopy, kCpuOptimizer };

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  // splitmix64-style finalizer over a running hash (no cryptographic claims; keys are compared too).
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

calibrate::CollectiveOp collective_op(OpKind k) {
  switch (k) {
    case OpKind::AllGather: return calibrate::CollectiveOp::AllGather;
    case OpKind::ReduceScatter: return calibrate::CollectiveOp::ReduceScatter;
    default: return calibrate::CollectiveOp::AllReduce;
  }
}

}  // namespace

std::size_t ProfileCostModel::KeyHash::operator()(const KernelKey& k) const {
  std::uint64_t h = static_cast<std::uint64_t>(k.kind);
  for (std::int64_t v : {k.a, k.b, k.c, k.d, k.e, k.f}) h = mix(h, static_cast<std::uint64_t>(v));
  h = mix(h, static_cast<std::uint64_t>(k.dtype) * 2 + (k.backward ? 1 : 0));
  return static_cast<std::size_t>(h);
}

ProfileCostModel::ProfileCostModel(const calibrate::HardwareProfile& hw, bool native) : hw_(hw) {
  slowdown_ = hw.comm_overlap_slowdown();
  hook_ns_ = hw.framework_hook_ns();
  launch_ns_ = native ? hw.runtime_launch_ns() : hw.kernel_launch_ns();
  memo_.reserve(64);
}

TimeNs ProfileCostModel::memory_bound(Bytes bytes) const {
  // The most frequent query (every copy/cast op): its own table keyed by the byte count alone.
  if (const TimeNs* hit = memory_bound_memo_.find(BytesKey{bytes})) return *hit;
  TimeNs t = bytes > 0 ? hw_.memory_bound_time(bytes) : 0;
  memory_bound_memo_.insert(BytesKey{bytes}, t);
  return t;
}

TimeNs ProfileCostModel::memory_bound(Bytes bytes, MemoryClass cls) const {
  if (cls == MemoryClass::Copy) return memory_bound(bytes);
  KernelKey key{kMemoryBound, bytes, static_cast<std::int64_t>(cls), 0, 0, 0, 0, 0, false};
  auto it = memo_.find(key);
  if (it != memo_.end()) return it->second;
  TimeNs t = bytes > 0 ? hw_.memory_bound_time(bytes, cls) : 0;
  memo_.emplace(key, t);
  return t;
}

TimeNs ProfileCostModel::kernel_time(const models::KernelDesc& k) const {
  switch (k.kind) {
    case models::KernelKind::Gemm: {
      KernelKey key{kGemm, k.m, k.n, k.k, 0, 0, 0, static_cast<int>(k.dtype), false};
      auto it = memo_.find(key);
      TimeNs one;
      if (it != memo_.end()) {
        one = it->second;
      } else {
        one = (k.m > 0 && k.n > 0 && k.k > 0) ? hw_.gemm_time(k.m, k.n, k.k, k.dtype) : 0;
        memo_.emplace(key, one);
      }
      return one * k.count;
    }
    case models::KernelKind::Attention: {
      KernelKey key{kAttention, k.batch, k.seq, k.heads, k.kv_heads, k.head_dim, 0, static_cast<int>(k.dtype),
                    k.backward};
      auto it = memo_.find(key);
      if (it != memo_.end()) return it->second;
      TimeNs t = hw_.attention_time(k.batch, k.seq, k.heads, k.kv_heads, k.head_dim, k.dtype, k.backward);
      memo_.emplace(key, t);
      return t;
    }
    case models::KernelKind::Elementwise:
    case models::KernelKind::Embedding:
    case models::KernelKind::CrossEntropy:
      return memory_bound(k.bytes, k.mem_class);
  }
  return 0;
}

TimeNs ProfileCostModel::collective(const Op& op) const {
  const calibrate::CollectiveOp c = collective_op(op.kind);
  const CollectiveKey key{op.comm_bytes, static_cast<int>(c), op.group_size, op.nodes_spanned};
  if (const TimeNs* hit = collective_memo_.find(key)) return *hit;
  // A group of one rank moves nothing: NCCL returns at once (no profile query).
  TimeNs t = (op.group_size > 1 && op.comm_bytes > 0)
                 ? hw_.collective_time(c, op.comm_bytes, op.group_size, op.nodes_spanned)
                 : 0;
  if (op.group_size > 1 && op.comm_bytes > 0 &&
      hw_.collective_extrapolated(c, op.comm_bytes, op.group_size, op.nodes_spanned)) {
    char line[200];
    std::snprintf(line, sizeof line, "%s of %.3g MiB over %d ranks on %d node(s)", calibrate::collective_name(c),
                  static_cast<double>(op.comm_bytes) / static_cast<double>(kMiB), op.group_size, op.nodes_spanned);
    extrapolations_.emplace_back(line);
  }
  collective_memo_.insert(key, t);
  return t;
}

// The hot path: a (kind, stream) slot hit returns at once; every miss goes through the memo tables
// below (out of line, so that the hits need no stack frame).
TimeNs ProfileCostModel::op_time(const Op& op) const {
  switch (op.kind) {
    case OpKind::Forward:
    case OpKind::Backward:
    case OpKind::Recompute: {
      if (!op.shared_kernels) return other_op_time(op);
      Recent& r = recent(op);
      if (r.list == op.shared_kernels.get()) return r.t;   // r.list is null until a list was stored
      return list_miss(op, r);
    }
    case OpKind::AllGather:
    case OpKind::ReduceScatter:
    case OpKind::AllReduce: {
      Recent& r = recent(op);
      if (r.used && r.bytes == op.comm_bytes && r.group_size == op.group_size && r.nodes == op.nodes_spanned)
        return r.t;
      return collective_miss(op, r);
    }
    case OpKind::CopyIn:
    case OpKind::CopyOut:
    case OpKind::Cast:
    case OpKind::Pad:
    case OpKind::Divide:
    case OpKind::OptimizerStep: {
      Recent& r = recent(op);
      if (r.used && r.bytes == op.copy_bytes) return r.t;
      return memory_bound_miss(op, r);
    }
    default:
      return other_op_time(op);
  }
}

TimeNs ProfileCostModel::list_miss(const Op& op, Recent& r) const {
  const TimeNs t = list_time(op);
  r.list = op.shared_kernels.get();
  r.t = t;
  return t;
}

TimeNs ProfileCostModel::collective_miss(const Op& op, Recent& r) const {
  const TimeNs t = collective(op);
  r.bytes = op.comm_bytes;
  r.group_size = op.group_size;
  r.nodes = op.nodes_spanned;
  r.t = t;
  r.used = true;
  return t;
}

TimeNs ProfileCostModel::memory_bound_miss(const Op& op, Recent& r) const {
  const TimeNs t = op.kind == OpKind::OptimizerStep ? memory_bound(op.copy_bytes, MemoryClass::Optimizer)
                                                    : memory_bound(op.copy_bytes);
  r.bytes = op.copy_bytes;
  r.t = t;
  r.used = true;
  return t;
}

TimeNs ProfileCostModel::list_time(const Op& op) const {
  // Every block's ops share one list: time it once per list (its sum is the same every time).
  for (const auto& [list, t] : list_memo_)
    if (list == op.shared_kernels) return t;
  TimeNs t = 0;
  for (const auto& k : *op.shared_kernels) t += kernel_time(k);
  list_memo_.emplace_back(op.shared_kernels, t);
  return t;
}

// What op_time does not answer from a slot: compute ops with their own kernel list (hand-built
// programs; the lowering's ops share a list), host copies and the CPU optimizer step.
TimeNs ProfileCostModel::other_op_time(const Op& op) const {
  switch (op.kind) {
    case OpKind::Forward:
    case OpKind::Backward:
    case OpKind::Recompute: {
      TimeNs t = 0;
      for (const auto& k : op.kernels) t += kernel_time(k);
      return t;
    }
    case OpKind::H2D:
    case OpKind::D2H: {
      KernelKey key{kHostCopy, op.copy_bytes, 0, 0, 0, 0, 0, 0, false};
      auto it = memo_.find(key);
      if (it != memo_.end()) return it->second;
      TimeNs t = op.copy_bytes > 0 ? hw_.host_copy_time(op.copy_bytes) : 0;
      memo_.emplace(key, t);
      return t;
    }
    case OpKind::CpuOptimizerStep: {
      KernelKey key{kCpuOptimizer, op.params, 0, 0, 0, 0, 0, 0, false};
      auto it = memo_.find(key);
      if (it != memo_.end()) return it->second;
      TimeNs t = op.params > 0 ? hw_.cpu_optimizer_time(op.params) : 0;
      memo_.emplace(key, t);
      return t;
    }
    default:
      return 0;   // collectives and memory-bound ops: op_time answers them (slot or memo table)
  }
}

TimeNs ProfileCostModel::cpu_issue_time(const Op& op) const {
  return static_cast<TimeNs>(op.cpu_hooks) * hook_ns_ + static_cast<TimeNs>(op.kernel_launches) * launch_ns_;
}

}  // namespace fsdpsim::sim

// The cost model of the simulator: times a StepProgram's ops from a calibrated HardwareProfile.
//   compute ops      Σ over their kernels: GEMM gemm_time(m,n,k,dtype) × count, attention
//                    attention_time(...), elementwise / embedding / cross-entropy memory_bound_time(bytes, class)
//   collectives      collective_time(op, S, group size, nodes spanned)     (S as nccl-tests counts it)
//   copies, casts, pads, divides    memory_bound_time(copy_bytes); GPU optimizer step: class Optimizer
//   H2D / D2H        host_copy_time(copy_bytes)
//   CpuOptimizerStep cpu_optimizer_time(params)
//   CPU issue        cpu_hooks × framework_hook_ns + kernel_launches × kernel_launch_ns
//   launch queue     launch_queue_depth kernels per stream (sim/executor.cpp "Launch queue")
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
  // `native`: the program is the bundled C++ runtime's (implementation "runtime"): its ops cost the CPU the
  // profile's runtime_launch_ns, not eager PyTorch's kernel_launch_ns.
  explicit ProfileCostModel(const calibrate::HardwareProfile& hw, bool native = false);

  TimeNs op_time(const Op& op) const override;
  TimeNs cpu_issue_time(const Op& op) const override;
  double overlap_slowdown() const override { return slowdown_; }
  int launch_queue_depth() const override { return hw_.launch_queue_depth(); }

  // Collective queries that fell outside the profile's measured/sourced range (extrapolated), as
  // readable lines ("all_gather 1.2 GiB over 1024 ranks on 128 nodes"), each distinct query once.
  const std::vector<std::string>& extrapolations() const { return extrapolations_; }

 private:
  TimeNs kernel_time(const models::KernelDesc& k) const;
  TimeNs collective(const Op& op) const;
  TimeNs memory_bound(Bytes bytes) const;   // class Copy (copies, casts, pads, divides)
  TimeNs memory_bound(Bytes bytes, MemoryClass cls) const;
  TimeNs list_time(const Op& op) const;   // a compute op's Op::shared_kernels, through list_memo_
  TimeNs other_op_time(const Op& op) const;   // compute ops without a shared list, host copies, CPU optimizer

  // The last query per (op kind, stream) and its answer, checked before the memo tables. Consecutive
  // units issue the same op shapes on the same streams (80 identical blocks: every block's copy-in,
  // all-gather, copy-out, forward, ... has the bytes and group of the previous block's), so most
  // queries equal the previous one of their slot. A slot holds its query's full key (for its kind:
  // the shared kernel list, copy_bytes, or comm_bytes + group size + nodes) and the time the memo
  // tables answered, which never changes for that key: a hit returns exactly what the memo would.
  struct Recent {
    const void* list = nullptr;   // compute ops: Op::shared_kernels (kept alive by list_memo_)
    Bytes bytes = 0;              // memory-bound ops: copy_bytes; collectives: comm_bytes
    int group_size = 0, nodes = 0;
    TimeNs t = 0;
    bool used = false;
  };
  static constexpr int kKinds = static_cast<int>(OpKind::CpuOptimizerStep) + 1;
  static constexpr int kStreamSlots = 8;   // slot = kind x (stream mod 8): a collision only costs a miss
  Recent& recent(const Op& op) const {
    return recent_[static_cast<int>(op.kind) * kStreamSlots + (op.stream & (kStreamSlots - 1))];
  }
  // Slot misses, kept out of line so that op_time's hits need no stack frame.
  [[gnu::noinline]] TimeNs collective_miss(const Op& op, Recent& r) const;
  [[gnu::noinline]] TimeNs memory_bound_miss(const Op& op, Recent& r) const;
  [[gnu::noinline]] TimeNs list_miss(const Op& op, Recent& r) const;

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
  // The two queries every program repeats most (one per collective, one per copy/cast op) get flat
  // open-addressing tables: a lookup is a multiply, a mask and a compare or two.
  template <class Key>
  class FlatMemo {
   public:
    const TimeNs* find(const Key& k) const {
      if (slots_.empty()) return nullptr;
      const std::size_t mask = slots_.size() - 1;
      for (std::size_t i = k.hash() & mask;; i = (i + 1) & mask) {
        const Slot& s = slots_[i];
        if (!s.used) return nullptr;
        if (s.key == k) return &s.value;
      }
    }
    void insert(const Key& k, TimeNs v) {
      if (2 * (count_ + 1) > slots_.size()) grow();
      place(k, v);
      ++count_;
    }

   private:
    struct Slot {
      Key key{};
      TimeNs value = 0;
      bool used = false;
    };
    void place(const Key& k, TimeNs v) {
      const std::size_t mask = slots_.size() - 1;
      std::size_t i = k.hash() & mask;
      while (slots_[i].used) i = (i + 1) & mask;
      slots_[i] = Slot{k, v, true};
    }
    void grow() {
      std::vector<Slot> old;
      old.swap(slots_);
      slots_.assign(old.empty() ? 64 : 2 * old.size(), Slot{});
      for (const Slot& s : old)
        if (s.used) place(s.key, s.value);
    }
    std::vector<Slot> slots_;
    std::size_t count_ = 0;
  };
  static std::size_t mix64(std::uint64_t x) {
    x *= 0x9e3779b97f4a7c15ULL;
    return static_cast<std::size_t>(x ^ (x >> 31));
  }
  struct BytesKey {
    Bytes bytes = 0;
    std::size_t hash() const { return mix64(static_cast<std::uint64_t>(bytes)); }
    bool operator==(const BytesKey&) const = default;
  };
  struct CollectiveKey {
    Bytes bytes = 0;
    int op = 0, group_size = 0, nodes = 0;
    std::size_t hash() const {
      return mix64(static_cast<std::uint64_t>(bytes) ^
                   (static_cast<std::uint64_t>(op) << 58 ^ static_cast<std::uint64_t>(group_size) << 24 ^
                    static_cast<std::uint64_t>(nodes) << 44));
    }
    bool operator==(const CollectiveKey&) const = default;
  };
  mutable FlatMemo<BytesKey> memory_bound_memo_;
  mutable FlatMemo<CollectiveKey> collective_memo_;
  mutable std::vector<std::string> extrapolations_;
  // Total time per shared kernel list (Op::shared_kernels), searched linearly: a program has at most
  // six lists (forward/backward of embedding, block, head). Holding the pointer keeps the list alive,
  // so an address can never be reused by another list while this memo exists.
  mutable std::vector<std::pair<std::shared_ptr<const std::vector<models::KernelDesc>>, TimeNs>> list_memo_;
  mutable Recent recent_[kKinds * kStreamSlots];
};

}  // namespace fsdpsim::sim

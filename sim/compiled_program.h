// The executor's form of a program (sim/executor.cpp): one small record per op with what the event
// engine reads, every op's lists in one flat array, and each buffer's caching-allocator facts. The
// StepProgram (program/step_program.h) stays the plain data structure both executors share; this is only
// what the simulator's engine runs. Two producers build it:
//  * compile_program (sim/executor.h): from a StepProgram, with validate_program's checks;
//  * the stretch (sim/stretch.h): from the lowering of the same plan with fewer layers (and fewer
//    micro-batches), by writing out copies of its repeated blocks directly as records (simulate()
//    without a trace uses it).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/units.h"
#include "program/sim_result.h"
#include "program/step_program.h"

namespace fsdpsim::sim {

// What the engine needs to know of an op's kind, as bits of OpRec::flags.
inline constexpr std::uint8_t kCollective = 1, kSlowable = 2, kCpuOp = 4, kBadKind = 8;

// SM kernels share the GPU with NCCL's CTAs and HBM traffic (semantics N5); host copies run on the
// copy engines and collectives are the cause, so neither is slowed.
constexpr bool is_slowable(OpKind k) {
  switch (k) {
    case OpKind::Forward: case OpKind::Backward: case OpKind::Recompute:
    case OpKind::CopyIn: case OpKind::CopyOut: case OpKind::Cast: case OpKind::Pad: case OpKind::Divide:
    case OpKind::OptimizerStep:
      return true;
    default:
      return false;
  }
}
inline constexpr unsigned kNumOpKinds = static_cast<unsigned>(OpKind::CpuOptimizerStep) + 1;
// OpRec::flags of each kind, as one table lookup; the last entry stands for any value out of
// OpKind's range (which compile_program rejects).
inline constexpr std::array<std::uint8_t, kNumOpKinds + 1> kKindFlags = [] {
  std::array<std::uint8_t, kNumOpKinds + 1> t{};
  for (unsigned k = 0; k < kNumOpKinds; ++k) {
    const auto kind = static_cast<OpKind>(k);
    t[k] = static_cast<std::uint8_t>((is_collective(kind) ? kCollective : 0) | (is_slowable(kind) ? kSlowable : 0) |
                                     (kind == OpKind::CpuOptimizerStep ? kCpuOp : 0));
  }
  t[kNumOpKinds] = kBadKind;
  return t;
}();

// An op's progress during a run. A GPU op goes NotIssued -> Issued (enqueued by the CPU) -> Running ->
// Done; a CpuOptimizerStep goes NotIssued -> Done at the end of its issue. (16 bits, not 8: a store
// through a char type may alias anything, so g++ would reload every member after each state change.)
enum OpState : std::uint16_t { kNotIssued = 0, kIssued, kRunning, kDone };

// The hot facts of one op. Its lists live in CompiledProgram::lists as [GPU waits | CPU waits | allocs |
// frees as (buffer, reuse_after_op) pairs], contiguous in op order: op i's start where op i-1's end
// (op 0's at 0), so `wait_pos` of a compiled op is that start. state, wait_pos (the first GPU wait not
// yet seen complete), next_in_stream and next_in_group are the engine's: it sets them before a run.
struct OpRec {
  int stream = 0;
  std::uint8_t flags = 0;          // kCollective | kSlowable | kCpuOp
  std::uint8_t group = 0;          // CommGroup (collectives only)
  OpState state = kNotIssued;
  int wait_pos = 0;
  int cpu_waits = 0, allocs = 0, frees = 0, end = 0;
  int next_in_stream = 0;          // the next GPU op of its stream (the number of ops: none)
  int next_in_group = 0;           // collectives: the next collective of its NCCL queue (likewise)
  // Kernels the op puts on its stream's launch queue (Op::kernel_launches; 0 for a CpuOptimizerStep):
  // sim/executor.cpp "Launch queue".
  int launches = 0;
};

// The allocator calls of compiled op `r` at its issue, in program order (issue_memory, program/step_program.h):
// alloc(buffer) for each alloc, free(buffer) for each free inside the op among them; returns the list
// position of the first free made after enqueueing (the frees from there to r.end, as pairs).
template <class Alloc, class Free>
inline int issue_memory(const int* lists, const OpRec& r, Alloc&& alloc, Free&& free) {
  int a = r.allocs, f = r.frees;
  for (; f < r.end && is_free_inside_op(lists[f + 1]); f += 2) {
    for (const int k = r.allocs + allocs_before_free(lists[f + 1]); a < k; ++a) alloc(lists[a]);
    free(lists[f]);
  }
  for (; a < r.frees; ++a) alloc(lists[a]);
  return f;
}

// A buffer as the caching-allocator model sees it.
struct CompiledBuffer {
  Bytes bytes = 0;
  int pool_stream = 0;
  MemCategory category = MemCategory::UnshardedParams;
  bool persistent = false;
  bool first_step_lazy = false;      // (Buffer::first_step_lazy)
  bool after_construction = false;   // (Buffer::after_construction)
  int init_originals = -1;           // (Buffer::init_originals)
  bool operator==(const CompiledBuffer&) const = default;
};
inline CompiledBuffer compiled_buffer(const Buffer& b) {
  return CompiledBuffer{b.bytes,           b.pool_stream,        b.category,       b.persistent,
                        b.first_step_lazy, b.after_construction, b.init_originals};
}

// A run of identical periods (filled by the stretch, sim/stretch.h): ops [begin, begin + period * count)
// are `count` periods of `period` ops, each op repeating the op `period` ids before it: the same
// record (stream, flags, NCCL group, launches) and costs, lists of the same lengths whose entries name the same
// roles one period later (the op or buffer so many periods on, or the same op or buffer outside the
// run), buffers of the same bytes, pool and category. Runs are sorted by `begin` and may nest (a run of
// micro-batches holding runs of blocks). The engine may use them to skip repeated periods; it checks
// what its skipping relies on.
struct PeriodicRun {
  int begin = 0;
  int period = 0;
  int count = 0;
};

struct CompiledProgram {
  int num_streams = 0;
  std::vector<OpRec> ops;              // one per op, then the end sentinel (never issued)
  std::vector<int> lists;
  std::vector<CompiledBuffer> buffers;
  // Bytes each rank sends (nccl-tests N1): all_gather, reduce_scatter, all_reduce.
  std::array<std::int64_t, 3> comm_sent{0, 0, 0};
  std::vector<std::string> notes;      // the result's first notes (a compiled StepProgram's are its own)
  std::vector<InitRequest> init_scratch;   // StepProgram::init_scratch (the stretch's: its source's)
  int init_flatten_world = 0, init_flatten_last = -1;   // (StepProgram's; the root's buffer precedes every block's)
  std::vector<std::vector<Bytes>> init_originals;       // (StepProgram's)
  std::vector<InitOffloaded> init_offloaded;            // (StepProgram's)
  std::vector<LoopSetupCall> loop_setup;                // (StepProgram's)
  std::vector<PeriodicRun> runs;       // (the stretch's; compile_program leaves it empty)
  // Some free has a reuse_after_op (record_stream): memory then depends on GPU progress.
  bool record_stream_frees = false;
  int num_ops() const { return static_cast<int>(ops.size()) - 1; }
};

}  // namespace fsdpsim::sim

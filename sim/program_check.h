// The checks of validate_program (sim/executor.h) in two parts, so that the executor can run the
// per-op checks inside its own first pass over the ops (same checks, same order, same errors).
#pragma once
#include "sim/step_program.h"

namespace fsdpsim::sim::detail {

// Streams and buffers (validate_program's first part). InputError naming the field.
void check_streams_and_buffers(const StepProgram& p);
// Op i (validate_program's per-op part), given the numbers of streams and buffers.
void check_op(const StepProgram& p, int i, int n_streams, int n_buffers);

// The same checks as one inline yes/no (the executor's hot path); on false, call check_op for the
// error (it reports the first failing check in validate_program's order).
inline bool op_ok(const StepProgram& p, int id, int n_streams, int n_buffers) {
  const Op& op = p.ops[id];
  const auto below = [](int v, int n) { return static_cast<unsigned>(v) < static_cast<unsigned>(n); };
  bool ok = op.id == id && below(op.stream, n_streams) &&
            static_cast<unsigned>(op.kind) <= static_cast<unsigned>(OpKind::CpuOptimizerStep) && op.copy_bytes >= 0 &&
            op.cpu_hooks >= 0 && op.kernel_launches >= 0;
  for (int w : op.waits) ok &= below(w, id);
  for (int w : op.cpu_waits) ok &= below(w, id);
  for (int b : op.allocs) {
    if (!below(b, n_buffers)) return false;
    ok &= !p.buffers[b].persistent;
  }
  for (const FreeSpec& f : op.frees) ok &= below(f.buffer, n_buffers) && f.reuse_after_op >= -1 && f.reuse_after_op <= id;
  if (op.kind == OpKind::AllGather || op.kind == OpKind::ReduceScatter || op.kind == OpKind::AllReduce)
    ok &= static_cast<unsigned>(op.group) <= static_cast<unsigned>(CommGroup::PostForward) && op.group_size >= 1 &&
          op.comm_bytes >= 0;
  return ok;
}

}  // namespace fsdpsim::sim::detail

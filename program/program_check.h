// validate_program: the structural checks a StepProgram must pass before either executor runs it
// (the simulator's, sim/executor.h, and the runtime's). The checks also come in two parts, so that the
// simulator's executor can run the per-op checks inside its own first pass over the ops (it evaluates
// the same conditions while copying each op's lists, and calls check_op for the error: same checks,
// same order, same errors).
#pragma once
#include "program/step_program.h"

namespace fsdpsim::sim {

// The ill-formed-program checks of execute() alone (InputError naming the field).
void validate_program(const StepProgram& program);

}  // namespace fsdpsim::sim

namespace fsdpsim::sim::detail {

// Streams and buffers (validate_program's first part). InputError naming the field.
void check_streams_and_buffers(const StepProgram& p);
void check_loop_setup(const StepProgram& p);   // (StepProgram::loop_setup)
// Op i (validate_program's per-op part), given the numbers of streams and buffers.
void check_op(const StepProgram& p, int i, int n_streams, int n_buffers);

}  // namespace fsdpsim::sim::detail

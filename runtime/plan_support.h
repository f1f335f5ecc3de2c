// What the bundled runtime executes of a plan, written once for both backends (issue 22 stage 5: the CPU
// and CUDA runners shared this list as two copies). The runtime runs its own eager kernels
// (runtime/layers on OpenBLAS, runtime/cuda), so a plan key that changes which kernels run (compile,
// float8 compute), which parameters train (trainable_fraction, frozen_units) or what the loss keeps
// (cross_entropy other than "torch") has no counterpart in a measured step: such a plan is refused, with
// the key and its value, rather than measured as something it is not.
#pragma once
#include "models/model_spec.h"
#include "program/plan.h"

namespace fsdpsim::runtime {

enum class RuntimeBackend { Cpu, Cuda };

// Throws InputError (exit 2) naming the first plan key the backend's runtime does not execute. The
// backend's own limits on the model's shapes (runtime_dims, the CUDA attention's head dims) are checked
// by its runner.
void check_plan_supported(const sim::Plan& plan, RuntimeBackend backend);

}  // namespace fsdpsim::runtime

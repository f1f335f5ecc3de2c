// The plan the bundled runtime executes, and that `validate` simulates to compare with it: the user's,
// with implementation "runtime" (models/model_spec.h ModelImpl::Runtime): the runtime runs its own
// kernels (runtime/layers, runtime/cuda), whose saved activations are one buffer per block laid out as
// models/model_activations.cpp's formula, not the tensors another implementation would save.
#pragma once
#include "program/plan.h"

namespace fsdpsim::runtime {

inline sim::Plan runtime_plan(const sim::Plan& plan) {
  sim::Plan p = plan;
  p.implementation = models::ModelImpl::Runtime;
  return p;
}

}  // namespace fsdpsim::runtime

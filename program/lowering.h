// FSDP lowering: (model, wrap graph, resolved plan, cluster shape) -> StepProgram, for FSDP1 and
// FSDP2 semantics (docs fsdp-semantics.md, cited by rule id: F1.x, F2.x, P1-P6, M1-M15, A1-A6).
#pragma once
#include "models/model_spec.h"
#include "models/wrap_graph.h"
#include "program/plan.h"
#include "program/step_program.h"

namespace fsdpsim::sim {

struct Topology {
  int world = 1;
  int gpus_per_node = 1;
  // One cuBLAS workspace (HardwareProfile::cublas_workspace_bytes; 0: none, as on the CPU runtime).
  Bytes cublas_workspace = 0;
  // The GPU's multiprocessors (HardwareProfile::cuda_sm_count; 0: no CUDA device): the staging buffers of
  // PyTorch's reduction kernels depend on it (models/cuda_reduce.h).
  int sm_count = 0;
};

// `plan` must have gone through resolve_plan(). Deterministic: same input, same program.
StepProgram lower(const models::ModelSpec& model, const models::WrapGraph& graph, const Plan& plan,
                  const Topology& topo);

}  // namespace fsdpsim::sim

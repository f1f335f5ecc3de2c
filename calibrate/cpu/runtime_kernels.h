// The CPU backend's own non-GEMM kernels (runtime/layers, runtime/train), timed at a model's shapes
// so that the profile predicts what `fsdpsim run --backend cpu` executes: its attention is scalar
// code, not a GEMM, and its norms, rotary, SwiGLU and cross-entropy do transcendental math per
// element, so one memcpy bandwidth cannot time them. Every rank runs the kernels at once (as in
// training); a kernel's time is the slowest rank's typical call (blas_gemm.h typical_call_seconds says which and why).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "calibrate/cpu/blas_gemm.h"
#include "common/memory_class.h"
#include "models/model_spec.h"

namespace fsdpsim::calibrate::cpu {

struct RuntimeKernelRates {
  double attn_fwd_eff = 0, attn_bwd_eff = 0;   // executed causal FLOPs / (time x peak)
  double class_bw[kMemoryClasses] = {0, 0, 0, 0, 0, 0, 0, 0};   // bytes/s by class (0: not measured)
  std::vector<std::string> lines;              // one per timed kernel: time, bytes, rate (console and sources)
};

// Times the runtime's kernels for `model` at (micro_batch, seq_len) and converts them into the profile's
// terms: the bytes the simulator's kernel list (models/kernels.h, fp32, implementation "fused": the
// runtime's one-pass kernels) gives each class divided by the measured time of the runtime calls doing
// that work, less `min_kernel_ns` per listed kernel (the model adds it back); attention efficiencies
// against `peak_flops`. `copy_bytes`: the size of the memcpy and of the optimizer step timed (one
// block's parameters in fp32, the size the runtime copies). Collective over `comm`.
RuntimeKernelRates time_runtime_kernels(const models::ModelSpec& model, std::int64_t micro_batch, std::int64_t seq_len,
                                        double peak_flops, double min_kernel_ns, std::int64_t copy_bytes, int reps,
                                        MPI_Comm comm, const ComputeTiming& ct);

}  // namespace fsdpsim::calibrate::cpu

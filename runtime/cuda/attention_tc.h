// Tensor-core flash attention (bf16 wmma, FlashAttention-2 style) for head_dim 64 and 128: the
// same contract as attention_forward / attention_backward in kernels.h (layouts, GQA, causal mask,
// lse in natural log, dq/dk/dv overwritten, D [B,NH,T] fp32 scratch), several times faster than the
// CUDA-core kernels there. Kernels and their design: attention_tc_kernels.cuh.
//
// kernels.h's attention_forward / attention_backward take this path when attention_tc_selected()
// says so, and keep their CUDA-core kernels otherwise (head_dim 16 or 32, misaligned tensors, or
// FSDPSIM_CUDA_ATTENTION=simple).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

namespace fsdpsim::runtime::cuda {

using bf16 = std::uint16_t;

bool attention_tc_supports_head_dim(int HD);   // 64, 128

// The environment's choice of attention kernels: FSDPSIM_CUDA_ATTENTION unset, "" or "tc" -> true
// (tensor cores where supported), "simple" -> false (the CUDA-core kernels). Anything else throws
// InputError naming the variable.
bool attention_tc_requested();

// True when attention_tc_requested(), HD is supported and every tensor is 16-byte aligned (the
// kernels move 16 bytes at a time; the runtime's activation buffers can start at any 4-byte offset
// for odd token counts).
bool attention_tc_selected(int HD, std::initializer_list<const void*> tensors);

// As attention_forward / attention_backward (kernels.h); HD must be supported and the tensors
// 16-byte aligned (check_failed otherwise). No memory is allocated; launches are checked.
void attention_forward_tc(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int NH,
                          int NKV, int HD, cudaStream_t s);
void attention_backward_tc(bf16* dq, bf16* dk, bf16* dv, float* D, const bf16* dout, const bf16* q, const bf16* k,
                           const bf16* v, const bf16* out, const float* lse, int B, int T, int NH, int NKV, int HD,
                           cudaStream_t s);

}  // namespace fsdpsim::runtime::cuda

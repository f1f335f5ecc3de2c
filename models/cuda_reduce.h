// PyTorch's CUDA reduction kernels (aten/src/ATen/native/cuda/Reduce.cuh, setReduceConfig and
// ReduceConfig::global_memory_size) split a long reduction across thread blocks and then allocate, from the
// caching allocator, a staging buffer of partial results for the duration of the kernel. A Linear's bias
// gradient in its backward (AddmmBackward0: grad.sum_to_size(bias) = the sum over the tokens of a
// [tokens, out_features] gradient) is such a reduction: for GPT-2 small at 16,384 tokens on an H200 it
// allocates 96 MiB (768 outputs) and 132 MiB (3072 outputs), measured in PyTorch 2.11's allocator history
// (reports/validation/torch-memory-2026-11-27).
#pragma once
#include <cstdint>

#include "common/units.h"

namespace fsdpsim::models {

// Threads one SM runs at once (cudaDeviceProp.maxThreadsPerMultiProcessor: 2048 on sm_80, sm_90 and sm_100,
// the data-centre GPUs the built-in profiles describe).
inline constexpr int kCudaMaxThreadsPerSm = 2048;

// The staging buffer (bytes) of PyTorch's sum over dim 0 of a contiguous [rows, cols] tensor (bf16, fp16 or
// fp32 elements; float accumulation, 4-byte partials; the allocator's blocks are aligned for any vector
// width) on a GPU of `sm_count` multiprocessors; 0 when the kernel reduces within its blocks (short
// reductions, or many outputs), or sm_count <= 0.
// Reduce.cuh's path for this shape: the reduced dimension is not the fastest-moving one, so the block's x
// dimension spans the outputs (vectorized by 4, 2 or 1 along them) and the reduction is split across
// warps and then across blocks. The semaphores it allocates beside it (4 bytes per output block) are left
// out (one 512-byte block of the small pool).
Bytes cuda_sum_rows_staging_bytes(std::int64_t rows, std::int64_t cols, int sm_count);

}  // namespace fsdpsim::models

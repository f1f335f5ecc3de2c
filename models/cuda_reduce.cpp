#include "models/cuda_reduce.h"

#include <algorithm>

namespace fsdpsim::models {
namespace {

std::int64_t div_up(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Reduce.cuh set_block_dimension's bracket: `dim < cap ? last_pow2(dim) : cap` for a power-of-two cap.
std::int64_t pow2_bracket(std::int64_t dim, std::int64_t cap) {
  if (dim >= cap) return cap;
  std::int64_t p = 1;
  while (p * 2 <= dim) p *= 2;
  return p;
}

}  // namespace

Bytes cuda_sum_rows_staging_bytes(std::int64_t rows, std::int64_t cols, int sm_count) {
  if (sm_count <= 0 || rows <= 0 || cols <= 0) return 0;
  constexpr std::int64_t kWarp = 32;
  constexpr std::int64_t kMaxNumThreads = 512;   // mnt_wrapper<T>::MAX_NUM_THREADS (all but complex<double>)
  constexpr std::int64_t kMinValuesPerThread = 16, kMaxValuesPerThread = 256;
  constexpr Bytes kPartialBytes = 4;             // sizeof(arg_t): float accumulation of bf16/fp16/fp32 sums
  // get_output_vec_size: 4, 2 or 1 as the output extent and the row stride (both `cols` elements) allow.
  std::int64_t vec = 4;
  while (vec > 1 && cols % vec != 0) vec /= 2;
  const std::int64_t max_threads = kMaxNumThreads / vec;
  const std::int64_t dim0 = pow2_bracket(cols / vec, max_threads);   // block.x spans the outputs
  const std::int64_t dim1 = pow2_bracket(rows, max_threads);         // block.y the reduced rows
  std::int64_t block_width = std::min(dim0, kWarp);
  const std::int64_t block_height = std::min(dim1, max_threads / block_width);
  block_width = std::min(dim0, max_threads / block_height);
  const std::int64_t num_threads = block_width * block_height;
  std::int64_t step_output = block_width, step_input = 1;
  // split across warps when each thread would still sum at least min(16 x block_height, 256) values
  bool block_y_reduce = false;
  if (div_up(rows, step_input) >= std::min(block_height * 16, kMaxValuesPerThread)) {
    step_input *= block_height;
    block_y_reduce = true;
  } else {
    step_output *= block_height;
  }
  const std::int64_t target_grid = static_cast<std::int64_t>(sm_count) * (kCudaMaxThreadsPerSm / num_threads);
  const std::int64_t grid = div_up(cols / vec, step_output);
  const std::int64_t values_per_thread = div_up(rows, step_input);
  if (!block_y_reduce || values_per_thread < kMaxValuesPerThread || grid > target_grid) return 0;
  const std::int64_t c1 = div_up(target_grid, grid);
  const std::int64_t c2 = div_up(values_per_thread, kMinValuesPerThread);
  const std::int64_t c3 = div_up(values_per_thread, kMaxValuesPerThread);
  const std::int64_t ctas_per_output = std::max(c3, std::min(c1, c2));
  if (ctas_per_output <= 1) return 0;
  // global_memory_size: no block-x reduction here, so one partial per output per block column
  return kPartialBytes * cols * ctas_per_output * block_width * vec;
}

}  // namespace fsdpsim::models

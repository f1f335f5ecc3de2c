// models/cuda_reduce.h: the staging buffer of PyTorch's CUDA sum over the rows of a [rows, cols] tensor
// (a biased linear's bias gradient), against PyTorch 2.11's allocator history and by hand through
// Reduce.cuh's setReduceConfig.
#include <gtest/gtest.h>

#include "models/cuda_reduce.h"
#include "models/implementation.h"
#include "models/zoo.h"

namespace fsdpsim::models {
namespace {

// Measured: GPT-2 small, 16 x 1024 tokens, on an H200 (132 SMs): c_proj's bias gradient (768 outputs)
// staged 100,663,296 B and c_fc's (3072 outputs) 138,412,032 B (reports/validation/torch-memory-2026-11-27,
// gpt2-fsdp2-w8-fused's allocator history, events 27260 and 27278).
TEST(CudaReduce, BiasGradientStagingAsMeasuredOnAnH200) {
  EXPECT_EQ(cuda_sum_rows_staging_bytes(16384, 768, 132), 100663296);
  EXPECT_EQ(cuda_sum_rows_staging_bytes(16384, 3072, 132), 138412032);
}

// By hand. 768 outputs, vectors of 4: dim0 = 192 -> 128 threads' bracket, block 32 x 4 (128 threads), grid
// 192 / 32 = 6 blocks of outputs; 16384 rows over 4 warps = 4096 values per thread, so split across blocks:
// min(ceil(target / 6), ceil(4096 / 16) = 256) with target = SMs x 2048 / 128. Buffer = 4 B x outputs x
// ctas x 32 x 4.
//  * A100 (108 SMs): target 1728, ctas min(288, 256) = 256: the same 96 MiB.
//  * 3072 outputs on an A100: grid 24, ctas min(72, 256) = 72: 4 x 3072 x 72 x 128 = 113,246,208.
//  * 1024 rows: 256 values per thread, ctas min(352, 16) = 16: 4 x 768 x 16 x 128 = 6,291,456.
//  * 512 rows: 128 values per thread, below 256: reduced within the blocks, no buffer.
//  * 50257 outputs (odd: no vectors): block 32 x 16, grid 1571 > target 132 x 4 = 528: no buffer.
TEST(CudaReduce, ByHandThroughReduceConfig) {
  EXPECT_EQ(cuda_sum_rows_staging_bytes(16384, 768, 108), 100663296);
  EXPECT_EQ(cuda_sum_rows_staging_bytes(16384, 3072, 108), 113246208);
  EXPECT_EQ(cuda_sum_rows_staging_bytes(1024, 768, 132), 6291456);
  EXPECT_EQ(cuda_sum_rows_staging_bytes(512, 768, 132), 0);
  EXPECT_EQ(cuda_sum_rows_staging_bytes(16384, 50257, 132), 0);
  EXPECT_EQ(cuda_sum_rows_staging_bytes(16384, 768, 0), 0);   // no CUDA device
}

// In a block: a biased linear whose weight trains holds the staging buffer in its backward, so GPT-2's
// block backward needs c_fc's 132 MiB more than without a device (the largest of its four linears' buffers
// falls at its backward peak, at the MLP); llama (no biases) is unchanged.
TEST(CudaReduce, BiasedBlocksBackwardHoldsTheStagingBuffer) {
  const ModelSpec gpt2 = load_model("gpt2");
  ImplOptions cpu{ModelImpl::Fused};
  ImplOptions h200 = cpu;
  h200.sm_count = 132;
  const BlockMemory a = block_memory(gpt2, 16, 1024, Dtype::BF16, CheckpointMode::None, cpu);
  const BlockMemory b = block_memory(gpt2, 16, 1024, Dtype::BF16, CheckpointMode::None, h200);
  EXPECT_EQ(a.saved_bytes(), b.saved_bytes());
  EXPECT_EQ(a.forward_extra, b.forward_extra);
  EXPECT_GT(b.backward_extra, a.backward_extra);
  EXPECT_LE(b.backward_extra - a.backward_extra, 138412032);
  const ModelSpec llama = load_model("llama-1b");
  ImplOptions l = cpu;
  l.sm_count = 132;
  EXPECT_EQ(block_memory(llama, 2, 2048, Dtype::BF16, CheckpointMode::None, cpu).backward_extra,
            block_memory(llama, 2, 2048, Dtype::BF16, CheckpointMode::None, l).backward_extra);
}

}  // namespace
}  // namespace fsdpsim::models

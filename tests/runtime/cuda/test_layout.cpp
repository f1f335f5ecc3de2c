// Host-only checks of the CUDA backend's memory layout (no GPU needed): the activations its kernels
// keep in the program's buffers are exactly what models/model_activations.cpp counts for bf16, so
// the runner's buffer-size checks hold and measured peaks are comparable with predicted ones.
#include <gtest/gtest.h>

#include "models/model_spec.h"
#include "models/zoo.h"
#include "runtime/cuda/cuda_segment_compute.h"
#include "runtime/model/dims.h"

namespace fsdpsim::runtime::cuda {
namespace {

void check(const models::ModelSpec& m, int B, int T) {
  const Dims d = runtime_dims(m, B, T);
  EXPECT_EQ(cuda_block_acts_bytes(d),
            models::block_saved_activation_bytes(m, B, T, Dtype::BF16, models::CheckpointMode::None)) << m.name;
  EXPECT_EQ(d.tokens() * d.C * 2, models::block_saved_activation_bytes(m, B, T, Dtype::BF16, models::CheckpointMode::Full))
      << m.name;
  EXPECT_EQ(cuda_logits_bytes(d), models::logits_bytes(m, B, T, Dtype::BF16)) << m.name;
  // The fused loss's lse [N] fits in the fp32 part, 4-byte aligned.
  EXPECT_EQ(cuda_logits_lse_offset(d) % 4, 0);
  EXPECT_LE(cuda_logits_lse_offset(d) + d.tokens() * 4, cuda_logits_bytes(d));
}

TEST(CudaLayout, SavedActivationsMatchTheModelsFormulaForBf16) {
  check(models::load_model("tiny-llama", "--model"), 2, 64);
  check(models::load_model("llama-1b", "--model"), 1, 2048);
  check(models::load_model("llama3-8b", "--model"), 1, 8192);
  models::ModelSpec odd = models::load_model("tiny-llama", "--model");
  odd.vocab_size = 4097;   // odd N*V: the lse still lands aligned
  check(odd, 1, 33);
}

}  // namespace
}  // namespace fsdpsim::runtime::cuda

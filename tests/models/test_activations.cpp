// Saved-activation, backward-working and logits bytes against hand derivations
// (formulas in models/model_activations.cpp).
#include <gtest/gtest.h>

#include "models/zoo.h"

using namespace fsdpsim;
using namespace fsdpsim::models;

TEST(Activations, Llama3_8bNoCheckpointingByHand) {
  // h 4096, a 32, g 8, d 128, f 14336, bf16 (2 B), b 1, s 4096 -> T = 4096 tokens.
  // per token in bf16: 4h (x, norm1 out, residual, norm2 out) = 16,384
  //   + q,k,v (32 + 16) * 128 = 6,144 + attention out 32 * 128 = 4,096 + 4f = 57,344  -> 83,968 elements
  //   = 167,936 B, + fp32: 2 RMSNorm rstd 8 B + logsumexp 4 * 32 = 128 B -> 168,072 B per token
  EXPECT_EQ(block_saved_activation_bytes(load_model("llama3-8b"), 1, 4096, Dtype::BF16, CheckpointMode::None),
            168'072LL * 4096);
}

TEST(Activations, FullCheckpointingSavesOnlyTheBlockInput) {
  EXPECT_EQ(block_saved_activation_bytes(load_model("llama3-8b"), 2, 4096, Dtype::BF16, CheckpointMode::Full),
            2LL * 4096 * 4096 * 2);
  EXPECT_EQ(block_saved_activation_bytes(load_model("gpt2"), 3, 1024, Dtype::FP32, CheckpointMode::Full),
            3LL * 1024 * 768 * 4);
}

TEST(Activations, SelectiveOpByHand) {
  // torchtitan op SAC on a llama block: mm order q(1) k(2) v(3) o(4) gate(5) up(6) down(7); saved: odd
  // ones q [a*d = 4096], v [g*d = 1024], gate [f = 14336], down [h = 4096]; plus the block input 4096,
  // SDPA output 4096 (bf16) and logsumexp 32 * 4 B.
  // (4096 + 4096 + 1024 + 14336 + 4096 + 4096) * 2 + 128 = 63,616 B per token.
  EXPECT_EQ(block_saved_activation_bytes(load_model("llama3-8b"), 1, 4096, Dtype::BF16, CheckpointMode::SelectiveOp),
            63'616LL * 4096);
}

TEST(Activations, Gpt2LayerNormPlainMlpByHand) {
  // h 768, a = g = 12, d 64, f 3072, bf16, b 2, s 1024 -> T = 2048.
  // 4h = 3072 + q,k,v,attn-out 4 * 768 = 3072 + 2f = 6144 -> 12,288 elements = 24,576 B
  // + LayerNorm mean+rstd 2 * 8 B + logsumexp 12 * 4 B = 64 B -> 24,640 B per token
  EXPECT_EQ(block_saved_activation_bytes(load_model("gpt2"), 2, 1024, Dtype::BF16, CheckpointMode::None),
            24'640LL * 2048);
  // selective: every GPT-2 linear has a bias (aten.addmm): only input + SDPA output + logsumexp
  EXPECT_EQ(block_saved_activation_bytes(load_model("gpt2"), 2, 1024, Dtype::BF16, CheckpointMode::SelectiveOp),
            (768LL * 2 + 768 * 2 + 48) * 2048);
}

TEST(Activations, MoeSavesTopKExpertSlots) {
  // Mixtral, bf16, b 1, s 1024. Attention part as llama3-8b: (4096 + 6144 + 4096) * 2 + 4 + 128.
  // MLP part: (residual + norm2 out) 2 * 4096 * 2 + 4 (rstd) + k=2 slots * (2h + 4f) * 2
  //   = 16,388 + 2 * (8192 + 57344) * 2 = 16,388 + 262,144; router: fp32 probs 8 * 4 + indices 2 * 8
  //   + weights 2 * 4 = 56. Block input 4096 * 2.
  const std::int64_t per_token = 8192 + (28'672 + 132) + (16'388 + 262'144 + 56);
  EXPECT_EQ(block_saved_activation_bytes(load_model("mixtral-8x7b"), 1, 1024, Dtype::BF16, CheckpointMode::None),
            per_token * 1024);
}

TEST(Activations, BackwardWorkingBytesByHand) {
  // tiny-llama: h 256, a 8, g 4, d 32, f 688, bf16, b 1, s 128.
  // attention tensors per token: (256 + (8 + 8) * 32 + 8 * 32) * 2 + 4 + 32 = 2,084
  // MLP tensors: 2 * 256 * 2 + 4 + 4 * 688 * 2 = 6,532
  // MLP phase: 2,084 + 6,532 + (2 * 256 + 3 * 688) * 2 = 13,768
  // attention phase: 2,084 + (2 * 256 + (16 + 8) * 32) * 2 + 4 * 8 * 32 = 5,668
  EXPECT_EQ(block_backward_working_bytes(load_model("tiny-llama"), 1, 128, Dtype::BF16), 13'768LL * 128);
  // not checkpointed: only the grads on top of the saved tensors; MLP phase (2 * 256 + 3 * 688) * 2
  // = 5,152 beats the attention phase (3,584 - 6,532 freed MLP tensors < 0)
  EXPECT_EQ(block_backward_grad_bytes(load_model("tiny-llama"), 1, 128, Dtype::BF16), 5'152LL * 128);
}

TEST(Activations, LogitsByHand) {
  const ModelSpec m = load_model("llama3-8b");
  const std::int64_t tv = 4096LL * 128256;
  EXPECT_EQ(logits_bytes(m, 1, 4096, Dtype::BF16), tv * (2 + 4));       // bf16 logits + fp32 log_softmax
  EXPECT_EQ(logits_peak_bytes(m, 1, 4096, Dtype::BF16), tv * (2 + 4 + 4));  // + the fp32 upcast copy
  EXPECT_EQ(logits_peak_bytes(m, 1, 4096, Dtype::FP32), tv * (4 + 4));      // fp32: no copy
}

TEST(Activations, ScaleLinearlyWithTokensAndOrderAcrossModes) {
  for (const auto& name : zoo_names()) {
    SCOPED_TRACE(name);
    const ModelSpec m = load_model(name);
    const Bytes none1 = block_saved_activation_bytes(m, 1, 512, Dtype::BF16, CheckpointMode::None);
    EXPECT_EQ(block_saved_activation_bytes(m, 4, 512, Dtype::BF16, CheckpointMode::None), 4 * none1);
    const Bytes sel = block_saved_activation_bytes(m, 1, 512, Dtype::BF16, CheckpointMode::SelectiveOp);
    const Bytes full = block_saved_activation_bytes(m, 1, 512, Dtype::BF16, CheckpointMode::Full);
    EXPECT_LT(full, sel);
    EXPECT_LT(sel, none1);
    EXPECT_GT(block_backward_working_bytes(m, 1, 512, Dtype::BF16), none1 - full);
  }
}

// The loss implementations (model_spec.h LossImpl), by hand for llama3-8b-like shapes at one 4096-token
// sequence: T = 4096, V = 128256, C = 4096, bf16.
TEST(Activations, LogitsBytesPerLossImplementation) {
  ModelSpec m;
  m.vocab_size = 128256;
  m.hidden = 4096;
  const Bytes t = 4096, tv = t * 128256;
  EXPECT_EQ(logits_bytes(m, 1, 4096, Dtype::BF16, LossImpl::Torch), tv * 6);
  EXPECT_EQ(logits_bytes(m, 1, 4096, Dtype::BF16, LossImpl::Fused), tv * 2 + t * 4);
  EXPECT_EQ(logits_peak_bytes(m, 1, 4096, Dtype::BF16, LossImpl::Fused), tv * 2 + t * 4 + tv * 2);
  EXPECT_EQ(logits_bytes(m, 1, 4096, Dtype::BF16, LossImpl::FusedLinear), t * 4096 * 2 + t * 4);
  // torchtune's chunked output: the same bytes as torch at the forward's end, one chunk's fp32 copy on top
  // (8 chunks of 512 positions; 3 chunks of ceil(4096 / 3) = 1366 positions; fp32 logits: no copy)
  EXPECT_EQ(logits_bytes(m, 1, 4096, Dtype::BF16, LossImpl::Chunked), tv * 6);
  EXPECT_EQ(logits_peak_bytes(m, 1, 4096, Dtype::BF16, LossImpl::Chunked), tv * 6 + 512 * 128256 * 4);
  EXPECT_EQ(logits_peak_bytes(m, 2, 4096, Dtype::BF16, LossImpl::Chunked, 3), 2 * tv * 6 + 2 * 1366 * 128256 * 4);
  EXPECT_EQ(logits_peak_bytes(m, 1, 4096, Dtype::FP32, LossImpl::Chunked), tv * 8);
  // Liger's chunking: ceil(128256 / 4096) = 32 chunks of ceil(4096 / 32) = 128 tokens, fp32 logits.
  EXPECT_EQ(logits_peak_bytes(m, 1, 4096, Dtype::BF16, LossImpl::FusedLinear), t * 4096 * 2 + t * 4 + 128 * 128256 * 4);
  EXPECT_EQ(loss_impl_name(LossImpl::FusedLinear), "fused_linear");
  EXPECT_EQ(loss_impl_name(LossImpl::Fused), "fused");
  EXPECT_EQ(loss_impl_name(LossImpl::Torch), "torch");
}

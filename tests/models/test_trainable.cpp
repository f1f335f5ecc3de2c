// Frozen weights (LoRA-like, issue 19; models/trainable.h): the rule that picks the trainable matrices
// from trainable_fraction, checked against the ground-truth harness's own counts, and the saved tensors
// and backward kernels of frozen blocks, counted by hand.
//
// Tiny llama as tests/models/test_implementation.cpp: hidden h = 8, heads a = 2, kv heads g = 1,
// head_dim d = 4, ffn f = 16; micro-batch 1 x seq 4 -> T = 4 tokens; bf16 (e = 2 B):
//   h-wide 64, fp32 h-wide 128, q 64, k or v 32, ffn-wide 128, per-token fp32 stat 16, logsumexp 32,
//   litgpt's weight.float() [h] fp32 = 32.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "models/implementation.h"
#include "models/kernels.h"
#include "models/trainable.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "tests/models/tiny_models.h"

using namespace fsdpsim;
using namespace fsdpsim::models;
using namespace fsdpsim::models::testing;

namespace {

BlockMemory block(ModelImpl impl, CheckpointMode mode, const GradFlow& g) {
  return block_memory(tiny_llama(), 1, 4, Dtype::BF16, mode, ImplOptions{impl, false, Float8Recipe::None}, g);
}

std::vector<std::int64_t> layers_with(const TrainableSet& s, Weight w) {
  std::vector<std::int64_t> v;
  for (std::size_t l = 0; l < s.layers.size(); ++l)
    if (s.layers[l] & weight_bit(w)) v.push_back(static_cast<std::int64_t>(l));
  return v;
}

std::vector<std::string> gemms(const std::vector<KernelDesc>& ks) {
  std::vector<std::string> v;
  for (const KernelDesc& k : ks)
    if (k.kind == KernelKind::Gemm) v.push_back(k.name);
  return v;
}

constexpr WeightMask bit(Weight w) { return weight_bit(w); }

}  // namespace

// The rule against the harness's own trainable counts (tests/fixtures/torch_memory: trainable_params),
// with the requested fraction and with the 6-decimal fraction the fixture records as run.
TEST(Trainable, RuleMatchesTheHarnessLlama1bLitgpt) {
  // llama-1b: 1,235,814,400 parameters; litgpt's fused qkv 2048 x 3072 = 6,291,456, proj 2048 x 2048.
  // 5%: 61.79 M -> qkv in 9 blocks (56.62 M), then proj in 1 (4.19 M): 60,817,408; MLP matrices (16.8 M)
  // no longer fit. Evenly spaced: (i * 16) // 9 = 0 1 3 5 7 8 10 12 14.
  for (double f : {0.05, 0.049212}) {
    const TrainableSet s = trainable_set(load_model("llama-1b"), ModelImpl::LitGPT, f);
    EXPECT_FALSE(s.all);
    EXPECT_EQ(s.total, 1'235'814'400);
    EXPECT_EQ(s.trainable, 60'817'408) << f;
    EXPECT_EQ(layers_with(s, Weight::QKV), (std::vector<std::int64_t>{0, 1, 3, 5, 7, 8, 10, 12, 14})) << f;
    EXPECT_EQ(layers_with(s, Weight::Out), (std::vector<std::int64_t>{0})) << f;
    for (Weight w : {Weight::Q, Weight::K, Weight::V, Weight::Gate, Weight::Up, Weight::Down})
      EXPECT_TRUE(layers_with(s, w).empty()) << f;
    EXPECT_EQ(s.first_trained_layer(), 0);
  }
}

TEST(Trainable, RuleMatchesTheHarnessLlama3_8bHf) {
  // llama3-8b: 8,030,261,248 parameters; HF's q_proj 4096 x 4096 = 16,777,216, v_proj 4096 x 1024.
  // 1%: 80.30 M -> q_proj in 4 blocks (0 8 16 24), v_proj in 3 (0 10 21): 79,691,776.
  for (double f : {0.01, 0.009924}) {
    const TrainableSet s = trainable_set(load_model("llama3-8b"), ModelImpl::HF, f);
    EXPECT_EQ(s.trainable, 79'691'776) << f;
    EXPECT_EQ(layers_with(s, Weight::Q), (std::vector<std::int64_t>{0, 8, 16, 24})) << f;
    EXPECT_EQ(layers_with(s, Weight::V), (std::vector<std::int64_t>{0, 10, 21})) << f;
    EXPECT_TRUE(layers_with(s, Weight::K).empty()) << f;
  }
  // Below one matrix: the smallest one of block 0, the first of equal sizes in registration order
  // (k_proj before v_proj).
  const TrainableSet tiny = trainable_set(load_model("llama3-8b"), ModelImpl::HF, 1e-5);
  EXPECT_EQ(tiny.trainable, 4096 * 1024);
  EXPECT_EQ(tiny.layers[0], bit(Weight::K));
  EXPECT_TRUE(trainable_set(load_model("llama3-8b"), ModelImpl::HF, 1.0).all);
}

TEST(Trainable, ModuleTreeTensorsMapOntoTheRecipesWeights) {
  EXPECT_EQ(tensor_weight("model.layers.3.self_attn.q_proj.weight").layer, 3);
  EXPECT_EQ(tensor_weight("model.layers.3.self_attn.q_proj.weight").weights, bit(Weight::Q) | bit(Weight::QKV));
  EXPECT_EQ(tensor_weight("model.layers.0.mlp.down_proj.weight").weights, bit(Weight::Down));
  EXPECT_EQ(tensor_weight("model.layers.0.input_layernorm.weight").weights, bit(Weight::AttnNorm));
  EXPECT_EQ(tensor_weight("model.layers.0.post_attention_layernorm.weight").weights, bit(Weight::MlpNorm));
  EXPECT_EQ(tensor_weight("model.layers.0.self_attn.q_proj.bias").weights, 0u);
  EXPECT_EQ(tensor_weight("transformer.h.2.attn.c_attn.weight").weights,
            bit(Weight::Q) | bit(Weight::K) | bit(Weight::V) | bit(Weight::QKV));
  EXPECT_EQ(tensor_weight("transformer.h.2.mlp.c_proj.weight").weights, bit(Weight::Down));
  EXPECT_EQ(tensor_weight("transformer.h.2.attn.c_proj.weight").weights, bit(Weight::Out));
  EXPECT_EQ(tensor_weight("model.embed_tokens.weight").layer, -1);
  EXPECT_EQ(tensor_weight("model.embed_tokens.weight").weights, bit(Weight::Embedding));
  EXPECT_EQ(tensor_weight("lm_head.weight").weights, bit(Weight::LmHead));
  EXPECT_EQ(tensor_weight("model.norm.weight").weights, bit(Weight::FinalNorm));
  // litgpt's fused qkv trains q_proj, k_proj and v_proj of the module tree; nothing else trains.
  const TrainableSet s = trainable_set(load_model("llama-1b"), ModelImpl::LitGPT, 0.05);
  EXPECT_TRUE(tensor_trains(s, "model.layers.1.self_attn.k_proj.weight"));
  EXPECT_FALSE(tensor_trains(s, "model.layers.2.self_attn.k_proj.weight"));
  EXPECT_TRUE(tensor_trains(s, "model.layers.0.self_attn.o_proj.weight"));
  EXPECT_FALSE(tensor_trains(s, "model.layers.0.input_layernorm.weight"));
  EXPECT_FALSE(tensor_trains(s, "model.embed_tokens.weight"));
  // Every tensor the rule trains, summed over the module tree, is the rule's count.
  std::int64_t sum = 0;
  for (const FsdpUnit& u : build_wrap_graph(load_model("llama-1b"), WrapPolicy{}).units)
    for (const ParamTensor& t : u.tensors)
      if (tensor_trains(s, t.name)) sum += t.numel();
  EXPECT_EQ(sum, s.trainable);
}

// litgpt's block (litgpt/model.py) with frozen weights, by hand. All trainable, the block keeps 1536 B
// (test_implementation.cpp LitgptByHand).
TEST(TrainableTape, LitgptFrozenBlockSavesNoLinearInput) {
  // A frozen block whose input requires grad (a block after the first trainable one): every op records,
  // but a frozen linear saves no input (attn_norm.out, mlp_norm.out, mlp.prod), and `x_normed *
  // weight.float()` keeps the fp32 weight (for x_normed's gradient) but not x_normed (only the frozen
  // weight's gradient reads it).
  const BlockMemory frozen = block(ModelImpl::LitGPT, CheckpointMode::None, GradFlow{0, true});
  EXPECT_EQ(entries(frozen), (Entries{
                                 {"attn_norm.x_fp32", 128},     // x * x
                                 {"attn_norm.rstd", 16},        // rsqrt's result
                                 {"attn_norm.weight_fp32", 32}, // saved for x_normed's gradient
                                 {"attn.q_rope", 64},           // SDPA's q, k, v, out, logsumexp
                                 {"attn.k_rep", 64},
                                 {"attn.v_rep", 64},
                                 {"attn.out", 64},
                                 {"attn.lse", 32},
                                 {"mlp_norm.x_fp32", 128},
                                 {"mlp_norm.rstd", 16},
                                 {"mlp_norm.weight_fp32", 32},
                                 {"mlp.gate", 128},   // silu's input
                                 {"mlp.up", 128},     // mul's operands (both require grad)
                                 {"mlp.act", 128},
                             }));
  // 1536 - 2 x 128 (normed_fp32) - 2 x 64 (the norms' outputs) - 128 (prod) = 1024
  EXPECT_EQ(frozen.saved_bytes(), 1024);

  // The block holding the step's first trainable weight (its input does not require grad: a frozen
  // embedding), qkv training: nothing before qkv records a graph (the input norm saves nothing), qkv
  // saves its input; from there on as above.
  const BlockMemory first = block(ModelImpl::LitGPT, CheckpointMode::None, GradFlow{bit(Weight::QKV), false});
  EXPECT_EQ(entries(first), (Entries{
                                {"attn_norm.out", 64},   // qkv's input, for its weight's gradient
                                {"attn.q_rope", 64},
                                {"attn.k_rep", 64},
                                {"attn.v_rep", 64},
                                {"attn.out", 64},
                                {"attn.lse", 32},
                                {"mlp_norm.x_fp32", 128},
                                {"mlp_norm.rstd", 16},
                                {"mlp_norm.weight_fp32", 32},
                                {"mlp.gate", 128},
                                {"mlp.up", 128},
                                {"mlp.act", 128},
                            }));
  EXPECT_EQ(first.saved_bytes(), 64 + 288 + 176 + 384);

  // Nothing trains and nothing requires grad (a block before the first trainable weight): no graph, no
  // saved tensor, no backward; under full checkpointing not even the block input is kept.
  for (CheckpointMode mode : {CheckpointMode::None, CheckpointMode::Full, CheckpointMode::SelectiveOp}) {
    const BlockMemory none = block(ModelImpl::LitGPT, mode, GradFlow{0, false});
    EXPECT_TRUE(none.saved.empty());
    EXPECT_EQ(none.backward_extra, 0);
  }
  // Full checkpointing of the first trainable block keeps its input (the checkpoint's _NoopSaveInputs),
  // though the input does not require grad.
  const BlockMemory full = block(ModelImpl::LitGPT, CheckpointMode::Full, GradFlow{bit(Weight::QKV), false});
  EXPECT_EQ(entries(full), (Entries{{"x", 64}}));
  EXPECT_TRUE(full.saved[0].is_input);
}

// Hugging Face's block (transformers LlamaAttention / LlamaMLP / LlamaRMSNorm) with only q_proj training
// and an input that does not require grad: q_proj saves its input, k_proj and v_proj none; SDPA saves q,
// k and v (one formula for all three); `self.weight * normed` with a frozen weight keeps nothing.
TEST(TrainableTape, HfOnlyQProjTrains) {
  const BlockMemory bm = block(ModelImpl::HF, CheckpointMode::None, GradFlow{bit(Weight::Q), false});
  EXPECT_EQ(entries(bm), (Entries{
                             {"attn_norm.out", 64},
                             {"attn.v", 32},
                             {"attn.q_rope", 64},
                             {"attn.k_rope", 32},
                             {"attn.out", 64},
                             {"attn.lse", 32},
                             {"mlp_norm.x_fp32", 128},
                             {"mlp_norm.rstd", 16},
                             {"mlp.gate", 128},
                             {"mlp.act", 128},
                             {"mlp.up", 128},
                         }));
  EXPECT_EQ(bm.saved_bytes(), 816);
  // All trainable but the input does not require grad (FSDP1: the first block's unit trains whole under
  // a frozen embedding): the input norm's fp32 chain records nothing until `self.weight * normed`.
  const BlockMemory unit = block(ModelImpl::HF, CheckpointMode::None, GradFlow{kAllWeights, false});
  EXPECT_EQ(unit.saved_bytes(), 1280 - 128 - 16);
  EXPECT_EQ(entries(unit).front(), (std::pair<std::string, Bytes>{"attn_norm.normed", 64}));
}

// The backward kernels follow the same flow: a weight-gradient GEMM per trainable weight, an input
// gradient where the input requires grad, nothing for a block without a graph.
TEST(TrainableKernels, WeightGradientsPerWeight) {
  const ModelSpec m = load_model("llama-1b");
  const auto bwd = [&](const GradFlow& g) {
    return gemms(backward_kernels(m, ModulePart::Block, 1, 1024, Dtype::BF16, g));
  };
  EXPECT_EQ(bwd(GradFlow{}), (std::vector<std::string>{"down_proj_dgrad", "down_proj_wgrad", "up_proj_dgrad",
                                                       "up_proj_wgrad", "gate_proj_dgrad", "gate_proj_wgrad",
                                                       "o_proj_dgrad", "o_proj_wgrad", "v_proj_dgrad", "v_proj_wgrad",
                                                       "k_proj_dgrad", "k_proj_wgrad", "q_proj_dgrad", "q_proj_wgrad"}));
  EXPECT_EQ(bwd(GradFlow{0, true}), (std::vector<std::string>{"down_proj_dgrad", "up_proj_dgrad", "gate_proj_dgrad",
                                                              "o_proj_dgrad", "v_proj_dgrad", "k_proj_dgrad",
                                                              "q_proj_dgrad"}));
  // q_proj trains, the input does not require grad: no dgrad into the input norm's output, no norm backward.
  EXPECT_EQ(bwd(GradFlow{bit(Weight::Q), false}),
            (std::vector<std::string>{"down_proj_dgrad", "up_proj_dgrad", "gate_proj_dgrad", "o_proj_dgrad",
                                      "q_proj_wgrad"}));
  EXPECT_TRUE(backward_kernels(m, ModulePart::Block, 1, 1024, Dtype::BF16, GradFlow{0, false}).empty());
  // The old all-or-nothing form is the same as the flows it stands for.
  EXPECT_EQ(gemms(backward_kernels(m, ModulePart::Block, 1, 1024, Dtype::BF16, false)), bwd(GradFlow{0, true}));
  EXPECT_EQ(gemms(backward_kernels(m, ModulePart::FinalNormAndHead, 1, 1024, Dtype::BF16,
                                   GradFlow{0, true})),
            (std::vector<std::string>{"lm_head_dgrad"}));
}

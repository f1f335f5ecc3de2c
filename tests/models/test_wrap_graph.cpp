// FSDP units under each wrap policy: counts, params, root contents, tensors and forward order.
#include <gtest/gtest.h>

#include "common/errors.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"

using namespace fsdpsim;
using namespace fsdpsim::models;

namespace {

WrapPolicy policy(const std::string& s) { return parse_wrap_policy(s, "--wrap-policy"); }

std::vector<std::string> forward_names(const WrapGraph& g) {
  std::vector<std::string> out;
  for (int id : g.forward_order) out.push_back(g.units[id].name);
  return out;
}

void expect_consistent(const ModelSpec& m, const WrapGraph& g) {
  std::int64_t sum = 0;
  for (const auto& u : g.units) {
    std::int64_t t = 0;
    for (const auto& p : u.tensors) t += p.numel();
    EXPECT_EQ(t, u.params) << u.name;
    sum += u.params;
  }
  EXPECT_EQ(sum, count_params(m).total);
  EXPECT_EQ(g.total_params, sum);
  ASSERT_EQ(g.forward_order.size(), g.units.size());
  EXPECT_EQ(g.forward_order.front(), 0);
  EXPECT_TRUE(g.units[0].is_root);
}

}  // namespace

TEST(WrapGraph, TransformerBlockPolicyLlama3) {
  const ModelSpec m = load_model("llama3-8b");
  const WrapGraph g = build_wrap_graph(m, WrapPolicy{});
  expect_consistent(m, g);
  ASSERT_EQ(g.units.size(), 33u);
  const ParamCounts c = count_params(m);
  // root: embedding + final norm + head
  EXPECT_EQ(g.units[0].params, c.embedding + c.final_norm + c.lm_head);
  EXPECT_EQ(g.units[0].parts, (std::vector<ModulePart>{ModulePart::Embedding, ModulePart::FinalNormAndHead}));
  EXPECT_TRUE(g.units[0].layers.empty());
  EXPECT_EQ(g.units[0].tensors.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(g.units[0].tensors.back().name, "lm_head.weight");
  for (int i = 1; i <= 32; ++i) {
    EXPECT_EQ(g.units[i].params, c.per_block);
    EXPECT_EQ(g.units[i].name, "model.layers." + std::to_string(i - 1));
    EXPECT_EQ(g.units[i].layers, std::vector<int>{i - 1});
    EXPECT_EQ(g.units[i].parts, std::vector<ModulePart>{ModulePart::Block});
    EXPECT_EQ(g.forward_order[i], i);
  }
  // named_parameters order inside a LlamaDecoderLayer: self_attn, mlp, input_layernorm, post_attention_layernorm
  const auto& t = g.units[1].tensors;
  ASSERT_EQ(t.size(), 9u);
  EXPECT_EQ(t[0].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(t[0].shape, (std::vector<std::int64_t>{4096, 4096}));
  EXPECT_EQ(t[1].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(t[1].shape, (std::vector<std::int64_t>{1024, 4096}));
  EXPECT_EQ(t[4].name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(t[6].shape, (std::vector<std::int64_t>{4096, 14336}));  // down_proj [out, in]
  EXPECT_EQ(t[7].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(t[8].name, "model.layers.0.post_attention_layernorm.weight");
}

// litgpt's parameter layout (implementation "litgpt"): one fused qkv linear per block, (n_head + 2 n_kv) x
// head_dim rows, and the block's modules registered in execution order (norm_1, attn, norm_2, mlp), as
// litgpt/model.py's Block and CausalSelfAttention hold them. Same parameter count as the HF layout.
TEST(WrapGraph, LitgptFusesQkvAndRegistersInExecutionOrder) {
  const ModelSpec m = load_model("llama3-8b");
  const WrapGraph g = build_wrap_graph(m, WrapPolicy{}, ModelImpl::LitGPT);
  expect_consistent(m, g);
  ASSERT_EQ(g.units.size(), 33u);
  const auto& t = g.units[1].tensors;
  ASSERT_EQ(t.size(), 7u);
  EXPECT_EQ(t[0].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(t[1].name, "model.layers.0.self_attn.qkv_proj.weight");
  EXPECT_EQ(t[1].shape, (std::vector<std::int64_t>{4096 + 2 * 1024, 4096}));
  EXPECT_EQ(t[2].name, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(t[3].name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(t[4].name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(t[6].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(g.units[1].params, count_params(m).per_block);
  // models litgpt has no plain-block layout for keep Hugging Face's (a MoE block)
  const ModelSpec moe = load_model("mixtral-8x7b");
  EXPECT_EQ(build_wrap_graph(moe, WrapPolicy{}, ModelImpl::LitGPT).units[1].tensors.size(),
            build_wrap_graph(moe, WrapPolicy{}).units[1].tensors.size());
}

TEST(WrapGraph, NonePolicyIsOneRootUnit) {
  const ModelSpec m = load_model("llama3-8b");
  const WrapGraph g = build_wrap_graph(m, policy("none"));
  expect_consistent(m, g);
  ASSERT_EQ(g.units.size(), 1u);
  EXPECT_EQ(g.units[0].parts.size(), 3u);
  EXPECT_EQ(g.units[0].layers.size(), 32u);
  EXPECT_EQ(g.units[0].tensors.size(), 1u + 32 * 9 + 2);
}

TEST(WrapGraph, SizePolicyTinyLlamaByHand) {
  // tiny-llama sizes: q,o 65,536; k,v 32,768; self_attn 196,608; gate/up/down 176,128 each;
  // norms 256; block 725,504; embed and head 1,048,576.
  const ModelSpec m = load_model("tiny-llama");
  // min 100,000: no single attention projection qualifies but self_attn (196,608) does; each MLP
  // linear does (176,128), leaving the MLP and the block with remainders 0 and 512; embed and head wrap.
  const WrapGraph g = build_wrap_graph(m, policy("size:100000"));
  expect_consistent(m, g);
  ASSERT_EQ(g.units.size(), 1u + 1 + 4 * 4 + 1);
  EXPECT_EQ(g.units[0].params, 4 * 512 + 256);  // every block's two norms + the final norm
  const auto names = forward_names(g);
  EXPECT_EQ(names[0], "root");
  EXPECT_EQ(names[1], "model.embed_tokens");
  EXPECT_EQ(names[2], "model.layers.0.self_attn");
  EXPECT_EQ(names[3], "model.layers.0.mlp.gate_proj");
  EXPECT_EQ(names[4], "model.layers.0.mlp.up_proj");
  EXPECT_EQ(names[5], "model.layers.0.mlp.down_proj");
  EXPECT_EQ(names[6], "model.layers.1.self_attn");
  EXPECT_EQ(names.back(), "lm_head");
  // the root computes the blocks' norms and the final norm; the embedding runs under its own unit
  EXPECT_EQ(g.units[0].parts, (std::vector<ModulePart>{ModulePart::Block, ModulePart::FinalNormAndHead}));
  EXPECT_EQ(g.units[0].layers.size(), 4u);

  // min 1,000,000: no block qualifies (725,504); embed (1,048,576) does; then LlamaModel's remainder
  // (4 blocks + final norm = 2,902,272) does, and lm_head: the root keeps nothing.
  const WrapGraph g2 = build_wrap_graph(m, policy("size:1000000"));
  expect_consistent(m, g2);
  EXPECT_EQ(forward_names(g2), (std::vector<std::string>{"root", "model", "model.embed_tokens", "lm_head"}));
  EXPECT_EQ(g2.units[0].params, 0);
  EXPECT_EQ(g2.units[1].params, 4 * 725'504 + 256);

  // min larger than the model: one root unit
  EXPECT_EQ(build_wrap_graph(m, policy("size:100000000")).units.size(), 1u);
}

TEST(WrapGraph, SizePolicyForwardOrderFollowsExecutionNotRegistration) {
  // min 256 wraps every parameterised leaf (the norms have exactly 256); their parents keep nothing.
  // A llama layer registers self_attn before input_layernorm but its forward runs the norm first:
  // unit ids follow registration, forward_order follows execution.
  const ModelSpec m = load_model("tiny-llama");
  const WrapGraph g = build_wrap_graph(m, policy("size:256"));
  expect_consistent(m, g);
  ASSERT_EQ(g.units.size(), 1u + 1 + 4 * 9 + 1 + 1);
  EXPECT_EQ(g.units[0].params, 0);
  EXPECT_EQ(g.units[2].name, "model.layers.0.self_attn.q_proj");
  const auto names = forward_names(g);
  EXPECT_EQ(names[1], "model.embed_tokens");
  EXPECT_EQ(names[2], "model.layers.0.input_layernorm");
  EXPECT_EQ(names[3], "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(names[6], "model.layers.0.self_attn.o_proj");
  EXPECT_EQ(names[7], "model.layers.0.post_attention_layernorm");
  EXPECT_EQ(names[8], "model.layers.0.mlp.gate_proj");
  EXPECT_EQ(names[10], "model.layers.0.mlp.down_proj");
  EXPECT_EQ(names[names.size() - 2], "model.norm");
  EXPECT_EQ(names.back(), "lm_head");
}

TEST(WrapGraph, ModulesPolicyEmbeddingAndHeadAsUnits) {
  const ModelSpec m = load_model("llama3-8b");
  const WrapGraph g = build_wrap_graph(m, policy("modules:layers.*,embed_tokens,lm_head"));
  expect_consistent(m, g);
  ASSERT_EQ(g.units.size(), 35u);
  EXPECT_EQ(g.units[0].params, 4096);  // only model.norm stays with the root
  const auto names = forward_names(g);
  EXPECT_EQ(names[1], "model.embed_tokens");
  EXPECT_EQ(names[2], "model.layers.0");
  EXPECT_EQ(names[33], "model.layers.31");
  EXPECT_EQ(names[34], "lm_head");
  EXPECT_EQ(g.units[0].parts, std::vector<ModulePart>{ModulePart::FinalNormAndHead});
}

TEST(WrapGraph, ModulesPolicyUnknownNameIsInputError) {
  const ModelSpec m = load_model("llama3-8b");
  try {
    build_wrap_graph(m, policy("modules:layers.*,transformer.wte"));
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "wrap_policy.modules");
    EXPECT_EQ(e.value(), "\"transformer.wte\"");
  }
}

TEST(WrapGraph, TiedHeadStaysWithTheEmbedding) {
  const ModelSpec m = load_model("gemma-2b");
  const WrapGraph g = build_wrap_graph(m, WrapPolicy{});
  expect_consistent(m, g);
  EXPECT_EQ(g.units.size(), 19u);
  const ParamCounts c = count_params(m);
  EXPECT_EQ(g.units[0].params, c.embedding + c.final_norm);
  EXPECT_EQ(g.units[0].parts, (std::vector<ModulePart>{ModulePart::Embedding, ModulePart::FinalNormAndHead}));
  // asking for lm_head as a unit: it owns no tensor (tied), so no unit is made
  EXPECT_EQ(build_wrap_graph(m, policy("modules:lm_head")).units.size(), 1u);
}

TEST(WrapGraph, Gpt2NamesAndConv1DShapes) {
  const ModelSpec m = load_model("gpt2");
  const WrapGraph g = build_wrap_graph(m, WrapPolicy{});
  expect_consistent(m, g);
  ASSERT_EQ(g.units.size(), 13u);
  EXPECT_EQ(g.units[1].name, "transformer.h.0");
  const auto& t = g.units[1].tensors;
  ASSERT_EQ(t.size(), 12u);
  EXPECT_EQ(t[0].name, "transformer.h.0.ln_1.weight");
  EXPECT_EQ(t[2].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(t[2].shape, (std::vector<std::int64_t>{768, 2304}));  // Conv1D [in, out]
  EXPECT_EQ(t[3].shape, std::vector<std::int64_t>{2304});
  EXPECT_EQ(g.units[0].tensors[1].name, "transformer.wpe.weight");
  EXPECT_EQ(g.modules[g.units[1].module].type, "GPT2Block");
}

TEST(WrapGraph, MixtralExpertsInsideTheBlockUnit) {
  const ModelSpec m = load_model("mixtral-8x7b");
  const WrapGraph g = build_wrap_graph(m, WrapPolicy{});
  expect_consistent(m, g);
  const auto& t = g.units[1].tensors;
  ASSERT_EQ(t.size(), 4u + 1 + 8 * 3 + 2);
  EXPECT_EQ(t[4].name, "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_EQ(t[5].name, "model.layers.0.block_sparse_moe.experts.0.w1.weight");
  EXPECT_EQ(t[6].name, "model.layers.0.block_sparse_moe.experts.0.w2.weight");
  EXPECT_EQ(t[6].shape, (std::vector<std::int64_t>{4096, 14336}));
  // size policy at 1e8: each expert (3 * 4096 * 14336 = 176M) and the embedding (131M) qualify; a
  // block's remainder (attention 42M + router + norms) does not, but MixtralModel's remainder (32 of
  // them, 1.3B) does. Ids follow registration pre-order: model, embed_tokens, experts...
  const WrapGraph gs = build_wrap_graph(m, policy("size:100000000"));
  expect_consistent(m, gs);
  ASSERT_EQ(gs.units.size(), 1u + 1 + 1 + 32 * 8 + 1);
  EXPECT_EQ(gs.units[1].name, "model");
  EXPECT_EQ(gs.units[2].name, "model.embed_tokens");
  EXPECT_EQ(gs.units[3].name, "model.layers.0.block_sparse_moe.experts.0");
  EXPECT_EQ(gs.units[1].params, 32 * (41'943'040 + 8 * 4096 + 2 * 4096) + 4096);
  EXPECT_EQ(gs.units[0].params, 0);
}

TEST(WrapGraph, MptHasNoHeadModuleWhenTied) {
  const ModelSpec m = load_model("mpt-125m");
  const WrapGraph g = build_wrap_graph(m, WrapPolicy{});
  expect_consistent(m, g);
  EXPECT_EQ(g.units[1].name, "transformer.blocks.0");
  EXPECT_EQ(g.units[1].tensors[0].name, "transformer.blocks.0.norm_1.weight");
  EXPECT_EQ(g.units[1].tensors[2].name, "transformer.blocks.0.attn.Wqkv.weight");
  for (const auto& mod : g.modules) EXPECT_NE(mod.name, "lm_head");
}

TEST(WrapGraph, EveryZooModelEveryPolicyIsConsistent) {
  for (const auto& name : zoo_names()) {
    SCOPED_TRACE(name);
    const ModelSpec m = load_model(name);
    for (const auto& p : {"block", "none", "size:100000000", "size:1000"}) {
      SCOPED_TRACE(p);
      expect_consistent(m, build_wrap_graph(m, policy(p)));
    }
  }
}

TEST(WrapPolicyParse, GoodAndBad) {
  EXPECT_EQ(policy("block").kind, WrapPolicy::Kind::TransformerBlock);
  EXPECT_EQ(policy("none").kind, WrapPolicy::Kind::None);
  EXPECT_EQ(policy("size:5000").min_num_params, 5000);
  EXPECT_EQ(policy("modules:a,b.*").modules, (std::vector<std::string>{"a", "b.*"}));
  EXPECT_EQ(wrap_policy_name(policy("modules:a,b.*")), "modules:a,b.*");
  for (const auto& bad : {"", "blocks", "size:", "size:0", "size:-5", "size:12x", "modules:", "modules:a,,b"}) {
    SCOPED_TRACE(bad);
    try {
      policy(bad);
      FAIL();
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), "--wrap-policy");
    }
  }
}

// Exact parameter counts: every zoo model against its published count, per-part breakdowns derived
// by hand, the module tree's tensors against count_params, and llm-foundry's MPT counts.
#include <gtest/gtest.h>

#include <map>

#include "common/json_reader.h"
#include "fixture.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"

using namespace fsdpsim::models;

TEST(Params, EveryZooModelExact) {
  // Published / HF-reported totals (the brief's list, plus HF model cards for Llama-2, Mistral, Qwen2,
  // Llama-3.2-1B; MPT at max_seq_len 2048 from llm-foundry's tables; tiny-llama by hand below).
  const std::map<std::string, std::int64_t> expected = {
      {"gpt2", 124'439'808},          {"gpt2-xl", 1'557'611'200},      {"llama2-7b", 6'738'415'616},
      {"llama2-13b", 13'015'864'320}, {"llama2-70b", 68'976'648'192},  {"llama3-8b", 8'030'261'248},
      {"llama3-70b", 70'553'706'496}, {"llama-1b", 1'235'814'400},     {"mistral-7b", 7'241'732'096},
      {"qwen2-7b", 7'615'616'512},    {"gemma-2b", 2'506'172'416},     {"mixtral-8x7b", 46'702'792'704},
      {"tiny-llama", 4'999'424},      {"mpt-125m", 125'311'488},       {"mpt-350m", 355'985'408},
      {"mpt-760m", 760'470'528},      {"mpt-1b", 1'315'950'592},       {"mpt-3b", 2'651'837'440},
      {"mpt-7b", 6'658'859'008},      {"mpt-13b", 12'853'954'560},     {"mpt-30b", 29'975'214'080},
      {"mpt-70b", 64'862'437'376},
      // By hand from the configs (the cards round: "1.3B", "3B"): phi-1.5 = embedding 51200 x 2048 + 24 x
      // (LayerNorm 2 x 2048 + q, k, v, dense 4 x (2048^2 + 2048) + fc1 2048 x 8192 + 8192 + fc2 8192 x 2048 +
      // 2048) + final LayerNorm 4096 + lm_head 51200 x 2048 + its bias 51200; StableLM-Base-Alpha-3B = embed_in
      // 50688 x 4096 + 16 x (2 LayerNorms 4 x 4096 + query_key_value 4096 x 12288 + 12288 + dense 4096^2 +
      // 4096 + dense_h_to_4h 4096 x 16384 + 16384 + dense_4h_to_h 16384 x 4096 + 4096) + final 8192 + embed_out.
      {"phi-1.5", 1'418'270'720},     {"stablelm-alpha-3b", 3'637'321'728},
      // Llama-3.1-405B (HF card: 405B): embedding and head 2 x 128256 x 16384 + 126 x (q, o 2 x 16384^2 + k, v
      // 2 x 16384 x 1024 + MLP 3 x 16384 x 53248 + 2 norms 2 x 16384) + final norm 16384.
      {"llama3.1-405b", 405'853'388'800},
  };
  EXPECT_EQ(zoo_names().size(), expected.size());
  for (const auto& name : zoo_names()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(expected.count(name));
    EXPECT_EQ(count_params(load_model(name)).total, expected.at(name));
  }
}

TEST(Params, Llama3_8bBreakdownByHand) {
  const ParamCounts c = count_params(load_model("llama3-8b"));
  // embedding 128256 * 4096; untied head the same
  EXPECT_EQ(c.embedding, 525'336'576);
  EXPECT_EQ(c.lm_head, 525'336'576);
  // block: q 4096*4096 + k,v 2 * 4096*1024 + o 4096*4096 = 41,943,040; MLP 3 * 4096*14336 = 176,160,768;
  // two RMSNorms 2*4096
  EXPECT_EQ(c.per_block, 41'943'040 + 176'160'768 + 8'192);
  EXPECT_EQ(c.blocks, 32 * c.per_block);
  EXPECT_EQ(c.final_norm, 4'096);
  EXPECT_EQ(c.active_per_block, c.per_block);
  EXPECT_EQ(c.matmul_active, 32LL * (41'943'040 + 176'160'768) + 525'336'576);
  EXPECT_EQ(c.block_biases, 0);
}

TEST(Params, TinyLlamaByHand) {
  // vocab 4096, hidden 256, 4 layers, 8 heads of 32, 4 kv heads, ffn 688, untied:
  // embed 1,048,576 + head 1,048,576 + 4 * (q 65,536 + k 32,768 + v 32,768 + o 65,536 + 3*256*688
  // = 528,384 + norms 512) + final norm 256 = 4,999,424.
  const ParamCounts c = count_params(load_model("tiny-llama"));
  EXPECT_EQ(c.per_block, 65'536 + 32'768 + 32'768 + 65'536 + 528'384 + 512);
  EXPECT_EQ(c.total, 1'048'576 * 2 + 4 * c.per_block + 256);
}

TEST(Params, MixtralActiveVsTotal) {
  const ParamCounts c = count_params(load_model("mixtral-8x7b"));
  const std::int64_t attn = 41'943'040, expert = 3 * 4096 * 14336, router = 8 * 4096;
  EXPECT_EQ(c.per_block, attn + router + 8 * expert + 8'192);
  EXPECT_EQ(c.active_per_block, attn + router + 2 * expert + 8'192);
  // ~12.9B active per token (ecosystem.md section 3)
  EXPECT_EQ(32 * c.active_per_block + c.embedding + c.lm_head + c.final_norm, 12'879'925'248);
}

TEST(Params, Gpt2TiedWithBiasesAndPositions) {
  const ParamCounts c = count_params(load_model("gpt2"));
  EXPECT_EQ(c.lm_head, 0);
  EXPECT_EQ(c.positions, 1024 * 768);
  EXPECT_EQ(c.embedding, 50257 * 768 + 1024 * 768);
  // LN 2*768, c_attn 768*2304 + 2304, c_proj 768*768 + 768, LN, c_fc 768*3072 + 3072, c_proj 3072*768 + 768
  EXPECT_EQ(c.per_block, 1536 + 1'771'776 + 590'592 + 1536 + 2'362'368 + 2'360'064);
  EXPECT_EQ(c.block_biases, 2304 + 768 + 3072 + 768);
  EXPECT_EQ(c.block_norms, 4 * 768);
  EXPECT_EQ(c.final_norm, 1536);
}

TEST(Params, ModuleTreeTensorsAgreeWithCountParams) {
  for (const auto& name : zoo_names()) {
    SCOPED_TRACE(name);
    const ModelSpec m = load_model(name);
    std::int64_t sum = 0, own = 0;
    for (const Module& mod : build_module_tree(m)) {
      own += mod.own_params;
      for (const auto& t : mod.params) sum += t.numel();
    }
    EXPECT_EQ(sum, count_params(m).total);
    EXPECT_EQ(own, sum);
  }
}

TEST(Params, LlmFoundryMptCountsFollowSeqLen) {
  // All 216 published MPT parameter counts (learned position table sized by the benchmark seq_len).
  const auto doc = fsdpsim::read_json_file(fixture("llm_foundry_mpt.json"), "fixture");
  int checked = 0;
  for (const auto& r : doc.at("records")) {
    const ModelSpec m = with_seq_len(load_model(r.at("model").get<std::string>()), r.at("seq_len").get<std::int64_t>());
    SCOPED_TRACE(r.at("id").get<std::string>());
    EXPECT_EQ(count_params(m).total, r.at("params").get<std::int64_t>());
    ++checked;
  }
  EXPECT_EQ(checked, 216);
}

TEST(Params, WithSeqLenLeavesOtherModelsAlone) {
  const ModelSpec g = load_model("gpt2");  // GPT-2's table is fixed at n_positions
  EXPECT_EQ(with_seq_len(g, 512).max_positions, 1024);
  EXPECT_EQ(with_seq_len(load_model("mpt-7b"), 8192).max_positions, 8192);
}

// HF config.json import for each model type, from fixtures carrying the published fields
// (ecosystem.md Appendix A) plus the keys real files carry and the importer must ignore.
#include <gtest/gtest.h>

#include "common/json_reader.h"
#include "fixture.h"
#include "models/zoo.h"

using namespace fsdpsim;
using namespace fsdpsim::models;

TEST(HfImport, LlamaFixtureMatchesZoo) {
  const ModelSpec m = load_model(fixture("llama3_8b.json"));
  EXPECT_EQ(m.model_type, "llama");
  EXPECT_EQ(m.block_class, "LlamaDecoderLayer");
  EXPECT_EQ(m.name, "meta-llama/Meta-Llama-3-8B");
  EXPECT_EQ(m.n_kv_heads, 8);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.mlp, MlpKind::SwiGLU);
  EXPECT_EQ(m.norm, NormKind::RMSNorm);
  EXPECT_EQ(m.positions, PositionKind::Rotary);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(count_params(m).total, 8'030'261'248);
  EXPECT_EQ(count_params(load_model(fixture("llama3_70b.json"))).total, 70'553'706'496);
}

TEST(HfImport, MistralSlidingWindowIsIrrelevant) {
  const ModelSpec m = load_model(fixture("mistral_7b.json"));
  EXPECT_EQ(m.block_class, "MistralDecoderLayer");
  EXPECT_EQ(m.head_dim, 128);  // absent: hidden / heads
  EXPECT_EQ(count_params(m).total, 7'241'732'096);
  Json j = read_json_file(fixture("mistral_7b.json"), "f");
  j.erase("sliding_window");
  EXPECT_EQ(count_params(import_hf_config(j, "x")).total, 7'241'732'096);
}

TEST(HfImport, Qwen2HasQkvBias) {
  const ModelSpec m = load_model(fixture("qwen2_7b.json"));
  EXPECT_EQ(m.block_class, "Qwen2DecoderLayer");
  EXPECT_TRUE(m.qkv_bias);
  EXPECT_FALSE(m.out_bias);
  EXPECT_EQ(count_params(m).block_biases, 3584 + 2 * 512);  // q [28*128] + k, v [4*128]
  EXPECT_EQ(count_params(m).total, 7'615'616'512);
}

TEST(HfImport, GemmaTiesByDefault) {
  // the fixture omits tie_word_embeddings, as many gemma files do: GemmaConfig defaults to True
  const Json j = read_json_file(fixture("gemma_2b.json"), "f");
  ASSERT_FALSE(j.contains("tie_word_embeddings"));
  const ModelSpec m = import_hf_config(j, "gemma.json");
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_EQ(m.head_dim, 256);
  EXPECT_EQ(m.mlp, MlpKind::GeGLU);
  EXPECT_EQ(m.block_class, "GemmaDecoderLayer");
  EXPECT_EQ(count_params(m).total, 2'506'172'416);
}

TEST(HfImport, Gpt2AliasesAndNullInner) {
  const ModelSpec m = load_model(fixture("gpt2_xl.json"));
  EXPECT_EQ(m.hidden, 1600);
  EXPECT_EQ(m.n_layers, 48);
  EXPECT_EQ(m.n_heads, 25);
  EXPECT_EQ(m.head_dim, 64);
  EXPECT_EQ(m.ffn_hidden, 6400);  // n_inner null -> 4 * n_embd
  EXPECT_EQ(m.max_positions, 1024);
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_TRUE(m.conv1d_weights);
  EXPECT_EQ(m.norm, NormKind::LayerNorm);
  EXPECT_EQ(m.mlp, MlpKind::Plain);
  EXPECT_EQ(m.positions, PositionKind::Learned);
  EXPECT_EQ(m.block_class, "GPT2Block");
  EXPECT_EQ(count_params(m).total, 1'557'611'200);
  // the HF-generic names are accepted too (GPT2Config.attribute_map)
  const Json alias = {{"model_type", "gpt2"}, {"hidden_size", 768}, {"num_hidden_layers", 12},
                      {"num_attention_heads", 12}, {"vocab_size", 50257}};
  EXPECT_EQ(count_params(import_hf_config(alias, "a")).total, 124'439'808);
}

TEST(HfImport, MixtralAndNumExpertsAlias) {
  const ModelSpec m = load_model(fixture("mixtral_8x7b.json"));
  EXPECT_EQ(m.n_experts, 8);
  EXPECT_EQ(m.experts_top_k, 2);
  EXPECT_EQ(m.block_class, "MixtralDecoderLayer");
  EXPECT_EQ(count_params(m).total, 46'702'792'704);
  Json j = read_json_file(fixture("mixtral_8x7b.json"), "f");
  j["num_experts"] = j["num_local_experts"];
  j.erase("num_local_experts");
  EXPECT_EQ(import_hf_config(j, "x").n_experts, 8);
}

TEST(HfImport, MptLlmFoundryConfig) {
  const ModelSpec m = load_model(fixture("mpt_125m.json"));
  EXPECT_EQ(m.block_class, "MPTBlock");
  EXPECT_EQ(m.ffn_hidden, 3072);
  EXPECT_EQ(m.positions, PositionKind::Learned);
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_TRUE(m.norm_bias);
  EXPECT_FALSE(m.positions_follow_seq_len);  // a user's file is taken as written
  EXPECT_EQ(count_params(m).total, 125'311'488);  // llm-foundry's count at seq 2048
  Json j = read_json_file(fixture("mpt_125m.json"), "f");
  j["no_bias"] = true;
  j["learned_pos_emb"] = false;
  // no biases anywhere, LayerNorm weight only, no position table:
  // 12 * (4*768*768 + 2*768*3072 + 2*768) + 50368*768 + 768
  EXPECT_EQ(count_params(import_hf_config(j, "x")).total, 12LL * (4 * 768 * 768 + 2 * 768 * 3072 + 2 * 768) + 50368LL * 768 + 768);
  j["attn_config"]["attn_type"] = "grouped_query_attention";
  j["attn_config"]["kv_n_heads"] = 4;
  EXPECT_EQ(import_hf_config(j, "x").n_kv_heads, 4);
}

TEST(HfImport, LlamaDefaultsWhenKeysAbsent) {
  const Json j = {{"model_type", "llama"}, {"hidden_size", 256}, {"intermediate_size", 688},
                  {"num_hidden_layers", 2}, {"num_attention_heads", 8}, {"vocab_size", 1000}};
  const ModelSpec m = import_hf_config(j, "x");
  EXPECT_EQ(m.n_kv_heads, 8);  // num_key_value_heads missing -> heads
  EXPECT_EQ(m.head_dim, 32);   // hidden / heads
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(m.hidden_act, "silu");
  Json b = j;
  b["attention_bias"] = true;
  b["mlp_bias"] = true;
  const ModelSpec mb = import_hf_config(b, "x");
  EXPECT_TRUE(mb.qkv_bias && mb.out_bias && mb.mlp_bias);
  // q,k,v,o biases 4 * 256 + MLP biases 688 * 2 + 256, per block
  EXPECT_EQ(count_params(mb).total - count_params(m).total, 2LL * (4 * 256 + 2 * 688 + 256));
}

TEST(HfImport, ModelDirectoryWithConfigJson) {
  const ModelSpec m = load_model(fixture("hf_dir"));
  EXPECT_EQ(count_params(m).total, 70'553'706'496);
}

TEST(HfImport, ZooGoesThroughTheImporter) {
  const ModelSpec a = load_model("llama3-8b");
  const ModelSpec b = load_model(fixture("llama3_8b.json"));
  EXPECT_EQ(model_to_json(a).dump().size() > 0, true);
  Json ja = model_to_json(a), jb = model_to_json(b);
  ja.erase("name");
  jb.erase("name");
  EXPECT_EQ(ja, jb);
}

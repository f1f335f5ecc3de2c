// HF config.json import for each model type, from fixtures carrying the published fields
// (ecosystem.md Appendix A) plus the keys real files carry and the importer must ignore.
#include <gtest/gtest.h>

#include "common/errors.h"
#include "common/json_reader.h"
#include "fixture.h"
#include "models/wrap_graph.h"
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

// Dropout as each config spells it, with its class's default when absent: GPT2Config 0.1 each, MPTConfig
// and the llama family 0.0; out of [0, 1) is an input error naming the key.
TEST(HfImport, DropoutKeysAndDefaults) {
  const Json gpt2 = {{"model_type", "gpt2"}, {"n_embd", 768}, {"n_layer", 12}, {"n_head", 12}, {"vocab_size", 50257}};
  const ModelSpec d = import_hf_config(gpt2, "g");
  EXPECT_DOUBLE_EQ(d.resid_dropout, 0.1);
  EXPECT_DOUBLE_EQ(d.embd_dropout, 0.1);
  EXPECT_DOUBLE_EQ(d.attn_dropout, 0.1);
  Json off = gpt2;
  off["resid_pdrop"] = 0.0;
  off["embd_pdrop"] = 0.05;
  const ModelSpec o = import_hf_config(off, "g");
  EXPECT_DOUBLE_EQ(o.resid_dropout, 0.0);
  EXPECT_DOUBLE_EQ(o.embd_dropout, 0.05);
  Json bad = gpt2;
  bad["resid_pdrop"] = 1.5;
  try {
    import_hf_config(bad, "g");
    ADD_FAILURE() << "resid_pdrop 1.5 accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "g:resid_pdrop");
  }
  const ModelSpec mpt = load_model(fixture("mpt_125m.json"));
  EXPECT_DOUBLE_EQ(mpt.resid_dropout, 0.0);
  Json mj = read_json_file(fixture("mpt_125m.json"), "f");
  mj["resid_pdrop"] = 0.1;
  mj["emb_pdrop"] = 0.1;
  EXPECT_DOUBLE_EQ(import_hf_config(mj, "x").resid_dropout, 0.1);
  EXPECT_DOUBLE_EQ(import_hf_config(mj, "x").embd_dropout, 0.1);
  const ModelSpec llama = load_model("llama3-8b");
  EXPECT_DOUBLE_EQ(llama.resid_dropout + llama.embd_dropout + llama.attn_dropout, 0.0);
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

// The published checkpoints' parameter counts (Hugging Face safetensors totals), each also derived by
// hand below from the fixture (the checkpoint's config.json as published).

TEST(HfImport, Gemma2NormsAroundAttentionAndMlp) {
  // google/gemma-2-2b: 2,614,341,888 parameters (keras-team/keras-hub
  // keras_hub/src/models/gemma/gemma_presets.py, "gemma2_2b_en": "params": 2614341888).
  const ModelSpec m = load_model(fixture("gemma2_2b.json"));
  EXPECT_EQ(m.block_class, "Gemma2DecoderLayer");
  EXPECT_EQ(m.block_norms, 4);
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_EQ(m.mlp, MlpKind::GeGLU);
  // per block: q 2304*2048 + k, v 2304*1024 each + o 2048*2304 = 14,155,776; MLP 3*2304*9216 = 63,700,992;
  // 4 norms 4*2304 = 9,216 -> 77,865,984; 26 blocks = 2,024,515,584; + embedding 256000*2304 = 589,824,000
  // (tied head) + final norm 2,304 = 2,614,341,888.
  EXPECT_EQ(count_params(m).per_block, 77'865'984);
  EXPECT_EQ(count_params(m).total, 2'614'341'888);
}

TEST(HfImport, Phi3FusedProjectionsCountAsSeparateOnes) {
  // microsoft/Phi-3-mini-4k-instruct: 3,821,079,552 parameters (keras-team/keras-hub
  // keras_hub/src/models/phi3/phi3_presets.py, "phi3_mini_4k_instruct_en": "params": 3821079552).
  const ModelSpec m = load_model(fixture("phi3_mini_4k.json"));
  EXPECT_EQ(m.block_class, "Phi3DecoderLayer");
  EXPECT_FALSE(m.tied_embeddings);
  // per block: qkv 3072*9216 + o 3072*3072 + gate_up 3072*16384 + down 8192*3072 + 2 norms 6,144
  // = 113,252,352; 32 blocks = 3,624,075,264; + embedding and head 2 * 32064*3072 = 197,001,216
  // + final norm 3,072 = 3,821,079,552.
  EXPECT_EQ(count_params(m).per_block, 113'252'352);
  EXPECT_EQ(count_params(m).total, 3'821'079'552);
}

TEST(HfImport, Qwen3PerHeadQkNorms) {
  // Qwen/Qwen3-0.6B: 596,049,920 parameters (vllm-project/compressed-tensors tests/test_offload,
  // test_accelerate_load_disk: `model.num_parameters() == 596049920`).
  const ModelSpec m = load_model(fixture("qwen3_0_6b.json"));
  EXPECT_EQ(m.block_class, "Qwen3DecoderLayer");
  EXPECT_EQ(m.qk_norm, QkNorm::PerHead);
  EXPECT_FALSE(m.qkv_bias);
  EXPECT_EQ(m.head_dim, 128);   // given, and not hidden / heads (= 64)
  // per block: q 1024*2048 + k, v 1024*1024 each + o 2048*1024 = 6,291,456; q_norm, k_norm 2*128;
  // MLP 3*1024*3072 = 9,437,184; 2 norms 2,048 -> 15,730,944; 28 blocks = 440,466,432; + embedding
  // 151936*1024 = 155,582,464 (tied) + final norm 1,024 = 596,049,920.
  EXPECT_EQ(count_params(m).block_norms, 2 * 1024 + 2 * 128);
  EXPECT_EQ(count_params(m).total, 596'049'920);
  Json j = read_json_file(fixture("qwen3_0_6b.json"), "f");
  j.erase("head_dim");   // Qwen3Config's default head_dim is 128, not hidden / heads
  EXPECT_EQ(import_hf_config(j, "x").head_dim, 128);
}

TEST(HfImport, Olmo2PostNormsAndFullQkNorms) {
  // allenai/OLMo-2-1124-7B: 7,298,617,344 parameters (its Hugging Face safetensors total).
  const ModelSpec m = load_model(fixture("olmo2_7b.json"));
  EXPECT_EQ(m.block_class, "Olmo2DecoderLayer");
  EXPECT_EQ(m.qk_norm, QkNorm::Full);
  // per block: attention 4*4096*4096 = 67,108,864; MLP 3*4096*11008 = 135,266,304; post-attention and
  // post-MLP norms 2*4096 + q_norm 4096 + k_norm 4096 = 16,384 -> 202,391,552; 32 blocks =
  // 6,476,529,664; + embedding and head 2 * 100352*4096 = 822,083,584 + final norm 4,096 = 7,298,617,344.
  EXPECT_EQ(count_params(m).per_block, 202'391'552);
  EXPECT_EQ(count_params(m).total, 7'298'617'344);
}

TEST(HfImport, NewTypesModuleTreesAgreeWithTheCounts) {
  for (const char* f : {"gemma2_2b.json", "phi3_mini_4k.json", "qwen3_0_6b.json", "olmo2_7b.json"}) {
    const ModelSpec m = load_model(fixture(f));
    std::int64_t n = 0;
    for (const auto& mod : build_module_tree(m))
      for (const auto& p : mod.params) n += p.numel();
    EXPECT_EQ(n, count_params(m).total) << f;
  }
}

// EleutherAI/pythia-160m (GPT-NeoX): 162,322,944 parameters. embed_in 50304 x 768 = 38,633,472; per block 2
// LayerNorms 3,072 + query_key_value 768 x 2304 + 2304 + dense 768^2 + 768 + dense_h_to_4h 768 x 3072 + 3072 +
// dense_4h_to_h 3072 x 768 + 768 = 7,087,872, x 12 = 85,054,464; final LayerNorm 1,536; embed_out 38,633,472.
TEST(HfImport, GptNeoxParallelResidualAndPartialRotary) {
  Json j = Json::parse(R"({"model_type":"gpt_neox","hidden_size":768,"intermediate_size":3072,"num_hidden_layers":12,
      "num_attention_heads":12,"rotary_pct":0.25,"rotary_emb_base":10000,"use_parallel_residual":true,
      "vocab_size":50304,"max_position_embeddings":2048,"hidden_act":"gelu","layer_norm_eps":1e-05,
      "tie_word_embeddings":false,"attention_dropout":0.0,"hidden_dropout":0.0,"torch_dtype":"float16"})");
  const ModelSpec m = import_hf_config(j, "pythia");
  EXPECT_EQ(m.block_class, "GPTNeoXLayer");
  EXPECT_TRUE(m.parallel_residual);
  EXPECT_EQ(m.block_norms, 2);
  EXPECT_EQ(m.rotary_dim, 16);   // int(64 * 0.25)
  EXPECT_TRUE(m.qkv_bias && m.out_bias && m.mlp_bias);
  EXPECT_EQ(m.norm, NormKind::LayerNorm);
  EXPECT_EQ(m.mlp, MlpKind::Plain);
  EXPECT_EQ(count_params(m).per_block, 7'087'872);
  EXPECT_EQ(count_params(m).total, 162'322'944);
  std::int64_t n = 0;
  bool head = false;
  for (const auto& mod : build_module_tree(m)) {
    for (const auto& p : mod.params) n += p.numel();
    head = head || mod.name == "embed_out";
  }
  EXPECT_EQ(n, count_params(m).total);
  EXPECT_TRUE(head);
  // use_parallel_residual false: the sequential block; rotary_pct 1: all of the head (rotary_dim 0)
  j["use_parallel_residual"] = false;
  j["rotary_pct"] = 1.0;
  const ModelSpec s = import_hf_config(j, "pythia");
  EXPECT_FALSE(s.parallel_residual);
  EXPECT_EQ(s.rotary_dim, 0);
  EXPECT_EQ(s.rope_dims(), 64);
}

TEST(HfImport, PhiSharedNormHeadBiasAndItsErrors) {
  const ModelSpec m = load_model("phi-1.5");
  EXPECT_EQ(m.model_type, "phi");
  EXPECT_EQ(m.block_class, "PhiDecoderLayer");
  EXPECT_TRUE(m.parallel_residual);
  EXPECT_EQ(m.block_norms, 1);
  EXPECT_EQ(m.rotary_dim, 32);
  EXPECT_EQ(m.n_kv_heads, 32);   // num_key_value_heads null -> the heads
  EXPECT_TRUE(m.lm_head_bias);
  EXPECT_EQ(count_params(m).lm_head, 51200 * 2048 + 51200);
  Json j = Json::parse(R"({"model_type":"phi","hidden_size":2048,"intermediate_size":8192,"num_hidden_layers":24,
      "num_attention_heads":32,"vocab_size":51200,"qk_layernorm":true})");
  try {
    import_hf_config(j, "cfg");
    FAIL() << "qk_layernorm accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "cfg:qk_layernorm");
  }
  j["qk_layernorm"] = false;
  for (double bad : {0.3, 1.5, 0.0}) {   // 0.3 * 64 = 19.2 -> 19 (odd); 1.5 and 0 out of (0, 1]
    j["partial_rotary_factor"] = bad;
    try {
      import_hf_config(j, "cfg");
      FAIL() << "partial_rotary_factor " << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), "cfg:partial_rotary_factor") << bad;
    }
  }
  j.erase("partial_rotary_factor");
  EXPECT_EQ(import_hf_config(j, "cfg").rotary_dim, 32);   // PhiConfig's default 0.5
}

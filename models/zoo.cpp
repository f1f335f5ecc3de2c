// The built-in zoo: Hugging Face-style config.json objects embedded in the binary, imported through
// the same import_hf_config() path as user files (one path, fewer bugs). Values are the published
// ones (ecosystem.md section 3 and Appendix A; Llama-2 and Llama-3.2 from their HF config.json files;
// MPT shapes from llm-foundry's benchmark tables, /work/shared/data/published-dev-set.jsonl).
#include <sys/stat.h>

#include <string>
#include <utility>

#include "common/errors.h"
#include "common/json_reader.h"
#include "models/zoo.h"

namespace fsdpsim::models {
namespace {

struct ZooEntry {
  const char* name;
  const char* config;  // HF config.json text
};

// MPT as llm-foundry's benchmark tables ran it: max_seq_len = the benchmarked sequence length (the
// dev set's counts grow by exactly seq_len * d_model), MPTConfig defaults otherwise, i.e. biases on,
// LayerNorm with bias, learned position table [max_seq_len, d_model], tied embeddings, GELU MLP 4x,
// vocab 50368. These reproduce all 216 llm-foundry parameter counts in the dev set.
#define MPT(d, h, l) \
  "{\"model_type\":\"mpt\",\"d_model\":" #d ",\"n_heads\":" #h ",\"n_layers\":" #l \
  ",\"expansion_ratio\":4,\"max_seq_len\":2048,\"vocab_size\":50368,\"no_bias\":false,\"learned_pos_emb\":true," \
  "\"fsdpsim_positions_follow_seq_len\":true}"

const ZooEntry kZoo[] = {
    {"gpt2", R"({"model_type":"gpt2","_name_or_path":"openai-community/gpt2","n_embd":768,"n_layer":12,"n_head":12,"n_inner":null,"n_positions":1024,"n_ctx":1024,"vocab_size":50257,"activation_function":"gelu_new"})"},
    {"gpt2-xl", R"({"model_type":"gpt2","_name_or_path":"openai-community/gpt2-xl","n_embd":1600,"n_layer":48,"n_head":25,"n_inner":null,"n_positions":1024,"n_ctx":1024,"vocab_size":50257,"activation_function":"gelu_new"})"},
    {"llama2-7b", R"({"model_type":"llama","_name_or_path":"meta-llama/Llama-2-7b-hf","hidden_size":4096,"intermediate_size":11008,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":32,"vocab_size":32000,"tie_word_embeddings":false,"max_position_embeddings":4096,"rope_theta":10000.0,"hidden_act":"silu"})"},
    {"llama2-13b", R"({"model_type":"llama","_name_or_path":"meta-llama/Llama-2-13b-hf","hidden_size":5120,"intermediate_size":13824,"num_hidden_layers":40,"num_attention_heads":40,"num_key_value_heads":40,"vocab_size":32000,"tie_word_embeddings":false,"max_position_embeddings":4096,"rope_theta":10000.0,"hidden_act":"silu"})"},
    {"llama2-70b", R"({"model_type":"llama","_name_or_path":"meta-llama/Llama-2-70b-hf","hidden_size":8192,"intermediate_size":28672,"num_hidden_layers":80,"num_attention_heads":64,"num_key_value_heads":8,"vocab_size":32000,"tie_word_embeddings":false,"max_position_embeddings":4096,"rope_theta":10000.0,"hidden_act":"silu"})"},
    {"llama3-8b", R"({"model_type":"llama","_name_or_path":"meta-llama/Meta-Llama-3-8B","hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"vocab_size":128256,"tie_word_embeddings":false,"max_position_embeddings":8192,"rope_theta":500000.0,"hidden_act":"silu"})"},
    {"llama3-70b", R"({"model_type":"llama","_name_or_path":"meta-llama/Meta-Llama-3-70B","hidden_size":8192,"intermediate_size":28672,"num_hidden_layers":80,"num_attention_heads":64,"num_key_value_heads":8,"head_dim":128,"vocab_size":128256,"tie_word_embeddings":false,"max_position_embeddings":8192,"rope_theta":500000.0,"hidden_act":"silu"})"},
    {"llama-1b", R"({"model_type":"llama","_name_or_path":"meta-llama/Llama-3.2-1B","hidden_size":2048,"intermediate_size":8192,"num_hidden_layers":16,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":64,"vocab_size":128256,"tie_word_embeddings":true,"max_position_embeddings":131072,"rope_theta":500000.0,"hidden_act":"silu"})"},
    {"llama3.1-405b", R"({"model_type":"llama","_name_or_path":"meta-llama/Llama-3.1-405B","hidden_size":16384,"intermediate_size":53248,"num_hidden_layers":126,"num_attention_heads":128,"num_key_value_heads":8,"head_dim":128,"vocab_size":128256,"tie_word_embeddings":false,"max_position_embeddings":131072,"rope_theta":500000.0,"hidden_act":"silu"})"},
    {"mistral-7b", R"({"model_type":"mistral","_name_or_path":"mistralai/Mistral-7B-v0.1","hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":32000,"tie_word_embeddings":false,"max_position_embeddings":32768,"sliding_window":4096,"rope_theta":10000.0,"hidden_act":"silu"})"},
    {"qwen2-7b", R"({"model_type":"qwen2","_name_or_path":"Qwen/Qwen2-7B","hidden_size":3584,"intermediate_size":18944,"num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,"vocab_size":152064,"tie_word_embeddings":false,"max_position_embeddings":131072,"rope_theta":1000000.0,"use_sliding_window":false,"hidden_act":"silu"})"},
    {"gemma-2b", R"({"model_type":"gemma","_name_or_path":"google/gemma-2b","hidden_size":2048,"intermediate_size":16384,"num_hidden_layers":18,"num_attention_heads":8,"num_key_value_heads":1,"head_dim":256,"vocab_size":256000,"tie_word_embeddings":true,"max_position_embeddings":8192,"rope_theta":10000.0,"hidden_act":"gelu"})"},
    {"mixtral-8x7b", R"({"model_type":"mixtral","_name_or_path":"mistralai/Mixtral-8x7B-v0.1","hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"num_local_experts":8,"num_experts_per_tok":2,"vocab_size":32000,"tie_word_embeddings":false,"max_position_embeddings":32768,"rope_theta":1000000.0,"router_aux_loss_coef":0.02,"hidden_act":"silu"})"},
    // Parallel-residual, partial-rotary shapes (model types phi and gpt_neox): Phi-1.5 as its config.json
    // (transformers' native PhiConfig keys) and StableLM-Base-Alpha-3B, the shape litgpt's Config defaults
    // describe (lit_gpt/config.py: n_layer 16, n_embd 4096, n_head 32, rotary_percentage 0.25, parallel_residual,
    // LayerNorm, GptNeoxMLP 4x, bias, vocab 50254 padded to 50688).
    {"phi-1.5", R"({"model_type":"phi","_name_or_path":"microsoft/phi-1_5","hidden_size":2048,"intermediate_size":8192,"num_hidden_layers":24,"num_attention_heads":32,"num_key_value_heads":null,"partial_rotary_factor":0.5,"qk_layernorm":false,"vocab_size":51200,"max_position_embeddings":2048,"hidden_act":"gelu_new","layer_norm_eps":1e-05,"resid_pdrop":0.0,"embd_pdrop":0.0,"attention_dropout":0.0,"tie_word_embeddings":false,"rope_theta":10000.0})"},
    {"stablelm-alpha-3b", R"({"model_type":"gpt_neox","_name_or_path":"stabilityai/stablelm-base-alpha-3b","hidden_size":4096,"intermediate_size":16384,"num_hidden_layers":16,"num_attention_heads":32,"rotary_pct":0.25,"use_parallel_residual":true,"vocab_size":50688,"max_position_embeddings":4096,"hidden_act":"gelu","layer_norm_eps":1e-05,"tie_word_embeddings":false,"rotary_emb_base":10000})"},
    // ~5.0M parameters: small enough for the CPU runtime to train in seconds, llama-shaped (GQA, SwiGLU).
    {"tiny-llama", R"({"model_type":"llama","_name_or_path":"fsdpsim/tiny-llama","hidden_size":256,"intermediate_size":688,"num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":4,"vocab_size":4096,"tie_word_embeddings":false,"max_position_embeddings":2048,"rope_theta":10000.0,"hidden_act":"silu"})"},
    {"mpt-125m", MPT(768, 12, 12)},
    {"mpt-350m", MPT(1024, 16, 24)},
    {"mpt-760m", MPT(1536, 12, 24)},
    {"mpt-1b", MPT(2048, 16, 24)},
    {"mpt-3b", MPT(2560, 20, 32)},
    {"mpt-7b", MPT(4096, 32, 32)},
    {"mpt-13b", MPT(5120, 40, 40)},
    {"mpt-30b", MPT(7168, 56, 48)},
    {"mpt-70b", MPT(8192, 64, 80)},
};
#undef MPT

const ZooEntry* find_zoo(const std::string& name) {
  for (const auto& e : kZoo)
    if (name == e.name) return &e;
  return nullptr;
}

std::string zoo_list() {
  std::string s;
  for (const auto& e : kZoo) s += std::string(s.empty() ? "" : ", ") + e.name;
  return s;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

std::vector<std::string> zoo_names() {
  std::vector<std::string> out;
  for (const auto& e : kZoo) out.emplace_back(e.name);
  return out;
}

ModelSpec load_model(const std::string& name_or_path, const std::string& field) {
  if (const ZooEntry* z = find_zoo(name_or_path)) {
    ModelSpec m = import_hf_config(Json::parse(z->config), name_or_path);
    m.name = z->name;
    return m;
  }
  const bool looks_like_path = name_or_path.find('/') != std::string::npos ||
                               name_or_path.find(".json") != std::string::npos || exists(name_or_path);
  if (name_or_path.empty() || !looks_like_path)
    throw InputError(field, "\"" + name_or_path + "\"",
                     "a zoo model (" + zoo_list() + ") or a path to a Hugging Face config.json");
  // A model directory (as downloaded from the Hub) holds its config.json.
  std::string path = is_directory(name_or_path) ? name_or_path + "/config.json" : name_or_path;
  const Json j = read_json_file(path, field);
  return import_hf_config(j, path);
}

}  // namespace fsdpsim::models

// Helpers shared by the exporters, and the JSON bundle of all four exports.
#include "planner/exports.h"

#include <algorithm>
#include <cstdio>

namespace fsdpsim::planner {

std::string torch_dtype(Dtype d) {
  switch (d) {
    case Dtype::FP32: return "torch.float32";
    case Dtype::BF16: return "torch.bfloat16";
    case Dtype::FP16: return "torch.float16";
    case Dtype::FP8: return "torch.float8_e4m3fn";
  }
  return "torch.float32";
}

// Where Hugging Face transformers keeps the blocks (modeling_<type>.py of each architecture).
std::string block_list_path(const models::ModelSpec& m) {
  if (m.model_type == "gpt2") return "model.transformer.h";
  if (m.model_type == "mpt") return "model.transformer.blocks";
  if (m.model_type == "gpt_neox") return "model.gpt_neox.layers";
  return "model.model.layers";
}

std::string peft_lora_config(const models::ModelSpec& m, const sim::LoraPlan& l, std::vector<std::string>& notes) {
  // Module names as the Hugging Face models register them (PEFT matches target_modules by name suffix):
  // Llama-like q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; GPT-2 attn.c_attn (q, k and v
  // in one Conv1D), attn.c_proj, mlp.c_fc, mlp.c_proj; MPT attn.Wqkv, attn.out_proj, ffn.up_proj, ffn.down_proj;
  // GPT-NeoX attention.query_key_value (q, k, v in one), attention.dense, mlp.dense_h_to_4h, mlp.dense_4h_to_h;
  // Phi q_proj, k_proj, v_proj, self_attn.dense, mlp.fc1, mlp.fc2.
  const bool gpt2 = m.model_type == "gpt2", mpt = m.model_type == "mpt";
  const bool neox = m.model_type == "gpt_neox", phi = m.model_type == "phi";
  const char* fused_qkv = gpt2 ? "c_attn" : mpt ? "Wqkv" : "query_key_value";
  std::vector<std::string> mods;
  bool fused_named = false;
  const auto add = [&](const std::string& s) {
    if (std::find(mods.begin(), mods.end(), s) == mods.end()) mods.push_back(s);
  };
  for (const std::string& t : l.targets) {
    if (t == "q" || t == "k" || t == "v") {
      if (gpt2 || mpt || neox) {
        add(fused_qkv);
        fused_named = true;
      } else {
        add(t + "_proj");
      }
    } else if (t == "o") {
      add(gpt2 ? "attn.c_proj" : mpt ? "out_proj" : neox ? "attention.dense" : phi ? "self_attn.dense" : "o_proj");
    } else if (t == "gate") {
      add("gate_proj");
    } else if (t == "up") {
      add(gpt2 ? "c_fc" : neox ? "dense_h_to_4h" : phi ? "fc1" : "up_proj");
    } else if (t == "down") {
      add(gpt2 ? "mlp.c_proj" : neox ? "dense_4h_to_h" : phi ? "fc2" : "down_proj");
    } else if (t == "head") {
      add("lm_head");
    }
  }
  if (fused_named && !(l.adapts("q") && l.adapts("k") && l.adapts("v")))
    notes.push_back(std::string("lora targets: ") + fused_qkv +
                    " holds q, k and v in one module: PEFT adapts all three (as fsdpsim simulates for this model)");
  std::string list;
  for (const auto& s : mods) list += (list.empty() ? "\"" : ", \"") + s + "\"";
  char d[32];
  std::snprintf(d, sizeof d, "%g", l.dropout);
  return "LoraConfig(r=" + std::to_string(l.rank) + ", lora_alpha=" + std::to_string(2 * l.rank) +
         ", lora_dropout=" + d + ", target_modules=[" + list + "])";
}

std::string litgpt_lora_flags(const sim::LoraPlan& l, std::vector<std::string>& notes) {
  const int mlp = (l.adapts("gate") ? 1 : 0) + (l.adapts("up") ? 1 : 0) + (l.adapts("down") ? 1 : 0);
  if (mlp > 0 && mlp < 3)
    notes.push_back("lora targets: litgpt's lora_mlp adapts every MLP linear (fc_1, fc_2, proj); a part of the MLP "
                    "alone is not expressible there");
  char d[32];
  std::snprintf(d, sizeof d, "%g", l.dropout);
  const auto b = [](bool v) { return v ? "true" : "false"; };
  return "--lora_r " + std::to_string(l.rank) + " --lora_alpha " + std::to_string(2 * l.rank) + " --lora_dropout " + d +
         " --lora_query " + b(l.adapts("q")) + " --lora_key " + b(l.adapts("k")) + " --lora_value " + b(l.adapts("v")) +
         " --lora_projection " + b(l.adapts("o")) + " --lora_mlp " + b(mlp > 0) + " --lora_head " + b(l.adapts("head"));
}

std::string block_class_name(const models::ModelSpec& m) {
  return m.block_class.empty() ? "DecoderLayer" : m.block_class;
}

std::string block_import_line(const models::ModelSpec& m) {
  static const char* kTypes[] = {"llama", "mistral", "qwen2", "gemma", "gpt2", "mixtral", "gemma2", "phi3", "qwen3", "olmo2",
                                 "gpt_neox", "phi"};
  for (const char* t : kTypes)
    if (m.model_type == t)
      return "from transformers.models." + m.model_type + ".modeling_" + m.model_type + " import " + block_class_name(m);
  return "# import " + block_class_name(m) + " from your model's code (model_type \"" + m.model_type + "\")";
}

Export make_export(const std::string& framework, const ExportInput& in) {
  if (framework == "fsdp2") return export_fsdp2(in);
  if (framework == "lightning") return export_lightning(in);
  if (framework == "accelerate") return export_accelerate(in);
  return export_torchtitan(in);
}

nlohmann::json export_to_json(const Export& e) {
  return {{"format", e.format}, {"target", e.target}, {"text", e.text}, {"unsupported", e.unsupported}};
}

nlohmann::json exports_to_json(const ExportInput& in) {
  nlohmann::json j = nlohmann::json::object();
  for (const char* fw : {"fsdp2", "lightning", "accelerate", "torchtitan"}) j[fw] = export_to_json(make_export(fw, in));
  return j;
}

std::string alloc_conf_line(const sim::Plan& p) {
  const std::string a = sim::alloc_conf_text(p.alloc_conf);
  return a.empty() ? "" : "PYTORCH_CUDA_ALLOC_CONF=\"" + a + "\"";
}

}  // namespace fsdpsim::planner

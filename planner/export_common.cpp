// Helpers shared by the exporters, and the JSON bundle of all four exports.
#include "planner/exports.h"

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
  return "model.model.layers";
}

std::string block_class_name(const models::ModelSpec& m) {
  return m.block_class.empty() ? "DecoderLayer" : m.block_class;
}

std::string block_import_line(const models::ModelSpec& m) {
  static const char* kTypes[] = {"llama", "mistral", "qwen2", "gemma", "gpt2", "mixtral", "gemma2", "phi3", "qwen3", "olmo2"};
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

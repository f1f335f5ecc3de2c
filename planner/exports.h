// Ready-to-paste exports of a plan for four front-ends (ecosystem.md §2): raw FSDP2 `fully_shard`
// (Python), PyTorch Lightning (Python), accelerate's config YAML, torchtitan's job TOML.
// Each names the framework version whose keys it uses. What a front-end cannot express is never
// dropped silently: it is a comment in the text and an entry of `unsupported`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/hardware_profile.h"
#include "models/model_spec.h"
#include "program/plan.h"

namespace fsdpsim::planner {

struct Export {
  std::string format;                    // "python", "yaml", "toml"
  std::string target;                    // "PyTorch >= 2.6", ...
  std::string text;
  std::vector<std::string> unsupported;  // plan settings the front-end cannot express, and what was emitted
};

struct ExportInput {
  models::ModelSpec model;
  calibrate::Cluster cluster;
  sim::Plan plan;                        // resolved (mesh filled)
  std::string label;                     // the plan's label (a comment in each export)
};

Export export_fsdp2(const ExportInput& in);
Export export_lightning(const ExportInput& in);
Export export_accelerate(const ExportInput& in);
Export export_torchtitan(const ExportInput& in);

// One front-end's export ("fsdp2", "lightning", "accelerate", "torchtitan"), and its JSON form.
Export make_export(const std::string& framework, const ExportInput& in);
nlohmann::json export_to_json(const Export& e);
// {"fsdp2": {...}, "lightning": {...}, "accelerate": {...}, "torchtitan": {...}} of one plan.
nlohmann::json exports_to_json(const ExportInput& in);

// Shared helpers for the exporters.
std::string torch_dtype(Dtype d);                       // "torch.bfloat16"
std::string block_list_path(const models::ModelSpec& m); // "model.model.layers" (HF layout)
std::string block_class_name(const models::ModelSpec& m);
std::string block_import_line(const models::ModelSpec& m); // "from transformers... import X" or a comment
// plan.lora in PEFT's terms: `LoraConfig(r=..., lora_alpha=..., lora_dropout=..., target_modules=[...])` with the
// model's module names (Hugging Face layout); the plan's targets a fused q/k/v module cannot separate are named in
// `notes`.
std::string peft_lora_config(const models::ModelSpec& m, const sim::LoraPlan& l, std::vector<std::string>& notes);
// plan.lora as litgpt's finetune flags (--lora_r ... --lora_head); targets litgpt cannot express alone in `notes`.
std::string litgpt_lora_flags(const sim::LoraPlan& l, std::vector<std::string>& notes);
// `PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"` for the plan's alloc_conf, or "" for PyTorch's defaults.
std::string alloc_conf_line(const sim::Plan& p);

}  // namespace fsdpsim::planner

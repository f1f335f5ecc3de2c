// model-info's content, built once as JSON; the text form is rendered from the same numbers.
#include "models/model_info.h"

#include <cstdio>
#include <sstream>

#include "models/zoo.h"

namespace fsdpsim::models {
namespace {

const char* part_name(ModulePart p) {
  switch (p) {
    case ModulePart::Embedding: return "embedding";
    case ModulePart::Block: return "block";
    case ModulePart::FinalNormAndHead: return "final_norm_and_head";
  }
  return "block";
}

// 8030261248 -> "8,030,261,248"
std::string grouped(std::int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// "0-31" / "3" / "" for a sorted list of layers
std::string layer_ranges(const std::vector<int>& layers) {
  std::string s;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(layers[i]) + (j > i ? "-" + std::to_string(layers[j]) : "");
    i = j + 1;
  }
  return s;
}

}  // namespace

nlohmann::json model_info_json(const ModelSpec& spec, const ModelInfoRequest& req) {
  const ModelSpec m = with_seq_len(spec, req.seq_len);
  const ParamCounts c = count_params(m);
  const FlopsPerToken f = flops_per_token(m, req.seq_len);
  const std::int64_t b = req.micro_batch, s = req.seq_len;
  const double tokens = static_cast<double>(b) * static_cast<double>(s);
  nlohmann::json j;
  j["model"] = model_to_json(m);
  j["seq_len"] = s;
  j["micro_batch"] = b;
  j["activation_dtype"] = std::string(dtype_name(req.dtype));
  j["params_total"] = c.total;
  j["params_embedding"] = c.embedding;
  j["params_positions"] = c.positions;
  j["params_per_block"] = c.per_block;
  j["params_active_per_block"] = c.active_per_block;
  j["params_blocks"] = c.blocks;
  j["params_final_norm"] = c.final_norm;
  j["params_lm_head"] = c.lm_head;
  j["params_matmul_active_per_token"] = c.matmul_active;
  j["flops_per_token_fwd"] = f.forward;
  j["flops_per_token_fwdbwd"] = f.forward_backward;
  j["flops_per_token_matmul_fwd"] = f.matmul_forward;
  j["flops_per_token_attention_fwd"] = f.attention_forward;
  j["flops_convention"] =
      "forward = 2 * matmul weights per token (LM head included, MoE: active experts) + 4 * n_layers * seq_len * "
      "n_heads * head_dim (no causal halving, PaLM / llm-foundry convention); fwd+bwd = 3 * forward; no recompute";
  nlohmann::json per_block, per_token;
  for (auto mode : {CheckpointMode::None, CheckpointMode::SelectiveOp, CheckpointMode::Full}) {
    const Bytes bytes = block_saved_activation_bytes(m, b, s, req.dtype, mode);
    per_block[checkpoint_mode_name(mode)] = bytes;
    per_token[checkpoint_mode_name(mode)] = static_cast<double>(bytes) / tokens;
  }
  j["activation_bytes_per_block"] = per_block;
  j["activation_bytes_per_block_per_token"] = per_token;
  j["block_backward_working_bytes"] = block_backward_working_bytes(m, b, s, req.dtype);
  j["block_backward_grad_bytes"] = block_backward_grad_bytes(m, b, s, req.dtype);
  j["logits_bytes"] = logits_bytes(m, b, s, req.dtype);
  j["logits_peak_bytes"] = logits_peak_bytes(m, b, s, req.dtype);
  // The implementation recipe's saved tensors (models/implementation.cpp), per token of one block.
  nlohmann::json recipe;
  const ImplOptions impl{req.implementation};
  for (auto mode : {CheckpointMode::None, CheckpointMode::SelectiveOp, CheckpointMode::Full})
    recipe[checkpoint_mode_name(mode)] =
        static_cast<double>(block_memory(m, b, s, req.dtype, mode, impl).saved_bytes()) / tokens;
  j["implementation"] = model_impl_name(req.implementation);
  j["saved_bytes_per_block_per_token"] = recipe;
  j["final_norm_saved_bytes_per_token"] =
      static_cast<double>(final_norm_memory(m, b, s, req.dtype, impl).saved_bytes()) / tokens;
  j["activation_assumptions"] =
      "flash/memory-efficient SDPA (no S x S scores), fused norms, no dropout; selective_op = torchtitan op-level "
      "SAC (saves mm outputs except every second mm, and SDPA outputs); approximate for MoE routing (balanced)";

  const WrapGraph g = build_wrap_graph(m, req.policy);
  j["wrap_policy"] = wrap_policy_name(req.policy);
  nlohmann::json units = nlohmann::json::array();
  for (const auto& u : g.units) {
    nlohmann::json parts = nlohmann::json::array();
    for (auto p : u.parts) parts.push_back(part_name(p));
    units.push_back({{"id", u.id},
                     {"name", u.name},
                     {"module_type", g.modules[u.module].type},
                     {"params", u.params},
                     {"num_tensors", u.tensors.size()},
                     {"parts", parts},
                     {"layers", u.layers},
                     {"is_root", u.is_root}});
  }
  j["units"] = units;
  j["forward_order"] = g.forward_order;
  return j;
}

std::string model_info_text(const ModelSpec& spec, const ModelInfoRequest& req) {
  const nlohmann::json j = model_info_json(spec, req);
  const auto& md = j["model"];
  std::ostringstream o;
  auto i64 = [&](const char* k) { return grouped(j[k].get<std::int64_t>()); };
  o << "Model " << md["name"].get<std::string>() << " (" << md["model_type"].get<std::string>() << ", block "
    << md["block_class"].get<std::string>() << ")\n"
    << "  hidden " << md["hidden"] << ", layers " << md["n_layers"] << ", heads " << md["n_heads"] << " (kv "
    << md["n_kv_heads"] << ", head_dim " << md["head_dim"] << "), ffn " << md["ffn_hidden"] << " "
    << md["mlp"].get<std::string>() << ", vocab " << md["vocab_size"] << "\n"
    << "  norm " << md["norm"].get<std::string>() << ", positions " << md["positions"].get<std::string>()
    << " (max " << md["max_positions"]
    << (md["positions_follow_seq_len"].get<bool>() ? ", sized by seq_len as in llm-foundry's benchmarks" : "")
    << "), embeddings " << (md["tied_embeddings"].get<bool>() ? "tied" : "untied")
    << ", biases qkv/out/mlp " << md["qkv_bias"] << "/" << md["out_bias"] << "/" << md["mlp_bias"];
  if (md["n_experts"].get<std::int64_t>() > 0)
    o << ", MoE " << md["n_experts"] << " experts top-" << md["experts_top_k"];
  if (md["parallel_residual"].get<bool>())
    o << "\n  parallel block: attention and MLP both read the block input ("
      << (md["block_norms"].get<std::int64_t>() == 1 ? "one shared norm" : "a norm each") << ")";
  if (md["positions"] == "rotary" && md["rotary_dim"] != md["head_dim"])
    o << (md["parallel_residual"].get<bool>() ? "; " : "\n  ") << "RoPE on " << md["rotary_dim"] << " of "
      << md["head_dim"] << " head dims";
  if (md["lm_head_bias"].get<bool>()) o << "; lm_head has a bias";
  o << "\n\nParameters (exact)\n"
    << "  total          " << i64("params_total") << "\n"
    << "  embedding      " << i64("params_embedding") << "\n"
    << "  per block      " << i64("params_per_block");
  if (j["params_active_per_block"] != j["params_per_block"]) o << "  (active per token " << i64("params_active_per_block") << ")";
  o << "\n  all blocks     " << i64("params_blocks") << "\n"
    << "  final norm     " << i64("params_final_norm") << "\n"
    << "  lm_head        " << i64("params_lm_head") << (md["tied_embeddings"].get<bool>() ? " (tied to the embedding)" : "")
    << "\n\nFLOPs per token at seq_len " << j["seq_len"] << " (model FLOPs, PaLM/llm-foundry convention)\n"
    << "  forward        " << fmt("%.6g", j["flops_per_token_fwd"].get<double>()) << "  (matmul "
    << fmt("%.6g", j["flops_per_token_matmul_fwd"].get<double>()) << " + attention "
    << fmt("%.6g", j["flops_per_token_attention_fwd"].get<double>()) << ")\n"
    << "  fwd+bwd        " << fmt("%.6g", j["flops_per_token_fwdbwd"].get<double>()) << "\n\n"
    << "Activations, one block, micro-batch " << j["micro_batch"] << " x seq " << j["seq_len"] << ", "
    << j["activation_dtype"].get<std::string>() << " (GiB = 2^30 bytes)\n";
  for (const char* mode : {"none", "selective_op", "full"}) {
    const double bytes = static_cast<double>(j["activation_bytes_per_block"][mode].get<std::int64_t>());
    o << "  saved, " << mode << std::string(14 - std::string(mode).size(), ' ') << fmt("%10.4f", bytes / 1073741824.0)
      << " GiB  (" << fmt("%.1f", j["activation_bytes_per_block_per_token"][mode].get<double>()) << " B/token)\n";
  }
  o << "  backward grads (block not checkpointed) " << fmt("%.4f", static_cast<double>(j["block_backward_grad_bytes"].get<std::int64_t>()) / 1073741824.0)
    << " GiB\n";
  o << "  backward working (checkpointed block) " << fmt("%.4f", static_cast<double>(j["block_backward_working_bytes"].get<std::int64_t>()) / 1073741824.0)
    << " GiB\n"
    << "  logits + fp32 log_softmax            " << fmt("%.4f", static_cast<double>(j["logits_bytes"].get<std::int64_t>()) / 1073741824.0)
    << " GiB (peak with the fp32 upcast " << fmt("%.4f", static_cast<double>(j["logits_peak_bytes"].get<std::int64_t>()) / 1073741824.0)
    << " GiB)\n  assumes: " << j["activation_assumptions"].get<std::string>() << "\n";
  o << "  implementation " << j["implementation"].get<std::string>() << ", saved per token per block:";
  for (const char* mode : {"none", "selective_op", "full"})
    o << " " << mode << " " << fmt("%.1f", j["saved_bytes_per_block_per_token"][mode].get<double>()) << " B";
  o << "; final norm " << fmt("%.1f", j["final_norm_saved_bytes_per_token"].get<double>()) << " B\n\n";
  o << "FSDP units, wrap policy " << j["wrap_policy"].get<std::string>() << ": " << j["units"].size()
    << " (listed in forward order)\n";
  for (const auto& id : j["forward_order"]) {
    const auto& u = j["units"][id.get<std::size_t>()];
    std::string parts;
    for (const auto& p : u["parts"]) parts += (parts.empty() ? "" : "+") + p.get<std::string>();
    const std::string layers = layer_ranges(u["layers"].get<std::vector<int>>());
    o << "  [" << u["id"] << "] " << u["name"].get<std::string>() << " (" << u["module_type"].get<std::string>()
      << "): " << grouped(u["params"].get<std::int64_t>()) << " params, " << u["num_tensors"] << " tensors, computes "
      << (parts.empty() ? "nothing" : parts) << (layers.empty() ? "" : " (layers " + layers + ")") << "\n";
  }
  return o.str();
}

}  // namespace fsdpsim::models

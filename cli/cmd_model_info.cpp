// fsdpsim model-info: parse the options, load the model, print models::model_info_{text,json}.
#include <iostream>

#include "cli/commands.h"
#include "common/args.h"
#include "common/context.h"
#include "common/errors.h"
#include "common/output_file.h"
#include "models/model_info.h"
#include "models/zoo.h"

namespace fsdpsim::cli {

int cmd_model_info(const Argv& argv) {
  const std::vector<OptionSpec> specs = {
      {"model", true, false, "zoo name (" + [] {
         std::string s;
         for (const auto& n : models::zoo_names()) s += (s.empty() ? "" : ", ") + n;
         return s;
       }() + ") or a Hugging Face config.json (or its directory)", "NAME|PATH"},
      {"json", false, false, "print JSON (context block under \"context\") instead of text"},
      {"seq-len", true, false, "sequence length for FLOPs and activations (default: min(max positions, 4096))", "N"},
      {"micro-batch", true, false, "sequences per micro-batch for activation bytes (default 1)", "N"},
      {"dtype", true, false, "activation dtype: bf16 (default), fp16, fp32, fp8", "DTYPE"},
      {"wrap-policy", true, false, "FSDP units to show: block (default) | none | size:N | modules:a,b,...", "POLICY"},
      {"implementation", true, false, "whose block code saves the activations: hf (default) | torchtitan | litgpt | fused", "NAME"},
      {"out", true, false, "also write the output to FILE (atomically)", "FILE"},
  };
  const Args args(argv, specs);
  if (args.help()) {
    std::cout << usage_text("model-info",
                            "Describe a model: its spec, exact parameter counts, FLOPs per token, activation bytes per "
                            "block for each checkpointing mode, and its FSDP units under a wrap policy.",
                            specs);
    return kExitOk;
  }
  if (!args.positional().empty()) throw InputError("model-info", args.positional()[0], "no positional arguments; use --model");
  const models::ModelSpec m = models::load_model(args.require("model"), "--model");

  models::ModelInfoRequest req;
  const bool fixed_table = m.positions == models::PositionKind::Learned && !m.positions_follow_seq_len;
  std::int64_t default_seq = 4096;
  if (m.max_positions > 0 && m.max_positions < default_seq && !m.positions_follow_seq_len) default_seq = m.max_positions;
  req.seq_len = args.get_int("seq-len", default_seq, 1, fixed_table ? m.max_positions : (std::int64_t{1} << 24));
  req.micro_batch = args.get_int("micro-batch", 1, 1, 1 << 20);
  req.dtype = parse_dtype(args.get("dtype", "bf16"), "--dtype");
  req.policy = models::parse_wrap_policy(args.get("wrap-policy", "block"), "--wrap-policy");
  req.implementation = models::parse_model_impl(args.get("implementation", "hf"), "--implementation");
  try {  // a module name that matches nothing: blame the option the user typed
    models::build_wrap_graph(models::with_seq_len(m, req.seq_len), req.policy);
  } catch (const InputError& e) {
    throw InputError("--wrap-policy", e.value(), e.allowed());
  }

  std::string out;
  if (args.has("json")) {
    nlohmann::ordered_json j;  // the context block opens the output
    j["context"] = context_block_with_profile("");
    const nlohmann::json info = models::model_info_json(m, req);  // named: items() must not outlive it
    for (const auto& [k, v] : info.items()) j[k] = v;
    out = j.dump(2) + "\n";
  } else {
    const nlohmann::json ctx = context_block_with_profile("");
    out = "# fsdpsim " + ctx["version"].get<std::string>() + " (" + ctx["git_sha"].get<std::string>() + ") " +
          ctx["date"].get<std::string>() + " on " + ctx["host"].get<std::string>() + ": " +
          ctx["command"].get<std::string>() + "\n" + models::model_info_text(m, req);
  }
  if (args.has("out")) write_file_atomic(args.get("out"), out, "--out");
  std::cout << out;
  return kExitOk;
}

}  // namespace fsdpsim::cli

// `fsdpsim diagnose`: read an existing Lightning / accelerate / torchtune / torchtitan / plan configuration,
// predict its memory and throughput, list its problems with the fix and the predicted gain.
#include <iostream>

#include "calibrate/hardware_profile.h"
#include "cli/commands.h"
#include "common/args.h"
#include "common/errors.h"
#include "common/output_file.h"
#include "models/zoo.h"
#include "planner/diagnose.h"
#include "planner/user_config.h"

namespace fsdpsim::cli {

int cmd_diagnose(const Argv& argv) {
  const std::vector<OptionSpec> specs = {
      {"model", true, false, "zoo name or config.json", "M"},
      {"cluster", true, false, "cluster name or JSON file", "C"},
      {"config", true, false, "the configuration: .py (Lightning FSDPStrategy + Trainer), .yaml (accelerate, "
                              "LightningCLI or a torchtune recipe config), .toml (torchtitan) or .json (fsdpsim plan)",
       "FILE"},
      {"format", true, false, "lightning | lightning-yaml | accelerate | torchtune | torchtitan | plan (default: from the file)", "F"},
      {"micro-batch", true, false, "sequences per GPU per micro-batch, if the config does not say", "N"},
      {"seq-len", true, false, "tokens per sequence, if the config does not say", "N"},
      {"grad-accum", true, false, "micro-batches per optimizer step, if the config does not say", "N"},
      {"memory-margin", true, false, "fraction of GPU memory kept free (default 0.05)", "F"},
      {"profile", true, false, "calibrated hardware profile JSON", "FILE"},
      {"json", true, false, "also write the diagnosis as JSON", "OUT"},
  };
  Args args(argv, specs);
  if (args.help()) {
    std::cout << usage_text("diagnose",
                            "Predict an existing FSDP configuration's memory and throughput and list its problems "
                            "(a wrap policy that wraps nothing, fp32 master weights vs bf16-true, no activation "
                            "checkpointing at long sequences, FULL_SHARD across slow inter-node links vs HYBRID_SHARD, "
                            "FULL_SHARD overhead for small models, HF gradient checkpointing outside FSDP, needless CPU "
                            "offload, the optimizer state, compiled QLoRA under checkpointing, torchtune's activation "
                            "offloading), each with the fix and the simulated gain, in the config's own keys. Add `# fsdpsim: micro_batch=N "
                            "seq_len=N grad_accum=N` to a config for what it cannot say.",
                            specs);
    return kExitOk;
  }
  models::ModelSpec model = models::load_model(args.require("model"), "--model");
  calibrate::Cluster cluster = calibrate::load_cluster(args.require("cluster"), "--cluster");
  calibrate::HardwareProfile hw = args.has("profile")
                                      ? calibrate::HardwareProfile::from_file(args.get("profile"), cluster, "--profile")
                                      : calibrate::HardwareProfile::for_cluster(cluster);
  planner::ReadOptions ro;
  ro.format = args.get("format", "");
  ro.micro_batch = args.get_int("micro-batch", 0, 1, 65536);
  ro.seq_len = args.get_int("seq-len", 0, 1, 1 << 22);
  ro.grad_accum = args.get_int("grad-accum", 0, 1, 65536);
  planner::UserConfig cfg = planner::read_user_config(args.require("config"), ro, model);
  model = models::with_seq_len(model, cfg.plan.seq_len);
  double margin = args.get_double("memory-margin", 0.05, 0.0, 0.9);
  planner::Diagnosis d = planner::diagnose(model, hw, cfg, margin);
  std::cout << planner::diagnosis_text(d);
  if (args.has("json"))
    write_file_atomic(args.get("json"), planner::diagnosis_to_json(d, model, cluster).dump(2) + "\n", "--json");
  return kExitOk;
}

}  // namespace fsdpsim::cli

// `fsdpsim fit`: does a plan fit, the largest micro-batch with and without checkpointing, and the
// smallest change that makes it fit (planner/fit.h).
#include <iostream>

#include "calibrate/hardware_profile.h"
#include "cli/commands.h"
#include "cli/plan_source.h"
#include "common/args.h"
#include "common/context.h"
#include "common/errors.h"
#include "common/output_file.h"
#include "models/zoo.h"
#include "planner/explain.h"
#include "planner/fit.h"
#include "sim/accuracy.h"
#include "sim/simulator.h"

namespace fsdpsim::cli {

int cmd_fit(const Argv& argv) {
  const std::vector<OptionSpec> specs = {
      {"model", true, false, "zoo name or config.json", "M"},
      {"cluster", true, false, "cluster name or JSON file", "C"},
      {"plan", true, false, "the plan: inline JSON, a plan file, plan.json[#N] from `fsdpsim plan`, or a Lightning / "
                            "accelerate / torchtune / torchtitan config (default: {} = PyTorch's FSDP2 defaults)", "P"},
      {"seq-len", true, false, "tokens per sequence when the plan does not say (plan key seq_len)", "N"},
      {"micro-batch", true, false, "sequences per GPU per micro-batch when a framework config does not say", "N"},
      {"memory-margin", true, false, "fraction of GPU memory kept free (default 0.05)", "F"},
      {"profile", true, false, "calibrated hardware profile JSON", "FILE"},
      {"json", true, false, "also write the answer as JSON", "OUT"},
      {"require-fit", false, false, "exit with code 3 if the plan does not fit", ""},
  };
  Args args(argv, specs);
  if (args.help()) {
    std::cout << usage_text("fit",
                            "Does the plan fit in GPU memory (with the margin)? The largest micro-batch that fits without "
                            "checkpointing and with each checkpointing mode, and the smallest single change that makes "
                            "the plan fit - every figure simulated.",
                            specs);
    return kExitOk;
  }
  if (!args.positional().empty()) throw InputError("fit", args.positional().front(), "no positional arguments (use --plan)");
  models::ModelSpec model = models::load_model(args.require("model"), "--model");
  const calibrate::Cluster cluster = calibrate::load_cluster(args.require("cluster"), "--cluster");
  const calibrate::HardwareProfile hw = args.has("profile") ? calibrate::HardwareProfile::from_file(args.get("profile"), cluster, "--profile")
                                                            : calibrate::HardwareProfile::for_cluster(cluster);
  planner::ReadOptions ro;
  ro.seq_len = args.get_int("seq-len", 0, 1, 1 << 22);
  ro.micro_batch = args.get_int("micro-batch", 0, 1, 65536);
  std::string spec = args.get("plan", "{}");
  PlanSource src = load_plan_source(spec, model, cluster, ro, "--plan");
  if (ro.seq_len > 0 && spec.front() == '{' && spec.find("seq_len") == std::string::npos) src.plan.seq_len = ro.seq_len;
  const double margin = args.get_double("memory-margin", 0.05, 0.0, 0.9);
  model = models::with_seq_len(model, src.plan.seq_len);
  const planner::FitAnswer a = planner::fit_plan(model, hw, src.plan, margin);
  std::cout << "fsdpsim fit: " << model.name << " on " << cluster.name << " (" << src.described << ")\n" << planner::fit_text(a)
            << sim::validation_record_section();
  if (args.has("json")) {
    nlohmann::json doc = {{"schema_version", "fsdpsim.fit/1"}, {"context", context_block_with_profile(hw.name())},
                          {"inputs", {{"model", model.name}, {"cluster", cluster.name}, {"plan_source", src.described}}}};
    doc.update(planner::fit_json(a));
    doc["accuracy"] = sim::validation_record_json();
    write_file_atomic(args.get("json"), doc.dump(2) + "\n", "--json");
  }
  if (args.has("require-fit") && !a.fits)
    throw DoesNotFitError(planner::memory_text(a.result, margin) + " (--require-fit)");
  return kExitOk;
}

}  // namespace fsdpsim::cli

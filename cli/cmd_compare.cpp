// `fsdpsim compare A B`: two plans side by side, each difference simulated alone (planner/compare.h).
#include <iostream>

#include "calibrate/hardware_profile.h"
#include "cli/commands.h"
#include "cli/plan_source.h"
#include "common/args.h"
#include "common/context.h"
#include "common/errors.h"
#include "common/output_file.h"
#include "models/zoo.h"
#include "planner/compare.h"
#include "planner/planner.h"
#include "sim/simulator.h"

namespace fsdpsim::cli {

int cmd_compare(const Argv& argv) {
  const std::vector<OptionSpec> specs = {
      {"model", true, false, "zoo name or config.json", "M"},
      {"cluster", true, false, "cluster name or JSON file", "C"},
      {"micro-batch", true, false, "sequences per GPU per micro-batch when a framework config does not say", "N"},
      {"seq-len", true, false, "tokens per sequence when a framework config does not say", "N"},
      {"grad-accum", true, false, "micro-batches per step when a framework config does not say", "N"},
      {"memory-margin", true, false, "fraction of GPU memory kept free (default 0.05)", "F"},
      {"profile", true, false, "calibrated hardware profile JSON", "FILE"},
      {"json", true, false, "also write the comparison as JSON", "OUT"},
  };
  Args args(argv, specs);
  if (args.help()) {
    std::cout << usage_text("compare A B",
                            "Compare two plans side by side - e.g. your config against the recommendation: "
                            "`fsdpsim compare train.py out/plan.json --model M --cluster C`. A and B are each an inline "
                            "plan JSON, a plan file, plan.json[#N] from `fsdpsim plan`, a `diagnose --json` or "
                            "`simulate --json` output, or a Lightning / accelerate / torchtune / torchtitan config. Each difference "
                            "is simulated alone on A, so the table says what each one costs or gains.",
                            specs);
    return kExitOk;
  }
  if (args.positional().size() != 2)
    throw InputError("compare", std::to_string(args.positional().size()) + " plans", "exactly two: fsdpsim compare A B --model M --cluster C");
  const models::ModelSpec model = models::load_model(args.require("model"), "--model");
  const calibrate::Cluster cluster = calibrate::load_cluster(args.require("cluster"), "--cluster");
  const calibrate::HardwareProfile hw = args.has("profile") ? calibrate::HardwareProfile::from_file(args.get("profile"), cluster, "--profile")
                                                            : calibrate::HardwareProfile::for_cluster(cluster);
  planner::ReadOptions ro;
  ro.micro_batch = args.get_int("micro-batch", 0, 1, 65536);
  ro.seq_len = args.get_int("seq-len", 0, 1, 1 << 22);
  ro.grad_accum = args.get_int("grad-accum", 0, 1, 65536);
  planner::CompareSide a, b;
  const PlanSource sa = load_plan_source(args.positional()[0], model, cluster, ro, "A");
  const PlanSource sb = load_plan_source(args.positional()[1], model, cluster, ro, "B");
  a.name = "A", a.source = sa.described, a.plan = sa.plan;
  b.name = "B", b.source = sb.described, b.plan = sb.plan;
  const double margin = args.get_double("memory-margin", 0.05, 0.0, 0.9);
  // The sides may differ in sequence length; a model whose position table follows it (MPT) differs too.
  const models::ModelSpec model_a = models::with_seq_len(model, a.plan.seq_len), model_b = models::with_seq_len(model, b.plan.seq_len);
  const planner::EvalFn sim_a = planner::fast_simulate(model_a, hw), sim_b = planner::fast_simulate(model_b, hw);
  auto simulate = [&](const sim::Plan& p) { return p.seq_len == b.plan.seq_len ? sim_b(p) : sim_a(p); };
  const planner::Comparison c = planner::compare_plans(hw, a, b, margin, simulate);
  std::cout << "fsdpsim compare: " << model.name << " on " << cluster.name << "\n" << planner::compare_text(c);
  if (args.has("json")) {
    nlohmann::json doc = {{"schema_version", "fsdpsim.compare/1"}, {"context", context_block_with_profile(hw.name())},
                          {"inputs", {{"model", model.name}, {"cluster", cluster.name}}}};
    doc.update(planner::compare_json(c));
    write_file_atomic(args.get("json"), doc.dump(2) + "\n", "--json");
  }
  return kExitOk;
}

}  // namespace fsdpsim::cli

#include "runtime/worker_common.h"

#include <cstdint>

#include "models/zoo.h"
#include "program/plan.h"

namespace fsdpsim::runtime {

std::vector<OptionSpec> worker_options(const std::string& plan_help, std::vector<OptionSpec> extra) {
  std::vector<OptionSpec> o = {
      {"model", true, false, "zoo name or config.json", "M"},
      {"plan", true, false, "plan JSON file or inline object (" + plan_help + ")", "P"},
      {"steps", true, false, "optimizer steps to run (default 3)", "K"},
      {"seed", true, false, "seed of the init and the synthetic data (default 1234)", "S"},
      {"lr", true, false, "learning rate (default 1e-3, torch.optim.AdamW's)", "LR"},
      {"gpus-per-node", true, false, "ranks per node for the program's group shapes (default: all)", "G"},
      {"out", true, false, "result JSON (rank 0)", "FILE"},
      {"dump", true, false, "parameters and gradients after the last step, JSON (rank 0)", "FILE"},
  };
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

RunConfig worker_config(const Args& a, int world) {
  RunConfig cfg;
  cfg.model = models::load_model(a.require("model"), "--model");
  models::validate_model(cfg.model, a.get("model"));
  const int gpn = static_cast<int>(a.get_int("gpus-per-node", world, 1, 1 << 20));
  cfg.plan = sim::resolve_plan(sim::load_plan(a.require("plan"), "--plan"), world, gpn);
  cfg.gpus_per_node = gpn;
  cfg.seed = static_cast<std::uint64_t>(a.get_int("seed", 1234, 0, INT64_MAX));
  cfg.optimizer.lr = static_cast<float>(a.get_double("lr", 1e-3, 1e-8, 1.0));
  return cfg;
}

nlohmann::json tensors_json(const std::vector<std::pair<std::string, std::vector<float>>>& ts) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [n, v] : ts) j[n] = v;
  return j;
}

}  // namespace fsdpsim::runtime

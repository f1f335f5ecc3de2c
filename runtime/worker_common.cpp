#include "runtime/worker_common.h"

namespace fsdpsim::runtime {

std::vector<OptionSpec> worker_common_options(const std::string& plan_help) {
  return {
      {"model", true, false, "zoo name or config.json", "M"},
      {"plan", true, false, "plan JSON file or inline object (" + plan_help + ")", "P"},
      {"steps", true, false, "optimizer steps to run (default 3)", "K"},
      {"seed", true, false, "seed of the init and the synthetic data (default 1234)", "S"},
      {"lr", true, false, "learning rate (default 1e-3, torch.optim.AdamW's)", "LR"},
      {"gpus-per-node", true, false, "ranks per node for the program's group shapes (default: all)", "G"},
      {"out", true, false, "result JSON (rank 0)", "FILE"},
      {"dump", true, false, "parameters and gradients after the last step, JSON (rank 0)", "FILE"},
  };
}

nlohmann::json tensors_json(const std::vector<std::pair<std::string, std::vector<float>>>& ts) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [n, v] : ts) j[n] = v;
  return j;
}

}  // namespace fsdpsim::runtime

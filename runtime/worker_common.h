// What the two runtime workers (fsdpsim-run-cpu under runtime/mpi, fsdpsim-run-cuda under
// runtime/cuda) share: the command-line options launcher.cpp passes to both, and the JSON form of
// gathered tensors for --dump.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/args.h"

namespace fsdpsim::runtime {

// model, plan, steps, seed, lr, gpus-per-node, out, dump; `plan_help` says which dtypes the backend takes.
std::vector<OptionSpec> worker_common_options(const std::string& plan_help);
// {name: [values...]} in the given order.
nlohmann::json tensors_json(const std::vector<std::pair<std::string, std::vector<float>>>& ts);

}  // namespace fsdpsim::runtime

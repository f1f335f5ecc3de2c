// A measured step in the simulator's result schema (sim::SimResult): the worker writes it with
// sim::sim_result_to_json(r, /*include_trace=*/true) and `fsdpsim run/validate` read it back here,
// so reports and validation treat a measured and a predicted step alike.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "program/sim_result.h"

namespace fsdpsim::runtime {

// Inverse of sim::sim_result_to_json for the fields it writes (times back to integer ns).
// A missing or mistyped field is InputError naming `source` and the field.
sim::SimResult sim_result_from_json(const nlohmann::json& j, const std::string& source);

}  // namespace fsdpsim::runtime

// Internal: the FSDP2 sharding code shared by the raw FSDP2 and the Lightning ModelParallelStrategy exports.
#pragma once
#include <string>
#include <vector>

#include "planner/exports.h"

namespace fsdpsim::planner {

void fsdp1_to_fsdp2_notes(const sim::Plan& p, std::vector<std::string>& unsupported);
std::string fsdp2_sharding_code(const ExportInput& in, const std::string& indent, const std::string& root,
                                const std::string& mesh_var, std::vector<std::string>& unsupported);
std::string mesh_code(const sim::Plan& p);
std::string accumulation_loop(const sim::Plan& p, const std::string& model);

}  // namespace fsdpsim::planner

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
// torchao float8 conversion lines (compute recipe, float8 all-gather), or "" without float8.
std::string float8_conversion_code(const sim::Plan& p, const std::string& indent, const std::string& root);
// "{31: False}": reshard_after_forward per block index from module_overrides, or "".
std::string reshard_overrides_code(const sim::Plan& p, const models::ModelSpec& m);
// "torch.optim.AdamW(params, lr=3e-4, fused=True)": the plan's optimizer and implementation.
std::string optimizer_code(const sim::Plan& p, const std::string& params);
// The import line optimizer_code's class needs ("import bitsandbytes\n", "import torchao.optim\n"), or "".
std::string optimizer_import(const sim::Plan& p);

}  // namespace fsdpsim::planner

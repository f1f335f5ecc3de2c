// PLACEHOLDER during development: replaced by the owning module's implementation.
#include <iostream>
#include "cli/commands.h"
namespace fsdpsim::cli {
int cmd_model_info(const Argv&) { std::cerr << "fsdpsim: 'model_info' is not built yet\n"; return 1; }
}  // namespace fsdpsim::cli

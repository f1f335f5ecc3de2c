// PLACEHOLDER during development: replaced by the owning module's implementation.
#include <iostream>
#include "cli/commands.h"
namespace fsdpsim::cli {
int cmd_plan(const Argv&) { std::cerr << "fsdpsim: 'plan' is not built yet\n"; return 1; }
}  // namespace fsdpsim::cli

// PLACEHOLDER during development: replaced by the owning module's implementation.
#include <iostream>
#include "cli/commands.h"
namespace fsdpsim::cli {
int cmd_simulate(const Argv&) { std::cerr << "fsdpsim: 'simulate' is not built yet\n"; return 1; }
}  // namespace fsdpsim::cli

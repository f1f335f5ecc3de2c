// PLACEHOLDER during development: replaced by the owning module's implementation.
#include <iostream>
#include "cli/commands.h"
namespace fsdpsim::cli {
int cmd_diagnose(const Argv&) { std::cerr << "fsdpsim: 'diagnose' is not built yet\n"; return 1; }
}  // namespace fsdpsim::cli

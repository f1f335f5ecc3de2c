// The context block that opens every output file (style.md lesson 6): tool version, git sha,
// host, date, command line, and the hardware profile used. For byte-identical outputs in tests,
// FSDPSIM_FIXED_CONTEXT=1 in the environment (or --deterministic) fixes date and host.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdpsim {

struct RunContext {
  std::vector<std::string> argv;   // the command line as typed
  std::string profile;             // profile name or file used ("" if none)
  bool deterministic = false;      // fixes date/host ("<fixed>")
};

// Process-wide context, set once by main() (argv, --deterministic) and read by writers.
RunContext& run_context();

nlohmann::json context_block(const RunContext& ctx);
// Same, with the profile overridden (a command may load its profile after main()).
nlohmann::json context_block_with_profile(const std::string& profile);
std::string tool_version();
std::string git_sha();

}  // namespace fsdpsim

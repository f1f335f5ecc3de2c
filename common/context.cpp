#include "common/context.h"

#include <unistd.h>

#include <cstdlib>
#include <ctime>

#include "fsdpsim_build_info.h"

namespace fsdpsim {

RunContext& run_context() {
  static RunContext ctx;
  return ctx;
}

std::string tool_version() { return FSDPSIM_VERSION; }
std::string git_sha() { return FSDPSIM_GIT_SHA; }

nlohmann::json context_block(const RunContext& ctx) {
  const char* fixed = std::getenv("FSDPSIM_FIXED_CONTEXT");
  bool det = ctx.deterministic || (fixed && std::string(fixed) == "1");
  std::string host = "<fixed>", date = "<fixed>";
  if (!det) {
    char buf[256] = {0};
    if (gethostname(buf, sizeof(buf) - 1) == 0) host = buf;
    std::time_t t = std::time(nullptr);
    char d[64];
    std::strftime(d, sizeof(d), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    date = d;
  }
  std::string cmd;
  for (size_t i = 0; i < ctx.argv.size(); ++i) cmd += (i ? " " : "") + ctx.argv[i];
  return nlohmann::json{{"tool", "fsdpsim"},       {"version", tool_version()}, {"git_sha", git_sha()},
                        {"host", host},            {"date", date},              {"command", cmd},
                        {"profile", ctx.profile}};
}

nlohmann::json context_block_with_profile(const std::string& profile) {
  RunContext c = run_context();
  c.profile = profile;
  return context_block(c);
}

}  // namespace fsdpsim

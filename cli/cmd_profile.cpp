// fsdpsim profile show FILE|NAME [--json]: summarizes a hardware profile (calibrate/profile_summary.h).
#include <iostream>

#include "calibrate/profile_summary.h"
#include "cli/commands.h"
#include "common/args.h"
#include "common/errors.h"

namespace fsdpsim::cli {
namespace {
const std::vector<OptionSpec> kOptions = {
    {"json", false, false, "print the full profile JSON (it opens with the profile's context block) instead of the summary"},
};
}  // namespace

int cmd_profile(const Argv& argv) {
  Args a(argv, kOptions);
  if (a.help() || a.positional().empty()) {
    std::cout << usage_text("profile show FILE|NAME",
                            "Summarize a hardware profile: a calibrated profile file, a cluster name (8xH100-SXM, "
                            "2x8xH100-SXM-IB-NDR400) or a built-in GPU (H100-SXM, A100-80GB, A100-40GB, H200, B200, RTX4090, CPU).",
                            kOptions);
    return a.help() ? 0 : kExitBadInput;
  }
  const auto& pos = a.positional();
  if (pos[0] != "show") throw InputError("profile", "\"" + pos[0] + "\"", "expected: fsdpsim profile show FILE|NAME");
  if (pos.size() != 2) throw InputError("profile show", std::to_string(pos.size() - 1) + " arguments", "expected one FILE or NAME");
  auto p = calibrate::load_profile_for_show(pos[1], "profile show");
  if (a.has("json")) {
    std::cout << p.to_json().dump(2) << "\n";   // opens with the profile's own context block
  } else {
    std::cout << calibrate::profile_summary(p);
  }
  return 0;
}

}  // namespace fsdpsim::cli

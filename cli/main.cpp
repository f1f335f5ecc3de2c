// fsdpsim: the user's door. Thin on purpose: dispatch to a subcommand, map errors to exit codes
// (0 ok, 2 bad input, 3 does not fit, 1 internal; design.md "Contract").
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/context.h"
#include "common/errors.h"
#include "common/output_file.h"

namespace {

struct Command {
  const char* name;
  int (*fn)(const fsdpsim::cli::Argv&);
  const char* summary;
};

const Command kCommands[] = {
    {"plan", fsdpsim::cli::cmd_plan, "search FSDP plans for a model and cluster; write plan.json and report.html"},
    {"simulate", fsdpsim::cli::cmd_simulate, "predict memory and step time of one plan"},
    {"diagnose", fsdpsim::cli::cmd_diagnose, "check an existing Lightning/accelerate/torchtitan/plan config"},
    {"fit", fsdpsim::cli::cmd_fit, "does a plan fit; the largest micro-batch; the smallest change that makes it fit"},
    {"compare", fsdpsim::cli::cmd_compare, "two plans side by side (e.g. your config vs the recommended one)"},
    {"model-info", fsdpsim::cli::cmd_model_info, "describe a model: parameters, FLOPs, FSDP units"},
    {"calibrate", fsdpsim::cli::cmd_calibrate, "measure collectives and kernels; write a hardware profile"},
    {"profile", fsdpsim::cli::cmd_profile, "inspect hardware profiles (profile show FILE|NAME)"},
    {"run", fsdpsim::cli::cmd_run, "execute a plan with the bundled FSDP runtime and measure it"},
    {"validate", fsdpsim::cli::cmd_validate, "run the simulator and the runtime on one plan and compare"},
};

void print_help(std::ostream& os) {
  os << "fsdpsim " << fsdpsim::tool_version() << " (" << fsdpsim::git_sha() << ")\n"
     << "A discrete-event simulator and planner for PyTorch FSDP training configurations.\n\n"
     << "Usage: fsdpsim COMMAND [options]    (fsdpsim COMMAND --help for its options)\n\nCommands:\n";
  for (const auto& c : kCommands) {
    std::string n = c.name;
    os << "  " << n << std::string(n.size() < 12 ? 12 - n.size() : 1, ' ') << c.summary << "\n";
  }
  os << "\nGlobal options: --deterministic (fix date/host in context blocks), --version\n"
     << "Exit codes: 0 ok, 2 bad input, 3 plan does not fit, 1 internal error.\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> all(argv, argv + argc);
  auto& ctx = fsdpsim::run_context();
  ctx.argv = all;
  std::vector<std::string> rest;
  for (size_t i = 1; i < all.size(); ++i) {
    if (all[i] == "--deterministic") ctx.deterministic = true;
    else rest.push_back(all[i]);
  }
  if (rest.empty() || rest[0] == "--help" || rest[0] == "-h" || rest[0] == "help") {
    print_help(std::cout);
    return 0;
  }
  if (rest[0] == "--version") {
    std::cout << "fsdpsim " << fsdpsim::tool_version() << " (" << fsdpsim::git_sha() << ")\n";
    return 0;
  }
  // Only the planner's search polls for an interruption; any other command stops at the signal.
  fsdpsim::install_interrupt_handler(rest[0] == "plan");
  for (const auto& c : kCommands) {
    if (rest[0] != c.name) continue;
    std::vector<std::string> sub(rest.begin() + 1, rest.end());
    try {
      return c.fn(sub);
    } catch (const fsdpsim::InputError& e) {
      std::cerr << "fsdpsim " << c.name << ": error: " << e.what() << "\n";
      return fsdpsim::kExitBadInput;
    } catch (const fsdpsim::DoesNotFitError& e) {
      std::cerr << "fsdpsim " << c.name << ": does not fit: " << e.what() << "\n";
      return fsdpsim::kExitDoesNotFit;
    } catch (const std::bad_alloc&) {
      std::cerr << "fsdpsim " << c.name << ": internal error: out of host memory\n";
      return fsdpsim::kExitInternal;
    } catch (const std::exception& e) {
      std::cerr << "fsdpsim " << c.name << ": internal error: " << e.what() << "\n";
      return fsdpsim::kExitInternal;
    }
  }
  std::cerr << "fsdpsim: error: unknown command \"" << rest[0] << "\" (see fsdpsim --help)\n";
  return fsdpsim::kExitBadInput;
}

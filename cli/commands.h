// One function per subcommand; each lives in its own file (cli/cmd_*.cpp) and throws InputError
// for bad input. main() alone maps exceptions to exit codes.
#pragma once
#include <string>
#include <vector>

namespace fsdpsim::cli {

using Argv = std::vector<std::string>;   // arguments after the subcommand name

int cmd_model_info(const Argv& args);    // cli/cmd_model_info.cpp (models)
int cmd_simulate(const Argv& args);      // cli/cmd_simulate.cpp  (sim)
int cmd_plan(const Argv& args);          // cli/cmd_plan.cpp      (planner + reports)
int cmd_diagnose(const Argv& args);      // cli/cmd_diagnose.cpp  (planner)
int cmd_fit(const Argv& args);           // cli/cmd_fit.cpp       (planner: does it fit, largest micro-batch)
int cmd_compare(const Argv& args);       // cli/cmd_compare.cpp   (planner: two plans side by side)
int cmd_calibrate(const Argv& args);     // cli/cmd_calibrate.cpp (calibrate)
int cmd_profile(const Argv& args);       // cli/cmd_profile.cpp   (calibrate: `profile show FILE`)
int cmd_run(const Argv& args);           // cli/cmd_run.cpp       (runtime)
int cmd_validate(const Argv& args);      // cli/cmd_validate.cpp  (runtime + sim)

}  // namespace fsdpsim::cli

// Starting the CPU runtime from `fsdpsim run` / `fsdpsim validate`: fsdpsim-run-cpu is looked up
// next to the fsdpsim executable and launched with
//   mpirun --allow-run-as-root --oversubscribe -np N fsdpsim-run-cpu ...   (N > 1)
//   fsdpsim-run-cpu ...                                                     (N = 1: no mpirun, no MPI)
// The worker's result JSON (worker_main.cpp) is read back from a temporary file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/args.h"
#include "sim/sim_result.h"

namespace fsdpsim::runtime {

struct LaunchOptions {
  std::string model;            // as given to --model
  std::string plan;             // as given to --plan (file or inline JSON)
  int ranks = 1;
  int steps = 3;
  int gpus_per_node = 0;        // 0 = all ranks on one node
  std::uint64_t seed = 1234;
  double lr = 1e-3;
};

struct LaunchResult {
  nlohmann::json worker;        // the worker's JSON (losses, step_times_s, measured, ...)
  sim::SimResult measured;      // worker["measured"] parsed back (trace included)
  std::vector<std::string> command;
};

// Options shared by `fsdpsim run` and `fsdpsim validate`: model, plan, ranks, steps, gpus-per-node,
// seed, lr; and their parsing (InputError naming the option).
std::vector<OptionSpec> launch_option_specs();
LaunchOptions launch_options_from_args(const Args& a);

// The worker executable's path: next to the running fsdpsim (/proc/self/exe).
std::string worker_path();
// The command line that would be run (for messages and tests).
std::vector<std::string> launch_command(const LaunchOptions& o, const std::string& worker, const std::string& out);
// Runs the worker and waits. Exit 2 from the worker (bad input; it printed why) is InputError; a
// missing worker/mpirun or another failure is std::runtime_error.
LaunchResult launch_run(const LaunchOptions& o);

}  // namespace fsdpsim::runtime

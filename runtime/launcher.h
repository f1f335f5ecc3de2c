// Starting the bundled runtime from `fsdpsim run` / `fsdpsim validate`: the backend's worker
// (fsdpsim-run-cpu for --backend cpu, the default; fsdpsim-run-cuda for --backend cuda) is looked up
// next to the fsdpsim executable and launched with
//   mpirun --allow-run-as-root --oversubscribe -np N WORKER ...   (N > 1; cuda: one GPU per rank)
//   WORKER ...                                                     (N = 1: no mpirun, no MPI)
// The worker's result JSON (workers/run_cpu_main.cpp, run_cuda_main.cpp) is read back from a temporary file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/args.h"
#include "program/sim_result.h"

namespace fsdpsim::runtime {

struct LaunchOptions {
  std::string model;            // as given to --model
  std::string plan;             // as given to --plan (file or inline JSON)
  std::string backend = "cpu";  // "cpu" (OpenBLAS + MPI, fp32) or "cuda" (CUDA + NCCL, bf16)
  int ranks = 1;
  int emulate_world = 0;        // cuda, one rank: rank 0 of this many ranks, collectives emulated (0 = off)
  // Emulated worlds: delay each collective's stream by its predicted duration on this cluster (""
  // = no delays), with this profile ("" = the cluster's built-in one).
  std::string pad_cluster, pad_profile;
  int steps = 3;
  int gpus_per_node = 0;        // 0 = all ranks on one node
  std::uint64_t seed = 1234;
  double lr = 1e-3;
  int world() const { return emulate_world > 0 ? emulate_world : ranks; }   // ranks of the executed program
};

struct LaunchResult {
  nlohmann::json worker;        // the worker's JSON (losses, step_times_s, measured, ...)
  sim::SimResult measured;      // worker["measured"] parsed back (trace included)
  std::vector<std::string> command;
};

// Options shared by `fsdpsim run` and `fsdpsim validate`: model, plan, backend, ranks, steps,
// gpus-per-node, seed, lr; and their parsing (InputError naming the option).
std::vector<OptionSpec> launch_option_specs();
LaunchOptions launch_options_from_args(const Args& a);

// The backend's worker executable: next to the running fsdpsim (/proc/self/exe).
std::string worker_path(const std::string& backend = "cpu");
// The command line that would be run (for messages and tests).
std::vector<std::string> launch_command(const LaunchOptions& o, const std::string& worker, const std::string& out);
// Runs the worker and waits. Exit 2 from the worker (bad input; it printed why) is InputError; a
// missing worker/mpirun or another failure is std::runtime_error.
LaunchResult launch_run(const LaunchOptions& o);

}  // namespace fsdpsim::runtime

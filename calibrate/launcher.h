// Starting the calibration programs from `fsdpsim calibrate` (cli/cmd_calibrate.cpp): they are
// separate executables next to the fsdpsim binary, so fsdpsim itself never needs MPI at run time
// or the CUDA libraries. The CPU calibrator runs under mpirun (started here unless this process
// already runs under one); the CUDA calibrator runs directly (or under mpirun for several nodes).
#pragma once
#include <string>
#include <vector>

namespace fsdpsim::calibrate {

std::string self_executable_dir();   // the directory of /proc/self/exe
bool running_under_mpi();            // OMPI_COMM_WORLD_SIZE / PMI_SIZE in the environment

struct LaunchRequest {
  std::string backend;               // "cpu" or "cuda"
  int ranks = 2;                     // MPI ranks (cpu: ranks on this host; cuda: > 1 means mpirun, one GPU per rank)
  std::vector<std::string> args;     // passed to the calibration program
  std::string exe_dir;               // where to find fsdpsim-calibrate-{cpu,cuda}
};

// The full argv to run; InputError("--backend", ...) when the program is not part of this build.
std::vector<std::string> calibration_command(const LaunchRequest& r);
// fork + execvp + wait; returns the child's exit status (128 + signal if it was killed).
int run_command(const std::vector<std::string>& argv);

}  // namespace fsdpsim::calibrate

// fsdpsim-run-cpu: one rank of the bundled FSDP runtime on the CPU backend. Launched by
// `fsdpsim run` / `fsdpsim validate` (or by hand) as
//   mpirun --allow-run-as-root --oversubscribe -np N fsdpsim-run-cpu --model M --plan P --out FILE ...
// or, for one rank, directly without mpirun (no MPI_Init: the in-process communicator).
// Rank 0 writes the result JSON (losses, per-step times, the measured SimResult of the last step
// with its trace) and, with --dump, every parameter and reduced gradient after the last step.
//
// Faults (issue 9): a rank whose run throws (an internal error, a collective timeout, an injected
// fault, running out of device memory) prints "fsdpsim-run-cpu: rank R of W (host H, pid P): ..."
// and calls MPI_Abort, so mpirun ends every rank and exits non-zero; a rank that dies makes mpirun
// end the others and name it. Collectives time out after FSDPSIM_COLLECTIVE_TIMEOUT_S (or
// --collective-timeout; mpi_communicator.h). An out-of-memory report adds the simulator's predicted
// peaks for the same program. FSDPSIM_FAULT injects faults for tests (fault_injection.h).
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/runtime_plan.h"

#include "common/args.h"
#include "common/context.h"
#include "common/errors.h"
#include "common/output_file.h"
#include "calibrate/hardware_profile.h"
#include "runtime/cpu/rank_runner.h"
#include "runtime/layers/blas.h"
#include "runtime/mpi/fault_injection.h"
#include "runtime/mpi/mpi_communicator.h"
#include "runtime/mpi/mpi_lsan.h"
#include "runtime/worker_common.h"
#include "program/plan.h"
#include "sim/simulator.h"

using namespace fsdpsim;

namespace {

const std::vector<OptionSpec> kOptions = runtime::worker_options("fp32 dtypes", {
    {"collective-timeout", true, false,
     "seconds a collective may take before the rank reports it and aborts the job (default: "
     "FSDPSIM_COLLECTIVE_TIMEOUT_S, else 300)", "S"},
});

// Reports a fatal error of this rank and ends the whole job (MPI_Abort makes mpirun stop every
// rank); without MPI, returns the exit code.
int fatal(bool mpi, int rank, int world, const std::string& what) {
  const std::string label = runtime::rank_label(rank, world);
  // Messages raised by the fault machinery already start with the rank's label.
  std::cerr << "fsdpsim-run-cpu: " << (what.rfind("rank ", 0) == 0 ? what : label + ": error: " + what);
  std::cerr << (mpi ? "\nfsdpsim-run-cpu: " + label + ": aborting all ranks (MPI_Abort)\n" : "\n") << std::flush;
  if (mpi) MPI_Abort(MPI_COMM_WORLD, kExitInternal);
  return kExitInternal;
}

// The simulator's prediction of this run's peaks, for an out-of-memory report.
std::string predicted_peaks(const runtime::RunConfig& cfg, int world) {
  try {
    const int gpn = cfg.gpus_per_node;
    const std::string name = gpn >= world ? std::to_string(world) + "xCPU"
                                          : std::to_string(world / gpn) + "x" + std::to_string(gpn) + "xCPU";
    const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(name, "--ranks"));
    sim::SimOptions o;
    o.record_trace = false;
    o.record_memory_timeline = false;
    const sim::SimResult p = sim::simulate(cfg.model, hw, runtime::runtime_plan(cfg.plan), o);
    return "the simulator predicts for this program: peak allocated " + std::to_string(p.peak_allocated) +
           " B, peak reserved " + std::to_string(p.peak_reserved) + " B (" + name + ")";
  } catch (const std::exception& e) {
    return std::string("no prediction: ") + e.what();
  }
}


// The training loop of one rank; rank 0 writes the results.
int run_steps(const Args& a, const runtime::RunConfig& cfg, runtime::Communicator* comm, int steps) {
  runtime::set_blas_threads(1);
  runtime::RankRunner runner(cfg, *comm);
  runtime::run_worker_steps(a, runner, *comm, steps, nlohmann::json::object());
  return 0;
}

int run(const Args& a, bool mpi, int rank, int world) {
  runtime::RunConfig cfg = runtime::worker_config(a, world);
  const int steps = static_cast<int>(a.get_int("steps", 3, 1, 100000));
  a.require("out");   // checked before any work
  const double timeout_s = a.get_double("collective-timeout", runtime::collective_timeout_from_env(), 0.001, 1e6);
  const std::optional<runtime::FaultSpec> fault = runtime::fault_spec_from_env();
  const bool faulty = fault && fault->rank == rank;
  if (faulty && fault->kind == runtime::FaultSpec::Kind::Oom) cfg.address_space = fault->bytes;

  runtime::LocalCommunicator local;
  std::unique_ptr<runtime::MpiCommunicator> mpi_comm;
  runtime::Communicator* comm = &local;
  if (mpi) {
    mpi_comm = std::make_unique<runtime::MpiCommunicator>(cfg.plan.mesh_shard, timeout_s);
    comm = mpi_comm.get();
  }
  std::unique_ptr<runtime::FaultInjectingCommunicator> injector;
  if (faulty && fault->kind != runtime::FaultSpec::Kind::Oom) {
    runtime::MpiCommunicator* m = mpi_comm.get();
    injector = std::make_unique<runtime::FaultInjectingCommunicator>(*comm, *fault, [m](const std::string& what) {
      if (m) m->fail(what);
    });
    comm = injector.get();
  }
  // From here on an error of this rank ends the job (the communicator stays alive until then).
  try {
    return run_steps(a, cfg, comm, steps);
  } catch (const InputError&) {
    throw;
  } catch (const runtime::DeviceOutOfMemory& e) {
    return fatal(mpi, rank, world, std::string(e.what()) + "; " + predicted_peaks(cfg, world));
  } catch (const std::exception& e) {
    return fatal(mpi, rank, world, e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  run_context().argv.assign(argv, argv + argc);
  Args a(args, kOptions);
  if (a.help()) {
    std::cout << usage_text("fsdpsim-run-cpu", "one rank of the bundled FSDP runtime (CPU + MPI backend)", kOptions);
    return 0;
  }
  // Under mpirun OpenMPI sets OMPI_COMM_WORLD_SIZE; without it this is a 1-rank run and MPI is not used.
  const bool mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  int world = 1, rank = 0;
  if (mpi) {
    int provided = 0;
    {
      runtime::ScopedLeakCheckOff lsan_off;   // OpenMPI's never-freed state (mpi_lsan.h)
      MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    }
    if (provided < MPI_THREAD_MULTIPLE) {
      std::cerr << "fsdpsim-run-cpu: MPI does not provide MPI_THREAD_MULTIPLE\n";
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  int rc = 0;
  try {
    rc = run(a, mpi, rank, world);
  } catch (const InputError& e) {
    // Every rank sees the same input: each exits with 2, rank 0 says why.
    if (rank == 0) std::cerr << "fsdpsim-run-cpu: error: " << e.what() << "\n";
    rc = kExitBadInput;
  } catch (const std::exception& e) {
    return fatal(mpi, rank, world, std::string("internal error: ") + e.what());
  }
  if (mpi) {
    runtime::ScopedLeakCheckOff lsan_off;
    MPI_Finalize();
  }
  return rc;
}

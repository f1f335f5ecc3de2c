// fsdpsim-run-cpu: one rank of the bundled FSDP runtime on the CPU backend. Launched by
// `fsdpsim run` / `fsdpsim validate` (or by hand) as
//   mpirun --allow-run-as-root --oversubscribe -np N fsdpsim-run-cpu --model M --plan P --out FILE ...
// or, for one rank, directly without mpirun (no MPI_Init: the in-process communicator).
// Rank 0 writes the result JSON (losses, per-step times, the measured SimResult of the last step
// with its trace) and, with --dump, every parameter and reduced gradient after the last step.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common/args.h"
#include "common/context.h"
#include "common/errors.h"
#include "common/output_file.h"
#include "models/zoo.h"
#include "runtime/cpu/rank_runner.h"
#include "runtime/layers/blas.h"
#include "runtime/mpi/mpi_communicator.h"
#include "sim/plan.h"

using namespace fsdpsim;

namespace {

const std::vector<OptionSpec> kOptions = {
    {"model", true, false, "zoo name or config.json", "M"},
    {"plan", true, false, "plan JSON file or inline object (fp32 dtypes)", "P"},
    {"steps", true, false, "optimizer steps to run (default 3)", "K"},
    {"seed", true, false, "seed of the init and the synthetic data (default 1234)", "S"},
    {"lr", true, false, "learning rate (default 1e-3, torch.optim.AdamW's)", "LR"},
    {"gpus-per-node", true, false, "ranks per node for the program's group shapes (default: all)", "G"},
    {"out", true, false, "result JSON (rank 0)", "FILE"},
    {"dump", true, false, "parameters and gradients after the last step, JSON (rank 0)", "FILE"},
};

nlohmann::json tensors_json(const std::vector<std::pair<std::string, std::vector<float>>>& ts) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [n, v] : ts) j[n] = v;
  return j;
}

int run(const Args& a, runtime::Communicator* comm_in, int world) {
  runtime::RunConfig cfg;
  cfg.model = models::load_model(a.require("model"), "--model");
  models::validate_model(cfg.model, a.get("model"));
  const int gpn = static_cast<int>(a.get_int("gpus-per-node", world, 1, 1 << 20));
  cfg.plan = sim::resolve_plan(sim::load_plan(a.require("plan"), "--plan"), world, gpn);
  cfg.gpus_per_node = gpn;
  cfg.seed = static_cast<std::uint64_t>(a.get_int("seed", 1234, 0, INT64_MAX));
  cfg.optimizer.lr = static_cast<float>(a.get_double("lr", 1e-3, 1e-8, 1.0));
  const int steps = static_cast<int>(a.get_int("steps", 3, 1, 100000));
  const std::string out = a.require("out");

  std::unique_ptr<runtime::Communicator> owned;
  runtime::Communicator* comm = comm_in;
  if (!comm) {
    owned = std::make_unique<runtime::MpiCommunicator>(cfg.plan.mesh_shard);
    comm = owned.get();
  }
  runtime::set_blas_threads(1);
  runtime::RankRunner runner(cfg, *comm);
  nlohmann::json losses = nlohmann::json::array(), times = nlohmann::json::array();
  runtime::StepOutcome last;
  for (int s = 0; s < steps; ++s) {
    comm->barrier();   // ranks start each step together, as a training loop's data loading would not
    last = runner.step();
    losses.push_back(last.loss);
    const double t = comm->max_world(to_seconds(last.measured.step_time_ns));
    times.push_back(t);
    last.measured.step_time_ns = static_cast<TimeNs>(t * 1e9);   // the step ends when the slowest rank ends
  }
  auto params = runner.gather_params();
  auto grads = runner.gather_grads();
  if (comm->rank() == 0) {
    nlohmann::json j;
    j["context"] = context_block_with_profile("");
    j["world"] = world;
    j["steps"] = steps;
    j["losses"] = losses;
    j["step_times_s"] = times;
    j["untracked_bytes"] = runner.untracked_bytes();
    j["measured"] = sim::sim_result_to_json(last.measured, true);
    write_file_atomic(out, j.dump(1), "--out");
    if (a.has("dump")) {
      nlohmann::json d;
      d["params"] = tensors_json(params);
      d["grads"] = tensors_json(grads);
      write_file_atomic(a.get("dump"), d.dump(), "--dump");
    }
  }
  comm->barrier();
  return 0;
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
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
      std::cerr << "fsdpsim-run-cpu: MPI does not provide MPI_THREAD_MULTIPLE\n";
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  int rc = 0;
  try {
    runtime::LocalCommunicator local;
    rc = run(a, mpi ? nullptr : &local, world);
  } catch (const InputError& e) {
    // Every rank sees the same input: each exits with 2, rank 0 says why.
    if (rank == 0) std::cerr << "fsdpsim-run-cpu: error: " << e.what() << "\n";
    rc = kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "fsdpsim-run-cpu: rank " << rank << ": internal error: " << e.what() << "\n";
    if (mpi) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  if (mpi) MPI_Finalize();
  return rc;
}

// fsdpsim-run-cuda: one rank of the bundled FSDP runtime on the CUDA + NCCL backend, with the
// options and result JSON of fsdpsim-run-cpu (workers/run_cpu_main.cpp). Launched by
// `fsdpsim run --backend cuda` / `fsdpsim validate --backend cuda` (or by hand) as
//   mpirun -np N fsdpsim-run-cuda --model M --plan P --out FILE ...   (one GPU per rank: local rank % GPUs)
// or, for one rank, directly without mpirun (no MPI_Init; NCCL communicators of one rank), or as
// rank 0 of a larger world emulated on one GPU (--emulate-world W, emulated_communicator.h).
// Input errors exit 2 (checked before any GPU is touched); no usable CUDA device or driver exits 1
// with a message saying so; any CUDA/cuBLAS/NCCL/MPI failure exits 1 naming host, rank, file:line.
#include <mpi.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "common/args.h"
#include "common/context.h"
#include "common/errors.h"
#include "common/output_file.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_rank_runner.h"
#include "runtime/cuda/emulated_communicator.h"
#include "runtime/cuda/nccl_communicator.h"
#include "runtime/worker_common.h"
#include "program/plan.h"
#include "sim/profile_cost_model.h"

using namespace fsdpsim;

namespace {

const std::vector<OptionSpec> kOptions = runtime::worker_options("param_dtype bf16, fp32 masters", {
    {"emulate-world", true, false,
     "run as rank 0 of a W-rank job on this one GPU: true shard sizes and buffers, collectives replaced by local "
     "copies (memory, compute and streams real; communication not); without mpirun", "W"},
    {"pad-cluster", true, false,
     "with --emulate-world: after each collective's local copy, delay its stream by the collective's predicted "
     "duration on this cluster (name or file; its GPU count must be W), so communication overlaps compute", "C"},
    {"pad-profile", true, false, "with --pad-cluster: the hardware profile of the delays (default: the cluster's built-in one)",
     "FILE"},
});

constexpr const char* kProg = "fsdpsim-run-cuda";

void finalize_mpi() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
}


runtime::RunConfig config_from(const Args& a, int world) {
  runtime::RunConfig cfg = runtime::worker_config(a, world);
  cfg.address_space = 1LL << 50;   // capped by the free device memory
  runtime::cuda::check_cuda_runtime_supports(cfg.model, cfg.plan);
  return cfg;
}

// --pad-cluster / --pad-profile: each collective's predicted duration (the simulator's cost model), 0 for
// every other op. Checked before any GPU work (exit 2 on bad input).
void check_padding_options(const Args& a, int emulate_world) {
  if (a.has("pad-profile") && !a.has("pad-cluster"))
    throw InputError("--pad-profile", a.get("pad-profile"), "only with --pad-cluster");
  if (!a.has("pad-cluster")) return;
  if (emulate_world <= 0) throw InputError("--pad-cluster", a.get("pad-cluster"), "only with --emulate-world");
  const calibrate::Cluster c = calibrate::load_cluster(a.get("pad-cluster"), "--pad-cluster");
  if (c.world() != emulate_world)
    throw InputError("--pad-cluster", a.get("pad-cluster"),
                     "a cluster of " + std::to_string(emulate_world) + " GPUs (--emulate-world), not " + std::to_string(c.world()));
  if (a.has("pad-profile")) calibrate::HardwareProfile::from_file(a.get("pad-profile"), c, "--pad-profile");
}

std::vector<TimeNs> collective_delays(const Args& a, const sim::StepProgram& program, int world) {
  const calibrate::Cluster c = calibrate::load_cluster(a.get("pad-cluster"), "--pad-cluster");
  if (c.world() != world) throw std::logic_error("collective_delays: cluster size changed");
  const calibrate::HardwareProfile hw = a.has("pad-profile") ? calibrate::HardwareProfile::from_file(a.get("pad-profile"), c, "--pad-profile")
                                                             : calibrate::HardwareProfile::for_cluster(c);
  const sim::ProfileCostModel cost(hw);
  std::vector<TimeNs> ns(program.ops.size(), 0);
  for (const sim::Op& op : program.ops)
    if (op.kind == sim::OpKind::AllGather || op.kind == sim::OpKind::ReduceScatter || op.kind == sim::OpKind::AllReduce)
      ns[op.id] = cost.op_time(op);
  return ns;
}

int run(const Args& a, const runtime::RunConfig& cfg, bool mpi, int emulate_world) {
  const int steps = static_cast<int>(a.get_int("steps", 3, 1, 100000));
  std::unique_ptr<runtime::cuda::DeviceCommunicator> owned;
  if (emulate_world > 0) owned = std::make_unique<runtime::cuda::EmulatedCommunicator>(emulate_world, cfg.plan.mesh_shard);
  else owned = std::make_unique<runtime::cuda::NcclCommunicator>(cfg.plan.mesh_shard, mpi);
  runtime::cuda::DeviceCommunicator& comm = *owned;
  runtime::cuda::CudaRankRunner runner(cfg, comm);
  if (a.has("pad-cluster")) runner.pad_collectives(collective_delays(a, runner.program(), comm.world()));
  nlohmann::json fields;
  cudaDeviceProp prop;
  int dev = 0;
  FSDPSIM_CUDA_CHECK(cudaGetDevice(&dev));
  FSDPSIM_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  fields["backend"] = "cuda+nccl";
  fields["device"] = prop.name;
  if (comm.emulated()) fields["emulated_world"] = comm.world();
  if (a.has("pad-cluster"))
    fields["collectives_padded"] = {{"cluster", a.get("pad-cluster")}, {"profile", a.get("pad-profile", "built-in")},
                                    {"how", "after each collective's local copy its stream waits the predicted duration"}};
  runtime::run_worker_steps(a, runner, comm, steps, std::move(fields));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  run_context().argv.assign(argv, argv + argc);
  const bool mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  int world = 1, rank = 0;
  try {
    Args a(args, kOptions);
    if (a.help()) {
      std::cout << usage_text(kProg, "one rank of the bundled FSDP runtime (CUDA + NCCL backend)", kOptions);
      return 0;
    }
    if (mpi) {
      int provided = 0;
      MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
      MPI_Comm_size(MPI_COMM_WORLD, &world);
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    }
    ::fsdpsim::set_check_rank(rank);
    const int emulate = static_cast<int>(a.get_int("emulate-world", 0, 1, 1 << 20));
    if (emulate > 0 && mpi)
      throw InputError("--emulate-world", std::to_string(emulate), "only without mpirun (one process emulates rank 0)");
    const runtime::RunConfig cfg = config_from(a, emulate > 0 ? emulate : world);
    check_padding_options(a, emulate);
    a.require("out");   // checked before the device is touched
    const std::string why = runtime::cuda::no_device_reason();
    if (!why.empty()) {
      std::cerr << kProg << ": no CUDA device/driver usable on " << ::fsdpsim::check_where() << " (" << why
                << "). Run it on a machine with an NVIDIA GPU and its driver, or use --backend cpu.\n";
      finalize_mpi();
      return 1;
    }
    int ndev = 0;
    FSDPSIM_CUDA_CHECK(cudaGetDeviceCount(&ndev));
    const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    FSDPSIM_CUDA_CHECK(cudaSetDevice((lr ? std::atoi(lr) : 0) % ndev));
    const int rc = run(a, cfg, mpi, emulate);
    finalize_mpi();
    return rc;
  } catch (const InputError& e) {
    if (rank == 0) std::cerr << kProg << ": error: " << e.what() << "\n";
    finalize_mpi();
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << kProg << ": rank " << rank << ": internal error: " << e.what() << "\n";
    int init = 0;
    MPI_Initialized(&init);
    if (init) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

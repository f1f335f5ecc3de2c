// fsdpsim-calibrate-cuda: measures a hardware profile on this machine's NVIDIA GPUs. NCCL
// collective sweeps (nccl-tests style) for every group size 2..N (all local GPUs in one process,
// or one GPU per rank under mpirun across nodes), cuBLAS bf16 GEMMs at the model's shapes, HBM
// bandwidth, launch overhead, PCIe, the context size, and a GEMM's slowdown while an all-gather
// runs. Without a GPU it says so and exits 1. Rank 0 writes the profile (atomically, context first).
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <set>
#include <sstream>

#include "calibrate/builtin_profiles.h"
#include "calibrate/cuda/cublas_gemm.h"
#include "calibrate/cuda/kernels.h"
#include "calibrate/cuda/nccl_harness.h"
#include "calibrate/launch_queue.h"
#include "calibrate/sourced_value.h"
#include "calibrate/sweep.h"
#include "common/args.h"
#include "common/context.h"
#include "common/errors.h"
#include "common/output_file.h"

namespace fsdpsim::calibrate::cuda {
namespace {

const std::vector<OptionSpec> kOptions = {
    {"out", true, false, "where to write the profile JSON (default cuda-profile.json)", "FILE"},
    {"quick", false, false, "short sweep (4 KiB..256 MiB)"},
    {"max-bytes", true, false, "largest collective size in bytes (default 1 GiB)", "N"},
    {"gemm-shapes", true, false, "comma-separated MxNxK GEMM shapes to measure (the model's)", "LIST"},
    {"attention", true, false, "SEQxHEAD_DIM of the model's attention (recorded in the context)", "SxD"},
};

struct Shape { std::int64_t m, n, k; };

std::vector<Shape> parse_shapes(const std::string& s) {
  std::vector<Shape> out;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    long long m = 0, n = 0, k = 0;
    char x1 = 0, x2 = 0;
    std::istringstream ts(tok);
    if (!(ts >> m >> x1 >> n >> x2 >> k) || x1 != 'x' || x2 != 'x' || m < 1 || n < 1 || k < 1 || !ts.eof() ||
        m * k > (1LL << 30) || k * n > (1LL << 30) || m * n > (1LL << 30))
      throw InputError("--gemm-shapes", "\"" + tok + "\"", "expected MxNxK with positive sizes (each operand < 2^30 elements)");
    out.push_back({m, n, k});
  }
  return out;
}

// The CPU cost of one eager PyTorch op (overheads.kernel_launch_ns): the built-in profile's fitted value (module
// Python, dispatch and the launch, scripts/fit_cpu_issue.py), which calibration cannot measure without PyTorch; the
// bare cudaLaunchKernel measured here, a small part of it, is named in the source.
nlohmann::json eager_op_cpu(const nlohmann::json& builtin, double bare_launch_ns) {
  nlohmann::json v = builtin["overheads"]["kernel_launch_ns"];
  v["source"] = v["source"].get<std::string>() + " (from the built-in profile; this host's bare cudaLaunchKernel measured " +
                std::to_string(std::lround(bare_launch_ns)) + " ns)";
  return v;
}

// The built-in profile for this GPU (by its CUDA name), or "" if none matches.
std::string builtin_match(const cudaDeviceProp& p) {
  std::string n = p.name;
  double gib = static_cast<double>(p.totalGlobalMem) / static_cast<double>(kGiB);
  if (n.find("H100") != std::string::npos) return "H100-SXM";
  if (n.find("H200") != std::string::npos) return "H200";
  if (n.find("B200") != std::string::npos) return "B200";
  if (n.find("A100") != std::string::npos) return gib > 60 ? "A100-80GB" : "A100-40GB";
  // GeForce RTX 4090 (AD102, 128 SMs); the 4090 D (114 SMs) and the 4090 Laptop GPU (AD103, 76 SMs)
  // also carry "4090" in their names but not the RTX4090 profile's peaks.
  if (n.find("4090") != std::string::npos && p.multiProcessorCount == 128) return "RTX4090";
  return "";
}

double elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  FSDPSIM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

int run(int argc, char** argv, bool mpi) {
  int rank = 0, world = 1;
  if (mpi) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
  }
  Args args(std::vector<std::string>(argv + 1, argv + argc), kOptions);
  if (args.help()) {
    if (rank == 0) std::cout << usage_text("fsdpsim-calibrate-cuda", "Measure a CUDA + NCCL hardware profile.", kOptions);
    return 0;
  }
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    std::cerr << "fsdpsim-calibrate-cuda: no CUDA device available on " << ::fsdpsim::check_where() << " ("
              << (e != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e) : std::string("0 devices"))
              << "). Run it on a machine with NVIDIA GPUs and a driver, or use `fsdpsim calibrate --backend cpu`.\n";
    return 1;
  }
  bool quick = args.has("quick");
  std::string out = args.get("out", "cuda-profile.json");
  SweepOptions so;
  so.max_bytes = args.get_int("max-bytes", quick ? 256 * kMiB : kGiB, 4 * kKiB, 64 * kGiB);
  std::vector<Shape> shapes = {{4096, 4096, 4096}, {8192, 8192, 8192}};
  if (quick) shapes = {{4096, 4096, 4096}};
  if (args.has("gemm-shapes"))
    for (auto s : parse_shapes(args.get("gemm-shapes"))) shapes.push_back(s);

  // Topology: one process with every local GPU (no MPI needed), or one GPU per MPI rank.
  int local_rank = 0, leader = 0, node_id = 0;
  std::vector<int> node_of(world, 0);
  if (mpi) {
    MPI_Comm node_comm;
    FSDPSIM_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm));
    MPI_Comm_rank(node_comm, &local_rank);
    leader = local_rank == 0 ? 1 : 0;
    FSDPSIM_MPI_CHECK(MPI_Exscan(&leader, &node_id, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (rank == 0) node_id = 0;
    FSDPSIM_MPI_CHECK(MPI_Bcast(&node_id, 1, MPI_INT, 0, node_comm));
    FSDPSIM_MPI_CHECK(MPI_Allgather(&node_id, 1, MPI_INT, node_of.data(), 1, MPI_INT, MPI_COMM_WORLD));
  }
  int device = world > 1 ? local_rank % ndev : 0;
  FSDPSIM_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop;
  FSDPSIM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int hl = 0;
  if (mpi) MPI_Get_processor_name(host, &hl);
  else gethostname(host, sizeof(host) - 1);
  bool tty = isatty(2) == 1;

  std::vector<SweepResult> sweeps;
  bool all_ok = true;
  int max_group = world > 1 ? world : ndev;
  NcclGroup overlap_group;   // the largest group, kept for the overlap measurement
  for (int n = 2; n <= max_group; ++n) {
    NcclGroup g;
    if (world > 1) {
      MPI_Comm gc;
      FSDPSIM_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank < n ? 0 : MPI_UNDEFINED, rank, &gc));
      if (gc == MPI_COMM_NULL) {
        FSDPSIM_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        continue;
      }
      std::set<int> nodes(node_of.begin(), node_of.begin() + n);
      g = make_mpi_group(gc, device, static_cast<int>(nodes.size()));
    } else {
      g = make_local_group(n);
    }
    for (const NcclCollective* c : {&nccl_all_gather(), &nccl_reduce_scatter(), &nccl_all_reduce()}) {
      auto last = std::chrono::steady_clock::now();
      SweepResult r = run_nccl_sweep(*c, g, so, host, [&](const SweepResult& rr, const SweepPoint& p) {
        auto now = std::chrono::steady_clock::now();
        if (tty || now - last > std::chrono::seconds(5)) std::cerr << format_sweep_row(rr, p), last = now;
      });
      for (const auto& p : r.points) all_ok = all_ok && p.check_ok;
      if (rank == 0) {
        std::cout << format_sweep_header(r);
        for (const auto& p : r.points) std::cout << format_sweep_row(r, p);
      }
      sweeps.push_back(std::move(r));
    }
    if (n == max_group) overlap_group = std::move(g);
    else g.destroy();
    if (world > 1) FSDPSIM_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  }
  MPI_Comm all = world > 1 ? MPI_COMM_WORLD : MPI_COMM_NULL;

  // Compute on this rank's GPU (every rank at once).
  FSDPSIM_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t s;
  FSDPSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t blas;
  FSDPSIM_CUBLAS_CHECK(cublasCreate(&blas));
  std::vector<MeasuredGemm> gemms;
  double best = 0;
  Shape best_shape{0, 0, 0};
  for (const auto& sh : shapes) {
    GemmBench b(sh.m, sh.n, sh.k, blas, s);
    double flops = 2.0 * sh.m * sh.n * sh.k;
    int reps = static_cast<int>(std::clamp(2e13 / flops, 3.0, 50.0));
    double t = max_over(b.time_ns(reps), all);
    bool ok = max_over(b.check() ? 0.0 : 1.0, all) == 0.0;
    all_ok = all_ok && ok;
    gemms.push_back({sh.m, sh.n, sh.k, "bf16", t});
    if (flops / t > best) best = flops / t * 1e9, best_shape = sh;
    if (rank == 0) std::printf("# cuBLAS bf16 %lldx%lldx%lld: %.1f us, %.1f TFLOP/s%s\n", (long long)sh.m, (long long)sh.n,
                               (long long)sh.k, t / 1e3, flops / t / 1e3, ok ? "" : "  WRONG RESULT");
  }
  // HBM: a 1 GiB device copy (read + write), mean of 10.
  void *src = nullptr, *dst = nullptr;
  const std::size_t copy_bytes = kGiB;
  FSDPSIM_CUDA_CHECK(cudaMalloc(&src, copy_bytes));
  FSDPSIM_CUDA_CHECK(cudaMalloc(&dst, copy_bytes));
  cudaEvent_t e0, e1;
  FSDPSIM_CUDA_CHECK(cudaEventCreate(&e0));
  FSDPSIM_CUDA_CHECK(cudaEventCreate(&e1));
  launch_copy(src, dst, copy_bytes, s);
  FSDPSIM_CUDA_CHECK(cudaEventRecord(e0, s));
  for (int i = 0; i < 10; ++i) launch_copy(src, dst, copy_bytes, s);
  FSDPSIM_CUDA_CHECK(cudaEventRecord(e1, s));
  FSDPSIM_CUDA_CHECK(cudaEventSynchronize(e1));
  FSDPSIM_CUDA_CHECK(cudaGetLastError());
  double hbm_bw = 2.0 * copy_bytes / (max_over(elapsed_ms(e0, e1) / 10, all) * 1e-3);
  // Launch overhead (CPU side) and the minimum kernel time (GPU side) of an empty kernel.
  const int launches = 10000;
  FSDPSIM_CUDA_CHECK(cudaStreamSynchronize(s));
  auto c0 = std::chrono::steady_clock::now();
  for (int i = 0; i < launches; ++i) launch_empty(s);
  double launch_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - c0).count() / launches;
  FSDPSIM_CUDA_CHECK(cudaStreamSynchronize(s));
  FSDPSIM_CUDA_CHECK(cudaEventRecord(e0, s));
  launch_empty(s);
  FSDPSIM_CUDA_CHECK(cudaEventRecord(e1, s));
  FSDPSIM_CUDA_CHECK(cudaEventSynchronize(e1));
  double min_kernel_ns = max_over(elapsed_ms(e0, e1) * 1e6, all);
  launch_ns = max_over(launch_ns, all);
  // PCIe: pinned host -> device, 256 MiB.
  void* pinned = nullptr;
  FSDPSIM_CUDA_CHECK(cudaMallocHost(&pinned, 256 * kMiB));
  FSDPSIM_CUDA_CHECK(cudaEventRecord(e0, s));
  for (int i = 0; i < 4; ++i) FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(dst, pinned, 256 * kMiB, cudaMemcpyHostToDevice, s));
  FSDPSIM_CUDA_CHECK(cudaEventRecord(e1, s));
  FSDPSIM_CUDA_CHECK(cudaEventSynchronize(e1));
  double pcie_bw = 4.0 * 256 * kMiB / (max_over(elapsed_ms(e0, e1), all) * 1e-3);
  FSDPSIM_CUDA_CHECK(cudaFreeHost(pinned));
  FSDPSIM_CUDA_CHECK(cudaFree(src));
  FSDPSIM_CUDA_CHECK(cudaFree(dst));
  // Overlap: an 8192^3 GEMM alone and while all-gathers of 256 MiB run on the NCCL stream.
  double slowdown = 0;
  if (!overlap_group.local.empty()) {
    GemmBench b(8192, 8192, 8192, blas, s);
    double alone = b.time_ns(5);
    std::size_t count = 256 * kMiB / 2 / overlap_group.size;
    auto& l0 = overlap_group.local[0];
    if (l0.buf_bytes < 256 * kMiB) throw std::runtime_error("overlap buffer smaller than 256 MiB: run without --max-bytes below it");
    for (int i = 0; i < 40; ++i) {   // enqueue enough all-gathers to outlast the GEMMs
      FSDPSIM_NCCL_CHECK(ncclGroupStart());
      for (auto& l : overlap_group.local) {
        FSDPSIM_CUDA_CHECK(cudaSetDevice(l.device));
        nccl_all_gather().run(l.buf, count, l.rank, l.comm, l.stream);
      }
      FSDPSIM_NCCL_CHECK(ncclGroupEnd());
    }
    FSDPSIM_CUDA_CHECK(cudaSetDevice(device));
    double busy = b.time_ns(5);
    for (auto& l : overlap_group.local) {
      FSDPSIM_CUDA_CHECK(cudaSetDevice(l.device));
      FSDPSIM_CUDA_CHECK(cudaStreamSynchronize(l.stream));
    }
    FSDPSIM_CUDA_CHECK(cudaSetDevice(device));
    slowdown = std::max(1.0, max_over(busy, all) / max_over(alone, all));
  }
  // Memory: what is left to the caching allocator with the CUDA context and NCCL communicators up.
  std::size_t free_b = 0, total_b = 0;
  FSDPSIM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  double context_gib = static_cast<double>(total_b - free_b) / static_cast<double>(kGiB);
  overlap_group.destroy();
  if (!all_ok) throw std::runtime_error("a correctness check failed (see WRONG above); no profile written");
  if (rank != 0) return 0;

  std::string match = builtin_match(prop);
  nlohmann::json base = match.empty() ? nlohmann::json() : builtin_gpu_json(match, "gpu");
  std::string where_txt = std::string("measured by fsdpsim-calibrate-cuda on ") + host + " (" + prop.name + ")";
  auto m = [&](double v, const std::string& what) { return sourced(v, "measured: " + what + "; " + where_txt); };
  nlohmann::json gpu = {{"schema", "fsdpsim.gpu_profile/1"}, {"name", match.empty() ? std::string(prop.name) : match},
                        {"kind", "gpu"}, {"description", std::string(prop.name) + ", " + where_txt},
                        {"default_intra_node", match.empty() ? "PCIe4" : base["default_intra_node"].get<std::string>()}};
  if (!match.empty()) gpu["peak_flops"] = base["peak_flops"];
  else gpu["peak_flops"] = {{"bf16", m(best, "no datasheet entry for this GPU: the best cuBLAS bf16 rate stands for the peak")}};
  char shape_txt[96];
  std::snprintf(shape_txt, sizeof(shape_txt), "%lldx%lldx%lld", (long long)best_shape.m, (long long)best_shape.n, (long long)best_shape.k);
  nlohmann::json mamf = m(best, std::string("best cuBLAS bf16 GEMM rate (") + shape_txt + ")");
  mamf["m"] = best_shape.m, mamf["n"] = best_shape.n, mamf["k"] = best_shape.k, mamf["dtype"] = "bf16";
  gpu["gemm"] = {{"mamf", mamf}, {"sm_count", m(prop.multiProcessorCount, "cudaDeviceProp.multiProcessorCount")},
                 {"tile_m", sourced(128, "assumption: a 128x128 output tile per CTA for wave quantization")},
                 {"tile_n", sourced(128, "assumption: see tile_m")},
                 {"k_half", sourced(64, "assumption: K at which the K loop runs at half efficiency")},
                 {"min_kernel_ns", m(std::round(min_kernel_ns), "CUDA-event time of one empty kernel")}};
  gpu["attention"] = match.empty()
      ? nlohmann::json{{"fwd_efficiency", sourced(0.5 * best / gpu["peak_flops"]["bf16"]["value"].get<double>(),
                                                  "assumption: half the measured GEMM efficiency (no flash-attention kernel in the CUDA toolkit to time)")},
                       {"bwd_efficiency", sourced(0.4 * best / gpu["peak_flops"]["bf16"]["value"].get<double>(),
                                                  "assumption: 0.4x the measured GEMM efficiency")}}
      : base["attention"];
  gpu["hbm"] = {{"bandwidth_bytes_per_s", m(hbm_bw, "16-byte vectorized device copy of 1 GiB, bytes read + written per second")},
                {"efficiency", sourced(1.0, "the bandwidth above is already achieved")}};
  gpu["overheads"] = {
      {"kernel_launch_ns", eager_op_cpu(match.empty() ? builtin_gpu_json("H100-SXM", "gpu") : base, launch_ns)},
      {"runtime_launch_ns", sourced(std::round(launch_ns) + 4000, "measured bare cudaLaunchKernel CPU cost (" +
                                                                      std::to_string(std::lround(launch_ns)) +
                                                                      " ns) + 4 us of the bundled runtime's C++ per op (assumption); " + where_txt)},
      {"framework_hook_ns", match.empty() ? sourced(50000, "assumption: one FSDP Python hook (fsdp-semantics.md D6)") : base["overheads"]["framework_hook_ns"]},
      {"launch_queue_depth", match.empty() || !base["overheads"].contains("launch_queue_depth")
                                 ? sourced(calibrate::kDefaultLaunchQueueDepth, "assumption, not measured here: calibrate/launch_queue.h")
                                 : base["overheads"]["launch_queue_depth"]},
      {"comm_overlap_slowdown", slowdown > 0 ? m(slowdown, "8192^3 bf16 GEMM while 256 MiB all-gathers run vs alone")
                                : (match.empty() ? sourced(1.14, "assumption: N5 SM-share estimate (one GPU: nothing to overlap with)") : base["overheads"]["comm_overlap_slowdown"])}};
  gpu["memory"] = {{"capacity_gib", m(static_cast<double>(total_b) / static_cast<double>(kGiB) - context_gib,
                                      "cudaMemGetInfo total minus what the CUDA context and NCCL communicators hold")},
                   {"cuda_context_gib", m(context_gib, "cudaMemGetInfo total - free with the context, cuBLAS and NCCL communicators up, no buffers")}};
  // The host memory and its bandwidth (not measured here): the built-in GPU's node figures, or an
  // assumed per-rank CPU optimizer bandwidth for a GPU without a built-in profile.
  gpu["host"] = match.empty() ? nlohmann::json{{"cpu_memory_bandwidth_bytes_per_s",
                                                sourced(100e9, "assumption: effective host DRAM bandwidth of a 2-socket server")}}
                              : base["host"];
  gpu["host"]["pcie_bytes_per_s"] = m(pcie_bw, "pinned host-to-device cudaMemcpyAsync, 4 x 256 MiB");
  gpu["host"]["pcie_efficiency"] = sourced(1.0, "the bandwidth above is already achieved");
  nlohmann::json ctx = context_block_with_profile("");
  int drv = 0, rt = 0, nccl_v = 0, blas_v = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  ncclGetVersion(&nccl_v);
  cublasGetVersion(blas, &blas_v);
  ctx["backend"] = "cuda";
  ctx["gpu"] = prop.name;
  ctx["gpus_per_process"] = world > 1 ? 1 : ndev;
  ctx["ranks"] = world;
  ctx["cuda_driver_version"] = drv;
  ctx["cuda_runtime_version"] = rt;
  ctx["nccl_version"] = nccl_v;
  ctx["cublas_version"] = blas_v;
  ctx["attention_shape"] = args.get("attention", "");
  ctx["quick"] = quick;
  nlohmann::json doc = make_profile_document(std::string(prop.name) + " x" + std::to_string(max_group) + " (" + host + ")", ctx, gpu,
                                             sweeps, gemms, "measured: cublasGemmEx bf16, fp32 accumulation, CUDA events, mean; " + where_txt);
  if (!sweeps.empty()) doc["intra_node"] = measured_intra_fabric(sweeps, "measured-" + gpu["default_intra_node"].get<std::string>(), "NVLink", where_txt);
  write_file_atomic(out, doc.dump(2) + "\n", "--out");
  std::cerr << "fsdpsim-calibrate-cuda: wrote " << out << "\n";
  FSDPSIM_CUBLAS_CHECK(cublasDestroy(blas));
  return 0;
}

}  // namespace
}  // namespace fsdpsim::calibrate::cuda

int main(int argc, char** argv) {
  // Under mpirun/srun: one GPU per rank, MPI bootstraps NCCL. Run directly: one process drives every
  // local GPU and MPI is never initialised (a one-GPU machine needs no mpirun or MPI daemons).
  const bool mpi = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE");
  if (mpi) MPI_Init(&argc, &argv);
  int world_rank = 0;
  if (mpi) MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  fsdpsim::set_check_rank(world_rank);   // every failed call names its rank
  fsdpsim::run_context().argv.assign(argv, argv + argc);
  fsdpsim::install_interrupt_handler();
  int rc = 0;
  try {
    rc = fsdpsim::calibrate::cuda::run(argc, argv, mpi);
  } catch (const fsdpsim::InputError& e) {
    std::cerr << "fsdpsim-calibrate-cuda: error: " << e.what() << "\n";
    rc = fsdpsim::kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "fsdpsim-calibrate-cuda: " << e.what() << "\n";
    if (mpi) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  if (mpi) MPI_Finalize();
  return rc;
}

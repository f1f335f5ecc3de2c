// fsdpsim-calibrate-cpu: measures a hardware profile for the CPU + MPI backend of the runtime,
// where each "GPU" is an MPI rank on a CPU. Run under mpirun (fsdpsim calibrate --backend cpu
// launches it): MPI collective sweeps for every group size, OpenBLAS sgemm at the model's shapes,
// memcpy bandwidth, the overlap slowdown; rank 0 writes the profile (atomically, context first).
#include <cblas.h>
#include <mpi.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "calibrate/cpu/blas_gemm.h"
#include "calibrate/cpu/mpi_check.h"
#include "calibrate/cpu/mpi_harness.h"
#include "calibrate/cpu/runtime_kernels.h"
#include "calibrate/sourced_value.h"
#include "calibrate/sweep.h"
#include "common/args.h"
#include "common/context.h"
#include "common/errors.h"
#include "common/output_file.h"
#include "models/kernels.h"
#include "models/zoo.h"
#include "runtime/model/dims.h"
#include "runtime/mpi/mpi_communicator.h"

extern "C" char* openblas_get_config(void);
extern "C" void openblas_set_num_threads(int);

namespace fsdpsim::calibrate::cpu {
namespace {

const std::vector<OptionSpec> kOptions = {
    {"out", true, false, "where to write the profile JSON (default cpu-profile.json)", "FILE"},
    {"quick", false, false, "short sweep (4 KiB..4 MiB, 3 GEMM shapes): about 10 s on 2 cores"},
    {"max-bytes", true, false, "largest collective size in bytes (default 256 MiB; --quick 4 MiB)", "N"},
    {"group-sizes", true, false, "comma-separated group sizes to sweep (default 2..ranks)", "LIST"},
    {"gemm-shapes", true, false, "comma-separated MxNxK GEMM shapes to measure (e.g. the model's)", "LIST"},
    {"attention", true, false, "SEQxHEAD_DIM of the attention-like GEMM (default 512x64)", "SxD"},
    {"threads-per-rank", true, false, "OpenBLAS threads per rank (default cores / local ranks)", "N"},
    {"idle-collectives", false, false, "sweep collectives on idle ranks (default: while each rank's compute thread "
                                       "runs sgemms, as the CPU runtime overlaps them)"},
    {"mpi-collectives", false, false, "sweep the blocking MPI collectives (default: the CPU runtime's own "
                                      "communicator, non-blocking and polled, as `fsdpsim run` executes them)"},
    {"model", true, false, "time the CPU runtime's own kernels and GEMMs (with their transposes) at this model's "
                           "shapes (zoo name or config.json)", "M"},
    {"micro-batch", true, false, "micro-batch of the model's shapes (default 1)", "B"},
    {"seq-len", true, false, "sequence length of the model's shapes (default 2048)", "S"},
};

// A measured GEMM as the runtime issues it (runtime/layers/matmul.cpp): forward NT (beta 0), dgrad NN
// and wgrad TN (both accumulate: beta 1).
struct Role {
  bool trans_a = false, trans_b = false;
  float beta = 0.0f;
};

struct Shape {
  std::int64_t m, n, k;
  Role role{};
};

// The model's GEMMs (one block, the head) with the role each plays, deduplicated by shape.
std::vector<Shape> model_gemms(const models::ModelSpec& m, std::int64_t b, std::int64_t s) {
  std::vector<Shape> out;
  for (auto part : {models::ModulePart::Block, models::ModulePart::FinalNormAndHead}) {
    auto ks = models::forward_kernels(m, part, b, s, Dtype::FP32);
    auto bw = models::backward_kernels(m, part, b, s, Dtype::FP32, true);
    ks.insert(ks.end(), bw.begin(), bw.end());
    for (const auto& k : ks) {
      if (k.kind != models::KernelKind::Gemm) continue;
      const bool dgrad = k.name.size() > 6 && k.name.compare(k.name.size() - 6, 6, "_dgrad") == 0;
      const bool wgrad = k.name.size() > 6 && k.name.compare(k.name.size() - 6, 6, "_wgrad") == 0;
      Role r = dgrad ? Role{false, false, 1.0f} : wgrad ? Role{true, false, 1.0f} : Role{false, true, 0.0f};
      bool seen = false;
      for (const auto& o : out) seen |= o.m == k.m && o.n == k.n && o.k == k.k;
      if (!seen) out.push_back({k.m, k.n, k.k, r});
    }
  }
  return out;
}

std::vector<std::int64_t> parse_int_list(const std::string& s, const std::string& field, char sep) {
  std::vector<std::int64_t> out;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, sep)) {
    try {
      size_t used = 0;
      long long v = std::stoll(tok, &used);
      if (used != tok.size() || v < 1 || v > (1LL << 31)) throw std::invalid_argument("range");
      out.push_back(v);
    } catch (const std::exception&) {
      throw InputError(field, "\"" + s + "\"", "expected positive integers separated by '" + std::string(1, sep) + "'");
    }
  }
  if (out.empty()) throw InputError(field, "\"" + s + "\"", "expected at least one value");
  return out;
}

std::vector<Shape> parse_shapes(const std::string& s, const std::string& field) {
  std::vector<Shape> out;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    auto v = parse_int_list(tok, field, 'x');
    if (v.size() != 3) throw InputError(field, "\"" + tok + "\"", "expected MxNxK");
    if (v[0] * v[1] > (1LL << 28) || v[1] * v[2] > (1LL << 28) || v[0] * v[2] > (1LL << 28))
      throw InputError(field, "\"" + tok + "\"", "each operand must stay below 2^28 elements (1 GiB fp32)");
    out.push_back({v[0], v[1], v[2], {}});
  }
  return out;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// Progress on rank 0: every row on a terminal, otherwise a line at most every 5 seconds.
class Progress {
 public:
  void row(const SweepResult& r, const SweepPoint& p) {
    if (tty_) {
      std::cerr << format_sweep_row(r, p);
      return;
    }
    auto now = std::chrono::steady_clock::now();
    if (now - last_ > std::chrono::seconds(5)) {
      last_ = now;
      std::cerr << "fsdpsim-calibrate-cpu: " << collective_name(r.op) << " on " << r.group_size << " ranks, "
                << p.bytes << " bytes done\n";
    }
  }
  bool tty() const { return tty_; }

 private:
  bool tty_ = isatty(2) == 1;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// A fitted bus bandwidth below kMinFraction of this machine's memcpy bandwidth cannot be a real
// shared-memory transport: it comes from sweeps taken while the ranks were starved (e.g. two
// calibrations at once). Say so instead of writing it silently.
constexpr double kMinFraction = 0.01;
void check_fitted_bandwidths(const nlohmann::json& fabric, double memcpy_bw, std::vector<std::string>& warnings) {
  for (const char* op : {"all_gather", "reduce_scatter", "all_reduce"}) {
    const double bw = fabric["busbw_bytes_per_s"][op]["value"].get<double>();
    if (bw < kMinFraction * memcpy_bw) {
      char line[240];
      std::snprintf(line, sizeof line, "fitted %s bus bandwidth %.3f GB/s is below %.0f%% of the memcpy bandwidth "
                    "(%.2f GB/s): its sweep is not trustworthy", op, bw / 1e9, 100 * kMinFraction, memcpy_bw / 1e9);
      warnings.push_back(line);
    }
  }
}

int run(int argc, char** argv, int thread_level) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  Args args(std::vector<std::string>(argv + 1, argv + argc), kOptions);
  if (args.help()) {
    if (rank == 0)
      std::cout << usage_text("fsdpsim-calibrate-cpu", "Measure a CPU + MPI hardware profile (run under mpirun).", kOptions);
    return 0;
  }
  if (world < 2) throw InputError("mpirun -np", std::to_string(world), "needs at least 2 ranks (collectives)");
  bool quick = args.has("quick");
  std::string out = args.get("out", "cpu-profile.json");
  SweepOptions so;
  so.max_bytes = args.get_int("max-bytes", quick ? 4 * kMiB : 256 * kMiB, 4 * kKiB, 4 * kGiB);
  so.iter_budget_bytes = quick ? 16 * kMiB : 1 * kGiB;   // caps timed iterations for big sizes
  so.warmup_iters = quick ? 2 : 5;
  so.iters = quick ? 10 : 20;
  std::vector<std::int64_t> groups;
  if (args.has("group-sizes")) {
    groups = parse_int_list(args.get("group-sizes"), "--group-sizes", ',');
    for (auto g : groups)
      if (g < 2 || g > world) throw InputError("--group-sizes", std::to_string(g), "each must be in [2, " + std::to_string(world) + "]");
  } else {
    for (int g = 2; g <= world; ++g) groups.push_back(g);
  }
  std::vector<Shape> shapes = quick ? std::vector<Shape>{{128, 128, 128, {}}, {256, 256, 256, {}}, {512, 512, 512, {}}}
                                    : std::vector<Shape>{{128, 128, 128, {}}, {256, 256, 256, {}}, {512, 512, 512, {}},
                                                         {1024, 1024, 1024, {}}};
  if (args.has("gemm-shapes"))
    for (auto s : parse_shapes(args.get("gemm-shapes"), "--gemm-shapes")) shapes.push_back(s);
  std::optional<models::ModelSpec> model;
  std::int64_t model_mb = args.get_int("micro-batch", 1, 1, 4096), model_seq = args.get_int("seq-len", 2048, 1, 1 << 20);
  if (args.has("model")) {
    model = models::load_model(args.get("model"), "--model");
    runtime::runtime_dims(*model, model_mb, model_seq);   // InputError if the CPU runtime cannot run it
    for (const auto& g : model_gemms(*model, model_mb, model_seq)) shapes.push_back(g);
  }
  auto att = parse_int_list(args.get("attention", "512x64"), "--attention", 'x');
  if (att.size() != 2 || att[0] > 16384 || att[1] > 1024) throw InputError("--attention", args.get("attention"), "expected SEQxHEAD_DIM");

  // Ranks per node and hosts.
  MPI_Comm node_comm;
  FSDPSIM_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm));
  int local = 1, node_rank = 0;
  MPI_Comm_size(node_comm, &local);
  MPI_Comm_rank(node_comm, &node_rank);
  int leader = node_rank == 0 ? 1 : 0, node_id = 0;
  FSDPSIM_MPI_CHECK(MPI_Exscan(&leader, &node_id, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  if (rank == 0) node_id = 0;
  FSDPSIM_MPI_CHECK(MPI_Bcast(&node_id, 1, MPI_INT, 0, node_comm));
  std::vector<int> node_of(world);
  FSDPSIM_MPI_CHECK(MPI_Allgather(&node_id, 1, MPI_INT, node_of.data(), 1, MPI_INT, MPI_COMM_WORLD));
  int nodes = *std::max_element(node_of.begin(), node_of.end()) + 1;
  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int hl = 0;
  MPI_Get_processor_name(host, &hl);
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = static_cast<int>(args.get_int("threads-per-rank", std::max(1, cores / local), 1, 1024));
  openblas_set_num_threads(threads);

  Progress progress;
  std::vector<std::string> warnings;   // suspect measurements: printed, and kept in the profile's context
  std::vector<SweepResult> sweeps;
  bool all_ok = true;
  // The CPU runtime overlaps its collectives with compute on the same cores (FSDP's prefetch and
  // reduce-scatter run on their own stream threads): measure them that way unless asked not to.
  const bool busy = !args.has("idle-collectives");
  std::optional<BackgroundCompute> background;
  if (busy) background.emplace(256);
  // The runtime's communicator forms shard groups of contiguous ranks over the whole world, so with it
  // only group sizes dividing the world are swept, every group at once (as in training).
  const bool runtime_comm = !args.has("mpi-collectives");
  for (auto g : groups) {
    if (runtime_comm && world % g != 0) {
      if (rank == 0) std::cerr << "fsdpsim-calibrate-cpu: group size " << g << " does not divide " << world << " ranks: skipped\n";
      continue;
    }
    MPI_Comm gc;
    FSDPSIM_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, runtime_comm ? static_cast<int>(rank / g) : rank < g ? 0 : MPI_UNDEFINED,
                                     rank, &gc));
    std::optional<runtime::MpiCommunicator> rt;
    if (runtime_comm) rt.emplace(static_cast<int>(g));
    if (gc != MPI_COMM_NULL) {
      std::set<int> gnodes(node_of.begin(), node_of.begin() + g);
      MpiGroup grp{gc, rank % static_cast<int>(g), static_cast<int>(g), static_cast<int>(gnodes.size())};
      MPI_Comm_rank(gc, &grp.rank);
      std::vector<float> tmp;
      for (const MpiCollective* c : {&mpi_all_gather(), &mpi_reduce_scatter(), &mpi_all_reduce()}) {
        if (rank == 0 && progress.tty()) std::cerr << format_sweep_header(SweepResult{c->op, grp.size, grp.nodes, "fp32", "", {}});
        // The runtime's calls with the harness's in-place buffer semantics (mpi_collective.h).
        const Transport transport = [&, op = c->op](float* buf, std::size_t count) {
          const auto n = static_cast<std::int64_t>(count);
          if (op == CollectiveOp::AllGather) {
            rt->all_gather(buf + grp.rank * n, buf, n, sim::CommGroup::Shard);
          } else if (op == CollectiveOp::ReduceScatter) {
            tmp.resize(count);
            rt->reduce_scatter(buf, tmp.data(), n, sim::CommGroup::Shard, runtime::ReduceOp::Sum);
            std::memcpy(buf, tmp.data(), sizeof(float) * count);
          } else {
            rt->all_reduce(buf, n, sim::CommGroup::Shard, runtime::ReduceOp::Sum);
          }
        };
        SweepResult r = run_mpi_sweep(*c, grp, so, host, [&](const SweepResult& rr, const SweepPoint& p) { progress.row(rr, p); },
                                      &warnings, runtime_comm ? &transport : nullptr);
        for (const auto& p : r.points) all_ok = all_ok && p.check_ok;
        if (rank == 0) {
          std::cout << format_sweep_header(r);
          for (const auto& p : r.points) std::cout << format_sweep_row(r, p);
        }
        sweeps.push_back(std::move(r));
      }
      FSDPSIM_MPI_CHECK(MPI_Comm_free(&gc));
    }
    FSDPSIM_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  }

  background.reset();
  if (busy)
    for (auto& r : sweeps)
      r.source += "; measured while a thread of every rank ran 256^3 sgemms (the runtime's compute overlapping its "
                  "collectives)";
  // Compute: every rank at once, as in training, unless the node has more ranks than cores (then one rank
  // at a time, times the ranks per core: see ComputeTiming).
  const ComputeTiming ct{local > cores, std::max(1.0, static_cast<double>(local) / cores)};
  std::vector<MeasuredGemm> gemms;
  double best = 0;
  Shape best_shape{0, 0, 0};
  for (const auto& s : shapes) {
    double flops = 2.0 * s.m * s.n * s.k;
    int reps = static_cast<int>(std::clamp(2e9 / flops, 3.0, 20.0));
    GemmTiming t = time_sgemm(s.m, s.n, s.k, reps, MPI_COMM_WORLD, s.role.trans_a, s.role.trans_b, s.role.beta, ct);
    all_ok = all_ok && t.check_ok;
    gemms.push_back({s.m, s.n, s.k, "fp32", t.time_ns});
    double rate = flops / (t.time_ns * 1e-9);
    if (rate > best) best = rate, best_shape = s;
    if (rank == 0)
      std::printf("# sgemm %lldx%lldx%lld: %.1f us, %.2f GFLOP/s%s\n", (long long)s.m, (long long)s.n, (long long)s.k,
                  t.time_ns / 1e3, rate / 1e9, t.check_ok ? "" : "  WRONG RESULT");
  }
  GemmTiming att_t = time_sgemm(att[0], att[0], att[1], 5, MPI_COMM_WORLD, false, false, 0.0f, ct);
  double att_eff = std::min(1.0, 2.0 * att[0] * att[0] * att[1] / (att_t.time_ns * 1e-9) / best);
  GemmTiming tiny = time_sgemm(1, 1, 1, 2000, MPI_COMM_WORLD);
  double mem_bw = memcpy_bandwidth(quick ? 16 * kMiB : 64 * kMiB, quick ? 5 : 10, MPI_COMM_WORLD);
  // The overlap slowdown with the runtime's own collectives (MpiCommunicator: non-blocking, polled with
  // short sleeps, the reduce-scatter's sum on the calling thread): an all-gather and a reduce-scatter of
  // 1 Mi floats per rank, back to back, over the whole world.
  double slow = 0;
  {
    runtime::MpiCommunicator wc(world);
    const std::int64_t count = 1 << 20;
    std::vector<float> gather(static_cast<size_t>(count) * world, 1.0f), scatter_in(gather.size(), 1.0f),
        scatter_out(static_cast<size_t>(count));
    const auto one_collective = [&] {
      wc.all_gather(gather.data() + static_cast<std::int64_t>(wc.group_rank(sim::CommGroup::Shard)) * count, gather.data(), count, sim::CommGroup::Shard);
      wc.reduce_scatter(scatter_in.data(), scatter_out.data(), count, sim::CommGroup::Shard, runtime::ReduceOp::Sum);
    };
    slow = overlap_slowdown(256, quick ? 0.1 : 0.4, MPI_COMM_WORLD, thread_level >= MPI_THREAD_MULTIPLE, one_collective);
  }
  // The runtime's own non-GEMM kernels at the model's shapes (attention, norms, rotary, SwiGLU,
  // cross-entropy, embedding, residual adds, AdamW, copies of one block's parameters).
  std::optional<RuntimeKernelRates> rk;
  if (model) {
    const std::int64_t copy_bytes = models::count_params(*model).per_block * 4;
    rk = time_runtime_kernels(*model, model_mb, model_seq, best, std::round(tiny.time_ns), copy_bytes, quick ? 3 : 7,
                              MPI_COMM_WORLD, ct);
    if (rank == 0)
      for (const auto& l : rk->lines) std::printf("# runtime kernel %s\n", l.c_str());
  }
  if (!all_ok) throw std::runtime_error("a correctness check failed (see WRONG in the tables above); no profile written");
  if (rank != 0) return 0;

  struct sysinfo si;
  sysinfo(&si);
  double host_gib = static_cast<double>(si.totalram) * si.mem_unit / static_cast<double>(kGiB);
  std::string where = std::string("measured by fsdpsim-calibrate-cpu on ") + host + " (" + cpu_model() + ", " +
                      std::to_string(world) + " ranks, " + std::to_string(threads) + " OpenBLAS thread(s) per rank)";
  char shape_txt[96];
  std::snprintf(shape_txt, sizeof(shape_txt), "%lldx%lldx%lld", (long long)best_shape.m, (long long)best_shape.n, (long long)best_shape.k);
  nlohmann::json gpu = {
      {"schema", "fsdpsim.gpu_profile/1"}, {"name", "CPU"}, {"kind", "cpu"}, {"default_intra_node", "SHM"},
      {"description", "a CPU rank of the CPU + MPI backend; " + where}};
  gpu["peak_flops"] = {
      {"fp32", sourced(best, "measured: the best cblas_sgemm rate over the measured shapes (" + std::string(shape_txt) + "), all ranks at once; " + where)},
      {"bf16", sourced(best, "the CPU backend computes in fp32: bf16 maps to the measured fp32 sgemm rate")},
      {"fp16", sourced(best, "the CPU backend computes in fp32: fp16 maps to the measured fp32 sgemm rate")}};
  nlohmann::json mamf = sourced(best, "measured: best sgemm rate (" + std::string(shape_txt) + "); " + where);
  mamf["m"] = best_shape.m, mamf["n"] = best_shape.n, mamf["k"] = best_shape.k, mamf["dtype"] = "fp32";
  gpu["gemm"] = {{"mamf", mamf},
                 {"sm_count", sourced(1, "CPU: no wave quantization is modelled")},
                 {"tile_m", sourced(1, "CPU: no wave quantization is modelled")},
                 {"tile_n", sourced(1, "CPU: no wave quantization is modelled")},
                 {"k_half", sourced(0, "CPU: no K-loop prologue is modelled; unmeasured shapes run at the best measured rate")},
                 {"min_kernel_ns", sourced(std::round(tiny.time_ns), "measured: typical time of a 1x1x1 cblas_sgemm call (the median of the calls within 1.5x the fastest); " + where)}};
  std::string att_src = "measured: sgemm rate at the attention-score shape " + std::to_string(att[0]) + "x" +
                        std::to_string(att[0]) + "x" + std::to_string(att[1]) + " relative to the best rate; " + where;
  gpu["attention"] = {{"fwd_efficiency", sourced(att_eff, att_src)}, {"bwd_efficiency", sourced(att_eff, att_src)}};
  if (rk) {
    char shape[160];
    std::snprintf(shape, sizeof shape, "%s at micro-batch %lld x seq %lld", args.get("model").c_str(),
                  static_cast<long long>(model_mb), static_cast<long long>(model_seq));
    const std::string rsrc = std::string("measured: the CPU runtime's own kernels (runtime/layers) at ") + shape + "; " + where;
    gpu["attention"] = {
        {"fwd_efficiency", sourced(rk->attn_fwd_eff, "measured: runtime attention_forward's executed causal FLOPs / "
                                                     "(time x the fp32 peak above), " + rsrc)},
        {"bwd_efficiency", sourced(rk->attn_bwd_eff, "measured: runtime attention_backward (2.5x the forward's FLOPs) "
                                                     "/ (time x the fp32 peak above), " + rsrc)}};
    nlohmann::json ew = nlohmann::json::object();
    for (int c = 0; c < kMemoryClasses; ++c)
      if (rk->class_bw[c] > 0)
        ew[memory_class_name(static_cast<MemoryClass>(c))] =
            sourced(rk->class_bw[c], std::string("measured: bytes the simulator's kernel list gives the class / time of "
                                                 "the runtime's calls doing that work, ") + rsrc);
    gpu["elementwise_bytes_per_s"] = ew;
  }
  std::string bw_src = "measured: memcpy bandwidth (bytes read + written per second, slowest rank, all ranks at once); " + where;
  gpu["hbm"] = {{"bandwidth_bytes_per_s", sourced(mem_bw, bw_src)}, {"efficiency", sourced(1.0, "the bandwidth above is already achieved, not peak")}};
  gpu["overheads"] = {
      {"kernel_launch_ns", sourced(std::round(tiny.time_ns), "measured: typical time of a 1x1x1 cblas_sgemm call (a C++ call, no Python; the median of the calls within 1.5x the fastest); " + where)},
      {"framework_hook_ns", sourced(0, "the CPU runtime is C++: no Python FSDP hooks")},
      {"launch_queue_depth", sourced(0, "the CPU runtime's stream threads take ops from unbounded queues "
                                        "(runtime/cpu/stream_executor.cpp): 0, no launch-queue bound")},
      {"comm_overlap_slowdown",
       slow > 0 ? sourced(slow, "measured: mean time of a 256^3 sgemm while another thread of every rank loops the runtime's all-gather and reduce-scatter (4 MiB per rank) vs alone; " + where)
                : sourced(1.0, "not measured: the MPI library does not provide MPI_THREAD_MULTIPLE")}};
  gpu["memory"] = {{"capacity_gib", sourced(host_gib, "measured: host memory (sysinfo totalram) on " + std::string(host))},
                   {"shared_by_ranks_of_a_node", sourced(1, "CPU ranks of a node share the host memory: capacity per rank = host / ranks per node")},
                   {"cuda_context_gib", sourced(0, "CPU backend: no CUDA context")}};
  gpu["host"] = {{"pcie_bytes_per_s", sourced(mem_bw, "CPU backend: 'host copies' are memcpy; " + bw_src)},
                 {"pcie_efficiency", sourced(1.0, "the bandwidth above is already achieved")},
                 {"cpu_memory_bandwidth_bytes_per_s", sourced(mem_bw, bw_src)}};

  nlohmann::json ctx = context_block_with_profile("");
  char mpi_ver[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int vl = 0;
  MPI_Get_library_version(mpi_ver, &vl);
  std::string mv(mpi_ver);
  ctx["backend"] = "cpu";
  ctx["ranks"] = world;
  ctx["nodes"] = nodes;
  ctx["cpu"] = cpu_model();
  ctx["cores"] = cores;
  ctx["openblas_threads_per_rank"] = threads;
  ctx["blas"] = std::string(openblas_get_config());
  ctx["mpi"] = mv.substr(0, mv.find('\n'));
  ctx["quick"] = quick;
  nlohmann::json doc = make_profile_document("CPU x" + std::to_string(world) + " (" + host + ")", ctx, gpu, sweeps, gemms,
                                             "measured: cblas_sgemm fp32 row-major with the runtime's transposes, max over ranks of each rank's typical call (the median of its calls within 1.5x its fastest); " + where);
  doc["intra_node"] = measured_intra_fabric(sweeps, "SHM", "PCI", where);
  check_fitted_bandwidths(doc["intra_node"], mem_bw, warnings);
  for (const auto& w : warnings) std::cerr << "fsdpsim-calibrate-cpu: WARNING: " << w << "\n";
  doc["context"]["calibration_warnings"] = warnings;
  write_file_atomic(out, doc.dump(2) + "\n", "--out");
  if (!warnings.empty())
    std::cerr << "fsdpsim-calibrate-cpu: " << warnings.size() << " warning(s) above, also in the profile's "
              << "context.calibration_warnings: was the machine busy (another calibration or build)? Calibrate again "
              << "on a quiet machine for trustworthy numbers\n";
  std::cerr << "fsdpsim-calibrate-cpu: wrote " << out << "\n";
  return 0;
}

}  // namespace
}  // namespace fsdpsim::calibrate::cpu

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  fsdpsim::set_check_rank(world_rank);   // every failed call names its rank
  fsdpsim::run_context().argv.assign(argv, argv + argc);   // the command line goes into the context block
  fsdpsim::install_interrupt_handler();
  int rc = 0;
  try {
    rc = fsdpsim::calibrate::cpu::run(argc, argv, provided);
  } catch (const fsdpsim::InputError& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::cerr << "fsdpsim-calibrate-cpu: error: " << e.what() << "\n";
    rc = fsdpsim::kExitBadInput;   // every rank parses the same arguments and fails the same way
  } catch (const std::exception& e) {
    std::cerr << "fsdpsim-calibrate-cpu: " << fsdpsim::check_where() << ": " << e.what() << "\n";
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}

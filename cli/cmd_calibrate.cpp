// fsdpsim calibrate --backend cuda|cpu [--model M --micro-batch B --seq-len S] [--out FILE]
//                   [--ranks N] [--quick] [--max-bytes N]
// Runs the calibration program of the backend (calibrate/launcher.h): fsdpsim-calibrate-cpu under
// mpirun, or fsdpsim-calibrate-cuda. With --model, the GEMM and attention shapes the model will run
// (models::forward_kernels / backward_kernels of one block and the head) are measured too; the CPU
// calibrator also times the CPU runtime's own kernels at those shapes.
#include <iostream>
#include <set>
#include <sstream>
#include <tuple>

#include "calibrate/launcher.h"
#include "cli/commands.h"
#include "common/args.h"
#include "common/errors.h"
#include "models/kernels.h"
#include "models/zoo.h"

namespace fsdpsim::cli {
namespace {

const std::vector<OptionSpec> kOptions = {
    {"backend", true, false, "cuda (cuBLAS + NCCL on this machine's GPUs) or cpu (OpenBLAS + MPI ranks)", "cuda|cpu"},
    {"model", true, false, "also measure this model's GEMM/attention shapes (zoo name or config.json)", "M"},
    {"micro-batch", true, false, "micro-batch size for the model's shapes (default 1)", "B"},
    {"seq-len", true, false, "sequence length for the model's shapes (default 2048)", "S"},
    {"out", true, false, "profile JSON to write (default <backend>-profile.json)", "FILE"},
    {"ranks", true, false, "MPI ranks (cpu: default 2; cuda: >1 runs one GPU per rank under mpirun)", "N"},
    {"quick", false, false, "short sweeps (CPU: ~10 s on 2 cores; CUDA: up to 256 MiB)"},
    {"max-bytes", true, false, "largest collective size in bytes", "N"},
};

// "MxNxK,..." of the model's GEMMs (deduplicated) and "SxD" of its attention.
std::pair<std::string, std::string> model_shapes(const Args& a, Dtype dtype) {
  models::ModelSpec m = models::load_model(a.get("model"), "--model");
  std::int64_t b = a.get_int("micro-batch", 1, 1, 4096), s = a.get_int("seq-len", 2048, 1, 1 << 20);
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> gemms;
  std::string attention;
  for (auto part : {models::ModulePart::Block, models::ModulePart::FinalNormAndHead}) {
    auto ks = models::forward_kernels(m, part, b, s, dtype);
    auto bw = models::backward_kernels(m, part, b, s, dtype, true);
    ks.insert(ks.end(), bw.begin(), bw.end());
    for (const auto& k : ks) {
      if (k.kind == models::KernelKind::Gemm) gemms.insert({k.m, k.n, k.k});
      if (k.kind == models::KernelKind::Attention && attention.empty())
        attention = std::to_string(k.seq) + "x" + std::to_string(k.head_dim);
    }
  }
  std::ostringstream os;
  for (const auto& [gm, gn, gk] : gemms) os << (os.tellp() > 0 ? "," : "") << gm << "x" << gn << "x" << gk;
  return {os.str(), attention};
}

}  // namespace

int cmd_calibrate(const Argv& argv) {
  Args a(argv, kOptions);
  if (a.help()) {
    std::cout << usage_text("calibrate", "Measure collectives and kernels on this machine; write a hardware profile "
                                         "(load it with --profile FILE).", kOptions);
    return 0;
  }
  calibrate::LaunchRequest r;
  r.backend = a.require("backend");
  if (r.backend != "cpu" && r.backend != "cuda") throw InputError("--backend", "\"" + r.backend + "\"", "expected cuda or cpu");
  r.ranks = static_cast<int>(a.get_int("ranks", r.backend == "cpu" ? 2 : 1, 1, 4096));
  if (r.backend == "cpu" && r.ranks < 2) throw InputError("--ranks", std::to_string(r.ranks), "the CPU calibration needs >= 2 ranks");
  r.exe_dir = calibrate::self_executable_dir();
  r.args = {"--out", a.get("out", r.backend + "-profile.json")};
  if (a.has("quick")) r.args.push_back("--quick");
  if (a.has("max-bytes")) r.args.insert(r.args.end(), {"--max-bytes", std::to_string(a.get_int("max-bytes", 0, 4096, 1LL << 40))});
  if (a.has("model") && r.backend == "cpu") {
    // The CPU calibrator loads the model itself: it times the runtime's own kernels and the GEMMs with the
    // transposes the runtime uses at the model's shapes (calibrate/cpu/runtime_kernels.h).
    models::load_model(a.get("model"), "--model");   // a bad name fails here, before mpirun
    r.args.insert(r.args.end(), {"--model", a.get("model"), "--micro-batch", std::to_string(a.get_int("micro-batch", 1, 1, 4096)),
                                 "--seq-len", std::to_string(a.get_int("seq-len", 2048, 1, 1 << 20))});
  } else if (a.has("model")) {
    auto [gemms, attention] = model_shapes(a, Dtype::BF16);
    if (!gemms.empty()) r.args.insert(r.args.end(), {"--gemm-shapes", gemms});
    if (!attention.empty()) r.args.insert(r.args.end(), {"--attention", attention});
  } else if (a.has("micro-batch") || a.has("seq-len")) {
    throw InputError("--model", "<missing>", "--micro-batch and --seq-len describe a model's shapes: give --model too");
  }
  auto cmd = calibrate::calibration_command(r);
  std::cerr << "fsdpsim calibrate: running";
  for (const auto& c : cmd) std::cerr << " " << c;
  std::cerr << "\n";
  int rc = calibrate::run_command(cmd);
  if (rc != 0) std::cerr << "fsdpsim calibrate: the " << r.backend << " calibration failed (exit " << rc << ")\n";
  return rc;
}

}  // namespace fsdpsim::cli

// Development-set check of the built-in profiles: simulate the MosaicML llm-foundry throughput rows
// of published-dev-set.jsonl (MPT models, FSDP FULL_SHARD / SHARD_GRAD_OP, Composer + torch 2.1,
// i.e. FSDP1) on the built-in H100 / A100 profiles, and print the error of tokens/s/GPU per row and
// the MAPE per GPU type, on the FIT subset (seq_len 2048 and <= 64 GPUs) and on the held-out rest.
//   calibrate_devset_llm_foundry [path/to/published-dev-set.jsonl] [--csv] [--sustained X] [--fit]
// --sustained X: override the profiles' gemm.sustained_fraction (1 = burst micro-benchmark rates).
// --fit: search the sustained fraction per GPU chip (H100, A100) on the FIT subset only.
// Assumptions, printed with the results: H100 rows (interconnect not stated) run on IB-NDR400,
// 8 NICs/node; A100 rows on RoCE-200G x 8 ("1600 Gbps node-node RoCE"); amp_bf16 = bf16 params,
// fp32 reduce (Composer's DEFAULT mixed precision of that era, marked uncertain in the data);
// fp8 rows are skipped (Transformer Engine layers are not modelled).
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>

#include "calibrate/hardware_profile.h"
#include "common/errors.h"
#include "models/zoo.h"
#include "sim/simulator.h"

using namespace fsdpsim;

namespace {

struct Row {
  std::string gpu, chip, cluster, model, strategy;
  std::int64_t seq = 0, mb = 0, ga = 1;
  int gpus = 0, per_node = 0;
  bool ac = false, fit = false;
  double measured = 0;
};

// The built-in profile of the row's cluster, with the sustained fraction overridden if asked.
calibrate::HardwareProfile profile(const Row& r, std::optional<double> sustained) {
  calibrate::Cluster c = calibrate::load_cluster(r.cluster);
  auto p = calibrate::HardwareProfile::for_cluster(c);
  if (!sustained) return p;
  nlohmann::json j = p.to_json();
  j["gpu"]["gemm"]["sustained_fraction"] = {{"value", *sustained}, {"source", "devset override"}};
  std::string path = "/tmp/fsdpsim_devset_profile_" + r.gpu + ".json";
  std::ofstream(path) << j.dump();
  return calibrate::HardwareProfile::from_file(path, c);
}

double simulate(const Row& r, const calibrate::HardwareProfile& hw, double* mfu) {
  auto model = models::with_seq_len(models::load_model(r.model), r.seq);
  nlohmann::json pj = {{"fsdp_version", 1}, {"sharding_strategy", r.strategy}, {"micro_batch", r.mb}, {"seq_len", r.seq},
                       {"grad_accum", r.ga}, {"param_dtype", "bf16"}, {"reduce_dtype", "fp32"},
                       {"activation_checkpointing", r.ac ? "full" : "none"}};
  sim::Plan plan = sim::resolve_plan(sim::parse_plan(pj), r.gpus, r.per_node);
  sim::SimOptions opts;
  opts.record_trace = false;
  opts.record_memory_timeline = false;
  auto res = sim::simulate(model, hw, plan, opts);
  if (mfu) *mfu = res.mfu;
  return res.tokens_per_s_per_gpu;
}

// Mean absolute percentage error over rows of `chip` ("" = all) in `subset` (0 fit, 1 held out, 2 all).
double mape(const std::vector<Row>& rows, const std::string& chip, int subset, std::optional<double> s) {
  double sum = 0;
  int n = 0;
  for (const auto& r : rows) {
    if ((!chip.empty() && r.chip != chip) || (subset == 0 && !r.fit) || (subset == 1 && r.fit)) continue;
    sum += std::fabs(simulate(r, profile(r, s), nullptr) - r.measured) / r.measured;
    ++n;
  }
  return n ? 100 * sum / n : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = std::string(FSDPSIM_SOURCE_DIR) + "/../shared/data/published-dev-set.jsonl";
  bool csv = false, fit = false;
  std::optional<double> sustained;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--csv") csv = true;
    else if (a == "--fit") fit = true;
    else if (a == "--sustained" && i + 1 < argc) sustained = std::stod(argv[++i]);
    else path = a;
  }
  std::ifstream in(path);
  if (!in) {
    std::cerr << "cannot read " << path << "\n";
    return 2;
  }
  std::vector<Row> rows;
  std::string line;
  int skipped = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.value("source", "").find("llm-foundry") == std::string::npos) continue;
    std::string gpu_txt = j["hardware"]["gpu"], prec = j["precision"].value("composer_precision", "");
    if (prec.find("fp8") != std::string::npos) {
      ++skipped;
      continue;
    }
    Row r;
    r.gpus = j["hardware"]["gpu_count"];
    r.per_node = std::min(r.gpus, 8);
    int nodes = std::max(1, r.gpus / 8);
    r.gpu = gpu_txt == "H100 80GB" ? "H100-SXM" : gpu_txt == "A100 80GB" ? "A100-80GB" : "A100-40GB";
    r.chip = r.gpu == "H100-SXM" ? "H100" : "A100";
    std::string fabric = r.gpu == "H100-SXM" ? "IB-NDR400" : "RoCE-200G";
    r.cluster = nodes > 1 ? std::to_string(nodes) + "x" + std::to_string(r.per_node) + "x" + r.gpu + "-" + fabric
                          : std::to_string(r.per_node) + "x" + r.gpu;
    r.model = j["model"]["name"];
    for (auto& ch : r.model) ch = static_cast<char>(std::tolower(ch));
    r.seq = j["seq_len"], r.mb = j["micro_batch"], r.ga = j.value("grad_accum", 1);
    r.strategy = j["parallelism"]["strategy"];
    r.ac = j["activation_checkpointing"].get<std::string>().rfind("full", 0) == 0;
    r.measured = j["metrics"]["tokens_per_sec_per_gpu"];
    r.fit = r.seq == 2048 && r.gpus <= 64;
    try {
      simulate(r, profile(r, std::nullopt), nullptr);
      rows.push_back(r);
    } catch (const std::exception& e) {
      ++skipped;
      std::printf("%-10s %-9s %6lld %5d: not simulated: %s\n", r.gpu.c_str(), r.model.c_str(), (long long)r.seq, r.gpus, e.what());
    }
  }
  std::map<std::string, std::optional<double>> chosen = {{"H100", sustained}, {"A100", sustained}};
  if (fit) {
    for (const char* chip : {"H100", "A100"}) {
      double best = 1e300, best_s = 1.0;
      for (int k = 40; k <= 100; ++k) {
        double e = mape(rows, chip, 0, k / 100.0);
        if (e < best) best = e, best_s = k / 100.0;
      }
      chosen[chip] = best_s;
      std::printf("fit %s: sustained_fraction = %.2f (MAPE %.1f%% on the fit subset)\n", chip, best_s, best);
    }
  }
  std::printf("%-10s %-9s %6s %5s %4s %3s %-13s %-4s %-4s %10s %10s %8s %6s\n", "gpu", "model", "seq", "gpus", "mb", "ga",
              "strategy", "AC", "set", "measured", "simulated", "err%", "mfu");
  std::map<std::string, std::array<std::pair<double, int>, 2>> acc;
  for (const auto& r : rows) {
    double mfu = 0;
    double sim_tps = simulate(r, profile(r, chosen[r.chip]), &mfu);
    double err = (sim_tps - r.measured) / r.measured;
    auto& a = acc[r.gpu][r.fit ? 0 : 1];
    a.first += std::fabs(err), a.second += 1;
    std::printf(csv ? "%s,%s,%lld,%d,%lld,%lld,%s,%s,%s,%.0f,%.0f,%.1f,%.3f\n"
                    : "%-10s %-9s %6lld %5d %4lld %3lld %-13s %-4s %-4s %10.0f %10.0f %8.1f %6.3f\n",
                r.gpu.c_str(), r.model.c_str(), (long long)r.seq, r.gpus, (long long)r.mb, (long long)r.ga, r.strategy.c_str(),
                r.ac ? "full" : "none", r.fit ? "fit" : "held", r.measured, sim_tps, 100 * err, mfu);
  }
  std::printf("\nMAPE of tokens/s/GPU (%s):\n", fit ? "sustained fraction fitted on the fit subset" :
                                                sustained ? "sustained fraction overridden" : "built-in profiles as shipped");
  for (const auto& [g, a] : acc) {
    int n = a[0].second + a[1].second;
    std::printf("  %-10s fit subset %5.1f%% (%d rows)   held out %5.1f%% (%d rows)   all %5.1f%% (%d rows)\n", g.c_str(),
                a[0].second ? 100 * a[0].first / a[0].second : 0.0, a[0].second,
                a[1].second ? 100 * a[1].first / a[1].second : 0.0, a[1].second, 100 * (a[0].first + a[1].first) / n, n);
  }
  std::printf("  skipped: %d rows (fp8 or not simulable); fit subset = seq_len 2048 and <= 64 GPUs\n", skipped);
  return 0;
}

// Development-set check of the built-in profiles: simulate the MosaicML llm-foundry throughput rows
// of published-dev-set.jsonl (MPT models, FSDP FULL_SHARD / SHARD_GRAD_OP, Composer + torch 2.1,
// i.e. FSDP1) on the built-in H100 / A100 profiles, and print the error of tokens/s/GPU per row and
// the MAPE per GPU type, on the FIT subset and on the held-out rest. The FIT subset holds out whole
// models: it is the rows of MPT-125m, -760m, -3b, -13b and -70b on <= 64 GPUs (every sequence length);
// MPT-350m, -1b, -7b, -30b and every run on > 64 GPUs are never used for fitting.
//   calibrate_devset_llm_foundry [path/to/published-dev-set.jsonl] [--csv] [--sustained X] [--attention F] [--fit]
//                                [--check PCT] [--check-ac-bias PCT]
// --sustained X: override the profiles' gemm.sustained_fraction (1 = burst micro-benchmark rates).
// --attention F: multiply the profiles' attention fwd/bwd efficiencies by F.
// --check PCT: exit 1 unless every GPU type's MAPE (all rows) is <= PCT (the CTest regression check
//        runs it on tests/calibrate/data/llm_foundry_devset.jsonl, a copy of the llm-foundry rows).
// --check-ac-bias PCT: with --check, also exit 1 unless the mean signed error of the full-AC rows is within +-PCT.
// --fit: search, per GPU type (H100-SXM, A100-40GB, A100-80GB: each has its own profile), the sustained
//        fraction and (where the fit subset has sequences longer than 2048) the attention factor minimizing
//        MAPE on the FIT subset only (a 0.04 x 0.10 grid, then 0.01 x 0.02 around its best point). The printed
//        values times the profiles' values before the fit are what the built-in profiles carry
//        (calibrate/profiles/gpus/*.json; the attention factor multiplies the shipped efficiencies).
// Assumptions, printed with the results: H100 rows (interconnect not stated) run on IB-NDR400,
// 8 NICs/node; A100 rows on RoCE-200G x 8 ("1600 Gbps node-node RoCE"); amp_bf16 = bf16 params,
// fp32 reduce (Composer's DEFAULT mixed precision of that era, marked uncertain in the data);
// fp8 rows are skipped (Transformer Engine layers are not modelled). Composer reduces gradients every
// micro-batch under FSDP (its ddp_sync_context only applies no_sync to DDP): grad_sync true; llm-foundry's
// models default to loss_fn fused_crossentropy (flash-attn's CrossEntropyLoss): cross_entropy "fused".
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "calibrate/hardware_profile.h"
#include "common/errors.h"
#include "models/zoo.h"
#include "sim/accuracy.h"
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

// What the harness may override in a built-in profile: the sustained fraction of burst GEMM and
// attention rates, and a factor on the attention efficiencies (fwd and bwd together).
struct Override {
  std::optional<double> sustained, attention;
};

// The built-in profile of the row's cluster, with the overrides applied.
calibrate::HardwareProfile profile(const Row& r, const Override& o) {
  calibrate::Cluster c = calibrate::load_cluster(r.cluster);
  auto p = calibrate::HardwareProfile::for_cluster(c);
  if (!o.sustained && !o.attention) return p;
  nlohmann::json j = p.to_json();
  if (o.sustained) j["gpu"]["gemm"]["sustained_fraction"] = {{"value", *o.sustained}, {"source", "devset override"}};
  if (o.attention) {
    for (const char* k : {"fwd_efficiency", "bwd_efficiency"}) {
      double v = j["gpu"]["attention"][k]["value"];
      j["gpu"]["attention"][k] = {{"value", v * *o.attention}, {"source", "devset override"}};
    }
  }
  return calibrate::HardwareProfile::from_json(j, "devset override of " + r.gpu, c);
}

// Per-row details of a simulation for the table.
struct Detail {
  double mfu = 0;
  bool fits = true;
  double peak_gib = 0;   // peak reserved + context
};

double simulate(const Row& r, const calibrate::HardwareProfile& hw, Detail* detail) {
  auto model = models::with_seq_len(models::load_model(r.model), r.seq);
  nlohmann::json pj = {{"fsdp_version", 1}, {"sharding_strategy", r.strategy}, {"micro_batch", r.mb}, {"seq_len", r.seq},
                       {"grad_accum", r.ga}, {"grad_sync", true}, {"cross_entropy", "fused"}, {"param_dtype", "bf16"}, {"reduce_dtype", "fp32"},
                       {"activation_checkpointing", r.ac ? "full" : "none"}};
  sim::Plan plan = sim::resolve_plan(sim::parse_plan(pj), r.gpus, r.per_node);
  sim::SimOptions opts;
  opts.record_trace = false;
  opts.record_memory_timeline = false;
  auto res = sim::simulate(model, hw, plan, opts);
  if (detail) {
    detail->mfu = res.mfu;
    detail->fits = res.fits;
    detail->peak_gib = static_cast<double>(res.peak_total_device) / (1024.0 * 1024 * 1024);
  }
  return res.tokens_per_s_per_gpu;
}

// Mean absolute percentage error over rows of `chip` ("" = all) in `subset` (0 fit, 1 held out, 2 all).
double mape(const std::vector<Row>& rows, const std::string& gpu, int subset, const Override& s) {
  double sum = 0;
  int n = 0;
  for (const auto& r : rows) {
    if ((!gpu.empty() && r.gpu != gpu) || (subset == 0 && !r.fit) || (subset == 1 && r.fit)) continue;
    sum += std::fabs(simulate(r, profile(r, s), nullptr) - r.measured) / r.measured;
    ++n;
  }
  return n ? 100 * sum / n : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = std::string(FSDPSIM_SOURCE_DIR) + "/../shared/data/published-dev-set.jsonl";
  bool csv = false, fit = false;
  std::optional<double> sustained, attention, check, check_ac_bias;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--csv") csv = true;
    else if (a == "--fit") fit = true;
    else if (a == "--sustained" && i + 1 < argc) sustained = std::stod(argv[++i]);
    else if (a == "--attention" && i + 1 < argc) attention = std::stod(argv[++i]);
    else if (a == "--check" && i + 1 < argc) check = std::stod(argv[++i]);
    else if (a == "--check-ac-bias" && i + 1 < argc) check_ac_bias = std::stod(argv[++i]);
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
    static const std::set<std::string> fit_models = {"mpt-125m", "mpt-760m", "mpt-3b", "mpt-13b", "mpt-70b"};
    r.fit = fit_models.count(r.model) && r.gpus <= 64;
    try {
      simulate(r, profile(r, Override{}), nullptr);
      rows.push_back(r);
    } catch (const std::exception& e) {
      ++skipped;
      std::printf("%-10s %-9s %6lld %5d: not simulated: %s\n", r.gpu.c_str(), r.model.c_str(), (long long)r.seq, r.gpus, e.what());
    }
  }
  // Per GPU type (each has its own profile): H100-SXM, A100-40GB, A100-80GB.
  std::set<std::string> gpus;
  for (const auto& r : rows) gpus.insert(r.gpu);
  std::map<std::string, Override> chosen;
  for (const auto& g : gpus) chosen[g] = {sustained, attention};
  if (fit) {
    for (const auto& g : gpus) {
      // Attention is only identifiable where the fit subset has long sequences.
      bool long_seq = false;
      for (const auto& r : rows) long_seq |= r.gpu == g && r.fit && r.seq > 2048;
      double best = 1e300;
      Override b{1.0, 1.0};
      // Coarse grid, then a finer one around the coarse optimum.
      for (int pass = 0; pass < 2; ++pass) {
        const double s0 = pass == 0 ? 0.40 : *b.sustained - 0.04, s1 = pass == 0 ? 1.00 : *b.sustained + 0.04;
        const double a0 = pass == 0 ? 0.50 : *b.attention - 0.10, a1 = pass == 0 ? 1.50 : *b.attention + 0.10;
        const double sd = pass == 0 ? 0.04 : 0.01, ad = pass == 0 ? 0.10 : 0.02;
        for (int ia = 0; ia <= (long_seq ? static_cast<int>(std::lround((a1 - a0) / ad)) : 0); ++ia)
          for (int is = 0; is <= static_cast<int>(std::lround((s1 - s0) / sd)); ++is) {
            const double k = std::min(1.0, s0 + is * sd), ka = long_seq ? a0 + ia * ad : 1.0;
            Override o{k, ka};
            double e = mape(rows, g, 0, o);
            if (e < best) best = e, b = o;
          }
      }
      chosen[g] = b;
      std::printf("fit %s: sustained_fraction = %.2f, attention efficiencies x %.2f (MAPE %.1f%% on the fit subset)\n",
                  g.c_str(), *b.sustained, *b.attention, best);
    }
  }
  int predicted_oom = 0;
  std::printf("%-10s %-9s %6s %5s %4s %3s %-13s %-4s %-4s %10s %10s %8s %6s %7s\n", "gpu", "model", "seq", "gpus", "mb", "ga",
              "strategy", "AC", "set", "measured", "simulated", "err%", "mfu", "peakGiB");
  std::map<std::string, std::array<std::pair<double, int>, 2>> acc;
  std::array<std::pair<double, int>, 2> ac_bias{};   // signed error sum and rows: [0] no AC, [1] full AC
  for (const auto& r : rows) {
    Detail d;
    double sim_tps = simulate(r, profile(r, chosen[r.gpu]), &d);
    if (!d.fits) ++predicted_oom;
    double err = (sim_tps - r.measured) / r.measured;
    auto& a = acc[r.gpu][r.fit ? 0 : 1];
    a.first += std::fabs(err), a.second += 1;
    ac_bias[r.ac ? 1 : 0].first += err, ac_bias[r.ac ? 1 : 0].second += 1;
    std::printf(csv ? "%s,%s,%lld,%d,%lld,%lld,%s,%s,%s,%.0f,%.0f,%.1f,%.3f,%.1f%s\n"
                    : "%-10s %-9s %6lld %5d %4lld %3lld %-13s %-4s %-4s %10.0f %10.0f %8.1f %6.3f %7.1f%s\n",
                r.gpu.c_str(), r.model.c_str(), (long long)r.seq, r.gpus, (long long)r.mb, (long long)r.ga, r.strategy.c_str(),
                r.ac ? "full" : "none", r.fit ? "fit" : "held", r.measured, sim_tps, 100 * err, d.mfu, d.peak_gib,
                d.fits ? "" : " (predicted OOM)");
  }
  std::printf("\nMAPE of tokens/s/GPU (%s):\n", fit ? "sustained fraction and attention factor fitted on the fit subset" :
                                                (sustained || attention) ? "profile values overridden" : "built-in profiles as shipped");
  for (const auto& [g, a] : acc) {
    int n = a[0].second + a[1].second;
    std::printf("  %-10s fit subset %5.1f%% (%d rows)   held out %5.1f%% (%d rows)   all %5.1f%% (%d rows)\n", g.c_str(),
                a[0].second ? 100 * a[0].first / a[0].second : 0.0, a[0].second,
                a[1].second ? 100 * a[1].first / a[1].second : 0.0, a[1].second, 100 * (a[0].first + a[1].first) / n, n);
  }
  auto bias = [](const std::pair<double, int>& b) { return b.second ? 100 * b.first / b.second : 0.0; };
  std::printf("  mean signed error (bias): full activation checkpointing %+.1f%% (%d rows), none %+.1f%% (%d rows)\n",
              bias(ac_bias[1]), ac_bias[1].second, bias(ac_bias[0]), ac_bias[0].second);
  std::printf("  skipped: %d rows (fp8 or not simulable); fit subset = MPT-125m/760m/3b/13b/70b on <= 64 GPUs\n", skipped);
  std::printf("  rows predicted not to fit in GPU memory (all of them ran): %d of %zu\n", predicted_oom, rows.size());
  if (check) {
    // Regression check (CTest): every GPU type's MAPE over all its rows within the target.
    int failed = 0;
    for (const auto& [g, a] : acc) {
      int n = a[0].second + a[1].second;
      double all = 100 * (a[0].first + a[1].first) / n;
      if (all > *check) std::printf("FAIL: %s MAPE %.1f%% > %.1f%%\n", g.c_str(), all, *check), ++failed;
    }
    if (acc.size() < 3) std::printf("FAIL: expected rows for 3 GPU types, got %zu\n", acc.size()), ++failed;
    // What the outputs state (sim/accuracy.h) is the held-out error measured here, to the printed decimal.
    const auto& held = sim::validation_record().time_held_out;
    if (held.size() != acc.size()) std::printf("FAIL: sim/accuracy.cpp records %zu GPU types\n", held.size()), ++failed;
    for (const sim::TimeRecord& t : held) {
      const auto it = acc.find(t.gpu);
      const auto& h = it == acc.end() ? std::pair<double, int>{0, 0} : it->second[1];
      const double mape = h.second ? h.first / h.second : 0.0;
      if (h.second != t.rows || std::fabs(mape - t.held_out_mape) > 0.0005)
        std::printf("FAIL: sim/accuracy.cpp records %s held out %.1f%% on %d rows, measured %.1f%% on %d: update it\n",
                    t.gpu.c_str(), 100 * t.held_out_mape, t.rows, 100 * mape, h.second), ++failed;
    }
    if (check_ac_bias && std::fabs(bias(ac_bias[1])) > *check_ac_bias)
      std::printf("FAIL: full-AC bias %+.1f%% beyond +-%.1f%%\n", bias(ac_bias[1]), *check_ac_bias), ++failed;
    return failed ? 1 : 0;
  }
  return 0;
}

// Peak-memory prediction error of fsdpsim on the MEMORY records of ../shared/data/published-dev-set-2.jsonl
// (in-tree copy: tests/calibrate/data/published_dev_set_2.jsonl, the records carrying a memory figure).
// Each compared record is simulated with the plan its source implies (the rows of
// devset_published2_rows.cpp, shared with the time report devset_published2.cpp) and its figure compared like with like: torch.cuda.max_memory_allocated with
// fsdpsim's peak allocated, reserved with peak reserved, nvidia-smi with peak_total_device. A figure
// that is a maximum over the whole run is compared with the larger of the first-step and steady-step
// peaks. A report, not a gate: no constant of the simulator is tuned here and no correction applied.
//   calibrate_devset_memory [path/to/published_dev_set_2.jsonl]
// Exit 0 normally, 2 when the data file cannot be read or a record is malformed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "models/zoo.h"
#include "sim/simulator.h"
#include "tests/calibrate/devset_published2_rows.h"

using namespace fsdpsim;

namespace {

using devset::MemoryKind;
using devset::Row;

// The memory figure of a record: value in bytes (or OOM), and the unit's assumption.
struct Figure {
  bool present = false;
  bool oom = false;
  double bytes = 0;
  std::string key, unit;
};

Figure memory_figure(const nlohmann::json& m) {
  Figure f;
  struct K {
    const char* key;
    double scale;
    const char* unit;
  };
  for (const K& k : {K{"max_gpu_ram_gb", 1e9, "GB (1e9)"}, K{"peak_memory_gb", 1e9, "GB (1e9)"},
                     K{"peak_memory_gib", 1073741824.0, "GiB (2^30)"}}) {
    if (!m.contains(k.key)) continue;
    f.present = true;
    f.key = k.key;
    f.unit = k.unit;
    const auto& v = m[k.key];
    if (v.is_string() && v.get<std::string>() == "OOM")
      f.oom = true;
    else if (v.is_number())
      f.bytes = v.get<double>() * k.scale;
    else
      throw std::runtime_error(std::string("metric ") + k.key + " is neither a number nor \"OOM\"");
    return f;
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path =
      argc > 1 ? argv[1] : std::string(FSDPSIM_SOURCE_DIR) + "/tests/calibrate/data/published_dev_set_2.jsonl";
  const std::vector<nlohmann::json> records =
      devset::read_records(path, "calibrate_devset_memory", [](const nlohmann::json& j) { memory_figure(j["metrics"]); });

  std::printf("fsdpsim peak-memory prediction vs published memory records (%s)\n", path.c_str());
  std::printf("Assumptions common to all rows:\n"
              "  - like with like: allocated figure vs fsdpsim peak_allocated, reserved vs peak_reserved, nvidia-smi vs\n"
              "    peak_total_device (reserved + CUDA context); a whole-run maximum vs max(first-step, steady-step) peak\n"
              "  - GB = 1e9 bytes, GiB = 2^30 bytes, per the record's metric key; printed figures in GB (1e9)\n"
              "  - built-in hardware profiles and clusters; no constant tuned, no correction factor\n"
              "  - 'ran' = the source reports a figure (the run completed); OOM rows compare only the fits verdict\n"
              "  - fits = fsdpsim SimResult::fits with SimOptions defaults (memory_margin 0: peak_total_device <= capacity)\n"
              "  - pred rsv = max(first, steady) peak_reserved, printed for reference (torchtune rows: which peak is uncertain)\n\n");
  std::printf("%-7s %-11s %-12s %-44s %-9s %9s %9s %9s %8s %-5s %-4s\n", "id", "model", "cluster", "plan", "kind",
              "meas GB", "pred GB", "pred rsv", "err%", "fits", "ran");

  struct Stat {
    int n = 0;
    double abs_sum = 0;
    int verdict_ok = 0, verdicts = 0;
  };
  std::map<std::string, Stat> per_source;
  std::vector<std::pair<std::string, std::string>> skipped;
  std::vector<std::pair<std::string, std::string>> assumptions;
  for (const auto& j : records) {
    const std::string id = j["id"].get<std::string>();
    const std::string source = j["source"].get<std::string>();
    const Figure fig = memory_figure(j["metrics"]);
    const Row* row = devset::find_row(id);
    if (!row) {
      skipped.push_back({id, fig.present ? "memory record with no mapping in devset_memory.cpp"
                                         : "no per-GPU memory figure in bytes"});
      continue;
    }
    const Row& r = *row;
    if (r.memory_skip) {
      skipped.push_back({id, r.memory_skip});
      continue;
    }
    if (!fig.present) {
      skipped.push_back({id, "mapped, but the record has no memory figure"});
      continue;
    }
    try {
      calibrate::Cluster c = calibrate::load_cluster(r.cluster);
      auto hw = calibrate::HardwareProfile::for_cluster(c);
      const models::ModelSpec model = models::load_model(r.model);
      std::string extra;
      const nlohmann::json pj = devset::row_plan(r, model, /*for_time=*/false, &extra);
      if (!extra.empty()) extra = "; " + extra;
      sim::Plan plan = sim::resolve_plan(sim::load_plan(pj.dump()), c.world(), c.gpus_per_node);
      sim::SimOptions opts;
      opts.record_trace = false;
      opts.record_memory_timeline = false;
      const auto res = sim::simulate(model, hw, plan, opts);
      const double alloc = static_cast<double>(std::max(res.peak_allocated, res.first_step_peak_allocated));
      const double rsv = static_cast<double>(std::max(res.peak_reserved, res.first_step_peak_reserved));
      const double predicted = r.kind == MemoryKind::Allocated ? alloc
                               : r.kind == MemoryKind::Reserved ? rsv
                                                          : rsv + static_cast<double>(res.context_bytes);
      Stat& s = per_source[source];
      const bool ran = !fig.oom;
      s.verdicts++;
      if (res.fits == ran) s.verdict_ok++;
      if (fig.oom) {
        std::printf("%-7s %-11s %-12s %-44s %-9s %9s %9.2f %9.2f %8s %-5s %-4s\n", id.c_str(), r.model, r.cluster,
                    r.summary, devset::memory_kind_name(r.kind), "OOM", predicted / 1e9, rsv / 1e9, "-", res.fits ? "yes" : "NO",
                    "no");
      } else {
        const double err = 100.0 * (predicted - fig.bytes) / fig.bytes;
        s.n++;
        s.abs_sum += std::fabs(err);
        std::printf("%-7s %-11s %-12s %-44s %-9s %9.2f %9.2f %9.2f %+8.1f %-5s %-4s\n", id.c_str(), r.model, r.cluster,
                    r.summary, devset::memory_kind_name(r.kind), fig.bytes / 1e9, predicted / 1e9, rsv / 1e9, err,
                    res.fits ? "yes" : "NO", "yes");
      }
      assumptions.push_back({id, std::string(r.assumes) + "; metric " + fig.key + " in " + fig.unit + extra});
    } catch (const std::exception& e) {
      skipped.push_back({id, std::string("simulation failed: ") + e.what()});
    }
  }

  std::printf("\nPer source (err%% = (predicted - measured) / measured; OOM rows count only in the fits verdicts):\n");
  int compared = 0;
  for (const auto& [src, s] : per_source) {
    compared += s.verdicts;
    std::printf("  %-55s rows %2d  MAE %6.1f%%  fits verdict agrees %d/%d\n", src.c_str(), s.n,
                s.n ? s.abs_sum / s.n : 0.0, s.verdict_ok, s.verdicts);
  }
  std::printf("\nAssumptions per compared row:\n");
  for (const auto& [id, a] : assumptions) std::printf("  %s: %s\n", id.c_str(), a.c_str());
  std::printf("\nSkipped (%zu of %zu records):\n", skipped.size(), records.size());
  for (const auto& [id, why] : skipped) std::printf("  %s: %s\n", id.c_str(), why.c_str());
  std::printf("\nCompared %d of %zu records.\n", compared, records.size());
  return 0;
}

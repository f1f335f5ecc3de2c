// `fsdpsim compare` (note in compare.h).
#include "planner/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "common/errors.h"
#include "planner/explain.h"
#include "planner/search_space.h"

namespace fsdpsim::planner {
namespace {

using nlohmann::json;

// Keys that decide one thing together; a key not listed is a group of its own.
const std::vector<std::pair<std::string, std::vector<std::string>>>& key_groups() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> g = {
      {"sharding layout", {"fsdp_version", "mesh", "sharding_strategy", "reshard_after_forward", "module_overrides", "use_orig_params"}},
      {"precision", {"param_dtype", "reduce_dtype", "master_weights_dtype", "fp8_all_gather", "float8"}},
      {"micro-batch split", {"micro_batch", "grad_accum"}},
      {"prefetch", {"backward_prefetch", "forward_prefetch", "limit_all_gathers", "prefetch_depth"}},
      {"cross_entropy", {"cross_entropy", "cross_entropy_chunks"}},   // the chunk count only with "chunked"
  };
  return g;
}

std::string group_of(const std::string& key) {
  for (const auto& [name, keys] : key_groups())
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) return name;
  return key;
}

std::string value_text(const json& v) { return v.is_null() ? "(default)" : v.is_string() ? v.get<std::string>() : v.dump(); }

std::string num(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// The memory categories that changed most between two results (at their allocated peaks), in words:
// "allocator_slack -2.10 GiB, unsharded_params -0.50 GiB"; "" when nothing moved by 0.05 GiB.
std::string memory_difference_text(const sim::SimResult& a, const sim::SimResult& b) {
  std::map<std::string, Bytes> d;
  for (const auto& [k, v] : b.breakdown_at_peak) d[k] += v;
  for (const auto& [k, v] : a.breakdown_at_peak) d[k] -= v;
  std::vector<std::pair<Bytes, std::string>> moved;
  for (const auto& [k, v] : d)
    if (std::llabs(v) * 20 >= kGiB) moved.emplace_back(std::llabs(v), k);
  std::sort(moved.rbegin(), moved.rend());
  std::string s;
  for (size_t i = 0; i < moved.size() && i < 3; ++i) {
    Bytes v = d[moved[i].second];
    s += (s.empty() ? "" : ", ") + moved[i].second + " " + (v >= 0 ? "+" : "-") + num("%.2f", to_gib(std::llabs(v))) + " GiB";
  }
  return s;
}

}  // namespace

Comparison compare_plans(const calibrate::HardwareProfile& hw, CompareSide a, CompareSide b, double margin,
                         const CompareSimulateFn& simulate) {
  const auto& cl = hw.cluster();
  Comparison c;
  c.margin = margin;
  for (CompareSide* s : {&a, &b}) {
    s->result = simulate(s->plan);
    s->fits_with_margin = memory_verdict(s->result, margin).fits;
  }
  const json ja = sim::plan_to_json(a.plan), jb = sim::plan_to_json(b.plan);
  std::map<std::string, std::vector<std::string>> differing;   // group -> keys
  std::vector<std::string> order;
  for (auto it = jb.begin(); it != jb.end(); ++it) {
    json va = ja.contains(it.key()) ? ja[it.key()] : json(), vb = it.value();
    if (va == vb) continue;
    std::string g = group_of(it.key());
    if (!differing.count(g)) order.push_back(g);
    differing[g].push_back(it.key());
  }
  for (auto it = ja.begin(); it != ja.end(); ++it)
    if (!jb.contains(it.key())) {
      std::string g = group_of(it.key());
      if (!differing.count(g)) order.push_back(g);
      differing[g].push_back(it.key());
    }
  for (const auto& g : order) {
    GroupDiff d;
    d.group = g;
    json mixed = ja;
    for (const auto& k : differing[g]) {
      d.keys.push_back(k + ": " + value_text(ja.contains(k) ? ja[k] : json()) + " -> " + value_text(jb.contains(k) ? jb[k] : json()));
      if (jb.contains(k)) mixed[k] = jb[k];
      else mixed.erase(k);
    }
    try {
      sim::Plan q = sim::resolve_plan(sim::parse_plan(mixed), cl.world(), cl.gpus_per_node);
      d.result = simulate(q);
      d.simulated = true;
      d.fits_with_margin = memory_verdict(d.result, margin).fits;
      d.tokens_gain = a.result.tokens_per_s_per_gpu > 0 ? d.result.tokens_per_s_per_gpu / a.result.tokens_per_s_per_gpu - 1 : 0;
      d.memory_delta = d.result.peak_total_device - a.result.peak_total_device;
      d.why = difference_text(a.result, d.result, a.plan, q);
      const std::string mem = memory_difference_text(a.result, d.result);
      if (!mem.empty()) d.why += "; memory at the peak: " + mem;
      if (q.fsdp_version != a.plan.fsdp_version)
        d.why += std::string("; FSDP1 frees with record_stream (a freed block waits for the stream that used it, semantics "
                             "M10) and keeps flat parameters, FSDP2 shards each parameter and avoids record_stream ") +
                 "(torchtitan docs/fsdp.md: 7% lower peak memory than FSDP1 on Llama-7B, 8x H100)";
    } catch (const InputError& e) {
      d.error = std::string("not valid alone: ") + e.what();
    }
    c.diffs.push_back(d);
  }
  std::stable_sort(c.diffs.begin(), c.diffs.end(), [](const GroupDiff& x, const GroupDiff& y) {
    if (x.simulated != y.simulated) return x.simulated;
    return std::fabs(x.tokens_gain) > std::fabs(y.tokens_gain);
  });
  c.overall = difference_text(a.result, b.result, a.plan, b.plan);
  if (const std::string mem = memory_difference_text(a.result, b.result); !mem.empty()) c.overall += "; memory at the peak: " + mem;
  c.a = std::move(a);
  c.b = std::move(b);
  return c;
}

std::string compare_text(const Comparison& c) {
  std::ostringstream os;
  const auto& ra = c.a.result;
  const auto& rb = c.b.result;
  char line[256];
  os << "A: " << c.a.source << "\n   " << label_of(c.a.plan) << "\n";
  os << "B: " << c.b.source << "\n   " << label_of(c.b.plan) << "\n\n";
  std::snprintf(line, sizeof line, "%-28s %16s %16s %12s\n", "", "A", "B", "B vs A");
  os << line;
  auto row = [&](const char* what, double va, double vb, const char* f, bool relative) {
    char da[64], db[64], dd[64];
    std::snprintf(da, sizeof da, f, va);
    std::snprintf(db, sizeof db, f, vb);
    if (relative) std::snprintf(dd, sizeof dd, "%+.1f%%", va != 0 ? 100 * (vb / va - 1) : 0.0);
    else std::snprintf(dd, sizeof dd, f[1] == '.' ? "%+.2f" : "%+.0f", vb - va);
    std::snprintf(line, sizeof line, "%-28s %16s %16s %12s\n", what, da, db, dd);
    os << line;
  };
  row("tokens/s per GPU", ra.tokens_per_s_per_gpu, rb.tokens_per_s_per_gpu, "%.0f", true);
  row("MFU %", 100 * ra.mfu, 100 * rb.mfu, "%.1f", false);
  row("step time (s)", to_seconds(ra.step_time_ns), to_seconds(rb.step_time_ns), "%.3f", true);
  row("  compute busy (s)", to_seconds(ra.compute_ns), to_seconds(rb.compute_ns), "%.3f", true);
  row("  exposed communication (s)", to_seconds(ra.exposed_comm_ns), to_seconds(rb.exposed_comm_ns), "%.3f", false);
  row("peak device memory (GiB)", to_gib(ra.peak_total_device), to_gib(rb.peak_total_device), "%.2f", false);
  const MemoryVerdict va = memory_verdict(ra, c.margin), vb = memory_verdict(rb, c.margin);
  row("headroom (GiB)", to_gib(va.headroom()), to_gib(vb.headroom()), "%.2f", false);
  std::map<std::string, std::pair<Bytes, Bytes>> cats;
  for (const auto& [k, v] : ra.breakdown_at_peak) cats[k].first = v;
  for (const auto& [k, v] : rb.breakdown_at_peak) cats[k].second = v;
  for (const auto& [k, v] : cats)
    if (v.first != v.second) row(("  " + k + " (GiB)").c_str(), to_gib(v.first), to_gib(v.second), "%.2f", false);
  os << "\nA: " << (c.a.fits_with_margin ? "fits" : "does not fit") << " - " << memory_text(ra, c.margin) << "\n";
  os << "B: " << (c.b.fits_with_margin ? "fits" : "does not fit") << " - " << memory_text(rb, c.margin) << "\n";
  os << "\nB against A: " << c.overall << ".\n";
  if (c.diffs.empty()) {
    os << "The two plans are the same.\n";
    return os.str();
  }
  os << "\nWhat each difference does alone (A with B's values for it, simulated):\n";
  for (const auto& d : c.diffs) {
    os << "  - " << d.group << " (";
    for (size_t i = 0; i < d.keys.size(); ++i) os << (i ? "; " : "") << d.keys[i];
    os << "): ";
    if (!d.simulated) {
      os << d.error << "\n";
      continue;
    }
    os << num("%+.1f", 100 * d.tokens_gain) << "% tokens/s, " << (d.memory_delta >= 0 ? "+" : "-") << gib_text(std::llabs(d.memory_delta))
       << " peak memory" << (d.fits_with_margin ? "" : " (does not fit)") << " - " << d.why << "\n";
  }
  return os.str();
}

nlohmann::json compare_json(const Comparison& c) {
  auto side = [&](const CompareSide& s) {
    return json{{"source", s.source}, {"plan", sim::plan_to_json(s.plan)}, {"result", sim::sim_result_to_json(s.result)},
                {"fits_with_margin", s.fits_with_margin}, {"memory", memory_text(s.result, c.margin)}};
  };
  json diffs = json::array();
  for (const auto& d : c.diffs) {
    json x = {{"group", d.group}, {"keys", d.keys}, {"simulated", d.simulated}};
    if (d.simulated)
      x.update({{"tokens_gain", d.tokens_gain}, {"memory_delta_bytes", d.memory_delta}, {"fits_with_margin", d.fits_with_margin},
                {"why", d.why}});
    else
      x["error"] = d.error;
    diffs.push_back(x);
  }
  return {{"a", side(c.a)}, {"b", side(c.b)}, {"memory_margin", c.margin}, {"overall", c.overall}, {"differences", diffs}};
}

}  // namespace fsdpsim::planner

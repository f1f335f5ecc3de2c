#include "calibrate/sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "calibrate/collective_model.h"

namespace fsdpsim::calibrate {

std::vector<Bytes> sweep_sizes(const SweepOptions& o, Bytes align) {
  std::vector<Bytes> out;
  align = std::max<Bytes>(align, 1);
  double s = static_cast<double>(std::max<Bytes>(o.min_bytes, align));
  double f = std::max(o.step_factor, 1.01);
  while (s <= static_cast<double>(o.max_bytes) * (1 + 1e-9)) {
    Bytes b = static_cast<Bytes>(s) / align * align;
    if (b >= align && (out.empty() || b > out.back())) out.push_back(b);
    s *= f;
  }
  return out;
}

int timed_iters_for(const SweepOptions& o, Bytes bytes) {
  if (o.iter_budget_bytes <= 0 || bytes <= 0) return o.iters;
  Bytes fit = o.iter_budget_bytes / bytes;
  return static_cast<int>(std::clamp<Bytes>(fit, 2, o.iters));
}

std::string format_sweep_header(const SweepResult& r) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "# %s, %d ranks on %d node(s), %s, in place\n#%13s %12s %6s %11s %9s %9s %7s\n",
                collective_name(r.op), r.group_size, r.nodes, r.dtype.c_str(), "size(B)", "count", "type", "time(us)",
                "algbw", "busbw", "#wrong");
  return buf;
}

std::string format_sweep_row(const SweepResult& r, const SweepPoint& p) {
  char buf[160];
  Bytes elem = r.dtype == "fp32" ? 4 : 2;
  Bytes count = r.op == CollectiveOp::AllReduce ? p.bytes / elem : p.bytes / elem / std::max(r.group_size, 1);
  std::snprintf(buf, sizeof(buf), " %13lld %12lld %6s %11.2f %9.2f %9.2f %7s\n", static_cast<long long>(p.bytes),
                static_cast<long long>(count), r.dtype.c_str(), p.time_ns / 1e3, p.algbw_GBps(),
                p.algbw_GBps() * busbw_factor(r.op, r.group_size), p.check_ok ? "0" : "WRONG");
  return buf;
}

nlohmann::json sweep_to_json(const SweepResult& r) {
  nlohmann::json pts = nlohmann::json::array();
  auto round2 = [](double x) { return std::round(x * 100.0) / 100.0; };
  for (const auto& p : r.points)
    pts.push_back({p.bytes, std::round(p.time_ns), round2(p.algbw_GBps()), round2(p.algbw_GBps() * busbw_factor(r.op, r.group_size))});
  return {{"op", collective_name(r.op)}, {"group_size", r.group_size}, {"nodes", r.nodes}, {"dtype", r.dtype},
          {"source", r.source}, {"points", pts}};
}

nlohmann::json measured_intra_fabric(const std::vector<SweepResult>& sweeps, const std::string& name,
                                     const std::string& link_class, const std::string& where) {
  int n = 0;
  for (const auto& r : sweeps)
    if (r.nodes == 1) n = std::max(n, r.group_size);
  double peak[3] = {0, 0, 0}, min_t = 1e300, min_s = 1e300, max_s = 0;
  for (const auto& r : sweeps) {
    if (r.nodes != 1 || r.group_size != n) continue;
    for (const auto& p : r.points) {
      peak[static_cast<int>(r.op)] = std::max(peak[static_cast<int>(r.op)], p.algbw_GBps() * 1e9 * busbw_factor(r.op, n));
      min_t = std::min(min_t, p.time_ns);
      min_s = std::min(min_s, static_cast<double>(p.bytes));
      max_s = std::max(max_s, static_cast<double>(p.bytes));
    }
  }
  // Grid search of (S_half, gamma) minimizing the squared log error of busbw over all ops.
  double best_err = 1e300, best_half = 1 << 20, best_gamma = 1.0;
  for (int g10 = 3; g10 <= 20; ++g10) {
    for (int l4 = 40; l4 <= 128; ++l4) {
      double gamma = g10 / 10.0, half = std::pow(2.0, l4 / 4.0), err = 0;
      for (const auto& r : sweeps) {
        if (r.nodes != 1 || r.group_size != n || peak[static_cast<int>(r.op)] <= 0) continue;
        for (const auto& p : r.points) {
          double meas = p.algbw_GBps() * 1e9 * busbw_factor(r.op, n);
          double model = peak[static_cast<int>(r.op)] / (1.0 + std::pow(half / static_cast<double>(p.bytes), gamma));
          if (meas > 0) err += std::pow(std::log(model / meas), 2);
        }
      }
      if (err < best_err) best_err = err, best_half = half, best_gamma = gamma;
    }
  }
  auto src = [&](const std::string& what) { return nlohmann::json(what + "; " + where); };
  auto sv = [&](double v, const std::string& what) { return nlohmann::json{{"value", v}, {"source", src(what)}}; };
  std::string grp = std::to_string(n) + "-rank sweeps";
  return {{"schema", "fsdpsim.fabric/1"}, {"name", name}, {"kind", "intra_node"}, {"link_class", link_class},
          {"description", "fitted on this machine's measured " + grp},
          {"busbw_bytes_per_s", {{"all_gather", sv(std::max(peak[0], 1e3), "measured: best all_gather busbw of the " + grp)},
                                 {"reduce_scatter", sv(std::max(peak[1], 1e3), "measured: best reduce_scatter busbw of the " + grp)},
                                 {"all_reduce", sv(std::max(peak[2], 1e3), "measured: best all_reduce busbw of the " + grp)}}},
          {"latency", {{"base_ns", sv(min_t < 1e300 ? min_t : 0, "measured: the smallest time of the " + grp)},
                       {"step_ns", sv(0, "not separated from base_ns: one group size per ramp fit")}}},
          {"ramp", {{"half_size_bytes", sv(best_half, "fitted: busbw(S) = peak/(1+(S_half/S)^gamma), least squares in log busbw over the " + grp)},
                    {"exponent", sv(best_gamma, "fitted with half_size_bytes")},
                    {"min_bytes", sv(min_s < 1e300 ? min_s : 1, "smallest measured size")},
                    {"max_bytes", sv(std::max(max_s, 1.0), "largest measured size")}}}};
}

nlohmann::json make_profile_document(const std::string& name, const nlohmann::json& context, const nlohmann::json& gpu,
                                     const std::vector<SweepResult>& sweeps, const std::vector<MeasuredGemm>& gemms,
                                     const std::string& gemm_source) {
  nlohmann::json measured = nlohmann::json::object();
  nlohmann::json colls = nlohmann::json::array();
  for (const auto& s : sweeps) colls.push_back(sweep_to_json(s));
  measured["collectives"] = colls;
  // GEMMs grouped by dtype: {"dtype", "source", "points": [[m, n, k, time_ns, TFLOP/s], ...]}.
  nlohmann::json groups = nlohmann::json::array();
  for (const char* dt : {"fp32", "bf16", "fp16", "fp8"}) {
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& g : gemms)
      if (g.dtype == dt)
        pts.push_back({g.m, g.n, g.k, std::round(g.time_ns),
                       std::round(2.0 * g.m * g.n * g.k / g.time_ns / 1e3 * 1000.0) / 1000.0});
    if (!pts.empty()) groups.push_back({{"dtype", dt}, {"source", gemm_source}, {"points", pts}});
  }
  measured["gemms"] = groups;
  return {{"schema", "fsdpsim.hardware_profile/1"}, {"context", context}, {"name", name}, {"gpu", gpu},
          {"measured", measured}};
}

}  // namespace fsdpsim::calibrate

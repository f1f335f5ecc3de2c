#include "runtime/compare.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace fsdpsim::runtime {

std::optional<double> relative_error(double predicted, double measured) {
  if (measured == 0) return std::nullopt;
  return (predicted - measured) / measured;
}

namespace {

nlohmann::json err_json(double predicted, double measured) {
  auto e = relative_error(predicted, measured);
  return e ? nlohmann::json(*e) : nlohmann::json(nullptr);
}

// Busy time of a set of spans: the length of the union of their intervals.
TimeNs union_length(std::vector<std::pair<TimeNs, TimeNs>> iv) {
  std::sort(iv.begin(), iv.end());
  TimeNs total = 0, cur_s = 0, cur_e = -1;
  for (auto [s, e] : iv) {
    if (cur_e < 0 || s > cur_e) {
      if (cur_e >= 0) total += cur_e - cur_s;
      cur_s = s;
      cur_e = e;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (cur_e >= 0) total += cur_e - cur_s;
  return total;
}

std::map<std::string, TimeNs> busy_by_track(const sim::SimResult& r) {
  std::map<std::string, std::vector<std::pair<TimeNs, TimeNs>>> iv;
  for (const auto& s : r.trace) iv[s.track].push_back({s.start_ns, s.start_ns + s.dur_ns});
  std::map<std::string, TimeNs> out;
  for (auto& [k, v] : iv) out[k] = union_length(v);
  return out;
}

using OpKey = std::tuple<std::string, std::string, int, int>;   // name, kind, unit, occurrence

std::map<OpKey, const sim::TraceSpan*> index_ops(const sim::SimResult& r, std::vector<OpKey>* order) {
  std::map<std::tuple<std::string, std::string, int>, int> seen;
  std::map<OpKey, const sim::TraceSpan*> out;
  for (const auto& s : r.trace) {
    if (s.track == "cpu") continue;   // CPU issue spans are not ops of a stream
    int n = seen[{s.name, s.kind, s.unit}]++;
    OpKey k{s.name, s.kind, s.unit, n};
    out[k] = &s;
    if (order) order->push_back(k);
  }
  return out;
}

}  // namespace

nlohmann::json compare_results(const sim::SimResult& p, const sim::SimResult& m) {
  nlohmann::json j;
  j["peak_allocated_error"] = err_json(static_cast<double>(p.peak_allocated), static_cast<double>(m.peak_allocated));
  j["peak_reserved_error"] = err_json(static_cast<double>(p.peak_reserved), static_cast<double>(m.peak_reserved));
  j["step_time_error"] = err_json(static_cast<double>(p.step_time_ns), static_cast<double>(m.step_time_ns));
  j["error_definition"] = "(predicted - measured) / measured";
  auto side = [](const sim::SimResult& r) {
    return nlohmann::json{{"peak_allocated_bytes", r.peak_allocated}, {"peak_reserved_bytes", r.peak_reserved},
                          {"step_time_s", to_seconds(r.step_time_ns)},  {"compute_s", to_seconds(r.compute_ns)},
                          {"comm_s", to_seconds(r.comm_ns)},            {"exposed_comm_s", to_seconds(r.exposed_comm_ns)},
                          {"cpu_blocked_s", to_seconds(r.cpu_blocked_ns)}};
  };
  j["predicted"] = side(p);
  j["measured"] = side(m);
  j["attribution"] = {
      {"step_time_diff_s", to_seconds(p.step_time_ns - m.step_time_ns)},
      {"compute_busy_diff_s", to_seconds(p.compute_ns - m.compute_ns)},
      {"comm_busy_diff_s", to_seconds(p.comm_ns - m.comm_ns)},
      {"exposed_comm_diff_s", to_seconds(p.exposed_comm_ns - m.exposed_comm_ns)},
      {"cpu_blocked_diff_s", to_seconds(p.cpu_blocked_ns - m.cpu_blocked_ns)},
      {"note", "each diff is predicted - measured; the step is bounded below by compute busy + exposed "
               "communication + CPU-bound gaps, so the largest diffs say which the prediction missed"}};

  // Per stream (track).
  const auto pb = busy_by_track(p), mb = busy_by_track(m);
  std::set<std::string> tracks;
  for (const auto& [k, v] : pb) tracks.insert(k);
  for (const auto& [k, v] : mb) tracks.insert(k);
  nlohmann::json streams = nlohmann::json::array();
  for (const auto& t : tracks) {
    const TimeNs a = pb.count(t) ? pb.at(t) : 0, b = mb.count(t) ? mb.at(t) : 0;
    streams.push_back({{"track", t}, {"predicted_busy_s", to_seconds(a)}, {"measured_busy_s", to_seconds(b)},
                       {"error", err_json(static_cast<double>(a), static_cast<double>(b))}});
  }
  j["per_stream"] = streams;

  // Per op, matched by (name, kind, unit, occurrence); per kind totals over matched ops.
  std::vector<OpKey> order;
  const auto pi = index_ops(p, &order);
  const auto mi = index_ops(m, nullptr);
  nlohmann::json ops = nlohmann::json::array(), unmatched = nlohmann::json::array();
  std::map<std::string, std::tuple<int, TimeNs, TimeNs>> by_kind;
  for (const auto& k : order) {
    const sim::TraceSpan* a = pi.at(k);
    auto it = mi.find(k);
    if (it == mi.end()) {
      unmatched.push_back({{"name", a->name}, {"kind", a->kind}, {"unit", a->unit}, {"only_in", "predicted"}});
      continue;
    }
    const sim::TraceSpan* b = it->second;
    ops.push_back({{"name", a->name},
                   {"kind", a->kind},
                   {"track", a->track},
                   {"unit", a->unit},
                   {"predicted_dur_s", to_seconds(a->dur_ns)},
                   {"measured_dur_s", to_seconds(b->dur_ns)},
                   {"error", err_json(static_cast<double>(a->dur_ns), static_cast<double>(b->dur_ns))},
                   {"predicted_start_s", to_seconds(a->start_ns)},
                   {"measured_start_s", to_seconds(b->start_ns)}});
    auto& [n, ta, tb] = by_kind[a->kind];
    ++n;
    ta += a->dur_ns;
    tb += b->dur_ns;
  }
  for (const auto& [k, s] : mi)
    if (!pi.count(k))
      unmatched.push_back({{"name", s->name}, {"kind", s->kind}, {"unit", s->unit}, {"only_in", "measured"}});
  nlohmann::json kinds = nlohmann::json::array();
  for (const auto& [k, v] : by_kind) {
    const auto& [n, ta, tb] = v;
    kinds.push_back({{"kind", k}, {"count", n}, {"predicted_s", to_seconds(ta)}, {"measured_s", to_seconds(tb)},
                     {"error", err_json(static_cast<double>(ta), static_cast<double>(tb))}});
  }
  j["per_kind"] = kinds;
  j["per_op"] = ops;
  j["unmatched_ops"] = unmatched;

  nlohmann::json bd = nlohmann::json::object();
  std::set<std::string> cats;
  for (const auto& [k, v] : p.breakdown_at_peak) cats.insert(k);
  for (const auto& [k, v] : m.breakdown_at_peak) cats.insert(k);
  for (const auto& c : cats) {
    const Bytes a = p.breakdown_at_peak.count(c) ? p.breakdown_at_peak.at(c) : 0;
    const Bytes b = m.breakdown_at_peak.count(c) ? m.breakdown_at_peak.at(c) : 0;
    bd[c] = {{"predicted_bytes", a}, {"measured_bytes", b}, {"error", err_json(static_cast<double>(a), static_cast<double>(b))}};
  }
  j["memory_breakdown"] = bd;
  return j;
}

}  // namespace fsdpsim::runtime

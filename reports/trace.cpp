#include "reports/trace.h"

#include <algorithm>
#include <map>

#include "common/output_file.h"
#include "reports/memory_align.h"
#include "reports/timeline_decimate.h"

namespace fsdpsim::reports {

namespace {

// Chrome trace-event timestamps are microseconds (floating point allowed); ours are integer ns.
double us(TimeNs ns) { return static_cast<double>(ns) / 1000.0; }

}  // namespace

nlohmann::json trace_json(const sim::SimResult& r, const nlohmann::json& context) {
  using nlohmann::json;
  constexpr int kPid = 0;
  json events = json::array();
  events.push_back({{"ph", "M"}, {"pid", kPid}, {"name", "process_name"}, {"args", {{"name", "fsdpsim: one rank, one step"}}}});

  // One thread (tid) per stream, in the report's track order. Spans of one stream never overlap in
  // the simulator, but a trace from elsewhere might: a span that starts before the previous one on
  // its lane ended goes to an extra lane ("compute #2"), so Perfetto never sees mis-nested slices.
  std::vector<std::string> tracks = track_order(r.trace);
  std::vector<size_t> order(r.trace.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto& x = r.trace[a];
    const auto& y = r.trace[b];
    auto tx = std::find(tracks.begin(), tracks.end(), x.track) - tracks.begin();
    auto ty = std::find(tracks.begin(), tracks.end(), y.track) - tracks.begin();
    if (tx != ty) return tx < ty;
    return x.start_ns < y.start_ns;
  });
  struct Lane { int tid; TimeNs end; };
  std::map<std::string, std::vector<Lane>> lanes;
  int next_tid = 1;
  json spans = json::array();
  std::vector<std::pair<int, std::string>> thread_names;
  for (size_t i : order) {
    const sim::TraceSpan& s = r.trace[i];
    auto& ls = lanes[s.track];
    Lane* lane = nullptr;
    for (auto& l : ls)
      if (s.start_ns >= l.end) { lane = &l; break; }
    if (!lane) {
      ls.push_back({next_tid++, 0});
      lane = &ls.back();
      std::string name = ls.size() == 1 ? s.track : s.track + " #" + std::to_string(ls.size());
      thread_names.emplace_back(lane->tid, name);
    }
    lane->end = s.start_ns + s.dur_ns;
    json args = {{"kind", s.kind}, {"unit", s.unit}, {"bytes", s.bytes}, {"start_ns", s.start_ns}, {"dur_ns", s.dur_ns}};
    spans.push_back({{"name", s.name}, {"cat", s.kind.empty() ? s.track : s.kind}, {"ph", "X"}, {"pid", kPid},
                     {"tid", lane->tid}, {"ts", us(s.start_ns)}, {"dur", us(s.dur_ns)}, {"args", args}});
  }
  for (const auto& [tid, name] : thread_names) {
    events.push_back({{"ph", "M"}, {"pid", kPid}, {"tid", tid}, {"name", "thread_name"}, {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"}, {"pid", kPid}, {"tid", tid}, {"name", "thread_sort_index"}, {"args", {{"sort_index", tid}}}});
  }
  for (auto& s : spans) events.push_back(std::move(s));
  // Memory as one counter track with two series (Perfetto draws "memory allocated_bytes" etc.), on the
  // GPU's clock like the spans (memory_align.h), so the counters cover the whole step.
  // (the steady step's samples: the trace's spans are that step's timing)
  for (const auto& m : gpu_aligned_memory(r.trace, steady_step_samples(r.memory_timeline, r.steady_step_start_ns)))
    events.push_back({{"ph", "C"}, {"pid", kPid}, {"name", "memory"}, {"ts", us(m.t_ns)},
                      {"args", {{"allocated_bytes", m.allocated}, {"reserved_bytes", m.reserved}}}});
  return json{{"traceEvents", events}, {"displayTimeUnit", "ns"}, {"otherData", context}};
}

void write_trace(const std::string& path, const sim::SimResult& r, const nlohmann::json& context,
                 const std::string& field) {
  // otherData comes after traceEvents in key order; the context block still opens the file as the
  // trace format's metadata object. Written compactly: traces can hold many thousands of events.
  write_file_atomic(path, trace_json(r, context).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", field);
}

}  // namespace fsdpsim::reports

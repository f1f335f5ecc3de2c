#include "runtime/measured_result.h"

#include <cmath>

#include "common/errors.h"
#include "common/json_reader.h"

namespace fsdpsim::runtime {

namespace {
TimeNs seconds_to_ns(double s) { return static_cast<TimeNs>(std::llround(s * 1e9)); }
constexpr double kMaxSeconds = 1e9;
constexpr std::int64_t kMaxBytes = std::int64_t{1} << 60;
}  // namespace

sim::SimResult sim_result_from_json(const nlohmann::json& j, const std::string& source) {
  sim::SimResult r;
  JsonReader top(j, source);
  JsonReader mem = top.get_object("peak_memory_bytes");
  r.peak_allocated = mem.get_int("allocated", 0, kMaxBytes);
  r.peak_reserved = mem.get_int("reserved", 0, kMaxBytes);
  r.context_bytes = mem.get_int("context", 0, kMaxBytes, 0);
  r.peak_total_device = mem.get_int("total_device", 0, kMaxBytes, 0);
  r.capacity = top.get_int("capacity_bytes", 0, kMaxBytes, 0);
  r.fits = top.get_bool("fits", false);
  if (top.has("memory_breakdown_bytes")) {
    JsonReader bd = top.get_object("memory_breakdown_bytes");
    for (const auto& [k, v] : top.raw("memory_breakdown_bytes").items()) r.breakdown_at_peak[k] = bd.get_int(k, 0, kMaxBytes);
  }
  r.step_time_ns = seconds_to_ns(top.get_double("step_time_s", 0, kMaxSeconds));
  r.compute_ns = seconds_to_ns(top.get_double("compute_s", 0, kMaxSeconds, 0));
  r.comm_ns = seconds_to_ns(top.get_double("comm_s", 0, kMaxSeconds, 0));
  r.exposed_comm_ns = seconds_to_ns(top.get_double("exposed_comm_s", 0, kMaxSeconds, 0));
  r.cpu_blocked_ns = seconds_to_ns(top.get_double("cpu_blocked_s", 0, kMaxSeconds, 0));
  r.alloc_retries = top.get_int("alloc_retries", 0, kMaxBytes, 0);
  r.tokens_per_step = top.get_double("tokens_per_step", 0, 1e18, 0);
  r.tokens_per_s_per_gpu = top.get_double("tokens_per_s_per_gpu", 0, 1e18, 0);
  r.mfu = top.get_double("mfu", 0, 1e6, 0);
  r.peak_flops = top.get_double("peak_flops_per_s", 0, 1e21, 0);
  r.peak_flops_dtype = top.get_string("peak_flops_dtype", "");
  r.model_flops_per_step_per_gpu = top.get_double("model_flops_per_step_per_gpu", 0, 1e30, 0);
  r.hardware_flops_per_step_per_gpu = top.get_double("hardware_flops_per_step_per_gpu", 0, 1e30, 0);
  if (top.has("comm_bytes_sent_per_gpu")) {
    JsonReader cb = top.get_object("comm_bytes_sent_per_gpu");
    for (const auto& [k, v] : top.raw("comm_bytes_sent_per_gpu").items()) r.comm_bytes_by_kind[k] = cb.get_int(k, 0, kMaxBytes);
  }
  if (top.has("notes")) {
    const auto& n = top.raw("notes");
    if (!n.is_array()) throw InputError(top.field("notes"), json_value_for_message(n), "an array of strings");
    for (const auto& s : n) {
      if (!s.is_string()) throw InputError(top.field("notes"), json_value_for_message(s), "strings");
      r.notes.push_back(s.get<std::string>());
    }
  }
  if (top.has("trace")) {
    const auto& t = top.raw("trace");
    if (!t.is_array()) throw InputError(top.field("trace"), json_value_for_message(t), "an array of spans");
    for (size_t i = 0; i < t.size(); ++i) {
      JsonReader s(t[i], top.field("trace") + "[" + std::to_string(i) + "]");
      sim::TraceSpan sp;
      sp.name = s.get_string("name");
      sp.track = s.get_string("track");
      sp.kind = s.get_string("kind");
      sp.unit = static_cast<int>(s.get_int("unit", -1, 1 << 30));
      sp.start_ns = s.get_int("start_ns", 0, kMaxBytes);
      sp.dur_ns = s.get_int("dur_ns", 0, kMaxBytes);
      sp.bytes = s.get_int("bytes", 0, kMaxBytes, 0);
      r.trace.push_back(sp);
    }
  }
  if (top.has("memory_timeline")) {
    const auto& m = top.raw("memory_timeline");
    if (!m.is_array()) throw InputError(top.field("memory_timeline"), json_value_for_message(m), "an array of samples");
    for (size_t i = 0; i < m.size(); ++i) {
      JsonReader s(m[i], top.field("memory_timeline") + "[" + std::to_string(i) + "]");
      r.memory_timeline.push_back(sim::MemorySample{s.get_int("t_ns", 0, kMaxBytes), s.get_int("allocated_bytes", 0, kMaxBytes),
                                                    s.get_int("reserved_bytes", 0, kMaxBytes)});
    }
  }
  return r;
}

}  // namespace fsdpsim::runtime

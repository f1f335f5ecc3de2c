#include "program/sim_result.h"

#include <algorithm>

namespace fsdpsim::sim {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::ShardedParams: return "sharded_params";
    case MemCategory::ShardedGrads: return "sharded_grads";
    case MemCategory::OptimizerState: return "optimizer_state";
    case MemCategory::UnshardedParams: return "unsharded_params";
    case MemCategory::UnshardedGrads: return "unsharded_grads";
    case MemCategory::CommBuffers: return "comm_buffers";
    case MemCategory::Activations: return "activations";
    case MemCategory::Logits: return "logits";
    case MemCategory::AllocatorSlack: return "allocator_slack";
    case MemCategory::CudaContext: return "cuda_context";
  }
  return "unknown";
}

namespace {
nlohmann::json peak_location_to_json(const PeakLocation& p) {
  nlohmann::json j = {{"op", p.op}, {"kind", p.kind}, {"unit", p.unit}, {"micro_batch", p.micro_batch}, {"phase", p.phase}};
  if (!p.name.empty()) j["name"] = p.name;
  return j;
}
}  // namespace

// Keys carry their units (_bytes, _s, _per_s); times are seconds in the JSON, integer ns in traces.
nlohmann::json sim_result_to_json(const SimResult& r, bool include_trace) {
  nlohmann::json j;
  j["peak_memory_bytes"] = {{"allocated", r.peak_allocated},
                            {"reserved", r.peak_reserved},
                            {"context", r.context_bytes},
                            {"total_device", r.peak_total_device}};
  j["capacity_bytes"] = r.capacity;
  j["host_memory_per_node_bytes"] = r.host_memory_per_node;
  j["host_capacity_per_node_bytes"] = r.host_capacity_per_node;
  j["fits"] = r.fits;
  nlohmann::json bd = nlohmann::json::object();
  for (const auto& [k, v] : r.breakdown_at_peak) bd[k] = v;
  j["memory_breakdown_bytes"] = bd;
  j["step_time_s"] = to_seconds(r.step_time_ns);
  j["compute_s"] = to_seconds(r.compute_ns);
  j["comm_s"] = to_seconds(r.comm_ns);
  j["exposed_comm_s"] = to_seconds(r.exposed_comm_ns);
  j["cpu_blocked_s"] = to_seconds(r.cpu_blocked_ns);
  if (r.cpu_issue_ns > 0) j["cpu_issue_s"] = to_seconds(r.cpu_issue_ns);
  j["alloc_retries"] = r.alloc_retries;
  j["tokens_per_step"] = r.tokens_per_step;
  j["tokens_per_s_per_gpu"] = r.tokens_per_s_per_gpu;
  j["mfu"] = r.mfu;
  j["peak_flops_per_s"] = r.peak_flops;
  j["peak_flops_dtype"] = r.peak_flops_dtype;
  j["model_flops_per_step_per_gpu"] = r.model_flops_per_step_per_gpu;
  j["hardware_flops_per_step_per_gpu"] = r.hardware_flops_per_step_per_gpu;
  nlohmann::json cb = nlohmann::json::object();
  for (const auto& [k, v] : r.comm_bytes_by_kind) cb[k] = v;
  j["comm_bytes_sent_per_gpu"] = cb;
  j["notes"] = r.notes;
  j["first_step_peak_memory_bytes"] = {{"allocated", r.first_step_peak_allocated},
                                       {"reserved", r.first_step_peak_reserved}};
  if (r.construction_peak_reserved > 0)
    j["construction_peak_memory_bytes"] = {{"allocated", r.construction_peak_allocated},
                                           {"reserved", r.construction_peak_reserved}};
  j["peak_at"] = {{"allocated", peak_location_to_json(r.peak_allocated_at)},
                  {"reserved", peak_location_to_json(r.peak_reserved_at)}};
  j["first_step_peak_at"] = {{"allocated", peak_location_to_json(r.first_step_peak_allocated_at)},
                             {"reserved", peak_location_to_json(r.first_step_peak_reserved_at)}};
  if (include_trace) {
    nlohmann::json t = nlohmann::json::array();
    for (const auto& s : r.trace)
      t.push_back({{"name", s.name}, {"track", s.track}, {"kind", s.kind}, {"unit", s.unit},
                   {"start_ns", s.start_ns}, {"dur_ns", s.dur_ns}, {"bytes", s.bytes}});
    j["trace"] = t;
    nlohmann::json m = nlohmann::json::array();
    for (const auto& s : r.memory_timeline)
      m.push_back({{"t_ns", s.t_ns}, {"allocated_bytes", s.allocated}, {"reserved_bytes", s.reserved}});
    j["memory_timeline"] = m;
    // Which steps the timeline covers: the first, then (from steady_step_start_ns) the steady step.
    j["memory_timeline_steps"] = r.steady_step_start_ns > 0 ? "first_and_steady" : "first";
    j["steady_step_start_ns"] = r.steady_step_start_ns;
  }
  return j;
}

TimeNs intersect_length(const std::vector<std::pair<TimeNs, TimeNs>>& a,
                        const std::vector<std::pair<TimeNs, TimeNs>>& b) {
  TimeNs total = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    TimeNs lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) total += hi - lo;
    if (a[i].second < b[j].second) ++i;
    else ++j;
  }
  return total;
}

}  // namespace fsdpsim::sim

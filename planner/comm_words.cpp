// Communication in words (comm_words.h).
#include "planner/comm_words.h"

#include <algorithm>
#include <cstdio>

namespace fsdpsim::planner {
namespace {

// Busy time of one collective kind: the union of its spans (a kind may run on several streams).
TimeNs busy_of(const std::vector<sim::TraceSpan>& trace, const std::string& kind) {
  std::vector<std::pair<TimeNs, TimeNs>> iv;
  for (const auto& s : trace)
    if (s.kind == kind && s.dur_ns > 0) iv.emplace_back(s.start_ns, s.start_ns + s.dur_ns);
  std::sort(iv.begin(), iv.end());
  TimeNs total = 0, end = -1;
  for (auto [a, b] : iv) {
    if (a > end) total += b - a;
    else if (b > end) total += b - end;
    end = std::max(end, b);
  }
  return total;
}

std::string pretty(const std::string& kind) {
  std::string s = kind;
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

}  // namespace

std::string gb_text(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GB", bytes / 1e9);
  return b;
}

std::vector<CollectiveUse> collective_use(const sim::Plan& p, const sim::SimResult& r, const calibrate::Cluster& cl) {
  std::vector<CollectiveUse> out;
  const bool shard_spans = p.mesh_shard > cl.gpus_per_node;
  const bool replicate_spans = p.mesh_replicate > 1 && cl.nodes > 1;
  for (const char* k : {"all_gather", "reduce_scatter", "all_reduce"}) {
    auto it = r.comm_bytes_by_kind.find(k);
    if (it == r.comm_bytes_by_kind.end() || it->second <= 0) continue;
    CollectiveUse u;
    u.kind = k;
    u.inter_node = std::string(k) == "all_reduce" ? replicate_spans : shard_spans;
    u.bytes_per_gpu = it->second;
    if (!r.trace.empty()) u.busy_ns = busy_of(r.trace, k);
    out.push_back(u);
  }
  return out;
}

std::string inter_node_text(const sim::Plan& p, const sim::SimResult& r, const calibrate::Cluster& cl) {
  if (cl.nodes <= 1) return "";
  std::string s;
  for (const auto& u : collective_use(p, r, cl)) {
    if (!u.inter_node) continue;
    std::string line = pretty(u.kind) + (u.kind == "all_reduce" ? " across the " + std::to_string(p.mesh_replicate) + " replicas"
                                                                : " over the " + std::to_string(p.mesh_shard) + "-GPU shard group") +
                       ": " + gb_text(static_cast<double>(u.bytes_per_gpu)) + " per GPU per step";
    // A replicate group with one rank per node (shard == GPUs per node): every byte crosses, and the
    // node's GPUs run their groups at once through the node's NICs.
    if (u.kind == "all_reduce" && p.mesh_shard == cl.gpus_per_node && cl.nics_per_node > 0)
      line += " (the node's " + std::to_string(cl.gpus_per_node) + " GPUs send " +
              gb_text(static_cast<double>(u.bytes_per_gpu) * cl.gpus_per_node) + " through its " +
              std::to_string(cl.nics_per_node) + " NIC" + (cl.nics_per_node == 1 ? "" : "s") + ")";
    if (u.busy_ns >= 0) {
      char b[48];
      std::snprintf(b, sizeof b, ", busy %.2f s", to_seconds(u.busy_ns));
      line += b;
    }
    s += (s.empty() ? "" : "; ") + line;
  }
  return s;
}

}  // namespace fsdpsim::planner

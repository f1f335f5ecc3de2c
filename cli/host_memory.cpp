// Host-memory check before a CPU run (host_memory.h).
#include "cli/host_memory.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "calibrate/hardware_profile.h"
#include "common/errors.h"
#include "program/plan.h"
#include "sim/simulator.h"

namespace fsdpsim::cli {
namespace {

// MemAvailable in bytes ("MemAvailable:   22093176 kB"), or -1.
Bytes mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  long long kb = 0;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return static_cast<Bytes>(kb) * 1024;
  return -1;
}

std::string gib(double b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f GiB", b / static_cast<double>(kGiB));
  return s;
}

}  // namespace

void check_host_memory(const runtime::LaunchOptions& o, const models::ModelSpec& model) {
  if (o.backend != "cpu") return;
  const Bytes avail = mem_available();
  if (avail <= 0) return;
  const int W = o.world();
  const int gpn = o.gpus_per_node > 0 ? o.gpus_per_node : W;
  const std::string name = gpn == W ? std::to_string(W) + "xCPU" : std::to_string(W / gpn) + "x" + std::to_string(gpn) + "xCPU";
  const calibrate::Cluster cluster = calibrate::load_cluster(name, "--ranks");
  const calibrate::HardwareProfile hw = calibrate::HardwareProfile::for_cluster(cluster);
  sim::SimOptions so;
  so.record_trace = false;
  so.record_memory_timeline = false;
  const sim::Plan plan = sim::resolve_plan(sim::load_plan(o.plan, "--plan"), W, gpn);
  const sim::SimResult r = sim::simulate(model, hw, plan, so);
  const double per_rank = static_cast<double>(r.peak_reserved);
  const double need = per_rank * o.ranks;
  if (need > static_cast<double>(avail))
    throw DoesNotFitError("the " + std::to_string(o.ranks) + " CPU rank(s) need about " + gib(need) + " of host memory (" +
                          gib(per_rank) + " per rank: the simulator's peak reserved for this plan on the CPU profile, which "
                          "the runtime's allocator follows) but this host has " + gib(static_cast<double>(avail)) +
                          " available (MemAvailable); not started. Use a smaller model, more sharding, activation "
                          "checkpointing or a smaller micro_batch / seq_len (fsdpsim simulate --cluster " + name + " shows the memory)");
}

}  // namespace fsdpsim::cli

// Speed of the hardware-profile cost functions the simulator calls for every op of every step
// (calibrate/hardware_profile.h): they must be arithmetic on precomputed tables, no allocation.
#include <benchmark/benchmark.h>

#include <fstream>

#include "calibrate/hardware_profile.h"

using namespace fsdpsim;
using namespace fsdpsim::calibrate;

static void BM_GemmTime(benchmark::State& st) {
  auto p = HardwareProfile::for_cluster(load_cluster("8xH100-SXM"));
  std::int64_t m = 8192;
  for (auto _ : st) {
    benchmark::DoNotOptimize(p.gemm_time(m, 8192, 28672, Dtype::BF16));
    m = m == 8192 ? 16384 : 8192;
  }
}
BENCHMARK(BM_GemmTime);

static void BM_AttentionTime(benchmark::State& st) {
  auto p = HardwareProfile::for_cluster(load_cluster("8xH100-SXM"));
  for (auto _ : st) benchmark::DoNotOptimize(p.attention_time(2, 8192, 64, 8, 128, Dtype::BF16, true));
}
BENCHMARK(BM_AttentionTime);

static void BM_CollectiveTimeBuiltin(benchmark::State& st) {
  auto p = HardwareProfile::for_cluster(load_cluster("8x8xH100-SXM-IB-NDR400"));
  Bytes s = 1 << 28;
  for (auto _ : st) {
    benchmark::DoNotOptimize(p.collective_time(CollectiveOp::AllGather, s, 64, 8));
    s ^= 1 << 20;
  }
}
BENCHMARK(BM_CollectiveTimeBuiltin);

static void BM_CollectiveTimeMeasured(benchmark::State& st) {
  // A calibrated profile: a measured sweep looked up by (op, group, nodes) and interpolated.
  Cluster c = load_cluster("8xH100-SXM");
  nlohmann::json j = HardwareProfile::for_cluster(c).to_json();
  nlohmann::json pts = nlohmann::json::array();
  for (Bytes s = 4096; s <= (Bytes(1) << 30); s *= 2) pts.push_back({s, 5000.0 + static_cast<double>(s) / 300.0});
  j["measured"] = {{"collectives", {{{"op", "all_gather"}, {"group_size", 8}, {"nodes", 1}, {"source", "synthetic"}, {"points", pts}}}}};
  std::string path = "/tmp/bench_profile_costs.json";
  std::ofstream(path) << j.dump();
  auto p = HardwareProfile::from_file(path, c);
  Bytes s = 3 << 26;
  for (auto _ : st) {
    benchmark::DoNotOptimize(p.collective_time(CollectiveOp::AllGather, s, 8, 1));
    s ^= 1 << 20;
  }
}
BENCHMARK(BM_CollectiveTimeMeasured);

BENCHMARK_MAIN();

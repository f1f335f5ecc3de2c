// The built-in profiles: they load, and every number in them cites a source (the nearest JSON
// object around each number has a non-empty "source" string).
#include <gtest/gtest.h>

#include <fstream>

#include "calibrate/builtin_profiles.h"
#include "calibrate/hardware_profile.h"
#include "common/errors.h"
#include "common/json_reader.h"

using namespace fsdpsim;
using namespace fsdpsim::calibrate;

namespace {

// Collects the JSON pointer of every number whose nearest enclosing object lacks a "source".
void walk(const nlohmann::json& j, const std::string& path, bool object_has_source, std::vector<std::string>& bad) {
  if (j.is_object()) {
    bool has = j.contains("source") && j["source"].is_string() && !j["source"].get<std::string>().empty();
    for (auto it = j.begin(); it != j.end(); ++it) walk(it.value(), path + "/" + it.key(), has, bad);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) walk(j[i], path + "/" + std::to_string(i), object_has_source, bad);
  } else if (j.is_number() && !object_has_source) {
    bad.push_back(path);
  }
}

}  // namespace

TEST(BuiltinProfiles, EveryNumberHasASource) {
  ASSERT_GE(embedded_profile_files().size(), 10u);
  for (const auto& f : embedded_profile_files()) {
    nlohmann::json j = parse_json_text(f.text, f.path);
    std::vector<std::string> bad;
    walk(j, "", false, bad);
    for (const auto& b : bad) ADD_FAILURE() << f.path << ": number without a source at " << b;
  }
}

TEST(BuiltinProfiles, TheWalkerCatchesAnUnsourcedNumber) {
  // The checker itself must be able to fail.
  std::vector<std::string> bad;
  walk(nlohmann::json::parse(R"({"a": {"value": 1, "source": "x"}, "b": {"value": 2}, "c": 3})"), "", false, bad);
  EXPECT_EQ(bad, (std::vector<std::string>{"/b/value", "/c"}));
}

TEST(BuiltinProfiles, ExpectedCatalog) {
  for (const char* g : {"A100-40GB", "A100-80GB", "H100-SXM", "H200", "B200", "RTX4090"}) EXPECT_TRUE(is_builtin_gpu(g)) << g;
  for (const char* f : {"NVLink3-NVSwitch", "NVLink4-NVSwitch", "NVLink5-NVSwitch", "PCIe4", "PCIe5", "IB-HDR200",
                        "IB-NDR400", "RoCE-200G", "RoCE-400G", "ETH-100G", "ETH-25G", "ETH-10G"})
    EXPECT_TRUE(is_builtin_fabric(f)) << f;
}

TEST(BuiltinProfiles, EveryGpuWithEveryFabricLoads) {
  for (const auto& g : builtin_gpu_names()) {
    for (const auto& inter : builtin_fabric_names("inter_node")) {
      Cluster c = load_cluster("2x8x" + g + "-" + inter);
      HardwareProfile p = HardwareProfile::for_cluster(c);
      EXPECT_GT(p.memory_capacity(), 0) << g;
      EXPECT_GT(p.collective_time(CollectiveOp::AllGather, kGiB, 16, 2), 0) << g << " " << inter;
    }
  }
}

TEST(BuiltinProfiles, SpecSheetNumbers) {
  // Dense peaks (datasheets), MFU is reported against these.
  auto h100 = HardwareProfile::for_cluster(load_cluster("8xH100-SXM"));
  EXPECT_DOUBLE_EQ(h100.peak_flops(Dtype::BF16), 989.4e12);
  EXPECT_DOUBLE_EQ(h100.peak_flops(Dtype::FP8), 1978.9e12);
  auto a100 = HardwareProfile::for_cluster(load_cluster("8xA100-80GB"));
  EXPECT_DOUBLE_EQ(a100.peak_flops(Dtype::BF16), 312e12);
  EXPECT_THROW(a100.peak_flops(Dtype::FP8), InputError);   // no fp8 on Ampere
  // Memory in GiB as torch reports it (cited in the profile).
  EXPECT_NEAR(to_gib(h100.memory_capacity()), 79.11, 1e-6);
  EXPECT_NEAR(to_gib(a100.memory_capacity()), 79.25, 1e-6);
  EXPECT_NEAR(to_gib(HardwareProfile::for_cluster(load_cluster("8xA100-40GB")).memory_capacity()), 39.50, 1e-6);
  EXPECT_GT(h100.cuda_context_bytes(), 0);
}

TEST(BuiltinProfiles, Rtx4090) {
  // GeForce RTX 4090: one PCIe card per GPU, no NVLink, so a cluster name without a fabric gets PCIe4.
  Cluster c = load_cluster("2xRTX4090");
  EXPECT_EQ(c.gpu, "RTX4090");
  EXPECT_EQ(c.intra_node, "PCIe4");
  EXPECT_EQ(c.world(), 2);
  auto p = HardwareProfile::for_cluster(c);
  // Dense peaks, Ada whitepaper: the "with FP32 Accumulate" rows (GeForce runs them at half the FP16-accumulate rate).
  EXPECT_DOUBLE_EQ(p.peak_flops(Dtype::BF16), 165.2e12);
  EXPECT_DOUBLE_EQ(p.peak_flops(Dtype::FP16), 165.2e12);
  EXPECT_DOUBLE_EQ(p.peak_flops(Dtype::FP32), 82.6e12);
  // Memory in GiB as torch reports it: 23.64 GiB of the 24564 MiB nvidia-smi shows.
  EXPECT_NEAR(to_gib(p.memory_capacity()), 23.64, 1e-6);
  EXPECT_EQ(p.cuda_sm_count(), 128);
  EXPECT_EQ(p.cublas_workspace_bytes(), static_cast<Bytes>(8.125 * static_cast<double>(kMiB)));   // sm_89 < 9.0
  // No typical node: the host RAM is unknown (a cluster file's host_memory_gib sets it).
  EXPECT_EQ(p.host_memory_per_node(), 0);
  EXPECT_GT(p.cpu_optimizer_bytes_per_s(), 0);
  auto four = HardwareProfile::for_cluster(load_cluster("4xRTX4090"));
  EXPECT_EQ(four.memory_capacity(), p.memory_capacity());
  EXPECT_GT(four.collective_time(CollectiveOp::AllGather, kGiB, 4, 1), 0);
}

TEST(BuiltinProfiles, ToJsonRoundTripsThroughFromFile) {
  Cluster c = load_cluster("2x8xH100-SXM-IB-NDR400");
  auto p = HardwareProfile::for_cluster(c);
  std::string path = std::string(FSDPSIM_BINARY_DIR) + "/roundtrip_profile.json";
  std::ofstream(path) << p.to_json().dump(2);
  auto q = HardwareProfile::from_file(path, c);
  EXPECT_EQ(q.name(), p.name());
  EXPECT_EQ(q.source(), path);
  EXPECT_EQ(q.memory_capacity(), p.memory_capacity());
  for (Bytes s : {Bytes(1) << 20, Bytes(1) << 30})
    for (auto op : {CollectiveOp::AllGather, CollectiveOp::ReduceScatter, CollectiveOp::AllReduce})
      EXPECT_EQ(q.collective_time(op, s, 16, 2), p.collective_time(op, s, 16, 2));
  EXPECT_EQ(q.gemm_time(4096, 4096, 4096, Dtype::BF16), p.gemm_time(4096, 4096, 4096, Dtype::BF16));
}

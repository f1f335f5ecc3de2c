// Cluster names and files: good names resolve to the right shape and fabrics; bad ones are
// InputError naming the field and listing what is allowed.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "calibrate/hardware_profile.h"
#include "common/errors.h"

using namespace fsdpsim;
using namespace fsdpsim::calibrate;

TEST(Cluster, SingleNodeName) {
  Cluster c = load_cluster("8xH100-SXM");
  EXPECT_EQ(c.nodes, 1);
  EXPECT_EQ(c.gpus_per_node, 8);
  EXPECT_EQ(c.gpu, "H100-SXM");
  EXPECT_EQ(c.intra_node, "NVLink4-NVSwitch");
  EXPECT_EQ(c.inter_node, "");
  EXPECT_EQ(c.world(), 8);
  EXPECT_EQ(load_cluster("8xA100-80GB").intra_node, "NVLink3-NVSwitch");
  EXPECT_EQ(load_cluster("4xA100-40GB").gpu, "A100-40GB");
  EXPECT_EQ(load_cluster("8xB200").intra_node, "NVLink5-NVSwitch");
  EXPECT_EQ(load_cluster("8xH200").intra_node, "NVLink4-NVSwitch");
  EXPECT_EQ(load_cluster("2xRTX4090").intra_node, "PCIe4");   // GeForce: no NVLink
  EXPECT_EQ(load_cluster("4xRTX4090").world(), 4);
  EXPECT_EQ(load_cluster("2x4xRTX4090-ETH-100G").inter_node, "ETH-100G");
}

TEST(Cluster, CpuRanks) {
  Cluster c = load_cluster("2xCPU");
  EXPECT_EQ(c.gpu, "CPU");
  EXPECT_EQ(c.intra_node, "SHM");
  EXPECT_EQ(c.world(), 2);
  auto p = HardwareProfile::for_cluster(load_cluster("4xCPU"));
  // CPU ranks of a node share the host memory.
  EXPECT_NEAR(static_cast<double>(p.memory_capacity()) * 2, static_cast<double>(HardwareProfile::for_cluster(c).memory_capacity()), 2.0);
  EXPECT_GT(p.collective_time(CollectiveOp::AllReduce, kMiB, 4, 1), 0);
}

TEST(Cluster, MultiNodeNames) {
  Cluster c = load_cluster("16x8xA100-80GB-IB-HDR200");
  EXPECT_EQ(c.nodes, 16);
  EXPECT_EQ(c.gpus_per_node, 8);
  EXPECT_EQ(c.gpu, "A100-80GB");
  EXPECT_EQ(c.intra_node, "NVLink3-NVSwitch");
  EXPECT_EQ(c.inter_node, "IB-HDR200");
  EXPECT_EQ(c.nics_per_node, 8);
  EXPECT_EQ(c.world(), 128);
  Cluster e = load_cluster("2x8xH100-SXM-ETH-10G");
  EXPECT_EQ(e.inter_node, "ETH-10G");
  EXPECT_EQ(e.nics_per_node, 1);
  Cluster n = load_cluster("4x8xH100-SXM-IB-NDR400");
  EXPECT_EQ(n.world(), 32);
  EXPECT_EQ(n.nics_per_node, 8);
  // NICs are capped at the GPUs per node (one rail per GPU).
  EXPECT_EQ(load_cluster("2x4xH100-SXM-IB-NDR400").nics_per_node, 4);
  // An explicit intra-node fabric before the inter-node one.
  Cluster p = load_cluster("2x8xA100-80GB-PCIe4-RoCE-200G");
  EXPECT_EQ(p.intra_node, "PCIe4");
  EXPECT_EQ(p.inter_node, "RoCE-200G");
  EXPECT_EQ(load_cluster("4xH100-SXM-PCIe5").intra_node, "PCIe5");
}

TEST(Cluster, BuiltinExamplesAllLoad) {
  for (const auto& n : builtin_cluster_examples()) {
    EXPECT_NO_THROW(load_cluster(n)) << n;
    EXPECT_NO_THROW(HardwareProfile::for_cluster(load_cluster(n))) << n;
  }
}

void expect_bad(const std::string& name, const std::string& needle) {
  try {
    load_cluster(name, "--cluster");
    ADD_FAILURE() << name << " was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field().rfind("--cluster", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << name << ": " << e.what();
  }
}

TEST(Cluster, BadNames) {
  expect_bad("", "expected");
  expect_bad("H100", "expected");
  expect_bad("8xV100", "unknown GPU");
  expect_bad("8xV100", "H100-SXM");            // lists the allowed GPUs
  expect_bad("0xH100-SXM", "counts must be >= 1");
  expect_bad("2x0xH100-SXM-IB-NDR400", "gpus_per_node");
  expect_bad("65xH100-SXM", "gpus_per_node");
  expect_bad("2x8xH100-SXM", "inter-node fabric");   // several nodes need a network
  expect_bad("2x8xH100-SXM-IB-XDR", "unknown fabric");
  expect_bad("2x8xH100-SXM-IB-XDR", "IB-NDR400");    // lists the allowed fabrics
  expect_bad("8xH100-SXMX", "unknown GPU");
  expect_bad("99999999999x8xH100-SXM-IB-NDR400", "expected");
  expect_bad("2x8xH100-SXM-IB-NDR400-extra", "unknown fabric");
}

std::string write_tmp(const std::string& name, const std::string& text) {
  std::string path = std::string(FSDPSIM_BINARY_DIR) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Cluster, JsonFile) {
  std::string p = write_tmp("test_cluster_ok.json",
                            R"({"nodes": 2, "gpus_per_node": 4, "gpu": "H100-SXM", "intra_node": "NVLink4-NVSwitch",
                                "inter_node": "IB-NDR400", "nics_per_node": 2, "gpu_memory_gib": 70})");
  Cluster c = load_cluster(p);
  EXPECT_EQ(c.world(), 8);
  EXPECT_EQ(c.nics_per_node, 2);
  EXPECT_EQ(c.gpu_memory_override, 70 * kGiB);
  EXPECT_EQ(HardwareProfile::for_cluster(c).memory_capacity(), 70 * kGiB);
  EXPECT_EQ(HardwareProfile::for_cluster(c).host_memory_per_node(), 2048 * kGiB);   // the H100 profile's DGX node
  std::string h = write_tmp("test_cluster_host.json",
                            R"({"nodes": 1, "gpus_per_node": 8, "gpu": "A100-40GB", "host_memory_gib": 512})");
  EXPECT_EQ(HardwareProfile::for_cluster(load_cluster(h)).host_memory_per_node(), 512 * kGiB);
  EXPECT_EQ(HardwareProfile::for_cluster(load_cluster("8xA100-40GB")).host_memory_per_node(), 1024 * kGiB);
}

TEST(Cluster, BadJsonFiles) {
  auto bad = [&](const std::string& text, const std::string& field) {
    std::string p = write_tmp("test_cluster_bad.json", text);
    try {
      load_cluster(p);
      ADD_FAILURE() << text;
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), field) << e.what();
    }
  };
  bad(R"({"nodes": 0, "gpus_per_node": 8, "gpu": "H100-SXM"})", "cluster.nodes");
  bad(R"({"nodes": 1, "gpus_per_node": 65, "gpu": "H100-SXM"})", "cluster.gpus_per_node");
  bad(R"({"nodes": 1, "gpus_per_node": 8, "gpu": "V100"})", "cluster.gpu");
  bad(R"({"nodes": 2, "gpus_per_node": 8, "gpu": "H100-SXM"})", "cluster.inter_node");
  bad(R"({"nodes": 2, "gpus_per_node": 8, "gpu": "H100-SXM", "inter_node": "NVLink4-NVSwitch"})", "cluster.inter_node");
  bad(R"({"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM", "intra_node": "IB-NDR400"})", "cluster.intra_node");
  bad(R"({"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM", "typo": 1})", "cluster.typo");
  bad(R"({"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM", "gpu_memory_gib": -4})", "cluster.gpu_memory_gib");
  bad(R"({"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM", "host_memory_gib": 0})", "cluster.host_memory_gib");
  bad(R"({"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM", "host_memory_gib": "2TB"})", "cluster.host_memory_gib");
  bad(R"({"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM", "host_memory_gib": 1e300})", "cluster.host_memory_gib");
  bad(R"([1, 2])", "cluster");
  try {
    load_cluster(std::string(FSDPSIM_BINARY_DIR) + "/no_such_cluster.json", "--cluster");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--cluster");
  }
}

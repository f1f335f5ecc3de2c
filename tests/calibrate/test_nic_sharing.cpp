// Collectives across nodes share the node's NICs with the other groups of the same shape, which run
// at the same time on the node's other GPUs (SPMD; calibrate/collective_model.h, issue 20 item 1).
// Hand-computed times on a 2-node, 8-GPU-per-node H100 cluster over 10 Gb Ethernet with 1 or 8 NICs.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include "calibrate/collective_model.h"
#include "calibrate/hardware_profile.h"

using namespace fsdpsim;
using namespace fsdpsim::calibrate;

namespace {

Cluster eth10g(int nics) {
  return cluster_from_json({{"name", "2x8xH100-SXM-ETH-10G"}, {"nodes", 2}, {"gpus_per_node", 8}, {"gpu", "H100-SXM"},
                            {"inter_node", "ETH-10G"}, {"nics_per_node", nics}},
                           "test");
}

// The built-in figures the hand counts use (calibrate/profiles/fabrics/ETH-10G.json, NVLink4-NVSwitch.json):
constexpr double kPerNicBusbw = 937500000.0;   // ETH-10G per_nic_busbw_bytes_per_s
constexpr double kNvlinkRingBusbw = 360e9;     // NVLink4 ring (all_gather) busbw: the intra-node leg
constexpr double kBaseNs = 6600, kNvlinkStepNs = 600, kEthStepNs = 2700;
// The message-size ramp of ETH-10G (S_half 16 MiB, gamma 0.9) at 1 GiB: 1 / (1 + (2^24 / 2^30)^0.9).
const double kRamp1GiB = 1.0 / (1.0 + std::pow(1.0 / 64.0, 0.9));

TimeNs hand(double latency_ns, double bytes_on_the_wire, double busbw) {
  return std::llround(latency_ns + bytes_on_the_wire / (busbw * kRamp1GiB) * 1e9);
}

}  // namespace

TEST(NicSharing, ReplicateAllReduceOneVersusEightNics) {
  // HSDP (replicate 2, shard 8): the replicate group is one rank per node, and the node's 8 ranks each
  // run their own replicate all-reduce at once. All-reduce of S = 1 GiB over n = 2 ranks on k = 2 nodes:
  // busbw factor 2(n-1)/n = 1, ring latency base + 2(k-1) inter-node steps = 6600 + 2 x 2700 = 12000 ns.
  const double S = 1073741824.0, lat = kBaseNs + 2 * kEthStepNs;
  // 8 NICs: each of the 8 groups has a NIC of its own (rail-aligned, N8): 1 x 0.9375 GB/s.
  const TimeNs t8 = HardwareProfile::for_cluster(eth10g(8)).collective_time(CollectiveOp::AllReduce, kGiB, 2, 2);
  EXPECT_EQ(t8, hand(lat, S * 1.0, 1 * kPerNicBusbw));
  // 1 NIC: the 8 groups share it, 1/8 of it each: 8 x 3.4 GB through one 10G NIC is 8 times slower.
  const TimeNs t1 = HardwareProfile::for_cluster(eth10g(1)).collective_time(CollectiveOp::AllReduce, kGiB, 2, 2);
  EXPECT_EQ(t1, hand(lat, S * 1.0, kPerNicBusbw / 8));
  EXPECT_NEAR(static_cast<double>(t1 - lat) / static_cast<double>(t8 - lat), 8.0, 1e-6);
}

TEST(NicSharing, TwoRanksPerNodeGetTwoEighthsOfTheNics) {
  // HSDP with shard 4 on 2 x 8 GPUs: replicate groups {0, 4, 8, 12}, ... have 2 ranks per node; the node
  // runs 8 / 2 = 4 of them at once, each with 2 x min(1, K / 8) NICs. All-reduce, n = 4, k = 2:
  // factor 2 x 3/4 = 1.5; latency 6600 + (2(n-1) - 2(k-1)) x 600 + 2(k-1) x 2700 = 6600 + 4 x 600 + 2 x 2700.
  const double S = 1073741824.0, lat = kBaseNs + 4 * kNvlinkStepNs + 2 * kEthStepNs;
  EXPECT_EQ(HardwareProfile::for_cluster(eth10g(1)).collective_time(CollectiveOp::AllReduce, kGiB, 4, 2),
            hand(lat, S * 1.5, 2 * (1.0 / 8) * kPerNicBusbw));
  EXPECT_EQ(HardwareProfile::for_cluster(eth10g(8)).collective_time(CollectiveOp::AllReduce, kGiB, 4, 2),
            hand(lat, S * 1.5, 2 * kPerNicBusbw));
}

TEST(NicSharing, AWholeNodeGroupUsesAllItsNics) {
  // FULL_SHARD over both nodes: one group of 8 ranks per node drives min(8, K) NICs (N8), as before.
  // All-gather, n = 16, k = 2: factor 15/16; latency 6600 + (15 - 1) x 600 + 1 x 2700.
  const double S = 1073741824.0, lat = kBaseNs + 14 * kNvlinkStepNs + 1 * kEthStepNs;
  EXPECT_EQ(HardwareProfile::for_cluster(eth10g(1)).collective_time(CollectiveOp::AllGather, kGiB, 16, 2),
            hand(lat, S * 15 / 16, 1 * kPerNicBusbw));
  EXPECT_EQ(HardwareProfile::for_cluster(eth10g(8)).collective_time(CollectiveOp::AllGather, kGiB, 16, 2),
            hand(lat, S * 15 / 16, 8 * kPerNicBusbw));
  // Within a node nothing is shared: NVSwitch gives every GPU its own links.
  EXPECT_EQ(HardwareProfile::for_cluster(eth10g(1)).collective_time(CollectiveOp::AllGather, kGiB, 8, 1),
            HardwareProfile::for_cluster(eth10g(8)).collective_time(CollectiveOp::AllGather, kGiB, 8, 1));
  // The intra-node ring still bounds a group with many NICs (here far above 8 x 0.94 GB/s).
  CollectiveModel m;
  m.has_inter = true;
  m.intra.busbw[0] = kNvlinkRingBusbw;
  m.inter.busbw[0] = 100e9;
  m.nics_per_node = 8;
  m.gpus_per_node = 8;
  EXPECT_DOUBLE_EQ(m.peak_busbw(CollectiveOp::AllGather, 16, 2), kNvlinkRingBusbw);
  EXPECT_DOUBLE_EQ(m.peak_busbw(CollectiveOp::AllReduce, 2, 2), 100e9);      // one NIC per group, no intra leg
  m.nics_per_node = 2;
  EXPECT_DOUBLE_EQ(m.peak_busbw(CollectiveOp::AllReduce, 2, 2), 100e9 * 2 / 8);
  m.gpus_per_node = 0;   // unknown node size: no sharing assumed (the pre-SPMD bound min(p, K))
  EXPECT_DOUBLE_EQ(m.peak_busbw(CollectiveOp::AllReduce, 2, 2), 100e9);
}

namespace {
// A calibrated profile for the 2x8 ETH-10G cluster with one measured 2-rank, 2-node all-reduce sweep.
std::string profile_with_replicate_sweep(const Cluster& c) {
  nlohmann::json j = HardwareProfile::for_cluster(c).to_json();
  j["name"] = "synthetic";
  j["measured"] = nlohmann::json::parse(R"({"collectives": [{"op": "all_reduce", "group_size": 2, "nodes": 2,
      "source": "synthetic test points: one group alone", "points": [[1048576, 1200000], [1073741824, 1100000000]]}]})");
  std::string path = std::string(FSDPSIM_BINARY_DIR) + "/synthetic_replicate_profile.json";
  std::ofstream(path) << j.dump(1);
  return path;
}
}  // namespace

TEST(NicSharing, MeasuredSweepsRanOneGroupAlone) {
  // `fsdpsim calibrate` times one group at a time. Under SPMD the 8 replicate groups of a node share its
  // one NIC, so the measured time past the model's latency (12000 ns, above) is 8 times longer; with 8
  // NICs each group has its own, as measured.
  const Cluster one = eth10g(1), eight = eth10g(8);
  auto p1 = HardwareProfile::from_file(profile_with_replicate_sweep(one), one);
  EXPECT_EQ(p1.collective_time(CollectiveOp::AllReduce, kGiB, 2, 2), 12000 + (1100000000LL - 12000) * 8);
  auto p8 = HardwareProfile::from_file(profile_with_replicate_sweep(eight), eight);
  EXPECT_EQ(p8.collective_time(CollectiveOp::AllReduce, kGiB, 2, 2), 1100000000);
}

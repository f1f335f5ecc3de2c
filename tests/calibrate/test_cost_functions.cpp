// Cost functions of the built-in profiles against the public measurements they cite, plus exact
// arithmetic checks of the documented formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "calibrate/hardware_profile.h"

using namespace fsdpsim;
using namespace fsdpsim::calibrate;

namespace {
HardwareProfile profile(const std::string& cluster) { return HardwareProfile::for_cluster(load_cluster(cluster)); }
// The same profile at burst (micro-benchmark) rates: gemm.sustained_fraction = 1.
HardwareProfile burst(const std::string& cluster) {
  Cluster c = load_cluster(cluster);
  nlohmann::json j = HardwareProfile::for_cluster(c).to_json();
  j["gpu"]["gemm"]["sustained_fraction"] = {{"value", 1.0}, {"source", "test: burst rates"}};
  std::string path = std::string(FSDPSIM_BINARY_DIR) + "/burst_" + cluster + ".json";
  std::ofstream(path) << j.dump();
  return HardwareProfile::from_file(path, c);
}
double busbw_GBps(CollectiveOp op, Bytes s, int n, TimeNs t) {
  double f = static_cast<double>(n - 1) / n * (op == CollectiveOp::AllReduce ? 2.0 : 1.0);
  return static_cast<double>(s) / (static_cast<double>(t) * 1e-9) * f / 1e9;
}
}  // namespace

TEST(Gemm, H100MatchesPublishedSquareBf16Sweep) {
  // zzc0721/torch-performance-test-data#79: H100 80GB HBM3, torch 2.7 cu128, bf16 square matmuls
  // (burst rates, as micro-benchmarks measure them).
  auto p = burst("8xH100-SXM");
  struct Pt { std::int64_t n; double tflops; double tol; };
  for (Pt pt : {Pt{1024, 176.62, 0.35}, Pt{2048, 676.59, 0.10}, Pt{4096, 788.72, 0.10}, Pt{8192, 797.51, 0.10},
                Pt{10240, 719.72, 0.10}}) {
    double flops = 2.0 * pt.n * pt.n * pt.n;
    double measured_ns = flops / (pt.tflops * 1e12) * 1e9;
    double t = static_cast<double>(p.gemm_time(pt.n, pt.n, pt.n, Dtype::BF16));
    EXPECT_NEAR(t / measured_ns, 1.0, pt.tol) << pt.n << "^3: model " << flops / t / 1e3 << " TFLOPS";
  }
}

TEST(Gemm, PassesThroughTheMamfPoint) {
  // A100 SXM: 267.9 TFLOPS at 6912x16384x2048 (ml-engineering MAMF table); +min_kernel_ns only.
  auto p = burst("8xA100-80GB");
  double flops = 2.0 * 6912 * 16384 * 2048;
  double t = static_cast<double>(p.gemm_time(6912, 16384, 2048, Dtype::BF16));
  EXPECT_NEAR(flops / (t * 1e-9) / 1e12, 267.9, 267.9 * 0.005);
}

TEST(Gemm, MonotoneAndRoofline) {
  auto p = profile("8xH100-SXM");
  TimeNs prev = 0;
  for (std::int64_t k = 64; k <= 16384; k *= 2) {
    TimeNs t = p.gemm_time(4096, 4096, k, Dtype::BF16);
    EXPECT_GT(t, prev);
    prev = t;
  }
  // A GEMV-shaped GEMM is memory-bound: time = bytes / (3.35 TB/s * 0.8) + 4 us.
  std::int64_t n = 8192, k = 8192;
  double bytes = 2.0 * (1 * k + k * n + 1 * n);
  EXPECT_EQ(p.gemm_time(1, n, k, Dtype::BF16), std::llround(bytes / (3.35e12 * 0.8) * 1e9) + 4000);
  // fp32 runs at the non-tensor rate: much slower than bf16.
  EXPECT_GT(p.gemm_time(4096, 4096, 4096, Dtype::FP32), 10 * p.gemm_time(4096, 4096, 4096, Dtype::BF16));
}

TEST(Gemm, SustainedFractionScalesComputeBoundGemms) {
  // The shipped H100 profile runs GEMMs at 0.64 of the burst rate (fitted on the dev set, see the profile).
  double shipped = static_cast<double>(profile("8xH100-SXM").gemm_time(8192, 8192, 8192, Dtype::BF16) - 4000);
  double fast = static_cast<double>(burst("8xH100-SXM").gemm_time(8192, 8192, 8192, Dtype::BF16) - 4000);
  EXPECT_NEAR(fast / shipped, 0.64, 1e-6);
}

TEST(Attention, Formula) {
  auto p = burst("8xH100-SXM");
  // Causal forward: 2*b*s^2*h*d FLOPs at 31.5% of 989.4 TFLOP/s (the FA3 paper's 35% for FA2 on H100 x the
  // dev-set attention factor 0.90), backward 2.5x the FLOPs at 27%, + 4 us.
  double fwd = 2.0 * 1 * 4096.0 * 4096 * 32 * 128;
  EXPECT_EQ(p.attention_time(1, 4096, 32, 8, 128, Dtype::BF16, false), std::llround(fwd / (989.4e12 * 0.315) * 1e9) + 4000);
  EXPECT_EQ(p.attention_time(1, 4096, 32, 8, 128, Dtype::BF16, true), std::llround(2.5 * fwd / (989.4e12 * 0.27) * 1e9) + 4000);
  // Quadratic in the sequence length.
  double r = static_cast<double>(p.attention_time(2, 8192, 32, 8, 128, Dtype::BF16, false) - 4000) /
             static_cast<double>(p.attention_time(2, 4096, 32, 8, 128, Dtype::BF16, false) - 4000);
  EXPECT_NEAR(r, 4.0, 1e-5);
}

TEST(Other, MemoryHostAndOverheads) {
  auto p = profile("8xH100-SXM");
  EXPECT_EQ(p.memory_bound_time(kGiB), std::llround(kGiB / (3.35e12 * 0.8) * 1e9) + 4000);
  EXPECT_EQ(p.host_copy_time(kGiB), std::llround(kGiB / (64e9 * 0.8) * 1e9) + 4000);
  // The CPU AdamW step: 28 B per parameter, each of the node's 8 ranks with 1/8 of the DGX H100's host
  // memory bandwidth (2 x 8 channels x DDR5-4400 x 8 B = 563.2 GB/s, x 0.7 sustained): 49.28 GB/s.
  EXPECT_EQ(p.cpu_optimizer_time(1000000000), std::llround(1e9 * 28 / (563.2e9 * 0.7 / 8) * 1e9));
  // Four ranks on a node share it four ways: twice as fast per rank.
  EXPECT_EQ(profile("4xH100-SXM").cpu_optimizer_time(1000000000), std::llround(1e9 * 28 / (563.2e9 * 0.7 / 4) * 1e9));
  EXPECT_EQ(p.host_memory_per_node(), 2048 * kGiB);   // DGX H100: 2 TB
  EXPECT_EQ(p.kernel_launch_ns(), 6000);
  EXPECT_GT(p.framework_hook_ns(), p.kernel_launch_ns());
  EXPECT_GE(p.comm_overlap_slowdown(), 1.0);
  EXPECT_LE(p.comm_overlap_slowdown(), 2.0);   // N5: 1.1-2x
}

TEST(Collectives, H100AllGatherAndAllReduceWithinTheCitedBusbw) {
  auto p = profile("8xH100-SXM");
  // AG/RS ~360-370 GB/s (nccl-tests#212, #326); NVLS AR ~480 (nccl-tests#212), 463.6 at 1 GiB on H200 (gt0210).
  double ag = busbw_GBps(CollectiveOp::AllGather, kGiB, 8, p.collective_time(CollectiveOp::AllGather, kGiB, 8, 1));
  EXPECT_GT(ag, 330);
  EXPECT_LE(ag, 370);
  double rs = busbw_GBps(CollectiveOp::ReduceScatter, kGiB, 8, p.collective_time(CollectiveOp::ReduceScatter, kGiB, 8, 1));
  EXPECT_NEAR(rs, ag, 1e-9);
  double ar = busbw_GBps(CollectiveOp::AllReduce, kGiB, 8, p.collective_time(CollectiveOp::AllReduce, kGiB, 8, 1));
  EXPECT_NEAR(ar, 463.58, 463.58 * 0.05);
  EXPECT_FALSE(p.collective_extrapolated(CollectiveOp::AllGather, kGiB, 8, 1));
  EXPECT_TRUE(p.collective_extrapolated(CollectiveOp::AllGather, 1024, 8, 1));        // below 32 KiB
  EXPECT_TRUE(p.collective_extrapolated(CollectiveOp::AllGather, 64 * kGiB, 8, 1));   // above 16 GiB
}

TEST(Collectives, PublishedAllReduceSweepsAtFsdpSizes) {
  // 8xA100 all_reduce, stas00/ml-engineering network/README.md (published-dev-set gt0185-gt0194).
  struct Pt { Bytes s; double busbw; };
  auto a = profile("8xA100-80GB");
  for (Pt pt : {Pt{33554432, 138.49}, Pt{67108864, 171.54}, Pt{134217728, 176.92}, Pt{268435456, 194.07},
                Pt{536870912, 222.72}, Pt{1073741824, 229.04}, Pt{4294967296, 233.88}, Pt{17179869184, 234.89}}) {
    double bw = busbw_GBps(CollectiveOp::AllReduce, pt.s, 8, a.collective_time(CollectiveOp::AllReduce, pt.s, 8, 1));
    EXPECT_NEAR(bw / pt.busbw, 1.0, 0.12) << "A100 AR " << pt.s;
  }
  // 8xH200 all_reduce (NVLS), gt0204-gt0214; H200 and H100 share NVLink4.
  auto h = profile("8xH200");
  for (Pt pt : {Pt{16777216, 219.89}, Pt{67108864, 346.51}, Pt{268435456, 436.15}, Pt{1073741824, 463.58},
                Pt{17179869184, 482.26}}) {
    double bw = busbw_GBps(CollectiveOp::AllReduce, pt.s, 8, h.collective_time(CollectiveOp::AllReduce, pt.s, 8, 1));
    EXPECT_NEAR(bw / pt.busbw, 1.0, 0.15) << "H200 AR " << pt.s;
  }
}

TEST(Collectives, AcrossNodesTheNicsBound) {
  // N8: busbw <= min(intra ring busbw, NICs x per-NIC busbw).
  auto ndr = profile("2x8xH100-SXM-IB-NDR400");
  double ag = busbw_GBps(CollectiveOp::AllGather, kGiB, 16, ndr.collective_time(CollectiveOp::AllGather, kGiB, 16, 2));
  EXPECT_LE(ag, 360);
  EXPECT_GT(ag, 300);
  // HSDP replicate group: one rank per node drives one NIC: ~46-48 GB/s (nccl-tests#290).
  double rep = busbw_GBps(CollectiveOp::AllReduce, kGiB, 2, ndr.collective_time(CollectiveOp::AllReduce, kGiB, 2, 2));
  EXPECT_LE(rep, 47);
  EXPECT_GT(rep, 40);
  // DGX-A100 8x200G: 192 GB/s multi-node AR busbw (NVIDIA/nccl#812).
  auto hdr = profile("4x8xA100-80GB-IB-HDR200");
  double ar = busbw_GBps(CollectiveOp::AllReduce, 4 * kGiB, 32, hdr.collective_time(CollectiveOp::AllReduce, 4 * kGiB, 32, 4));
  EXPECT_NEAR(ar, 192, 192 * 0.05);
  // 10 Gb Ethernet is two orders of magnitude slower than NVLink.
  auto eth = profile("2x8xH100-SXM-ETH-10G");
  EXPECT_GT(eth.collective_time(CollectiveOp::AllGather, kGiB, 16, 2), 100 * ndr.collective_time(CollectiveOp::AllGather, kGiB, 8, 1));
  // The latency grows with inter-node steps: 16 ranks on 2 nodes vs 16 on 4 nodes of 4.
  EXPECT_LT(profile("2x8xH100-SXM-IB-NDR400").collective_time(CollectiveOp::AllGather, 4096, 16, 2),
            profile("4x4xH100-SXM-IB-NDR400").collective_time(CollectiveOp::AllGather, 4096, 16, 4));
}

TEST(Collectives, PositiveAndMonotoneInSizeEverywhere) {
  for (const std::string c : {"8xH100-SXM", "8xA100-40GB", "4xA100-80GB-PCIe4", "2x8xH200-RoCE-400G", "2x8xB200-IB-NDR400"}) {
    auto p = profile(c);
    Cluster cl = load_cluster(c);
    for (auto op : {CollectiveOp::AllGather, CollectiveOp::ReduceScatter, CollectiveOp::AllReduce}) {
      for (int n : {2, cl.gpus_per_node, cl.world()}) {
        int k = (n + cl.gpus_per_node - 1) / cl.gpus_per_node;
        TimeNs prev = 0;
        for (Bytes s = 1024; s <= 64 * kGiB; s *= 2) {
          TimeNs t = p.collective_time(op, s, n, k);
          EXPECT_GT(t, prev) << c << " " << collective_name(op) << " n=" << n << " S=" << s;
          prev = t;
        }
      }
    }
    EXPECT_EQ(p.collective_time(CollectiveOp::AllGather, kGiB, 1, 1), 0);   // a group of one does nothing
  }
}

// Cost functions of the built-in profiles against the public measurements they cite, plus exact
// arithmetic checks of the documented formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "calibrate/compute_model.h"
#include "calibrate/hardware_profile.h"
#include "common/errors.h"

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
  // RTX 4090: 160.17 TFLOPS at 8192^3 (zzc0721/torch-performance-test-data#78), below the 165.2 peak.
  auto r = burst("2xRTX4090");
  double f8k = 2.0 * 8192 * 8192 * 8192;
  EXPECT_NEAR(f8k / (static_cast<double>(r.gemm_time(8192, 8192, 8192, Dtype::BF16)) * 1e-9) / 1e12, 160.17, 160.17 * 0.005);
}

TEST(Gemm, Rtx4090MatchesPublishedSquareBf16Sweep) {
  // zzc0721/torch-performance-test-data#78: RTX 4090, torch 2.7 cu128, bf16 square matmuls (burst rates).
  // Not checked: 1024^3 (126.84 TFLOPS), where 64 tiles of 128x128 half-fill the 128 SMs and the model gives ~half
  // the measured rate (cuBLAS picks smaller tiles there).
  auto p = burst("2xRTX4090");
  struct Pt { std::int64_t n; double tflops; };
  for (Pt pt : {Pt{2048, 164.81}, Pt{4096, 151.50}, Pt{8192, 160.17}, Pt{10240, 158.54}}) {
    double flops = 2.0 * pt.n * pt.n * pt.n;
    double measured_ns = flops / (pt.tflops * 1e12) * 1e9;
    double t = static_cast<double>(p.gemm_time(pt.n, pt.n, pt.n, Dtype::BF16));
    EXPECT_NEAR(t / measured_ns, 1.0, 0.10) << pt.n << "^3: model " << flops / t / 1e3 << " TFLOPS";
  }
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
  // The shipped H100 profile runs GEMMs at 0.69 of the burst rate (fitted on the dev set, see the profile).
  double shipped = static_cast<double>(profile("8xH100-SXM").gemm_time(8192, 8192, 8192, Dtype::BF16) - 4000);
  double fast = static_cast<double>(burst("8xH100-SXM").gemm_time(8192, 8192, 8192, Dtype::BF16) - 4000);
  EXPECT_NEAR(fast / shipped, 0.69, 1e-6);
}

TEST(Gemm, Float8NeedsFp8TensorCores) {
  // H100: fp8 GEMMs at the fp8 peak (twice bf16's), the same shape curve: a compute-bound one takes about half.
  auto h = profile("8xH100-SXM");
  const double bf16 = static_cast<double>(h.gemm_time(8192, 8192, 8192, Dtype::BF16) - 4000);
  const double fp8 = static_cast<double>(h.gemm_time(8192, 8192, 8192, Dtype::FP8) - 4000);
  EXPECT_NEAR(fp8 / bf16, 989.4 / 1978.9, 1e-3);
  // A100 has no fp8 tensor cores: the error names the plan key that asked for fp8 GEMMs.
  auto a = profile("8xA100-80GB");
  try {
    a.gemm_time(4096, 4096, 4096, Dtype::FP8);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "plan.float8");
    EXPECT_NE(std::string(e.what()).find("A100-80GB"), std::string::npos);
  }
}

TEST(Attention, Formula) {
  auto p = burst("8xH100-SXM");
  // Causal forward: 2*b*s^2*h*d FLOPs at 27.72% of 989.4 TFLOP/s at the reference shape (seq 16384, head dim
  // 128; the FA3 paper's 35% for FA2 on H100 x the dev-set attention factor 0.792), backward 2.5x the FLOPs
  // at 23.76%, + 4 us. At seq 4096 the efficiency scales by F(4096, 128) / F(16384, 128) with
  // F = s/(s+241) * s/(s+340) * d/(d+23.5): (4096/4337 * 4096/4436) / (16384/16625 * 16384/16724).
  const double f4096 = 4096.0 / 4337 * 4096.0 / 4436, f16384 = 16384.0 / 16625 * 16384.0 / 16724;
  const double k = f4096 / f16384;
  double fwd = 2.0 * 1 * 4096.0 * 4096 * 32 * 128;
  EXPECT_EQ(p.attention_time(1, 4096, 32, 8, 128, Dtype::BF16, false), std::llround(fwd / (989.4e12 * 0.2772 * k) * 1e9) + 4000);
  EXPECT_EQ(p.attention_time(1, 4096, 32, 8, 128, Dtype::BF16, true),
            std::llround(2.5 * fwd / (989.4e12 * 0.2376 * k) * 1e9) + 4000);
  // Quadratic in the sequence length, times the efficiency ratio of the two lengths.
  const double f8192 = 8192.0 / 8433 * 8192.0 / 8532;
  double r = static_cast<double>(p.attention_time(2, 8192, 32, 8, 128, Dtype::BF16, false) - 4000) /
             static_cast<double>(p.attention_time(2, 4096, 32, 8, 128, Dtype::BF16, false) - 4000);
  EXPECT_NEAR(r, 4.0 * f4096 / f8192, 1e-4);
}

TEST(Attention, ShapeCurvesMatchTheirSources) {
  calibrate::ComputeParams c;
  c.attn_seq_half = 241, c.attn_causal_half = 0, c.attn_head_dim_half = 0;
  c.attn_ref_seq = 16384, c.attn_ref_head_dim = 128;
  // pytorch/benchmark#2391, H100, d 128, non-causal FA2 (Triton tutorial) TFLOP/s at seq 512..8k vs 16k.
  const double meas[] = {328.882, 389.723, 433.721, 458.359, 470.732};
  for (int i = 0; i < 5; ++i)
    EXPECT_NEAR(calibrate::attention_shape_factor(c, 512 << i, 128), meas[i] / 476.753, 0.01) << (512 << i);
  // pytorch/benchmark#2443, H100 SDPA: causal / non-causal latency 0.199136 / 0.24512 ms at 512 and
  // 0.298208 / 0.442944 at 1024; causal does half the FLOPs, so its efficiency relative to non-causal is
  // 0.5 * t_full / t_causal = 0.615 and 0.743; the causal factor s/(s+340) gives 0.601 and 0.751.
  c.attn_seq_half = 0, c.attn_causal_half = 340, c.attn_ref_seq = 1e12;
  EXPECT_NEAR(calibrate::attention_shape_factor(c, 512, 128), 0.5 * 0.24512 / 0.199136, 0.02);
  EXPECT_NEAR(calibrate::attention_shape_factor(c, 1024, 128), 0.5 * 0.442944 / 0.298208, 0.02);
  // Dao-AILab/flash-attention#307: FA2 causal forward at 16k tokens, 24.15 ms (d 64) vs 41.80 ms (d 128); d 128
  // does twice the FLOPs, so d 64 runs at (41.80 / 24.15) / 2 = 0.865 of d 128's rate.
  c.attn_causal_half = 0, c.attn_head_dim_half = 23.5, c.attn_ref_seq = 16384;
  EXPECT_NEAR(calibrate::attention_shape_factor(c, 16384, 64), 41.799503 / 24.149960 / 2, 0.005);
}

TEST(Other, MemoryBoundClassRates) {
  // A profile giving the norm class its own rate (as a calibrated CPU profile does): norm kernels run at
  // it, every other class at HBM bandwidth x efficiency (3.35 TB/s x 0.8 on H100).
  Cluster c = load_cluster("8xH100-SXM");
  nlohmann::json j = HardwareProfile::for_cluster(c).to_json();
  j["gpu"]["elementwise_bytes_per_s"] = {{"norm", {{"value", 1e9}, {"source", "test"}}}};
  auto p = HardwareProfile::from_json(j, "test", c);
  EXPECT_EQ(p.memory_bound_time(1000000, MemoryClass::Norm), 1000000 + 4000);   // 1 MB at 1 GB/s = 1 ms
  EXPECT_EQ(p.memory_bound_time(1000000, MemoryClass::Copy), std::llround(1e6 / (3.35e12 * 0.8) * 1e9) + 4000);
  EXPECT_EQ(p.memory_bound_time(1000000, MemoryClass::Activation), p.memory_bound_time(1000000));
  j["gpu"]["elementwise_bytes_per_s"]["norm"]["value"] = 0;   // below the 1e3 bytes/s floor: bad input
  EXPECT_THROW(HardwareProfile::from_json(j, "test", c), InputError);
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
  // The CPU cost of one eager op, fitted on the CPU-bound per-op fixtures (scripts/fit_cpu_issue.py: 60.2 and
  // 66.9 us per op, 63.07 us least squares), and one FSDP hook (an assumption the fit keeps): the same in
  // every built-in GPU profile, a property of the host and PyTorch, not of the GPU.
  EXPECT_EQ(p.kernel_launch_ns(), 63000);
  EXPECT_EQ(p.framework_hook_ns(), 50000);
  for (const char* c : {"8xA100-40GB", "8xA100-80GB", "8xH200", "8xB200", "8xRTX4090"}) {
    EXPECT_EQ(profile(c).kernel_launch_ns(), p.kernel_launch_ns()) << c;
    EXPECT_EQ(profile(c).framework_hook_ns(), p.framework_hook_ns()) << c;
  }
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
  for (const std::string c : {"8xH100-SXM", "8xA100-40GB", "4xA100-80GB-PCIe4", "2x8xH200-RoCE-400G", "2x8xB200-IB-NDR400",
                             "4xRTX4090"}) {
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

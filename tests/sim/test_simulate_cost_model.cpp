// ProfileCostModel: each op kind is timed by exactly the profile query sim/profile_cost_model.h
// documents (the oracle is the profile itself, queried directly here).
#include <gtest/gtest.h>

#include "calibrate/hardware_profile.h"
#include "models/zoo.h"
#include "sim/profile_cost_model.h"
#include "sim/simulator.h"

namespace fsdpsim::sim {
namespace {

calibrate::HardwareProfile h100() {
  return calibrate::HardwareProfile::for_cluster(calibrate::load_cluster("2x8xH100-SXM-IB-NDR400"));
}

models::KernelDesc gemm(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t count = 1) {
  models::KernelDesc d;
  d.kind = models::KernelKind::Gemm;
  d.m = m;
  d.n = n;
  d.k = k;
  d.count = count;
  d.flops = 2.0 * m * n * k * count;
  return d;
}

TEST(ProfileCostModel, ComputeOpIsTheSumOfItsKernels) {
  const auto hw = h100();
  ProfileCostModel cost(hw);
  Op op;
  op.kind = OpKind::Forward;
  op.kernels.push_back(gemm(4096, 4096, 4096));
  op.kernels.push_back(gemm(4096, 14336, 4096, 3));
  models::KernelDesc attn;
  attn.kind = models::KernelKind::Attention;
  attn.batch = 1;
  attn.seq = 4096;
  attn.heads = 32;
  attn.kv_heads = 8;
  attn.head_dim = 128;
  op.kernels.push_back(attn);
  models::KernelDesc norm;
  norm.kind = models::KernelKind::Elementwise;
  norm.bytes = 64 * kMiB;
  op.kernels.push_back(norm);
  const TimeNs expected = hw.gemm_time(4096, 4096, 4096, Dtype::BF16) +
                          3 * hw.gemm_time(4096, 14336, 4096, Dtype::BF16) +
                          hw.attention_time(1, 4096, 32, 8, 128, Dtype::BF16, false) +
                          hw.memory_bound_time(64 * kMiB);
  EXPECT_EQ(cost.op_time(op), expected);
  EXPECT_EQ(cost.op_time(op), expected);   // memoized: the same answer
  EXPECT_GT(expected, 0);
}

TEST(ProfileCostModel, CollectivesCopiesAndHostOps) {
  const auto hw = h100();
  ProfileCostModel cost(hw);
  Op ag;
  ag.kind = OpKind::AllGather;
  ag.comm_bytes = 256 * kMiB;
  ag.group_size = 16;
  ag.nodes_spanned = 2;
  EXPECT_EQ(cost.op_time(ag), hw.collective_time(calibrate::CollectiveOp::AllGather, 256 * kMiB, 16, 2));
  Op ar = ag;
  ar.kind = OpKind::AllReduce;
  ar.group_size = 2;
  EXPECT_EQ(cost.op_time(ar), hw.collective_time(calibrate::CollectiveOp::AllReduce, 256 * kMiB, 2, 2));
  Op solo = ag;
  solo.group_size = 1;   // a one-rank group moves nothing
  EXPECT_EQ(cost.op_time(solo), 0);
  Op cast;
  cast.kind = OpKind::Cast;
  cast.copy_bytes = 3 * kMiB;
  EXPECT_EQ(cost.op_time(cast), hw.memory_bound_time(3 * kMiB));
  Op h2d;
  h2d.kind = OpKind::H2D;
  h2d.copy_bytes = 100 * kMiB;
  EXPECT_EQ(cost.op_time(h2d), hw.host_copy_time(100 * kMiB));
  Op opt;
  opt.kind = OpKind::CpuOptimizerStep;
  opt.params = 1'000'000'000;
  EXPECT_EQ(cost.op_time(opt), hw.cpu_optimizer_time(1'000'000'000));
}

TEST(ProfileCostModel, CpuIssueAndSlowdown) {
  const auto hw = h100();
  ProfileCostModel cost(hw);
  Op op;
  op.cpu_hooks = 3;
  op.kernel_launches = 7;
  EXPECT_EQ(cost.cpu_issue_time(op), 3 * hw.framework_hook_ns() + 7 * hw.kernel_launch_ns());
  EXPECT_DOUBLE_EQ(cost.overlap_slowdown(), hw.comm_overlap_slowdown());
  EXPECT_GE(cost.overlap_slowdown(), 1.0);
  // The bundled C++ runtime's ops cost its own launch (runtime_launch_ns), not eager PyTorch's fitted one.
  ProfileCostModel native(hw, /*native=*/true);
  EXPECT_EQ(native.cpu_issue_time(op), 3 * hw.framework_hook_ns() + 7 * hw.runtime_launch_ns());
  EXPECT_EQ(hw.runtime_launch_ns(), 6000);
  EXPECT_EQ(hw.kernel_launch_ns(), 63000);
}

// simulate() prices a plan of the bundled runtime (implementation "runtime") with runtime_launch_ns: the same
// ops issued at the C++ runtime's cost, not eager PyTorch's.
TEST(ProfileCostModel, RuntimePlansIssueAtTheRuntimesCost) {
  const auto hw = h100();
  const models::ModelSpec m = models::load_model("tiny-llama");
  Plan eager;
  eager.implementation = models::ModelImpl::TorchTitan;
  eager.micro_batch = 1;
  eager.seq_len = 128;
  Plan runtime = eager;
  runtime.implementation = models::ModelImpl::Runtime;
  const SimResult e = simulate(m, hw, eager), r = simulate(m, hw, runtime);
  ASSERT_GT(e.cpu_issue_ns, 0);
  ASSERT_GT(r.cpu_issue_ns, 0);
  // (the two programs differ in their kernels, not by 10x: the per-op cost does)
  EXPECT_LT(r.cpu_issue_ns * 3, e.cpu_issue_ns);
}

}  // namespace
}  // namespace fsdpsim::sim

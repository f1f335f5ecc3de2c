// The CPU + MPI calibration end to end: `fsdpsim calibrate --backend cpu --quick` builds exactly
// this command (calibrate/launcher.h), runs fsdpsim-calibrate-cpu under
// `mpirun --allow-run-as-root --oversubscribe -np 2`, and the profile it writes loads back.
#include <gtest/gtest.h>

#include <fstream>

#include "calibrate/hardware_profile.h"
#include "calibrate/launcher.h"
#include "calibrate/profile_summary.h"
#include "common/errors.h"
#include "common/json_reader.h"

using namespace fsdpsim;
using namespace fsdpsim::calibrate;

namespace {
const std::string kOut = std::string(FSDPSIM_BINARY_DIR) + "/test_cpu_profile.json";

class CpuCalibration : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LaunchRequest r;
    r.backend = "cpu";
    r.ranks = 2;
    r.exe_dir = FSDPSIM_BINARY_DIR;
    r.args = {"--quick", "--out", kOut, "--gemm-shapes", "64x96x128"};
    std::remove(kOut.c_str());
    rc_ = run_command(calibration_command(r));
  }
  static int rc_;
};
int CpuCalibration::rc_ = -1;

Cluster two_cpu_ranks() {
  Cluster c;
  c.name = "2xCPU";
  c.nodes = 1;
  c.gpus_per_node = 2;
  c.gpu = "CPU";
  c.intra_node = "SHM";
  return c;
}
}  // namespace

TEST(CpuLauncher, BuildsTheMpirunCommand) {
  LaunchRequest r;
  r.backend = "cpu";
  r.ranks = 3;
  r.exe_dir = FSDPSIM_BINARY_DIR;
  r.args = {"--quick"};
  auto cmd = calibration_command(r);
  if (running_under_mpi()) GTEST_SKIP() << "already under mpirun";
  ASSERT_EQ(cmd.size(), 7u);
  EXPECT_EQ(cmd[0], "mpirun");
  EXPECT_EQ(cmd[1], "--allow-run-as-root");
  EXPECT_EQ(cmd[2], "--oversubscribe");
  EXPECT_EQ(cmd[4], "3");
  EXPECT_EQ(cmd[5], std::string(FSDPSIM_BINARY_DIR) + "/fsdpsim-calibrate-cpu");
  r.backend = "tpu";
  EXPECT_THROW(calibration_command(r), InputError);
  r.backend = "cpu";
  r.exe_dir = "/nonexistent";
  EXPECT_THROW(calibration_command(r), InputError);
}

TEST_F(CpuCalibration, RunsAndWritesAProfile) {
  ASSERT_EQ(rc_, 0);
  Json j = read_json_file(kOut, "profile");
  // The context block comes first and names the backend and ranks.
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.begin().key(), "context");
  EXPECT_EQ(j["context"]["backend"], "cpu");
  EXPECT_EQ(j["context"]["ranks"], 2);
  EXPECT_EQ(j["schema"], "fsdpsim.hardware_profile/1");
  EXPECT_EQ(j["measured"]["collectives"].size(), 3u);   // AG, RS, AR on 2 ranks
}

TEST_F(CpuCalibration, ProfileLoadsBackWithPositiveMonotoneCollectives) {
  ASSERT_EQ(rc_, 0);
  auto p = HardwareProfile::from_file(kOut, two_cpu_ranks());
  EXPECT_GT(p.memory_capacity(), 0);
  EXPECT_GT(p.peak_flops(Dtype::FP32), 1e8);   // any CPU does > 0.1 GFLOP/s
  for (auto op : {CollectiveOp::AllGather, CollectiveOp::ReduceScatter, CollectiveOp::AllReduce}) {
    TimeNs prev = 0;
    for (Bytes s = 4 * kKiB; s <= 4 * kMiB; s *= 2) {
      TimeNs t = p.collective_time(op, s, 2, 1);
      EXPECT_GT(t, 0) << collective_name(op) << " " << s;
      EXPECT_GE(t, prev) << collective_name(op) << " " << s;
      EXPECT_FALSE(p.collective_extrapolated(op, s, 2, 1)) << s;
      prev = t;
    }
    EXPECT_TRUE(p.collective_extrapolated(op, 64 * kMiB, 2, 1));   // beyond the quick sweep
    EXPECT_GT(p.collective_time(op, 64 * kMiB, 2, 1), prev);
  }
  // The model's GEMM shape was measured and is used exactly.
  Json j = read_json_file(kOut, "profile");
  bool found = false;
  for (const auto& g : j["measured"]["gemms"])
    for (const auto& pt : g["points"])
      if (pt[0] == 64 && pt[1] == 96 && pt[2] == 128) {
        found = true;
        EXPECT_EQ(p.gemm_time(64, 96, 128, Dtype::FP32), std::llround(pt[3].get<double>()));
      }
  EXPECT_TRUE(found);
  EXPECT_NE(profile_summary(p).find("all_gather"), std::string::npos);
}

TEST_F(CpuCalibration, BadArgumentsExitWithCode2) {
  LaunchRequest r;
  r.backend = "cpu";
  r.ranks = 2;
  r.exe_dir = FSDPSIM_BINARY_DIR;
  r.args = {"--gemm-shapes", "64x0x3", "--out", std::string(FSDPSIM_BINARY_DIR) + "/never.json"};
  EXPECT_EQ(run_command(calibration_command(r)), 2);
  r.args = {"--no-such-option"};
  EXPECT_EQ(run_command(calibration_command(r)), 2);
}

// With --model, the calibrator also times the CPU runtime's own kernels at the model's shapes and the
// model's GEMMs with the transposes the runtime uses (calibrate/cpu/runtime_kernels.h).
namespace {
const std::string kModelOut = std::string(FSDPSIM_BINARY_DIR) + "/test_cpu_profile_model.json";

class CpuModelCalibration : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LaunchRequest r;
    r.backend = "cpu";
    r.ranks = 2;
    r.exe_dir = FSDPSIM_BINARY_DIR;
    r.args = {"--quick", "--max-bytes", "65536", "--out", kModelOut, "--model", "tiny-llama", "--micro-batch", "1",
              "--seq-len", "16"};
    std::remove(kModelOut.c_str());
    rc_ = run_command(calibration_command(r));
  }
  static int rc_;
};
int CpuModelCalibration::rc_ = -1;
}  // namespace

TEST_F(CpuModelCalibration, MeasuresTheRuntimesKernelsPerClass) {
  ASSERT_EQ(rc_, 0);
  Json j = read_json_file(kModelOut, "profile");
  const Json& ew = j["gpu"]["elementwise_bytes_per_s"];
  for (int c = 0; c < kMemoryClasses; ++c) {
    const char* name = memory_class_name(static_cast<MemoryClass>(c));
    ASSERT_TRUE(ew.contains(name)) << name;
    EXPECT_GT(ew[name]["value"].get<double>(), 0) << name;
    EXPECT_NE(ew[name]["source"].get<std::string>().find("tiny-llama"), std::string::npos) << name;
  }
  for (const char* k : {"fwd_efficiency", "bwd_efficiency"}) {
    const double e = j["gpu"]["attention"][k]["value"];
    EXPECT_GT(e, 0) << k;
    EXPECT_LE(e, 1) << k;
  }
  EXPECT_TRUE(j["context"]["calibration_warnings"].is_array());
  // The LM head's forward GEMM of tiny-llama (16 tokens x 4096 vocab x 256 hidden) was measured.
  bool head = false;
  for (const auto& g : j["measured"]["gemms"])
    for (const auto& pt : g["points"]) head |= pt[0] == 16 && pt[1] == 4096 && pt[2] == 256;
  EXPECT_TRUE(head);
  // The profile times each class at its own rate: 1 MB of norm kernel = 1e6 / rate s + min_kernel_ns.
  auto p = HardwareProfile::from_file(kModelOut, two_cpu_ranks());
  const double norm = ew["norm"]["value"], min_kernel = j["gpu"]["gemm"]["min_kernel_ns"]["value"];
  EXPECT_EQ(p.memory_bound_time(1000000, MemoryClass::Norm), std::llround(1e6 / norm * 1e9) + std::llround(min_kernel));
}

TEST_F(CpuModelCalibration, AModelTheRuntimeCannotRunIsBadInput) {
  LaunchRequest r;
  r.backend = "cpu";
  r.ranks = 2;
  r.exe_dir = FSDPSIM_BINARY_DIR;
  r.args = {"--quick", "--model", "no-such-model", "--out", std::string(FSDPSIM_BINARY_DIR) + "/never.json"};
  EXPECT_EQ(run_command(calibration_command(r)), 2);
  r.args = {"--quick", "--model", "mixtral-8x7b", "--out", std::string(FSDPSIM_BINARY_DIR) + "/never.json"};
  EXPECT_EQ(run_command(calibration_command(r)), 2);   // MoE: outside the CPU runtime's Llama family
}

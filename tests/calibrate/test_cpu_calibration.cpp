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

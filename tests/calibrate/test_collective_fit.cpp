// Fitting measured collective sweeps (collective_fit.h) on synthetic points with hand-computed
// answers, and its use through HardwareProfile::from_file.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "calibrate/collective_fit.h"
#include "calibrate/hardware_profile.h"
#include "common/errors.h"

using namespace fsdpsim;
using namespace fsdpsim::calibrate;

namespace {
// t = 4.8828125 ns/byte * S above 4 KiB (a pure bandwidth term), 10 us at 1 KiB.
CollectiveFit synthetic() {
  return CollectiveFit({{4096, 20000.0}, {1024, 10000.0}, {65536, 320000.0}, {16384, 80000.0}}, "points");
}
}  // namespace

TEST(CollectiveFit, ExactAtMeasuredPoints) {
  auto f = synthetic();
  EXPECT_EQ(f.time(1024), 10000);
  EXPECT_EQ(f.time(4096), 20000);
  EXPECT_EQ(f.time(16384), 80000);
  EXPECT_EQ(f.time(65536), 320000);
}

TEST(CollectiveFit, LogLogInterpolationBetweenPoints) {
  auto f = synthetic();
  // 2048 is the geometric midpoint of 1024 and 4096: the power law through both gives sqrt(10000*20000).
  EXPECT_EQ(f.time(2048), std::llround(std::sqrt(10000.0 * 20000.0)));   // 14142
  // On the linear part the power law has exponent 1: exactly proportional.
  EXPECT_EQ(f.time(8192), 40000);
  EXPECT_EQ(f.time(32768), 160000);
  EXPECT_FALSE(f.extrapolated(2048));
  EXPECT_FALSE(f.extrapolated(65536));
}

TEST(CollectiveFit, AlphaBetaBeyondTheLargestPoint) {
  auto f = synthetic();
  EXPECT_DOUBLE_EQ(f.tail_ns_per_byte(), 320000.0 / 65536.0);   // least squares on the top 3 points
  EXPECT_EQ(f.time(131072), 640000);
  EXPECT_EQ(f.time(65536 + 1000), 320000 + std::llround(4.8828125 * 1000));
  EXPECT_TRUE(f.extrapolated(131072));
}

TEST(CollectiveFit, FlatBelowTheSmallestPoint) {
  auto f = synthetic();
  EXPECT_EQ(f.time(8), 10000);
  EXPECT_TRUE(f.extrapolated(8));
}

TEST(CollectiveFit, AlphaBetaWithLatency) {
  // t = 5000 + 0.5*S on the top points: the tail keeps the fitted slope, anchored at the last point.
  CollectiveFit f({{1 << 20, 5000 + 0.5 * (1 << 20)}, {1 << 21, 5000 + 0.5 * (1 << 21)}, {1 << 22, 5000 + 0.5 * (1 << 22)}}, "p");
  EXPECT_NEAR(f.tail_ns_per_byte(), 0.5, 1e-9);
  EXPECT_EQ(f.time(1 << 23), 5000 + (1 << 22));
}

TEST(CollectiveFit, NoiseNeverMakesALargerMessageFaster) {
  CollectiveFit f({{1024, 100.0}, {2048, 90.0}, {4096, 200.0}}, "p");
  EXPECT_EQ(f.time(2048), 100);
  TimeNs prev = 0;
  for (Bytes s = 512; s <= 8192; s += 64) {
    EXPECT_GE(f.time(s), prev) << s;
    prev = f.time(s);
  }
}

TEST(CollectiveFit, BadPoints) {
  EXPECT_THROW(CollectiveFit({}, "p"), InputError);
  EXPECT_THROW(CollectiveFit({{0, 1.0}}, "p"), InputError);
  EXPECT_THROW(CollectiveFit({{1024, 0.0}}, "p"), InputError);
  EXPECT_THROW(CollectiveFit({{1024, NAN}}, "p"), InputError);
  EXPECT_THROW(CollectiveFit({{1024, 1.0}, {1024, 2.0}}, "p"), InputError);
  try {
    CollectiveFit({{1024, 1.0}, {-5, 2.0}}, "measured.collectives[0].points");
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "measured.collectives[0].points[0]");
  }
}

namespace {
std::string profile_with_sweep(const std::string& points_json) {
  Cluster c = load_cluster("8xH100-SXM");
  nlohmann::json j = HardwareProfile::for_cluster(c).to_json();
  j["name"] = "synthetic";
  j["measured"] = nlohmann::json::parse(R"({"collectives": [{"op": "all_gather", "group_size": 4, "nodes": 1,
      "source": "synthetic test points", "points": )" + points_json + "}]}");
  std::string path = std::string(FSDPSIM_BINARY_DIR) + "/synthetic_profile.json";
  std::ofstream(path) << j.dump(1);
  return path;
}
}  // namespace

TEST(CollectiveFit, UsedByHardwareProfileFromFile) {
  Cluster c = load_cluster("8xH100-SXM");
  auto p = HardwareProfile::from_file(profile_with_sweep("[[1024, 10000], [4096, 20000], [16384, 80000], [65536, 320000]]"), c);
  EXPECT_EQ(p.name(), "synthetic");
  EXPECT_EQ(p.collective_time(CollectiveOp::AllGather, 4096, 4, 1), 20000);
  EXPECT_EQ(p.collective_time(CollectiveOp::AllGather, 8192, 4, 1), 40000);
  EXPECT_FALSE(p.collective_extrapolated(CollectiveOp::AllGather, 8192, 4, 1));
  EXPECT_TRUE(p.collective_extrapolated(CollectiveOp::AllGather, 1 << 20, 4, 1));
  // Another group size: scaled by the busbw factor ratio ((8-1)/8) / ((4-1)/4), and flagged.
  EXPECT_EQ(p.collective_time(CollectiveOp::AllGather, 8192, 8, 1), std::llround(40000 * (7.0 / 8) / (3.0 / 4)));
  EXPECT_TRUE(p.collective_extrapolated(CollectiveOp::AllGather, 8192, 8, 1));
  // An op without a sweep falls back to the fabric model, flagged as well.
  EXPECT_GT(p.collective_time(CollectiveOp::AllReduce, 8192, 4, 1), 0);
  EXPECT_TRUE(p.collective_extrapolated(CollectiveOp::AllReduce, 8192, 4, 1));
}

TEST(CollectiveFit, BadSweepInAProfileNamesTheField) {
  Cluster c = load_cluster("8xH100-SXM");
  try {
    HardwareProfile::from_file(profile_with_sweep("[[1024, 10000], [1024, 20000]]"), c);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--profile.measured.collectives[0].points[1]") << e.what();
  }
  try {
    HardwareProfile::from_file(profile_with_sweep("[[1024]]"), c);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--profile.measured.collectives[0].points[0]") << e.what();
  }
}

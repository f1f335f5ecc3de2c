// `fsdpsim profile show NAME|FILE`: loading by GPU name, cluster name or file, and the summary text.
#include <gtest/gtest.h>

#include <fstream>

#include "calibrate/profile_summary.h"
#include "common/errors.h"

using namespace fsdpsim;
using namespace fsdpsim::calibrate;

TEST(ProfileShow, ByGpuAndClusterName) {
  auto p = load_profile_for_show("H100-SXM", "profile show");
  EXPECT_EQ(p.cluster().world(), 8);
  std::string s = profile_summary(p);
  for (const char* needle : {"H100-SXM", "989.4", "79.11 GiB", "all_gather", "reduce_scatter", "all_reduce",
                             "nccl-tests#326", "source:"})
    EXPECT_NE(s.find(needle), std::string::npos) << needle << "\n" << s;
  auto q = load_profile_for_show("2x8xA100-80GB-IB-HDR200", "profile show");
  EXPECT_NE(profile_summary(q).find("IB-HDR200"), std::string::npos);
  std::string r = profile_summary(load_profile_for_show("RTX4090", "profile show"));
  for (const char* needle : {"RTX4090", "intra-node PCIe4", "165.2", "23.64 GiB", "Ada GPU Architecture whitepaper",
                             "assumption, not fitted for this GPU"})
    EXPECT_NE(r.find(needle), std::string::npos) << needle << "\n" << r;
}

TEST(ProfileShow, ByFileRoundTrip) {
  auto p = load_profile_for_show("4x8xH100-SXM-IB-NDR400", "profile show");
  std::string path = std::string(FSDPSIM_BINARY_DIR) + "/show_profile.json";
  std::ofstream(path) << p.to_json().dump(1);
  auto q = load_profile_for_show(path, "profile show");
  EXPECT_EQ(q.cluster().world(), 32);
  EXPECT_EQ(q.collective_time(CollectiveOp::AllGather, kGiB, 32, 4), p.collective_time(CollectiveOp::AllGather, kGiB, 32, 4));
}

TEST(ProfileShow, BadNames) {
  EXPECT_THROW(load_profile_for_show("V100", "profile show"), InputError);
  EXPECT_THROW(load_profile_for_show("/nonexistent/profile.json", "profile show"), InputError);
  std::string path = std::string(FSDPSIM_BINARY_DIR) + "/bad_profile.json";
  std::ofstream(path) << R"({"schema": "something-else", "name": "x", "gpu": {}})";
  try {
    load_profile_for_show(path, "profile show");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "profile show.schema");
  }
}

// Timeline decimation and exposed-communication intervals on hand-checked traces.
#include <gtest/gtest.h>

#include "reports/timeline_decimate.h"

using namespace fsdpsim;
using namespace fsdpsim::reports;
using sim::TraceSpan;

namespace {
TraceSpan sp(const std::string& track, TimeNs start, TimeNs dur, const std::string& name = "s", const std::string& kind = "k") {
  return TraceSpan{name, track, kind, -1, start, dur, 0};
}
int total_count(const std::vector<TimelineRect>& r) {
  int n = 0;
  for (const auto& x : r) n += x.count;
  return n;
}
}  // namespace

TEST(Decimate, WideSpansAreKeptOneRectEach) {
  // 1 px = 10 ns: every span is >= 1 px.
  std::vector<TraceSpan> t = {sp("compute", 0, 10, "a"), sp("compute", 10, 50, "b"), sp("all_gather", 0, 30, "c")};
  auto r = decimate_trace(t, {10.0, 1.0, 4.0});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].track, "compute");   // track order: compute before all_gather
  EXPECT_EQ(r[0].name, "a");
  EXPECT_EQ(r[1].name, "b");
  EXPECT_EQ(r[2].track, "all_gather");
  for (const auto& x : r) EXPECT_EQ(x.count, 1);
}

TEST(Decimate, TinyAdjacentSpansMergeUpToFourPixels) {
  // 1 px = 10 ns; spans of 3 ns every 5 ns: tiny and 2 ns apart (< 1 px).
  std::vector<TraceSpan> t;
  for (int i = 0; i < 20; ++i) t.push_back(sp("cpu", i * 5, 3, "op" + std::to_string(i), "cpu"));
  auto r = decimate_trace(t, {10.0, 1.0, 4.0});
  // A group spans at most 40 ns: starts 0,5,...,35 end at 38 -> 8 spans; then 40..75 -> 8; then 80..95 -> 4.
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].count, 8);
  EXPECT_EQ(r[0].start_ns, 0);
  EXPECT_EQ(r[0].end_ns, 38);
  EXPECT_EQ(r[0].busy_ns, 24);
  EXPECT_EQ(r[0].name, "8 spans merged: op0 .. op7");
  EXPECT_EQ(r[1].count, 8);
  EXPECT_EQ(r[1].start_ns, 40);
  EXPECT_EQ(r[2].count, 4);
  EXPECT_EQ(total_count(r), 20);
}

TEST(Decimate, GapsWideSpansAndKindsBreakOrMarkGroups) {
  std::vector<TraceSpan> t = {sp("compute", 0, 2, "a", "forward"), sp("compute", 3, 2, "b", "backward"),
                              sp("compute", 30, 2, "c"),   // gap 25 ns > 1 px (10 ns): new group
                              sp("compute", 33, 50, "d"),  // wide: its own rect
                              sp("compute", 84, 2, "e")};  // tiny after a wide span: new group
  auto r = decimate_trace(t, {10.0, 1.0, 4.0});
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].count, 2);
  EXPECT_EQ(r[0].kind, "mixed");
  EXPECT_EQ(r[1].name, "c");
  EXPECT_EQ(r[2].name, "d");
  EXPECT_EQ(r[3].name, "e");
  EXPECT_EQ(total_count(r), 5);
}

TEST(Decimate, UnsortedInputAndUnknownTracks) {
  std::vector<TraceSpan> t = {sp("zeta", 5, 100), sp("cpu", 50, 100), sp("compute", 200, 100), sp("compute", 0, 100),
                              sp("alpha", 0, 100)};
  EXPECT_EQ(track_order(t), (std::vector<std::string>{"compute", "cpu", "alpha", "zeta"}));
  auto r = decimate_trace(t, {1.0, 1.0, 4.0});
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(r[0].start_ns, 0);   // sorted by start within the track
  EXPECT_EQ(r[1].start_ns, 200);
  EXPECT_EQ(r[2].track, "cpu");
}

// The simulator's definition (sim/executor.cpp): the compute stream idle before an op that was issued
// and whose predecessor finished, while a collective runs; collectives found by kind.
TEST(Exposed, CollectiveTimeTheComputeStreamWaitsFor) {
  std::vector<TraceSpan> t = {sp("compute", 0, 10, "a", "forward"), sp("compute", 20, 10, "b", "backward"),  // [0,10) [20,30)
                              sp("all_gather", 5, 20, "ag", "all_gather"),          // [5,25): b waits [10,20)
                              sp("reduce_scatter", 28, 12, "rs", "reduce_scatter"), // [28,40)
                              sp("all_reduce", 35, 10, "ar", "all_reduce"),         // [35,45): comm union [28,45)
                              sp("cpu", 50, 100, "x", "cpu_issue")};                // issues nothing on the GPU
  auto e = exposed_comm_intervals(t);
  // Communication after the last compute op keeps no compute op waiting: not exposed.
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], (std::pair<TimeNs, TimeNs>{10, 20}));
  // An optimizer step on the compute stream at 45 waits for the tail: [30,45) is exposed too.
  t.push_back(sp("compute", 45, 5, "opt", "optimizer_step"));
  e = exposed_comm_intervals(t);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0], (std::pair<TimeNs, TimeNs>{10, 20}));
  EXPECT_EQ(e[1], (std::pair<TimeNs, TimeNs>{30, 45}));
}

TEST(Exposed, ComputeIdleBeforeTheCpuIssuedIsNotCommunication) {
  // b is issued at 15 (its cpu_issue span ends there): the stream idles [10,15) on the CPU, [15,20) on
  // the all-gather.
  std::vector<TraceSpan> t = {sp("default", 0, 10, "a", "forward"), sp("default", 20, 10, "b", "forward"),
                              sp("cpu", 12, 3, "b", "cpu_issue"), sp("unshard", 5, 20, "AG u1", "all_gather")};
  auto e = exposed_comm_intervals(t);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], (std::pair<TimeNs, TimeNs>{15, 20}));
}

TEST(Exposed, FullyHiddenCommunication) {
  std::vector<TraceSpan> t = {sp("compute", 0, 100), sp("all_gather", 10, 20, "ag", "all_gather"),
                              sp("reduce_scatter", 60, 40, "rs", "reduce_scatter")};
  EXPECT_TRUE(exposed_comm_intervals(t).empty());
}

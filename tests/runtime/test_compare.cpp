// The validation comparison on hand-made results: signed relative errors, per-stream busy time as
// the union of spans, per-op matching by (name, kind, unit, occurrence), and the JSON round trip of
// a measured result.
#include <gtest/gtest.h>

#include "common/errors.h"
#include "runtime/compare.h"
#include "runtime/measured_result.h"

using namespace fsdpsim;
using namespace fsdpsim::runtime;

namespace {
sim::SimResult make(TimeNs step, Bytes alloc, Bytes reserved, std::vector<sim::TraceSpan> trace) {
  sim::SimResult r;
  r.step_time_ns = step;
  r.peak_allocated = alloc;
  r.peak_reserved = reserved;
  r.trace = std::move(trace);
  r.breakdown_at_peak["activations"] = alloc / 2;
  return r;
}
}  // namespace

TEST(Compare, SignedRelativeErrors) {
  auto p = make(1100, 1000, 2048, {});
  auto m = make(1000, 1000, 4096, {});
  auto j = compare_results(p, m);
  EXPECT_DOUBLE_EQ(j["step_time_error"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(j["peak_allocated_error"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j["peak_reserved_error"].get<double>(), -0.5);
  auto z = compare_results(p, make(0, 0, 0, {}));
  EXPECT_TRUE(z["step_time_error"].is_null());
}

TEST(Compare, PerStreamUnionAndPerOpMatching) {
  // Predicted: two forward spans overlapping on compute ([0,10) and [5,20) -> busy 20), one AG.
  std::vector<sim::TraceSpan> pt = {{"fwd unit 1", "compute", "forward", 1, 0, 10, 0},
                                    {"fwd unit 1", "compute", "forward", 1, 5, 15, 0},
                                    {"AG unit 1", "all_gather", "all_gather", 1, 0, 4, 100},
                                    {"issue", "cpu", "cpu", -1, 0, 1, 0}};
  std::vector<sim::TraceSpan> mt = {{"fwd unit 1", "compute", "forward", 1, 0, 20, 0},
                                    {"fwd unit 1", "compute", "forward", 1, 30, 10, 0},
                                    {"RS unit 1", "reduce_scatter", "reduce_scatter", 1, 0, 8, 100}};
  auto j = compare_results(make(20, 1, 1, pt), make(40, 1, 1, mt));
  std::map<std::string, nlohmann::json> streams;
  for (auto& s : j["per_stream"]) streams[s["track"]] = s;
  EXPECT_DOUBLE_EQ(streams["compute"]["predicted_busy_s"].get<double>(), 20e-9);
  EXPECT_DOUBLE_EQ(streams["compute"]["measured_busy_s"].get<double>(), 30e-9);
  ASSERT_EQ(j["per_op"].size(), 2u);   // the two forwards, matched in order of occurrence
  EXPECT_DOUBLE_EQ(j["per_op"][0]["error"].get<double>(), -0.5);   // 10 vs 20
  EXPECT_DOUBLE_EQ(j["per_op"][1]["error"].get<double>(), 0.5);    // 15 vs 10
  ASSERT_EQ(j["unmatched_ops"].size(), 2u);                        // AG only predicted, RS only measured
  ASSERT_EQ(j["per_kind"].size(), 1u);
  EXPECT_EQ(j["per_kind"][0]["count"], 2);
  EXPECT_DOUBLE_EQ(j["per_kind"][0]["error"].get<double>(), (25.0 - 30.0) / 30.0);
}

TEST(MeasuredResult, JsonRoundTrip) {
  sim::SimResult r = make(123456789, 5 * kMiB, 8 * kMiB, {{"AG unit 2", "all_gather", "all_gather", 2, 17, 33, 4096}});
  r.compute_ns = 1000;
  r.memory_timeline = {{0, 0, 0}, {10, 512, 2 * kMiB}};
  r.notes = {"measured"};
  r.comm_bytes_by_kind["all_gather"] = 4096;
  sim::SimResult b = sim_result_from_json(sim::sim_result_to_json(r, true), "measured.json");
  EXPECT_EQ(b.step_time_ns, r.step_time_ns);
  EXPECT_EQ(b.peak_allocated, r.peak_allocated);
  EXPECT_EQ(b.peak_reserved, r.peak_reserved);
  EXPECT_EQ(b.compute_ns, 1000);
  ASSERT_EQ(b.trace.size(), 1u);
  EXPECT_EQ(b.trace[0].start_ns, 17);
  EXPECT_EQ(b.trace[0].bytes, 4096);
  ASSERT_EQ(b.memory_timeline.size(), 2u);
  EXPECT_EQ(b.memory_timeline[1].reserved, 2 * kMiB);
  EXPECT_EQ(b.notes, r.notes);
  EXPECT_EQ(b.comm_bytes_by_kind["all_gather"], 4096);
  EXPECT_EQ(b.breakdown_at_peak["activations"], r.peak_allocated / 2);
  EXPECT_THROW(sim_result_from_json(nlohmann::json::object(), "x.json"), InputError);
}

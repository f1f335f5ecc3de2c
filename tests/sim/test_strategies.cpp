// End-to-end: lowered programs on the executor with fixed costs (tests/sim/fixed_cost_model.h).
// Exact nanoseconds on 2-block models, derived by hand in the comments: every op's GPU time is one
// of forward 100, backward 200, all-gather AG, reduce-scatter 60, all-reduce 70, optimizer 10; copies,
// casts and divides cost 0 and the CPU issues for free, so only dependencies and the single NCCL
// queue per process group (F1.4) shape the step.
#include <gtest/gtest.h>

#include <map>

#include "fixed_cost_model.h"
#include "sim/executor.h"
#include "test_lowering_fixtures.h"

namespace fsdpsim::sim {
namespace {

using namespace testing;

const Shapes kRoot = {{8, 4}, {4}, {8, 4}};
const Shapes kBlock = {{6, 4}, {3}};

FixedCosts costs(TimeNs ag) {
  FixedCosts c;
  c.forward_ns = 100;
  c.backward_ns = 200;
  c.all_gather_ns = ag;
  c.reduce_scatter_ns = 60;
  c.all_reduce_ns = 70;
  c.optimizer_ns = 10;
  return c;
}

SimResult run(const std::string& plan, TimeNs ag, int layers = 2) {
  std::vector<Shapes> blocks(layers, kBlock);
  StepProgram p = lower_hand(block_graph(kRoot, blocks), plan, 4, 4, layers);
  validate_program(p);
  return execute(p, FixedCostModel(costs(ag)));
}

const TraceSpan* span(const SimResult& r, const std::string& name, int nth = 0) {
  for (const auto& s : r.trace)
    if (s.name == name && nth-- == 0) return &s;
  return nullptr;
}

// FSDP2 FULL_SHARD, AG = 50. Forward: AG0 0-50, AG1 50-100 (one NCCL queue), fwd emb 50-150,
// fwd u1 150-250, AG2 100-150, fwd u2 250-350, fwd head 350-450. Backward: the root's pre-backward
// prefetches u2 (AG 250-300: its copy-in waits on u2's forward copy-out at 250); bwd head 450-650;
// u2's copy-out at 650, then AG1' 650-700; bwd u2 650-850; RS2 850-910; bwd u1 850-1050; u1's RS
// copy-in waits RS2, RS1 1050-1110; bwd emb 1050-1250; RS0 1250-1310; optimizer 1310-1320.
TEST(StrategiesExact, Fsdp2FullShard) {
  SimResult r = run("{}", 50);
  EXPECT_EQ(r.step_time_ns, 1320);
  EXPECT_EQ(r.compute_ns, 4 * 100 + 4 * 200 + 10);
  EXPECT_EQ(r.cpu_blocked_ns, 0);
  ASSERT_NE(span(r, "AG u1", 1), nullptr);
  EXPECT_EQ(span(r, "AG u1", 1)->start_ns, 650);
  EXPECT_EQ(span(r, "RS u0")->start_ns, 1250);
}

// FSDP1 FULL_SHARD, BACKWARD_PRE, rate limiter, AG = 50: the same shape as FSDP2 above, except that
// the CPU blocks at the root's prefetch of u2 until fwd u1 (two reshards back) completes at 250.
TEST(StrategiesExact, Fsdp1FullShardRateLimiter) {
  SimResult r = run(R"({"fsdp_version": 1})", 50);
  EXPECT_EQ(r.step_time_ns, 1320);
  EXPECT_EQ(r.cpu_blocked_ns, 250);
  EXPECT_EQ(span(r, "AG u2", 1)->start_ns, 250);
  EXPECT_EQ(span(r, "AG u1", 1)->start_ns, 300);
}

// FSDP1 with slow all-gathers (AG = 300). Forward: AG0 0-300, AG1 300-600, AG2 600-900; fwd u1 600-700,
// fwd u2 900-1000, head 1000-1100.
// BACKWARD_PRE: AG2' issued at 700 (limiter on fwd u1), runs 900-1200; bwd head 1100-1300; AG1' 1200-1500;
// bwd u2 1300-1500; RS2 1500-1560; bwd u1 1500-1700; RS1 1700-1760; bwd emb 1700-1900; RS0 1900-1960;
// optimizer 1960-1970. CPU blocked 0-700.
// NONE: AG2' 900-1200; bwd u2 1300-1500; RS2 1500-1560 is queued before AG1' (issued at 1000 after the
// limiter waits on fwd u2), so AG1' 1560-1860; bwd u1 1860-2060; RS1 2060-2120; bwd emb 2060-2260;
// RS0 2260-2320; optimizer 2320-2330. CPU blocked 0-700 and 700-1000.
TEST(StrategiesExact, Fsdp1BackwardPrefetchModes) {
  SimResult pre = run(R"({"fsdp_version": 1})", 300);
  EXPECT_EQ(pre.step_time_ns, 1970);
  EXPECT_EQ(pre.cpu_blocked_ns, 700);
  SimResult none = run(R"({"fsdp_version": 1, "backward_prefetch": null})", 300);
  EXPECT_EQ(none.step_time_ns, 2330);
  EXPECT_EQ(none.cpu_blocked_ns, 1000);
  EXPECT_EQ(span(none, "AG u1", 1)->start_ns, 1560);
  EXPECT_GT(none.exposed_comm_ns, pre.exposed_comm_ns);
}

// NO_SHARD: no all-gathers; one all-reduce per unit on the World group. Forward 0-400; bwd head 400-600,
// bwd u2 600-800, AR2 800-870, bwd u1 800-1000, AR1 1000-1070, bwd emb 1000-1200, AR0 1200-1270,
// optimizer (after the final callback) 1270-1280.
TEST(StrategiesExact, Fsdp1NoShard) {
  SimResult r = run(R"({"fsdp_version": 1, "sharding_strategy": "NO_SHARD"})", 50);
  EXPECT_EQ(r.step_time_ns, 1280);
  EXPECT_EQ(span(r, "AR u0")->start_ns, 1200);
}

// Unsharded-param bytes live (in CPU issue order, where allocations happen) just before the first
// backward op is issued: the forward/backward boundary.
Bytes unsharded_at_boundary(const StepProgram& p) {
  std::vector<bool> live(p.buffers.size(), false);
  for (const auto& o : p.ops) {
    if (o.kind == OpKind::Backward) break;
    for (int b : o.allocs) live[b] = true;
    for (const auto& f : o.frees) live[f.buffer] = false;
  }
  Bytes sum = 0;
  for (const auto& b : p.buffers)
    if (live[b.id] && b.category == MemCategory::UnshardedParams) sum += b.bytes;
  return sum;
}

// SHARD_GRAD_OP keeps every unit's unsharded params from forward into backward (M5): at the
// forward/backward boundary the whole model is unsharded, and the simulated peak includes it;
// FULL_SHARD has freed all but the root (and the one unit the root's pre-backward prefetches).
TEST(StrategiesMemory, ShardGradOpHoldsTheWholeUnshardedModelAtTheBoundary) {
  const Shapes blk = {{4096, 512}};
  auto g = block_graph({{4096, 512}}, {blk, blk, blk});
  const Bytes unit = 4096 * 512 * 2;   // one unit's unsharded bf16 params (divisible by N: no padding)
  for (int version : {1, 2}) {
    std::string v = std::to_string(version);
    std::string sgo = version == 1 ? R"({"fsdp_version": 1, "sharding_strategy": "SHARD_GRAD_OP"})"
                                   : R"({"reshard_after_forward": false})";
    StepProgram p = lower_hand(g, sgo, 4, 4, 3);
    EXPECT_EQ(unsharded_at_boundary(p), 4 * unit) << sgo;
    SimResult r = execute(p, FixedCostModel(costs(50)));
    Bytes persistent = 0;
    for (const auto& b : p.buffers)
      if (b.persistent) persistent += b.bytes;
    EXPECT_GE(r.peak_allocated, persistent + 4 * unit) << sgo;
    StepProgram f = lower_hand(g, R"({"fsdp_version": )" + v + "}", 4, 4, 3);
    EXPECT_EQ(unsharded_at_boundary(f), version == 1 ? 2 * unit : unit) << v;
  }
}

// The rate limiter bounds the unsharded params in flight: from the trace, an all-gather of unit k
// never starts before the forward of unit k-2 has finished; without it the CPU races ahead.
TEST(StrategiesMemory, RateLimiterBoundsInFlightAllGathersToTwo) {
  FixedCosts c = costs(10);
  c.forward_ns = 1000;
  auto g = block_graph(kRoot, {kBlock, kBlock, kBlock, kBlock, kBlock, kBlock});
  auto in_flight_max = [&](const std::string& plan) {
    StepProgram p = lower_hand(g, plan, 4, 4, 6);
    SimResult r = execute(p, FixedCostModel(c));
    // In forward, count non-root units whose AG started and whose forward has not ended, at each AG start.
    std::map<int, TimeNs> ag_start, fwd_end;
    for (const auto& s : r.trace) {
      if (s.kind == "all_gather" && s.unit > 0 && !ag_start.count(s.unit)) ag_start[s.unit] = s.start_ns;
      if (s.kind == "forward" && s.unit > 0 && !fwd_end.count(s.unit)) fwd_end[s.unit] = s.start_ns + s.dur_ns;
    }
    int worst = 0;
    for (auto [u, t] : ag_start) {
      int n = 0;
      for (auto [v, t2] : ag_start)
        if (t2 <= t && fwd_end[v] > t) ++n;
      worst = std::max(worst, n);
    }
    return worst;
  };
  EXPECT_LE(in_flight_max(R"({"fsdp_version": 1})"), 2);    // the unit computing + the one gathered next
  EXPECT_GE(in_flight_max(R"({"fsdp_version": 1, "limit_all_gathers": false})"), 6);
}

TEST(StrategiesDeterminism, SameInputSameBytes) {
  for (const char* plan : {R"({})", R"({"fsdp_version": 1, "grad_accum": 2})", R"({"mesh": [2, 2]})"}) {
    auto g = block_graph(kRoot, {kBlock, kBlock});
    SimResult a = execute(lower_hand(g, plan, 4, 2), FixedCostModel(costs(50)));
    SimResult b = execute(lower_hand(g, plan, 4, 2), FixedCostModel(costs(50)));
    EXPECT_EQ(sim_result_to_json(a, true).dump(), sim_result_to_json(b, true).dump()) << plan;
  }
}

}  // namespace
}  // namespace fsdpsim::sim

// The executor's fast-forward over repeated blocks (ExecOptions::fast_forward; "Fast-forward" at the
// top of sim/executor.cpp) is pure speed: every figure must be identical with it on and off, compared
// as the whole result JSON. Oracle: the same engine with the fast-forward off. Programs:
//  (1) lowered programs of zoo models under many plans, with the profiles' costs (overlap slowdown on);
//  (2) lowered 24-block programs under many plans with fixed round costs, so events tie everywhere;
//  (3) random block-repeating hand-built programs, some perturbed (a different duration, an extra wait,
//      an extra op, a rate-limiter CPU wait) so that the period breaks somewhere.
// Each group also asserts that the fast-forward acted, so no comparison passes vacuously.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "fixed_cost_model.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "sim/executor.h"
#include "program/lowering.h"
#include "program/plan.h"
#include "sim/profile_cost_model.h"
#include "sim/simulator.h"
#include "test_executor_builder.h"
#include "test_lowering_fixtures.h"
#include "zoo_cases.h"

namespace fsdpsim::sim {
namespace {

using namespace testing;

// Runs `p` with the fast-forward off and on; expects the same result JSON; returns what it did. With a
// memory timeline memory is replayed with the CPU's issues, without one (as simulate() and the planner
// run) apart where no free waits on the GPU: there the fast-forward also skips while the CPU still
// issues (sim/executor.cpp "The CPU still issuing"). Both are compared; the stats are the latter's.
ExecStats same_both_ways(const StepProgram& p, const OpCosts& costs, Bytes capacity, const std::string& what) {
  ExecStats last;
  for (const bool timeline : {true, false}) {
    ExecOptions off;
    off.record_trace = false;
    off.record_memory_timeline = timeline;
    off.memory_capacity = capacity;
    off.fast_forward = false;
    ExecOptions on = off;
    on.fast_forward = true;
    ExecStats st_off, st_on;
    off.stats = &st_off;
    on.stats = &st_on;
    const std::string a = sim_result_to_json(execute(p, costs, off)).dump();
    const std::string b = sim_result_to_json(execute(p, costs, on)).dump();
    EXPECT_EQ(a, b) << what << (timeline ? " (with a memory timeline)" : "");
    EXPECT_EQ(st_off.jumps, 0) << what;
    EXPECT_LE(st_on.ops_fast_forwarded, static_cast<int>(p.ops.size())) << what;
    last = st_on;
  }
  return last;
}

TEST(FastForward, LoweredZooProgramsGiveIdenticalResults) {
  const std::vector<ZooCase> cases = zoo_cases_and({
      {"llama-1b", "8xH100-SXM", R"({"fsdp_version":1,"sharding_strategy":"NO_SHARD","grad_accum":3})"},
      {"qwen2-7b", "2x8xH100-SXM-ETH-10G", R"({"fsdp_version":1,"mesh":{"replicate":2,"shard":8},)"
                                           R"("sharding_strategy":"_HYBRID_SHARD_ZERO2","grad_accum":2})"},
      {"gemma-2b", "8xH100-SXM", R"({"cpu_offload":true,"activation_checkpointing":{"mode":"full","outside_fsdp":true}})"},
      {"llama3-8b", "8xH100-SXM", R"({"fp8_all_gather":true,"trainable_fraction":0.1,"optimizer":"sgd","micro_batch":2})"},
  });
  int acted = 0;
  for (const ZooCase& c : cases) {
    const models::ModelSpec m0 = models::load_model(c.model);
    const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(c.cluster));
    const auto& cl = hw.cluster();
    const Plan rp = resolve_plan(parse_plan(nlohmann::json::parse(c.plan)), cl.world(), cl.gpus_per_node);
    const models::ModelSpec m = models::with_seq_len(m0, rp.seq_len);
    const StepProgram p = lower(m, models::build_wrap_graph(m, rp.auto_wrap_policy), rp, Topology{cl.world(), cl.gpus_per_node});
    ProfileCostModel cost(hw);
    const OpCosts costs = compute_op_costs(p, cost);
    const std::string what = c.model + " " + c.cluster + " " + c.plan;
    const ExecStats st = same_both_ways(p, costs, hw.memory_capacity() - hw.cuda_context_bytes(), what);
    if (st.jumps > 0) ++acted;
    if (&c == &cases[0]) {
      // The bench case: most of its ~2,300 ops are skipped.
      EXPECT_GT(st.ops_fast_forwarded, static_cast<int>(p.ops.size()) / 2) << what;
    }
  }
  EXPECT_GE(acted, 6);
}

// Gradient accumulation: the stretched program's run of whole micro-batches (hundreds of ops a period,
// more compute-stream boundaries than the snapshot ring holds) is snapshotted once a period. With FSDP1's
// record_stream frees the memory is replayed with the issues, so a jump moves it too (sim/memory_shift.cpp)
// and the steady step's replay skips the same periods; with FSDP2 the timing skips whole micro-batches
// while the CPU issues and the memory fold skips them in both steps. Every figure equals the run without
// the fast-forward, with and without a memory timeline (with one, no memory is moved).
TEST(FastForward, WholeMicroBatchesGiveIdenticalResults) {
  struct Case {
    const char* plan;
    bool fsdp1;
  };
  const Case cases[] = {
      {R"({"fsdp_version":1,"sharding_strategy":"FULL_SHARD","grad_accum":16,"limit_all_gathers":true})", true},
      {R"({"fsdp_version":1,"sharding_strategy":"FULL_SHARD","grad_accum":16,"grad_sync":false,)"
       R"("activation_checkpointing":"full"})", true},
      {R"({"fsdp_version":1,"sharding_strategy":"SHARD_GRAD_OP","grad_accum":16,"limit_all_gathers":false})", true},
      {R"({"fsdp_version":2,"grad_accum":24,"activation_checkpointing":"selective_op"})", false},
  };
  const models::ModelSpec m = models::load_model("llama-1b");
  const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster("8xH100-SXM"));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.plan);
    CompiledProgram prog;
    OpCosts costs;
    std::string why;
    ASSERT_TRUE(stretched_program(m, hw, parse_plan(nlohmann::json::parse(c.plan)), prog, costs, &why)) << why;
    bool long_run = false;
    for (const PeriodicRun& r : prog.runs) long_run = long_run || (r.period >= 40 && r.count >= 8);
    ASSERT_TRUE(long_run) << "a run of whole micro-batches";
    for (const bool timeline : {false, true}) {
      ExecOptions off;
      off.record_trace = false;
      off.record_memory_timeline = timeline;
      off.memory_capacity = hw.memory_capacity() - hw.cuda_context_bytes();
      off.fast_forward = false;
      ExecOptions on = off;
      on.fast_forward = true;
      ExecStats st;
      on.stats = &st;
      const std::string a = sim_result_to_json(execute_compiled(prog, costs, off)).dump();
      const std::string b = sim_result_to_json(execute_compiled(prog, costs, on)).dump();
      EXPECT_EQ(a, b) << (timeline ? "with a memory timeline" : "without a timeline");
      if (timeline) {
        EXPECT_EQ(st.memory_shift_jumps, 0);
        continue;
      }
      // Most ops are skipped: all but a few of the 16 to 24 micro-batches.
      EXPECT_GT(st.ops_fast_forwarded, prog.num_ops() / 2);
      if (c.fsdp1) {
        EXPECT_GE(st.memory_shift_jumps, 1);
        EXPECT_GE(st.steady_periods_shifted, 6);
      } else {
        EXPECT_EQ(st.memory_shift_jumps, 0);
        EXPECT_GE(st.memory_periods_skipped, 16);
      }
    }
  }
}

TEST(FastForward, LoweredProgramsWithTiedFixedCostsGiveIdenticalResults) {
  const char* plans[] = {
      R"({})",
      R"({"activation_checkpointing":"full","grad_accum":2,"grad_sync":true})",
      R"({"reshard_after_forward":false})",
      R"({"reshard_after_forward":2,"prefetch_depth":2})",
      R"({"fsdp_version":1})",
      R"({"fsdp_version":1,"backward_prefetch":"BACKWARD_POST","forward_prefetch":true})",
      R"({"fsdp_version":1,"limit_all_gathers":false,"activation_checkpointing":"every_3"})",
      R"({"fsdp_version":1,"sharding_strategy":"SHARD_GRAD_OP","backward_prefetch":"NONE"})",
      R"({"fsdp_version":1,"sharding_strategy":"NO_SHARD","grad_accum":2})",
      R"({"fsdp_version":1,"mesh":{"replicate":2,"shard":2},"sharding_strategy":"HYBRID_SHARD"})",
      R"({"mesh":{"replicate":2,"shard":2},"activation_checkpointing":"selective_op"})",
  };
  const int layers = 24;
  const Shapes root = {{8, 4}, {4}, {8, 4}};
  const Shapes block = {{6, 4}, {3}};
  int acted = 0;
  for (const char* plan : plans) {
    for (int variant = 0; variant < 3; ++variant) {
      const StepProgram p = lower_hand(block_graph(root, std::vector<Shapes>(layers, block)), plan, 4, 2, layers);
      FixedCosts fc;
      fc.forward_ns = 100;
      fc.backward_ns = 200;
      fc.recompute_ns = 100;
      fc.all_gather_ns = variant == 0 ? 100 : 150;   // ties with compute, or not
      fc.reduce_scatter_ns = 100;
      fc.all_reduce_ns = 50;
      fc.copy_ns = variant == 2 ? 7 : 0;
      fc.optimizer_ns = 10;
      fc.cpu_issue_ns = variant == 1 ? 3 : 0;
      fc.slowdown = variant == 0 ? 1.0 : 1.5;
      const OpCosts costs = compute_op_costs(p, FixedCostModel(fc));
      const ExecStats st = same_both_ways(p, costs, 0, std::string(plan) + " variant " + std::to_string(variant));
      if (st.jumps > 0) ++acted;
    }
  }
  EXPECT_GE(acted, 15);
}

// A random program of `blocks` repeated blocks, forward then backward, on the builder's five streams:
// per block an all-gather (Shard queue), optionally a copy, the compute op, and in backward a
// reduce-scatter and optionally an HSDP all-reduce (Replicate queue). Prefetch distance, which ops
// exist and their durations are drawn once per program, so the blocks repeat; `perturb` then changes
// one random thing at a random place.
struct RandomProgram {
  StepProgram p;
  OpCosts costs;
};

RandomProgram random_program(std::uint32_t seed, bool perturb = true) {
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  ProgramBuilder b;
  const int blocks = pick(4, 40);
  const int prefetch = pick(0, 3);
  const bool copy = pick(0, 1), hsdp = pick(0, 1), rate_limit = pick(0, 3) == 0;
  const TimeNs d_ag = pick(1, 4) * 25, d_copy = pick(0, 2) * 5, d_fwd = pick(1, 6) * 20, d_bwd = pick(1, 6) * 40,
               d_rs = pick(1, 4) * 25, d_ar = pick(1, 4) * 30, d_cpu = pick(0, 3) * 2;
  std::vector<TimeNs> dur;
  auto add = [&](OpKind k, int stream, std::vector<int> waits, TimeNs d) {
    const int id = b.op(k, stream, std::move(waits));
    if (k == OpKind::ReduceScatter || k == OpKind::AllReduce) b.last().group = k == OpKind::AllReduce ? CommGroup::Replicate : CommGroup::Shard;
    dur.push_back(d);
    return id;
  };
  // forward: AG of block k waits on the compute of block k - 1 - prefetch (the prefetch window)
  std::vector<int> fwd(blocks, -1), ag(blocks, -1);
  for (int k = 0; k < blocks; ++k) {
    std::vector<int> w;
    if (k - 1 - prefetch >= 0) w.push_back(fwd[k - 1 - prefetch]);
    ag[k] = add(OpKind::AllGather, ProgramBuilder::kAllGather, w, d_ag);
    if (rate_limit && k >= 2) b.last().cpu_waits.push_back(ag[k - 2]);
    int src = ag[k];
    if (copy) src = add(OpKind::CopyOut, ProgramBuilder::kCopy, {ag[k]}, d_copy);
    fwd[k] = add(OpKind::Forward, ProgramBuilder::kCompute, {src}, d_fwd);
  }
  // backward, in reverse block order
  std::vector<int> bwd(blocks, -1);
  for (int k = blocks - 1; k >= 0; --k) {
    const int r = blocks - 1 - k;   // position in backward
    std::vector<int> w;
    if (r - 1 - prefetch >= 0) w.push_back(bwd[k + 1 + prefetch]);
    const int a = add(OpKind::AllGather, ProgramBuilder::kAllGather, w, d_ag);
    bwd[k] = add(OpKind::Backward, ProgramBuilder::kCompute, {a}, d_bwd);
    const int rs = add(OpKind::ReduceScatter, ProgramBuilder::kReduceScatter, {bwd[k]}, d_rs);
    if (hsdp) add(OpKind::AllReduce, ProgramBuilder::kAllReduce, {rs}, d_ar);
  }
  add(OpKind::OptimizerStep, ProgramBuilder::kCompute, {}, 10);
  for (int k = 0; k < static_cast<int>(b.p.ops.size()); ++k)
    if (b.p.ops[k].kind == OpKind::OptimizerStep)
      for (int j = 0; j < k; ++j)
        if (b.p.ops[j].kind == OpKind::ReduceScatter || b.p.ops[j].kind == OpKind::AllReduce) b.p.ops[k].waits.push_back(j);
  // perturbations (the optimizer step's waits above are all earlier ops, so the program stays valid)
  const int n = static_cast<int>(b.p.ops.size());
  const int what = perturb ? pick(0, 4) : (pick(0, 4), 0);
  const int at = pick(0, n - 2);
  if (what == 1) dur[at] += pick(1, 30);
  // (a wait on a nearby op: one that is likely still running, so that the wait changes the timing)
  if (what == 2 && at > 0) {   // replaced, so that the op keeps its number of waits; or added
    const int w = std::max(0, at - pick(1, 5));
    if (!b.p.ops[at].waits.empty() && pick(0, 1)) b.p.ops[at].waits[0] = w;
    else b.p.ops[at].waits.push_back(w);
  }
  if (what == 3 && at > 2) b.p.ops[at].cpu_waits.push_back(std::max(0, at - pick(1, 5)));
  RandomProgram out;
  out.costs.gpu_ns = dur;
  out.costs.cpu_ns.assign(dur.size(), d_cpu);
  out.costs.overlap_slowdown = pick(0, 2) == 0 ? 1.0 : 1.0 + 0.25 * pick(1, 4);
  // Launch queues (drawn after the rest, so the programs above stay those of earlier seeds): the default
  // depth (never reached here), unbounded, or a few kernels, which the CPU, cheaper than the GPU, fills;
  // compute ops launch 1-3 kernels; perturbed, one op launches one more, or issues slower.
  const int depth = pick(0, 3);
  out.costs.launch_queue_depth = depth == 0 ? calibrate::kDefaultLaunchQueueDepth : depth == 1 ? 0 : pick(1, 8);
  const int l_fwd = pick(1, 3), l_bwd = pick(1, 3);
  for (Op& op : b.p.ops) {
    if (op.kind == OpKind::Forward) op.kernel_launches = l_fwd;
    if (op.kind == OpKind::Backward) op.kernel_launches = l_bwd;
  }
  if (perturb && pick(0, 4) == 0) b.p.ops[pick(0, n - 1)].kernel_launches += 1;
  // A third of the programs issue their all-gathers slowly (FSDP's hooks), so that the GPU also waits on
  // the CPU, whose issue times then count (start() reads them), while the queues block it elsewhere.
  if (pick(0, 2) == 0) {
    const TimeNs slow = pick(2, 12) * 10;
    for (int k = 0; k < n; ++k)
      if (b.p.ops[k].kind == OpKind::AllGather) out.costs.cpu_ns[k] = slow;
  }
  if (perturb && pick(0, 3) == 0) out.costs.cpu_ns[pick(0, n - 1)] += pick(1, 40);   // one slower issue
  out.p = std::move(b.p);
  return out;
}

TEST(FastForward, RandomBlockProgramsGiveIdenticalResults) {
  int acted = 0, ops = 0, skipped = 0, broken = 0, issuing = 0, queue_bound = 0;
  for (std::uint32_t seed = 1; seed <= 400; ++seed) {
    const RandomProgram rp = random_program(seed);
    validate_program(rp.p);
    const ExecStats st = same_both_ways(rp.p, rp.costs, 0, "seed " + std::to_string(seed));
    if (st.jumps > 0) ++acted;
    if (st.jumps_while_issuing > 0) ++issuing;
    ops += static_cast<int>(rp.p.ops.size());
    skipped += st.ops_fast_forwarded;
    // Count the perturbations that changed the step, in programs that were still fast-forwarded: the
    // cases where skipping a period it broke would have shown.
    const RandomProgram plain = random_program(seed, /*perturb=*/false);
    ExecOptions off;
    off.record_trace = false;
    off.fast_forward = false;
    // (the CPU blocked on a launch queue: more than on the rate limiter alone, if any)
    OpCosts unbounded = rp.costs;
    unbounded.launch_queue_depth = 0;
    if (execute(rp.p, rp.costs, off).cpu_blocked_ns > execute(rp.p, unbounded, off).cpu_blocked_ns) ++queue_bound;
    if (st.jumps > 0 && plain.p.ops.size() == rp.p.ops.size() &&
        sim_result_to_json(execute(rp.p, rp.costs, off)).dump() != sim_result_to_json(execute(plain.p, plain.costs, off)).dump())
      ++broken;
  }
  EXPECT_GE(acted, 100);
  EXPECT_GT(skipped, ops / 5);
  EXPECT_GE(broken, 40);
  std::printf("random block programs: %d of 400 fast-forwarded, %d while the CPU still issued; %d with the CPU "
              "blocked on a launch queue; %d perturbed and changed\n", acted, issuing, queue_bound, broken);
  EXPECT_GE(queue_bound, 60);
  EXPECT_GE(issuing, 30);

}

// 30 forward blocks: AG k (100 ns) waits on the forward of block k - 2 (prefetch one block), forward k
// (60 ns) on AG k. All-gather bound: forward k runs [100(k+1), 100(k+1) + 60). Block 20's AG instead
// waits on the forward of block 19 — one changed wait, same count — so from block 20 on everything
// starts 60 ns later: AG 20 runs [2060, 2160), forward 29 ends at 3120 instead of 3060.
TEST(FastForward, OneChangedWaitBreaksThePeriod) {
  for (const bool changed : {false, true}) {
    ProgramBuilder b;
    std::vector<int> fwd;
    std::vector<TimeNs> dur;
    for (int k = 0; k < 30; ++k) {
      std::vector<int> w;
      if (k >= 2) w.push_back(fwd[k - 2]);
      if (k == 20 && changed) w = {fwd[19]};
      const int ag = b.op(OpKind::AllGather, ProgramBuilder::kAllGather, w);
      fwd.push_back(b.op(OpKind::Forward, ProgramBuilder::kCompute, {ag}));
      dur.insert(dur.end(), {100, 60});
    }
    OpCosts costs;
    costs.gpu_ns = dur;
    costs.cpu_ns.assign(dur.size(), 0);
    const ExecStats st = same_both_ways(b.p, costs, 0, changed ? "changed" : "plain");
    EXPECT_GT(st.jumps, 0);
    ExecOptions o;
    o.record_trace = false;
    EXPECT_EQ(execute(b.p, costs, o).step_time_ns, changed ? 3120 : 3060);
  }
}

// A program with a trace is never fast-forwarded (the trace has a span per op).
TEST(FastForward, TracedRunsSimulateEveryOp) {
  const RandomProgram rp = random_program(7);
  ExecOptions o;
  o.record_trace = true;
  ExecStats st;
  o.stats = &st;
  const SimResult traced = execute(rp.p, rp.costs, o);
  EXPECT_EQ(st.jumps, 0);
  o.record_trace = false;
  const SimResult untraced = execute(rp.p, rp.costs, o);
  EXPECT_EQ(traced.step_time_ns, untraced.step_time_ns);
  EXPECT_EQ(traced.exposed_comm_ns, untraced.exposed_comm_ns);
}

}  // namespace
}  // namespace fsdpsim::sim

// The engine's skipping of repeated periods is pure speed (sim/memory_fold.cpp, and the fast-forward's
// run checks in sim/executor.cpp): with it off, every figure must be the same. Oracles:
//  (1) the memory replay call by call: after replaying a stretched program with skipping and without,
//      the allocator's whole state (segments, blocks, cached blocks in best-fit order, statistics) and
//      every live buffer's block must be identical, and so must the memory results; also under
//      capacities that force cache releases and OOMs somewhere in the step;
//  (2) the engine without skipping: whole result JSON, fast_forward on and off;
//  (3) the replay during the run: a program's memory replayed in a pass of its own (no timeline, no
//      record_stream) must give the memory figures of the replay interleaved with the CPU's issues.
// Each group checks that the skipping acted, so no comparison passes vacuously. Every replay covers the
// first and the steady step (sim/memory_tracker.h), each folded where it repeats, under the plan's
// PYTORCH_CUDA_ALLOC_CONF (expandable segments are replayed call by call: nothing to compare there but
// the results).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "common/errors.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "random_plans.h"
#include "sim/executor.h"
#include "program/lowering.h"
#include "sim/memory_tracker.h"
#include "program/plan.h"
#include "sim/profile_cost_model.h"
#include "sim/simulator.h"

namespace fsdpsim::sim {
namespace {

struct Case {
  std::string model, cluster, plan;
};

const Case kCases[] = {
    {"llama3-70b", "128x8xH100-SXM-IB-NDR400",
     R"({"mesh":{"replicate":16,"shard":64},"sharding_strategy":"HYBRID_SHARD","activation_checkpointing":"full",)"
     R"("seq_len":4096,"grad_accum":2,"grad_sync":true})"},
    {"llama3-8b", "8xH100-SXM", R"({"activation_checkpointing":"full","seq_len":4096,"grad_accum":2,"grad_sync":true})"},
    {"llama3-8b", "8xH100-SXM", R"({})"},
    {"llama3-8b", "8xH100-SXM", R"({"grad_accum":3})"},
    {"llama3-8b", "2x8xH100-SXM-IB-NDR400", R"({"reshard_after_forward":false,"prefetch_depth":2})"},
    {"llama3-8b", "2x8xH100-SXM-IB-NDR400", R"({"reshard_after_forward":8,"activation_checkpointing":"every_2"})"},
    {"llama3-70b", "16x8xH100-SXM-IB-NDR400", R"({"activation_checkpointing":"selective_op","micro_batch":2})"},
    {"mixtral-8x7b", "2x8xH100-SXM-IB-NDR400", R"({"cpu_offload":{"params":false,"optimizer":true},"grad_accum":2})"},
    {"llama2-13b", "8xA100-80GB", R"({"fp8_all_gather":false,"trainable_fraction":0.1,"optimizer":"sgd"})"},
    {"gpt2-xl", "8xA100-80GB", R"({"seq_len":1024,"micro_batch":4,"cross_entropy":"fused"})"},
    {"llama-1b", "8xH100-SXM", R"({"activation_checkpointing":"none","seq_len":2048,"micro_batch":2})"},
    {"qwen2-7b", "2x8xH100-SXM-ETH-10G", R"({"mesh":{"replicate":2,"shard":8},"grad_accum":2,"grad_sync":true})"},
    {"llama3-8b", "8xH100-SXM", R"({"grad_accum":3,"alloc_conf":"max_split_size_mb:128"})"},
    {"llama3-70b", "16x8xH100-SXM-IB-NDR400", R"({"micro_batch":2,"alloc_conf":"expandable_segments:True"})"},
};

// The allocator options of a plan (as simulate() passes them) with `capacity`.
AllocatorConfig allocator_config(const std::string& plan, Bytes capacity) {
  const AllocConf a = parse_plan(nlohmann::json::parse(plan)).alloc_conf;
  AllocatorConfig c{capacity};
  if (a.max_split_size > 0) c.max_split_size = a.max_split_size;
  c.expandable_segments = a.expandable_segments;
  return c;
}

std::string describe(const Case& c) { return c.model + " on " + c.cluster + " " + c.plan; }

bool stretched(const Case& c, CompiledProgram& p, OpCosts& costs) {
  const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(c.cluster));
  return stretched_program(models::load_model(c.model), hw, parse_plan(nlohmann::json::parse(c.plan)), p, costs);
}

// Replays p's memory (persistent buffers first) with or without skipping; the tracker's whole state.
struct Replayed {
  std::string state, result;
  MemoryTracker::FoldStats stats;
};
Replayed replay(const CompiledProgram& p, const AllocatorConfig& config, bool fold) {
  MemoryTracker t;
  t.start(p, config, /*record_timeline=*/false);
  t.allocate_persistent();
  Replayed out;
  try {
    t.replay(p, fold);
    out.stats = t.fold_stats();
    t.begin_steady_step();   // (as the executor: the steady step replayed on the first step's allocator)
    t.replay(p, fold);
    out.stats.jumps += t.fold_stats().jumps;
    out.stats.periods_skipped += t.fold_stats().periods_skipped;
  } catch (const InputError& e) {
    out.result = std::string("InputError: ") + e.what();
    return out;
  }
  SimResult r;
  t.fill(r, 0);
  out.state = t.canonical_state();
  out.result = sim_result_to_json(r).dump();
  return out;
}

TEST(MemoryFold, ReplayEqualsCallByCall) {
  int jumped = 0;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    CompiledProgram p;
    OpCosts costs;
    if (!stretched(c, p, costs) || p.record_stream_frees) continue;
    const AllocatorConfig cfg = allocator_config(c.plan, 0);
    const Replayed off = replay(p, cfg, false), on = replay(p, cfg, true);
    EXPECT_EQ(off.state, on.state);
    EXPECT_EQ(off.result, on.result);
    EXPECT_EQ(off.stats.jumps, 0);
    if (on.stats.jumps > 0) ++jumped;
  }
  // Only runs of whole micro-batches are skipped (their allocator states compared at period boundaries),
  // and these cases have few micro-batches: the equalities above are what this checks; the skip's reach is
  // reported, and the random-plan test below requires some skips.
  std::printf("[ fold ] %d of the cases skipped periods\n", jumped);
}

TEST(MemoryFold, ATrackerReplayingAgainKeepsItsResultsAndItsSkips) {
  // A tracker is reused from replay to replay (as a Simulator's is), its fold scratch with it: nothing of
  // one replay may leak into the next, and a run that skips keeps skipping. Ten replays of one program on
  // one tracker must each give the call-by-call results and state: the 70B benchmark plan (no skip), and
  // random plans until one that skips.
  auto check = [](const CompiledProgram& p, const AllocatorConfig& cfg) {
    const Replayed plain = replay(p, cfg, false);
    MemoryTracker t;
    int replays_that_jumped = 0;
    for (int i = 0; i < 10; ++i) {
      t.start(p, cfg, false);
      t.allocate_persistent();
      t.replay(p, true);
      int jumps = t.fold_stats().jumps;
      t.begin_steady_step();
      t.replay(p, true);
      jumps += t.fold_stats().jumps;
      SimResult r;
      t.fill(r, 0);
      EXPECT_EQ(t.canonical_state(), plain.state) << "replay " << i;
      EXPECT_EQ(sim_result_to_json(r).dump(), plain.result) << "replay " << i;
      if (jumps > 0) ++replays_that_jumped;
    }
    return replays_that_jumped;
  };
  {
    CompiledProgram p;
    OpCosts costs;
    ASSERT_TRUE(stretched(kCases[0], p, costs));
    EXPECT_EQ(check(p, allocator_config(kCases[0].plan, 0)), 0);
  }
  std::mt19937 rng(random_seed(11, 2));
  bool found = false;
  for (int i = 0; i < 400 && !found; ++i) {
    const RandomCase rc = random_case(rng);
    const auto& [model, cluster, plan, hw] = rc;
    CompiledProgram p;
    OpCosts costs;
    try {
      if (!stretched_program(models::load_model(model), hw, parse_plan(nlohmann::json::parse(plan)), p, costs)) continue;
    } catch (const InputError&) {
      continue;
    }
    if (p.record_stream_frees) continue;
    const AllocatorConfig cfg = allocator_config(plan, 0);
    if (replay(p, cfg, true).stats.jumps == 0) continue;
    SCOPED_TRACE(model + " on " + cluster + " " + plan);
    found = true;
    EXPECT_EQ(check(p, cfg), 10);
  }
  EXPECT_TRUE(found);
}

TEST(MemoryFold, ReplayUnderCapacityPressure) {
  // Capacities around the step's reserved peak: cudaMalloc retries (cache released) and OOMs happen
  // at some point of the step, inside a run or not; a skip must never cross one.
  int jumped = 0, retried = 0;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    CompiledProgram p;
    OpCosts costs;
    if (!stretched(c, p, costs) || p.record_stream_frees) continue;
    MemoryTracker t;
    t.start(p, allocator_config(c.plan, 0), false);
    t.allocate_persistent();
    t.replay(p, false);
    const Bytes peak = t.stats().peak_reserved;
    for (double f : {0.6, 0.85, 0.97, 0.995, 1.0}) {
      const Bytes cap = static_cast<Bytes>(static_cast<double>(peak) * f);
      const AllocatorConfig cfg = allocator_config(c.plan, cap);
      const Replayed off = replay(p, cfg, false), on = replay(p, cfg, true);
      EXPECT_EQ(off.state, on.state) << "capacity " << f;
      EXPECT_EQ(off.result, on.result) << "capacity " << f;
      if (on.stats.jumps > 0) ++jumped;
      if (off.result.find("\"alloc_retries\":0") == std::string::npos) ++retried;
    }
  }
  std::printf("[ fold ] %d replays under pressure skipped periods\n", jumped);   // (see ReplayEqualsCallByCall)
  EXPECT_GE(retried, 10);
}

TEST(MemoryFold, EverySkipOfRandomPlansLeavesTheCallByCallState) {
  // replay(..., verify = true) compares the allocator's whole state after every skip with a replay of
  // the same calls one by one (and throws on a difference); the results must also match. Random plans
  // (FSDPSIM_RANDOM_PLANS / FSDPSIM_RANDOM_SEED for a longer run than CI's), at the GPU's capacity and
  // at 80% of it, the first and the steady step.
  // (250 plans in CI: since runs of whole micro-batches are compared at their boundaries a third of them
  // skip periods, and each skip is verified by a replay from the start; 400 took ~200 s here.)
  const int plans = random_plan_count(250);
  std::mt19937 rng(random_seed(11, 2));
  int jumped = 0, replayed = 0;
  for (int i = 0; i < plans; ++i) {
    const RandomCase rc = random_case(rng);
    const auto& [model, cluster, plan, hw] = rc;
    SCOPED_TRACE(model + " on " + cluster + " " + plan);
    CompiledProgram p;
    OpCosts costs;
    try {
      if (!stretched_program(models::load_model(model), hw, parse_plan(nlohmann::json::parse(plan)), p, costs)) continue;
    } catch (const InputError&) {
      continue;
    }
    if (p.record_stream_frees) continue;
    const Bytes usable = hw.memory_capacity() - hw.cuda_context_bytes();
    for (Bytes cap : {usable, usable / 5 * 4}) {
      const AllocatorConfig cfg = allocator_config(plan, cap);
      // A program the executor rejects (a buffer live past the step's end) is rejected on every path.
      const Replayed plain = replay(p, cfg, false);
      if (plain.result.rfind("InputError", 0) == 0) {
        EXPECT_EQ(replay(p, cfg, true).result, plain.result);
        continue;
      }
      MemoryTracker a, b;
      a.start(p, cfg, false);
      a.allocate_persistent();
      EXPECT_NO_THROW(a.replay(p, true, /*verify=*/true));
      int jumps = a.fold_stats().jumps;
      a.begin_steady_step();
      EXPECT_NO_THROW(a.replay(p, true, /*verify=*/true));
      jumps += a.fold_stats().jumps;
      b.start(p, cfg, false);
      b.allocate_persistent();
      b.replay(p, false);
      b.begin_steady_step();
      b.replay(p, false);
      SimResult ra, rb;
      a.fill(ra, 0);
      b.fill(rb, 0);
      EXPECT_EQ(sim_result_to_json(ra).dump(), sim_result_to_json(rb).dump());
      EXPECT_EQ(a.canonical_state(), b.canonical_state());
      ++replayed;
      if (jumps > 0) ++jumped;
    }
  }
  EXPECT_GE(jumped, plans / 20);   // (measured: 134 of 400 since whole micro-batches are compared; 43 before)
  // (most random plans retry cudaMalloc at these capacities, set allocator options or give a steady step that
  // differs from the first)
  EXPECT_GE(replayed, plans / 2);
  std::printf("[ fold ] %d replays of %d random plans skipped periods; %d replays compared\n", jumped, plans,
              replayed);
}

std::string run(CompiledProgram& p, const OpCosts& costs, const AllocatorConfig& cfg, bool fast, ExecStats* st) {
  ExecOptions o;
  o.record_trace = false;
  o.record_memory_timeline = false;
  o.memory_capacity = cfg.capacity;
  o.expandable_segments = cfg.expandable_segments;
  o.max_split_size = cfg.max_split_size == kAllocNoMaxSplit ? 0 : cfg.max_split_size;
  o.fast_forward = fast;
  o.stats = st;
  try {
    return sim_result_to_json(execute_compiled(p, costs, o)).dump();
  } catch (const InputError& e) {   // (a program that fails its checks fails them on every path)
    return std::string("InputError: ") + e.what();
  }
}

TEST(MemoryFold, EngineResultsIdenticalWithSkippingOff) {
  int timing = 0, memory = 0, n = 0;
  auto check = [&](const std::string& what, CompiledProgram& p, const OpCosts& costs, const AllocatorConfig& cfg) {
    SCOPED_TRACE(what);
    ExecStats on, off;
    const std::string a = run(p, costs, cfg, false, &off);
    const std::string b = run(p, costs, cfg, true, &on);
    EXPECT_EQ(a, b);
    EXPECT_EQ(off.jumps + off.memory_jumps, 0);
    if (on.jumps > 0) ++timing;
    if (on.memory_jumps > 0) ++memory;
    ++n;
  };
  for (const Case& c : kCases) {
    CompiledProgram p;
    OpCosts costs;
    if (!stretched(c, p, costs)) continue;
    const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(c.cluster));
    check(describe(c), p, costs, allocator_config(c.plan, hw.memory_capacity() - hw.cuda_context_bytes()));
  }
  // Random plans (those the stretch accepts).
  const char* models[] = {"llama3-8b", "llama3-70b", "mistral-7b", "qwen2-7b", "llama2-13b", "gpt2-xl", "mixtral-8x7b"};
  const char* clusters[] = {"8xH100-SXM", "2x8xH100-SXM-IB-NDR400", "4x8xA100-40GB-IB-HDR200", "16x8xH100-SXM-IB-NDR400"};
  std::mt19937 rng(7);
  for (int i = 0; i < 120; ++i) {
    const Case c{random_name(rng, models), random_name(rng, clusters), ""};
    const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(c.cluster));
    const std::string plan = random_plan(rng, hw.cluster().world(), hw.cluster().gpus_per_node);
    CompiledProgram p;
    OpCosts costs;
    try {
      if (!stretched_program(models::load_model(c.model), hw, parse_plan(nlohmann::json::parse(plan)), p, costs)) continue;
    } catch (const InputError&) {
      continue;
    }
    check(c.model + " on " + c.cluster + " " + plan, p, costs,
          allocator_config(plan, hw.memory_capacity() - hw.cuda_context_bytes()));
  }
  std::printf("[ fold ] %d programs: timing skipped in %d, memory in %d\n", n, timing, memory);
  EXPECT_GE(n, 60);
  EXPECT_GE(timing, n * 2 / 3);   // (measured: 61 of 88; CPU-bound plans give the GPU nothing to skip)
  // (measured: 40 of 88 before issue 19's per-tensor memory, 3 since: see ReplayEqualsCallByCall)
  EXPECT_GE(memory, 1);
}

TEST(MemoryFold, SeparateReplayEqualsReplayDuringTheRun) {
  int separate = 0;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(c.cluster));
    const auto& cl = hw.cluster();
    const Plan rp = resolve_plan(parse_plan(nlohmann::json::parse(c.plan)), cl.world(), cl.gpus_per_node);
    const models::ModelSpec m = models::with_seq_len(models::load_model(c.model), rp.seq_len);
    const StepProgram prog = lower(m, models::build_wrap_graph(m, rp.auto_wrap_policy), rp, Topology{cl.world(), cl.gpus_per_node});
    ProfileCostModel cost(hw);
    const OpCosts costs = compute_op_costs(prog, cost);
    ExecOptions o;
    o.record_trace = false;
    o.memory_capacity = hw.memory_capacity() - hw.cuda_context_bytes();
    o.expandable_segments = rp.alloc_conf.expandable_segments;
    o.max_split_size = rp.alloc_conf.max_split_size;
    o.record_memory_timeline = true;   // the replay interleaved with the issues
    SimResult during = execute(prog, costs, o);
    o.record_memory_timeline = false;  // a pass of its own when nothing needs issue times or GPU progress
    SimResult apart = execute(prog, costs, o);
    during.memory_timeline.clear();
    EXPECT_EQ(sim_result_to_json(during).dump(), sim_result_to_json(apart).dump());
    CompiledProgram cp;
    compile_program(prog, cp);
    if (!cp.record_stream_frees) ++separate;
  }
  EXPECT_GE(separate, 8);
}

}  // namespace
}  // namespace fsdpsim::sim

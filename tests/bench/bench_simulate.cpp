// Simulated steps per second (style.md lesson 12: speed is measured here, never asserted in tests).
// Target (issue #3): >= 10,000 simulated llama3-70b steps/s on one core for the executor
// (80 units, 1024 GPUs, record_trace = record_memory_timeline = false). NOT reached yet. Measured
// 2026-11-22 with callgrind (deterministic; wall clock on the shared build machine varies 2x), per
// simulate() of the 70B case below: 18.7 M instructions before the speed work, 6.9 M after
// (lowering 5.3 -> 2.3 M, wrap graph 3.7 -> 0 M cached, op costs 2.2 -> 0.4 M, execute 4.4 -> 3.9 M,
// freeing the program 2.1 -> 0 M). The executor is now the largest part.
//   build-*/tests/bench/bench_simulate --benchmark_min_time=0.5   (libbenchmark 1.7: seconds, no "s")
// Variants, each for llama3-8b on 8xH100-SXM and llama3-70b on 128x8xH100-SXM-IB-NDR400:
//   WrapGraph    build_wrap_graph alone (simulate() caches it per thread, so a planner pays it once)
//   Lower        resolve_plan + lower with a prebuilt wrap graph (the StepProgram builder)
//   Execute      execute() with precomputed OpCosts (the event engine + allocator model alone)
//   CostExecute  ProfileCostModel + compute_op_costs + execute (what simulate() runs after lowering)
//   Simulate     simulate() end to end
#include <benchmark/benchmark.h>

#include <string>

#include "calibrate/hardware_profile.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "sim/executor.h"
#include "sim/lowering.h"
#include "sim/plan.h"
#include "sim/profile_cost_model.h"
#include "sim/simulator.h"

namespace {

using namespace fsdpsim;

struct Case {
  models::ModelSpec model;
  calibrate::HardwareProfile hw;
  sim::Plan plan;
};

// A plan that exercises most of the lowering: FSDP2, full activation checkpointing, two micro-batches
// of gradient accumulation, and for the 1024-GPU case HSDP (replicate 16, shard 64 = 8 nodes).
Case make_case(int which) {
  Case c;
  if (which == 0) {
    c.model = models::load_model("llama3-8b");
    c.hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster("8xH100-SXM"));
    c.plan.mesh_replicate = 1;
    c.plan.mesh_shard = 8;
  } else {
    c.model = models::load_model("llama3-70b");
    c.hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster("128x8xH100-SXM-IB-NDR400"));
    c.plan.mesh_replicate = 16;   // 70B × 16 B / 64 ≈ 17.5 GB of sharded state: fits
    c.plan.mesh_shard = 64;
    c.plan.sharding_strategy = sim::ShardingStrategy::HYBRID_SHARD;
  }
  c.plan.activation_checkpointing.mode = sim::ActivationCheckpointing::Mode::Full;
  c.plan.micro_batch = 1;
  c.plan.seq_len = 4096;
  c.plan.grad_accum = 2;
  // Reduce-scatter every micro-batch: with no_sync FSDP2 would hold every unit's unsharded fp32 grads
  // (semantics M12, 280 GB for 70B) and the plan would not fit.
  c.plan.grad_sync = true;
  return c;
}

const char* case_name(int which) { return which == 0 ? "llama3-8b/8xH100" : "llama3-70b/1024xH100"; }

sim::StepProgram lower_case(const Case& c, const models::WrapGraph& g) {
  const auto& cl = c.hw.cluster();
  sim::Plan rp = sim::resolve_plan(c.plan, cl.world(), cl.gpus_per_node);
  return sim::lower(c.model, g, rp, sim::Topology{cl.world(), cl.gpus_per_node});
}

models::WrapGraph graph_of(const Case& c) { return models::build_wrap_graph(c.model, c.plan.auto_wrap_policy); }

sim::ExecOptions fast_options() {
  sim::ExecOptions o;
  o.record_trace = false;
  o.record_memory_timeline = false;
  return o;
}

void BM_WrapGraph(benchmark::State& state) {
  Case c = make_case(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(graph_of(c));
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(case_name(static_cast<int>(state.range(0))));
}

void BM_Lower(benchmark::State& state) {
  Case c = make_case(static_cast<int>(state.range(0)));
  const models::WrapGraph g = graph_of(c);
  for (auto _ : state) benchmark::DoNotOptimize(lower_case(c, g));
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(case_name(static_cast<int>(state.range(0))));
}

void BM_Execute(benchmark::State& state) {
  Case c = make_case(static_cast<int>(state.range(0)));
  sim::StepProgram prog = lower_case(c, graph_of(c));
  sim::ProfileCostModel cost(c.hw);
  sim::OpCosts costs = sim::compute_op_costs(prog, cost);
  sim::ExecOptions o = fast_options();
  o.memory_capacity = c.hw.memory_capacity() - c.hw.cuda_context_bytes();
  for (auto _ : state) benchmark::DoNotOptimize(sim::execute(prog, costs, o));
  state.SetItemsProcessed(state.iterations());
  state.counters["ops"] = static_cast<double>(prog.ops.size());
  state.counters["buffers"] = static_cast<double>(prog.buffers.size());
  state.SetLabel(case_name(static_cast<int>(state.range(0))));
}

void BM_CostExecute(benchmark::State& state) {
  Case c = make_case(static_cast<int>(state.range(0)));
  sim::StepProgram prog = lower_case(c, graph_of(c));
  sim::ExecOptions o = fast_options();
  o.memory_capacity = c.hw.memory_capacity() - c.hw.cuda_context_bytes();
  for (auto _ : state) {
    sim::ProfileCostModel cost(c.hw);
    benchmark::DoNotOptimize(sim::execute(prog, cost, o));
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(case_name(static_cast<int>(state.range(0))));
}

void BM_Simulate(benchmark::State& state) {
  Case c = make_case(static_cast<int>(state.range(0)));
  sim::SimOptions o;
  o.record_trace = false;
  o.record_memory_timeline = false;
  for (auto _ : state) benchmark::DoNotOptimize(sim::simulate(c.model, c.hw, c.plan, o));
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(case_name(static_cast<int>(state.range(0))));
}

BENCHMARK(BM_WrapGraph)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Lower)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Execute)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CostExecute)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Simulate)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();

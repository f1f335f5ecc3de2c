// Google Benchmark of simulate() and its parts (WrapGraph, Lower, Execute, CostExecute, Simulate) for
// llama3-8b on 8xH100-SXM and llama3-70b on 128x8xH100-SXM-IB-NDR400. How to run it, what each variant
// measures, and the history of its figures: docs/benchmarks.md.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define FSDPSIM_HAVE_CALLGRIND_H 1
#endif
#endif

#include "calibrate/hardware_profile.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "sim/executor.h"
#include "program/lowering.h"
#include "program/plan.h"
#include "sim/profile_cost_model.h"
#include "program/lower_context.h"
#include "sim/simulator.h"

namespace {

using namespace fsdpsim;

struct Case {
  models::ModelSpec model;
  calibrate::HardwareProfile hw;
  sim::Plan plan;
};

// Cases 0 and 1: a plan that exercises most of the lowering: FSDP2, full activation checkpointing, two
// micro-batches of gradient accumulation, and for the 1024-GPU case HSDP (replicate 16, shard 64 = 8
// nodes). Case 2: what the default `fsdpsim plan` recommends for llama3-8b on 8 H100s (FSDP1 with the
// rate limiter, so record_stream and the memory replayed inline with the timing; 64 micro-batches);
// FSDPSIM_BENCH_PLAN (a plan's JSON) replaces case 2's plan, to measure another one on the same model.
Case make_case(int which) {
  Case c;
  if (which == 2) {
    c.model = models::load_model("llama3-8b");
    c.hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster("8xH100-SXM"));
    c.plan = sim::parse_plan(nlohmann::json::parse(R"({"fsdp_version": 1, "sharding_strategy": "FULL_SHARD",
        "mesh": {"replicate": 1, "shard": 8}, "activation_checkpointing": "selective_op", "micro_batch": 1,
        "grad_accum": 64, "grad_sync": true, "seq_len": 8192, "use_orig_params": true,
        "limit_all_gathers": true, "backward_prefetch": "BACKWARD_PRE", "implementation": "hf"})"));
    if (const char* e = std::getenv("FSDPSIM_BENCH_PLAN")) c.plan = sim::parse_plan(nlohmann::json::parse(e));
    return c;
  }
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

const char* case_name(int which) {
  return which == 0 ? "llama3-8b/8xH100" : which == 1 ? "llama3-70b/1024xH100" : "llama3-8b/8xH100 FSDP1 ga=64";
}

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

// The lowering as simulate() runs it: with a recycler (ops, buffers, the context's vectors and the
// kernel lists reused from the previous call).
void BM_Lower(benchmark::State& state) {
  Case c = make_case(static_cast<int>(state.range(0)));
  const models::WrapGraph g = graph_of(c);
  const auto& cl = c.hw.cluster();
  const sim::Plan rp = sim::resolve_plan(c.plan, cl.world(), cl.gpus_per_node);
  sim::lowering::OpRecycler recycler;
  for (auto _ : state) {
    sim::StepProgram p = sim::lowering::lower_with(c.model, g, rp, sim::Topology{cl.world(), cl.gpus_per_node}, &recycler);
    benchmark::DoNotOptimize(p.ops.data());
    sim::lowering::recycle(p, recycler);
  }
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
  sim::Workspace ws;   // the engine reused from one run to the next, as a Simulator does
  o.workspace = &ws;
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
  sim::Workspace ws;
  o.workspace = &ws;
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
  sim::Simulator simulator;   // as a planner thread keeps one
  for (auto _ : state) benchmark::DoNotOptimize(simulator.simulate(c.model, c.hw, c.plan, o));
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(case_name(static_cast<int>(state.range(0))));
}

BENCHMARK(BM_WrapGraph)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Lower)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Execute)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CostExecute)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Simulate)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

// --steps=CASE,N: no Google Benchmark run; simulate() case CASE (0 = 8B, 1 = 70B, 2 = the default plan's FSDP1 recommendation) twice to warm the
// per-thread caches, then N times with callgrind's collection switched on around those N calls only;
// then prints what the fast paths did on that case (stretch, timing fast-forward, memory fold).
// Run it under `valgrind --tool=callgrind --collect-atstart=no`: the collected instruction count
// divided by N is the cost of one steady-state simulate() (deterministic, unlike wall clock).
int run_steps(const char* arg) {
  int which = 0, n = 0;
  if (std::sscanf(arg, "%d,%d", &which, &n) != 2 || which < 0 || which > 2 || n < 1) {
    std::fprintf(stderr, "--steps=CASE,N: CASE 0, 1 or 2, N >= 1 (got \"%s\")\n", arg);
    return 2;
  }
  Case c = make_case(which);
  sim::SimOptions o;
  o.record_trace = false;
  o.record_memory_timeline = false;
  sim::Simulator simulator;
  for (int i = 0; i < 2; ++i) benchmark::DoNotOptimize(simulator.simulate(c.model, c.hw, c.plan, o));
#ifdef FSDPSIM_HAVE_CALLGRIND_H
  CALLGRIND_TOGGLE_COLLECT;
#endif
  for (int i = 0; i < n; ++i) benchmark::DoNotOptimize(simulator.simulate(c.model, c.hw, c.plan, o));
#ifdef FSDPSIM_HAVE_CALLGRIND_H
  CALLGRIND_TOGGLE_COLLECT;
#endif
  std::printf("%s: %d simulate() calls\n", case_name(which), n);
  {
    sim::CompiledProgram prog;
    sim::OpCosts costs;
    std::string why;
    const bool stretched = sim::stretched_program(c.model, c.hw, c.plan, prog, costs, &why);
    sim::ExecOptions eo = fast_options();
    eo.memory_capacity = c.hw.memory_capacity() - c.hw.cuda_context_bytes();
    sim::ExecStats st;
    eo.stats = &st;
    if (stretched) sim::execute_compiled(prog, costs, eo);
    std::printf("stretched %d (%s): %zu runs; jumps %d (%d while the CPU issues, %d moving the memory), ops "
                "fast-forwarded %d, memory jumps %d, memory periods skipped %d, steady-step periods skipped %d\n",
                stretched ? 1 : 0, why.c_str(), prog.runs.size(), st.jumps, st.jumps_while_issuing,
                st.memory_shift_jumps, st.ops_fast_forwarded, st.memory_jumps, st.memory_periods_skipped,
                st.steady_periods_shifted);
    for (const auto& r : prog.runs) std::printf("  run begin %d period %d count %d\n", r.begin, r.period, r.count);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--steps=", 8) == 0) return run_steps(argv[i] + 8);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

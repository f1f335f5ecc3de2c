// Simulated steps per second (style.md lesson 12: speed is measured here, never asserted in tests).
// Target (issue #3): >= 10,000 simulated llama3-70b steps/s on one core (80 units, 1024 GPUs,
// record_trace = record_memory_timeline = false). Reached on 2026-11-24: BM_Simulate/1 73-77 us, i.e.
// ~13,300 steps/s (medians of --benchmark_min_time=0.3 --benchmark_repetitions=3, three rounds alternating
// with the 9a18192 binary, which took 138-143 us; BM_Simulate/0 46-47 us against 56-57 us), by not lowering
// or replaying what repeats (README, "The simulator's fast path"): the stretch writes the 1024-GPU program
// out from a lowering of the same plan with few layers, memory is replayed apart from the timing with
// repeated periods folded (sim/memory_fold.cpp), and the CPU issues in a tight loop. Callgrind, as below:
// llama3-70b 27,535,547 per 20 steps = 1.38 M (was 54,038,576 = 2.70 M), llama3-8b 17,872,681 = 0.89 M
// (was 22,011,773 = 1.10 M).
// Other 70B plans gain less (timed with simulate() in a loop, same VM): 8 micro-batches 554 -> 336 us,
// no_sync 182 -> 139 us, FSDP1 with the rate limiter and 4 micro-batches 213 -> 168 us (stretch off -> on).
// Everything below is the history before that.
//
// Instructions per steady-state simulate() (callgrind, deterministic; the wall clock on the shared VM
// varies up to 2x with the other jobs on it):
//   valgrind --tool=callgrind --collect-atstart=no build-*/tests/bench/bench_simulate --steps=1,20
//   (collected instructions / 20; --steps=0,20 for llama3-8b)
//                       2026-11-22 before   after 11-22     after 11-23     after 11-23 (2nd)   after 11-23 (3rd)   fast-forward
//   llama3-70b/1024     6.61 M              4.09 M          3.35 M          3.00 M              2.93 M              2.71 M
//   llama3-8b/8         2.61 M              1.61 M          1.33 M          1.20 M              1.16 M              1.10 M
// 11-22: lowering 2.21 -> 0.91 M, op costs 0.38 -> 0.27, execute 3.92 -> 2.87 (allocator 1.41 -> 0.80).
// 11-23 (70B): lowering 0.91 -> 0.65 M (Context storage reused, flat per-segment lists, Builder hot paths
// inline), op costs 0.27 -> 0.15 (a per-(kind, stream) slot of the last exact query before the memo
// tables), allocator + tracker 0.91 -> 0.74 (leaner class hints, in-place split remainders), engine
// -0.19 M (running kernels re-timed in place: no stale events; the per-op checks fused into the copy pass).
// 11-23, 2nd round (70B, 3.35 -> 3.00 M): the engine's setup is one pass (one record per op, one flat list
// array, per-stream / per-group / dependents lists appended as linked lists: 0.50 -> 0.44 M) and a stream's
// or NCCL queue's head stays its head while it runs, so "can it start" is one state test (run loop
// ~1.18 -> ~1.00 M); simulate() without a trace builds a simulator-only program (no op inputs/outputs:
// -28 K); the tracker frees without a second liveness check and Block slots are 64 bytes (-25 K).
// 11-23, 3rd round (70B 3.00 -> 2.93 M, 8B 1.20 -> 1.16 M): MemoryTracker::allocate_persistent restores the
// allocator state it saved after the same persistent requests last time (CachingAllocator::save/restore:
// 80 K -> 21 K). This bench always hits; `fsdpsim plan --threads 1` hits in 219 of 235 simulate() calls
// (llama3-70b) and 816 of 847 (llama3-8b default), so the gain is a planner's too. Wall clock: within noise.
// An earlier round took the 70B case from 18.7 M to ~6.9 M (wrap graph cached, op costs memoized, op
// storage recycled). What was left after the 2nd round (70B, per step, 3.00 M) is spread thin, every piece already a tight loop:
// ~0.62 M building ~2,340 Op structs (the StepProgram is a plain data structure the runtime also
// executes), ~0.44 M checking them and copying them into the engine's records, ~0.14 M op costs, ~1.0 M
// event engine (~430 instructions per op: issue, start, completion, dependents, re-timing), ~0.7 M
// allocator model for ~2,000 allocations (414 persistent) and ~1,800 frees (~130 instructions each).
// 10,000/s means <= ~1.45 M instructions per step at this machine's ~14.6 instructions/ns: 2x below what
// is left. Tried and measured worse: -O3 (+0.8 %), LTO (+8.6 %), fixed per-stream event slots instead of
// the scanned event list (+1.7 to +2.7 %), forcing start() inline (+88 K, spills), inline allocator fast
// paths (-0.07 % small, +0.7 % forced), intrusive free lists per size class (+1.6 %: long list walks).
// Measured and dropped in the 3rd round: the lowering writing the ops' lists straight into the engine's
// form (linked lists in one node array; no Op vectors, no copying pass) cost +4.3 % (60.02 -> 62.58 M per
// 20 steps): the engine's setup pass only fell 0.44 -> 0.29 M, because most of it is the per-op checks and
// the dependents / stream / NCCL-queue links, not the copying, while ~5,600 appends cost ~40 instructions
// each in the lowering. So the old estimate of "-0.8 M without Op structs" was wrong: per-op bookkeeping is
// spread over lowering (~265 instructions per op), setup (~188), costs (~58), engine (~430) and allocator
// (~300 per op, ~1.6 allocations and frees each); 10,000/s allows ~620 per op in all. No local trim gets
// there: the 80 identical blocks (x 2 micro-batches) have to be simulated once, not 160 times. Facts for
// that design, measured on this case: the CPU never blocks (cpu_blocked 0) and issues all 2,344 ops in the
// first 91 ms of an 11.63 s step, so every allocation and free happens then, in CPU order; after that the
// engine is a pure timing problem (streams, NCCL queues, overlap slowdown) over repeated blocks, and the
// allocator never feeds back into timing. That timing IS periodic: in the --trace of this case the forward
// compute of units 2..79 starts every 17,742,751 ns exactly and the backward of units 80..2 every
// 53,479,206 ns, in both micro-batches. A block-periodic fast-forward of the timing is exact if the engine state at a block
// boundary (in-flight ops, pending events, remaining work as doubles) equals the previous boundary's
// shifted by (time, op ids); the allocator's state is not shift-periodic (activation segments accumulate,
// and double-buffered unsharded params may make its period two blocks), which is why skipping blocks
// there needs its own argument.
// The block-periodic fast-forward of the timing (2026-11-23, sim/executor.cpp "Fast-forward"; exact, checked
// against itself switched off in tests/sim/test_fast_forward.cpp) skips 2,174 of this case's 2,344 ops
// (llama3-8b: 721 of 886): 2.93 -> 2.71 M (54,104,568 per 20 steps), llama3-8b 1.164 -> 1.102 M
// (22,037,773). Less than the skipped share suggests: once the CPU has issued everything, simulating an
// op on the GPU costs only ~190 instructions, and proving that a skipped op repeats its counterpart costs
// ~127 (its stream, kind, queue, duration, each wait, next ops, woken streams). Measured and dropped:
// precomputing those facts as one exact 64-bit key per op cost as much as it saved (every op is keyed
// once and checked about once). Its first version cost the planner +1.6 % (llama3-8b default plan, 26.50
// -> 26.92 G instructions with --threads 1): g++ stopped inlining complete() into the run loop, and full
// snapshots were taken at every compute start of candidates that never repeat; with complete() forced
// inline and full snapshots only where a few scalars repeat, `fsdpsim plan --threads 1` went 26.50 ->
// 26.47 G (llama3-8b) and 912.6 -> 908.1 M (llama3-70b). What remains (~1.9 M) is the CPU side (lowering
// 0.62 M, engine setup 0.44 M, costs 0.14 M, issue + allocator 0.87 M), which runs once per op whatever
// the GPU does; skipping it needs a program that is itself block-periodic (lowered once per distinct
// block, with the allocator's evolution proven periodic).
//
// Wall clock, medians of --benchmark_repetitions=5 --benchmark_min_time=0.5 (other jobs on the VM):
// 2026-11-22: BM_Simulate/1 517-651 us -> 287-346 us (1,880 -> 3,480 steps/s at load 3), BM_Simulate/0
// 202-210 us -> 112-118 us, BM_Execute/1 292-318 us -> 197-201 us. 2026-11-23 (load 1.2-1.5, the 06b75b8
// and the new binary alternating, twice): BM_Simulate/1 275-277 us -> 228-230 us (3,610-3,640 ->
// 4,360-4,380 steps/s), BM_Simulate/0 109 us -> 88.9 us (9,170-9,220 -> 11,250 steps/s).
// 2026-11-23 2nd round (load ~1, the 0a8037b and the new binary alternating, twice): BM_Simulate/1
// 229 us -> 200-201 us (4,360-4,370 -> 4,980-5,010 steps/s), BM_Simulate/0 87.9-88.9 us -> 79.1-79.5 us
// (11,250-11,380 -> 12,580-12,650 steps/s). 2026-11-23 3rd round (load ~1.3, the 48722cf and the new
// binary alternating, twice): BM_Simulate/1 201, 207 us -> 205, 200 us; BM_Simulate/0 82.3, 80.6 us ->
// 80.5, 78.4 us: the -2.2 % in instructions is within the noise (~5,000 and ~12,500 steps/s).
// 2026-11-23 fast-forward (the 8690d40 and the 1c0a438 binary alternating, six rounds, --benchmark_min_time=0.3
// --benchmark_repetitions=3; the VM switched between a fast and a ~1.4x slower state, so only rounds with
// both in the same state count): BM_Simulate/1 201, 201 us -> 181, 181 us (fast state; 273, 284 -> 246, 258
// slow), i.e. ~4,980 -> ~5,520 steps/s; BM_Simulate/0 79.3, 79.5 -> 74.8, 73.0 us (~13,500 steps/s).
//   build-*/tests/bench/bench_simulate --benchmark_min_time=0.5   (libbenchmark 1.7: seconds, no "s")
// Variants, each for llama3-8b on 8xH100-SXM and llama3-70b on 128x8xH100-SXM-IB-NDR400:
//   WrapGraph    build_wrap_graph alone (simulate() caches it per thread, so a planner pays it once)
//   Lower        resolve_plan + lower with a prebuilt wrap graph (the public lower(): fresh storage, names)
//   Execute      execute() with precomputed OpCosts (the event engine + allocator model alone)
//   CostExecute  ProfileCostModel + compute_op_costs + execute (what simulate() runs after lowering)
//   Simulate     simulate() end to end
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

// --steps=CASE,N: no Google Benchmark run; simulate() case CASE (0 = 8B, 1 = 70B) twice to warm the
// per-thread caches, then N times with callgrind's collection switched on around those N calls only.
// Run it under `valgrind --tool=callgrind --collect-atstart=no`: the collected instruction count
// divided by N is the cost of one steady-state simulate() (deterministic, unlike wall clock).
int run_steps(const char* arg) {
  int which = 0, n = 0;
  if (std::sscanf(arg, "%d,%d", &which, &n) != 2 || which < 0 || which > 1 || n < 1) {
    std::fprintf(stderr, "--steps=CASE,N: CASE 0 or 1, N >= 1 (got \"%s\")\n", arg);
    return 2;
  }
  Case c = make_case(which);
  sim::SimOptions o;
  o.record_trace = false;
  o.record_memory_timeline = false;
  for (int i = 0; i < 2; ++i) benchmark::DoNotOptimize(sim::simulate(c.model, c.hw, c.plan, o));
#ifdef FSDPSIM_HAVE_CALLGRIND_H
  CALLGRIND_TOGGLE_COLLECT;
#endif
  for (int i = 0; i < n; ++i) benchmark::DoNotOptimize(sim::simulate(c.model, c.hw, c.plan, o));
#ifdef FSDPSIM_HAVE_CALLGRIND_H
  CALLGRIND_TOGGLE_COLLECT;
#endif
  std::printf("%s: %d simulate() calls\n", case_name(which), n);
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

// The memory model's speed with per-tensor allocation (issue 19: PyTorch's allocator sees every saved
// tensor and transient, so the lowering will allocate ~10-20 buffers per block where it allocates one).
// A synthetic stand-in until that lowering exists: simulate()'s stretched program of the bench_simulate
// 70B case (llama3-70b on 1024 H100s, HSDP 16x64, full AC, 2 micro-batches) with every activation and
// logits buffer split into pieces, allocated one after the other by the same op and freed by the same op
// in reverse order. The block periods stay those of the program, so the memory fold sees that many more
// calls per period. Splits (the benchmarks' first argument):
//   1   none (the program as simulate() runs it)
//   16  a llama block's saved tensors, in proportion to their bytes per token (h = 8192, kv = 1024,
//       ffn = 28672 for llama3-70b): the fp32 norm input 4h, normed 2h, q 2h, k 2kv, v 2kv, rotated q 2h,
//       rotated k 2kv, attention output 2h, the softmax statistics 256 B, o_proj input 2h, second norm
//       input 4h and output 2h, gate / up / SiLU / product 2ffn each. At 4096 tokens the kv-sized pieces
//       are 8 MiB: requests of 1-10 MiB share 20 MiB segments (memory/caching_allocator.h). Only buffers of
//       256 MiB or more are split so (the recomputed tensors of a block, ~1.5 GiB here; a block's input,
//       all that full AC saves, is one tensor of 64 MiB)
//   10, 20  equal pieces (6.4 / 3.2 MiB of a 64 MiB buffer: several to a 20 MiB segment)
//   BM_MemoryReplay/S/F  MemoryTracker: persistent buffers, the first step, the steady step (F=1: folded,
//                        and the steady step replayed on the first step's allocator, as the executor runs it)
//   BM_ExecuteTensors/S  execute_compiled(): the event engine with both steps of memory
//   build/tests/bench/bench_memory --benchmark_min_time=0.3 --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <stdexcept>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "models/zoo.h"
#include "sim/executor.h"
#include "sim/memory_tracker.h"
#include "program/plan.h"
#include "sim/simulator.h"

namespace {

using namespace fsdpsim;

struct Case {
  sim::CompiledProgram program;
  sim::OpCosts costs;
  Bytes capacity = 0;
};

Case base_case() {
  const models::ModelSpec model = models::load_model("llama3-70b");
  const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster("128x8xH100-SXM-IB-NDR400"));
  sim::Plan plan;
  plan.mesh_replicate = 16;
  plan.mesh_shard = 64;
  plan.sharding_strategy = sim::ShardingStrategy::HYBRID_SHARD;
  plan.activation_checkpointing.mode = sim::ActivationCheckpointing::Mode::Full;
  plan.seq_len = 4096;
  plan.grad_accum = 2;
  plan.grad_sync = true;
  Case c;
  if (!sim::stretched_program(model, hw, plan, c.program, c.costs)) throw std::runtime_error("bench_memory: not stretched");
  c.capacity = hw.memory_capacity() - hw.cuda_context_bytes();
  return c;
}

// The weights of a split (see the top).
std::vector<double> split_weights(int s) {
  constexpr double h = 8192, kv = 1024, ffn = 28672;
  if (s == 16) return {4 * h, 2 * h, 2 * h, 2 * kv, 2 * kv, 2 * h, 2 * kv, 2 * h, 256, 2 * h, 4 * h, 2 * h,
                       2 * ffn, 2 * ffn, 2 * ffn, 2 * ffn};
  return std::vector<double>(static_cast<std::size_t>(s), 1.0);
}

// `cp` with every Activations / Logits buffer split by split_weights(s) (see the top).
sim::CompiledProgram per_tensor(const sim::CompiledProgram& cp, int s) {
  const std::vector<double> w = split_weights(s);
  double total = 0;
  for (double x : w) total += x;
  sim::CompiledProgram out = cp;
  const int nb = static_cast<int>(cp.buffers.size());
  std::vector<int> first(nb), pieces(nb);
  out.buffers.clear();
  for (int b = 0; b < nb; ++b) {
    const sim::CompiledBuffer& x = cp.buffers[b];
    const bool split = !x.persistent && (x.category == sim::MemCategory::Activations || x.category == sim::MemCategory::Logits) &&
                       (s != 16 || x.bytes >= 256 * kMiB);
    first[b] = static_cast<int>(out.buffers.size());
    pieces[b] = split ? static_cast<int>(w.size()) : 1;
    Bytes left = x.bytes;
    for (int j = 0; j < pieces[b]; ++j) {
      sim::CompiledBuffer y = x;
      y.bytes = j == pieces[b] - 1 ? left : static_cast<Bytes>(static_cast<double>(x.bytes) * w[static_cast<std::size_t>(j)] / total);
      left -= y.bytes;
      out.buffers.push_back(y);
    }
  }
  out.lists.clear();
  int start = 0;
  for (int i = 0; i < cp.num_ops(); ++i) {
    const sim::OpRec& r = cp.ops[i];
    sim::OpRec& o = out.ops[i];
    o.wait_pos = static_cast<int>(out.lists.size());
    for (int p = start; p < r.cpu_waits; ++p) out.lists.push_back(cp.lists[p]);
    o.cpu_waits = static_cast<int>(out.lists.size());
    for (int p = r.cpu_waits; p < r.allocs; ++p) out.lists.push_back(cp.lists[p]);
    o.allocs = static_cast<int>(out.lists.size());
    for (int p = r.allocs; p < r.frees; ++p)
      for (int j = 0; j < pieces[cp.lists[p]]; ++j) out.lists.push_back(first[cp.lists[p]] + j);
    o.frees = static_cast<int>(out.lists.size());
    for (int p = r.frees; p < r.end; p += 2)
      for (int j = pieces[cp.lists[p]] - 1; j >= 0; --j) {
        out.lists.push_back(first[cp.lists[p]] + j);
        out.lists.push_back(cp.lists[p + 1]);
      }
    o.end = static_cast<int>(out.lists.size());
    start = r.end;
  }
  return out;
}

void BM_MemoryReplay(benchmark::State& state) {
  const Case c = base_case();
  const sim::CompiledProgram p = per_tensor(c.program, static_cast<int>(state.range(0)));
  const bool fold = state.range(1) != 0;
  sim::MemoryTracker t;
  int jumps = 0;
  for (auto _ : state) {
    t.start(p, c.capacity, false);
    t.allocate_persistent();
    t.replay(p, fold);
    jumps = t.fold_stats().jumps;
    t.begin_steady_step();
    t.replay(p, fold);
    jumps += t.fold_stats().jumps;
    benchmark::DoNotOptimize(t.stats());
  }
  state.counters["buffers"] = static_cast<double>(p.buffers.size());
  state.counters["fold_jumps"] = jumps;
  state.counters["peak_reserved_GiB"] = to_gib(t.stats().peak_reserved);
}

void BM_ExecuteTensors(benchmark::State& state) {
  const Case c = base_case();
  sim::CompiledProgram p = per_tensor(c.program, static_cast<int>(state.range(0)));
  sim::ExecOptions o;
  o.record_trace = false;
  o.record_memory_timeline = false;
  o.memory_capacity = c.capacity;
  for (auto _ : state) benchmark::DoNotOptimize(sim::execute_compiled(p, c.costs, o));
  state.counters["buffers"] = static_cast<double>(p.buffers.size());
}

BENCHMARK(BM_MemoryReplay)->ArgsProduct({{1, 16, 10, 20}, {0, 1}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ExecuteTensors)->Arg(1)->Arg(16)->Arg(10)->Arg(20)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();

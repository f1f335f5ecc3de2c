// models/ speed: what the planner pays per candidate when it rebuilds a wrap graph or a kernel list.
// Run by hand: build/tests/bench/bench_models
#include <benchmark/benchmark.h>

#include "models/kernels.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"

namespace {

using namespace fsdpsim::models;

void BM_BuildWrapGraph(benchmark::State& state, const char* model, const char* policy) {
  const ModelSpec m = load_model(model);
  const WrapPolicy p = parse_wrap_policy(policy, "policy");
  for (auto _ : state) benchmark::DoNotOptimize(build_wrap_graph(m, p));
}
BENCHMARK_CAPTURE(BM_BuildWrapGraph, llama3_8b_block, "llama3-8b", "block");
BENCHMARK_CAPTURE(BM_BuildWrapGraph, llama3_70b_block, "llama3-70b", "block");
BENCHMARK_CAPTURE(BM_BuildWrapGraph, mixtral_8x7b_block, "mixtral-8x7b", "block");
BENCHMARK_CAPTURE(BM_BuildWrapGraph, llama3_70b_size_1e8, "llama3-70b", "size:100000000");

void BM_BlockKernels(benchmark::State& state) {
  const ModelSpec m = load_model("llama3-70b");
  for (auto _ : state) {
    benchmark::DoNotOptimize(forward_kernels(m, ModulePart::Block, 1, 8192, fsdpsim::Dtype::BF16));
    benchmark::DoNotOptimize(backward_kernels(m, ModulePart::Block, 1, 8192, fsdpsim::Dtype::BF16, true));
  }
}
BENCHMARK(BM_BlockKernels);

void BM_LoadZooModel(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(load_model("llama3-70b"));
}
BENCHMARK(BM_LoadZooModel);

}  // namespace

BENCHMARK_MAIN();

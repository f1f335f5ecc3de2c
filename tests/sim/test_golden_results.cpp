// Regression oracle for the simulator's speed work (issue #3/#5 "Speed": faster, same results): a
// matrix of diverse plans on tiny-llama / llama3-8b / llama3-70b / mixtral, each simulated end to end,
// compared byte for byte with goldens in tests/sim/golden/ written by the code BEFORE any optimization.
//
// Each golden holds the full SimResult JSON without trace and memory timeline, plus a 64-bit FNV-1a
// digest of (a) the trace JSON, (b) the memory timeline JSON and (c) a canonical dump of the lowered
// StepProgram (every op field the runtime reads, kernels included), so the trace, the timeline and the
// program are checked exactly without storing megabytes. tiny-llama goldens also keep the full trace.
// The same plan simulated without trace/timeline must give the same figures (the planner's fast path).
//
// Regenerate (only when a result is MEANT to change, and say so in the commit):
//   FSDPSIM_UPDATE_GOLDEN=1 build-*/tests/sim/sim_test_golden_results
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/hardware_profile.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "program/lowering.h"
#include "program/plan.h"
#include "sim/simulator.h"
#include "program/step_program.h"

namespace fsdpsim::sim {
namespace {

struct GoldenCase {
  const char* name;      // golden file stem
  const char* model;
  const char* cluster;
  const char* plan;      // inline plan JSON
};

// Chosen to reach every lowering branch and the allocator's retry/OOM paths: FSDP1 strategies and
// prefetch modes, FSDP2 reshard_after_forward true/false/int, HSDP, activation checkpointing modes,
// CPU offload, fp8 all-gather, frozen params, SGD, grad accumulation with and without no_sync,
// fp16 reduce (divides), pure bf16, wrap policies, a 1-wide shard dim and plans that do not fit.
const std::vector<GoldenCase>& cases() {
  static const std::vector<GoldenCase> k = {
      {"tiny_fsdp2_default", "tiny-llama", "8xH100-SXM", R"({})"},
      {"tiny_fsdp1_full_shard", "tiny-llama", "8xH100-SXM", R"({"fsdp_version":1})"},
      {"tiny_fsdp1_grad_op_post", "tiny-llama", "8xH100-SXM",
       R"({"fsdp_version":1,"sharding_strategy":"SHARD_GRAD_OP","backward_prefetch":"BACKWARD_POST","forward_prefetch":true})"},
      {"tiny_fsdp1_no_shard", "tiny-llama", "8xH100-SXM", R"({"fsdp_version":1,"sharding_strategy":"NO_SHARD"})"},
      {"tiny_fsdp1_offload_accum", "tiny-llama", "8xH100-SXM",
       R"({"fsdp_version":1,"cpu_offload":true,"grad_accum":2,"limit_all_gathers":false,"use_orig_params":false})"},
      {"tiny_fsdp2_offload_opt", "tiny-llama", "8xH100-SXM",
       R"({"cpu_offload":{"params":false,"optimizer":true},"optimizer":"sgd"})"},
      {"tiny_fsdp2_fp16_every2", "tiny-llama", "8xH100-SXM",
       R"({"param_dtype":"fp16","reduce_dtype":"fp16","activation_checkpointing":"every_2","grad_accum":3})"},
      {"tiny_fsdp2_raf_false_nowrap", "tiny-llama", "8xH100-SXM",
       R"({"reshard_after_forward":false,"auto_wrap_policy":"none","seq_len":512,"micro_batch":4})"},
      {"tiny_fsdp2_replicated", "tiny-llama", "4xA100-80GB-PCIe4", R"({"mesh":[4,1]})"},
      {"l8b_fsdp2_default", "llama3-8b", "8xH100-SXM", R"({})"},
      {"l8b_fsdp2_ac_accum_sync", "llama3-8b", "8xH100-SXM",
       R"({"activation_checkpointing":"full","grad_accum":2,"grad_sync":true,"seq_len":4096})"},
      {"l8b_fsdp2_no_sync", "llama3-8b", "8xH100-SXM", R"({"grad_accum":2,"seq_len":4096})"},
      {"l8b_fsdp2_prefetch2_selective", "llama3-8b", "8xH100-SXM",
       R"({"prefetch_depth":2,"activation_checkpointing":"selective_op","micro_batch":2})"},
      {"l8b_fsdp2_fp8_lora", "llama3-8b", "8xH100-SXM", R"({"fp8_all_gather":true,"trainable_fraction":0.1})"},
      {"l8b_fsdp2_bf16_true", "llama3-8b", "8xH100-SXM", R"({"master_weights_dtype":"bf16","reduce_dtype":"bf16"})"},
      {"l8b_fsdp1_default", "llama3-8b", "8xH100-SXM", R"({"fsdp_version":1})"},
      {"l8b_fsdp1_outside_ac", "llama3-8b", "8xH100-SXM",
       R"({"fsdp_version":1,"activation_checkpointing":{"mode":"full","outside_fsdp":true},"backward_prefetch":"NONE"})"},
      {"l8b_fsdp1_no_fit", "llama3-8b", "8xA100-40GB", R"({"fsdp_version":1,"micro_batch":8,"seq_len":8192})"},
      {"l8b_fsdp2_no_fit", "llama3-8b", "8xA100-40GB", R"({"micro_batch":16,"seq_len":8192})"},
      {"l8b_fsdp2_size_wrap", "llama3-8b", "8xH100-SXM", R"({"auto_wrap_policy":{"min_num_params":500000000}})"},
      {"l8b_hsdp_2node", "llama3-8b", "2x8xH100-SXM-IB-NDR400", R"({"mesh":[2,8],"activation_checkpointing":"full"})"},
      {"l8b_fsdp1_hybrid_2node", "llama3-8b", "2x8xH100-SXM-IB-NDR400",
       R"({"fsdp_version":1,"sharding_strategy":"HYBRID_SHARD","mesh":[2,8]})"},
      {"l8b_fsdp1_zero2_hybrid", "llama3-8b", "2x8xH100-SXM-IB-NDR400",
       R"({"fsdp_version":1,"sharding_strategy":"_HYBRID_SHARD_ZERO2","mesh":[2,8],"grad_accum":2})"},
      {"l8b_fsdp2_raf_int", "llama3-8b", "2x8xH100-SXM-IB-NDR400", R"({"reshard_after_forward":8})"},
      {"l8b_eth_slow", "llama3-8b", "2x8xH100-SXM-ETH-10G", R"({"activation_checkpointing":"full"})"},
      {"l70b_hsdp_accum_ac", "llama3-70b", "128x8xH100-SXM-IB-NDR400",
       R"({"mesh":[16,64],"activation_checkpointing":"full","seq_len":4096,"grad_accum":2,"grad_sync":true})"},
      {"l70b_fsdp2_full_1024", "llama3-70b", "128x8xH100-SXM-IB-NDR400",
       R"({"activation_checkpointing":"full","seq_len":4096})"},
      {"l70b_fsdp1_hybrid", "llama3-70b", "128x8xH100-SXM-IB-NDR400",
       R"({"fsdp_version":1,"sharding_strategy":"HYBRID_SHARD","mesh":[16,64],"activation_checkpointing":"every_2"})"},
      {"l70b_no_fit_32", "llama3-70b", "4x8xH100-SXM-IB-NDR400", R"({"micro_batch":2,"seq_len":8192})"},
      {"l70b_a100_offload", "llama3-70b", "16x8xA100-80GB-IB-HDR200",
       R"({"fsdp_version":1,"cpu_offload":true,"activation_checkpointing":"full"})"},
      {"mixtral_fsdp2", "mixtral-8x7b", "4x8xH100-SXM-IB-NDR400", R"({"activation_checkpointing":"full"})"},
      // QLoRA: torchao's NF4 under FSDP2 (torchtune's shape, compiled: with full AC each block keeps its NF4 linears'
      // dequantized copies, TapeOp::escapes_checkpoint) and bitsandbytes' under FSDP1 (adapters apart)
      {"l70b_fsdp2_qlora", "llama3-70b", "8xA100-80GB",
       R"({"activation_checkpointing":"full","compile":true,"param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16",
           "frozen_units":["root"],"lora":{"rank":16,"targets":["q","k","v","o","mlp"],"quantize_base":"nf4"}})"},
      {"l8b_fsdp1_qlora_bnb", "llama3-8b", "2xRTX4090",
       R"({"fsdp_version":1,"use_orig_params":false,"activation_checkpointing":"full","param_dtype":"bf16","reduce_dtype":"bf16",
           "master_weights_dtype":"bf16","micro_batch":2,"frozen_units":["root"],
           "lora":{"rank":8,"targets":["q","v"],"dropout":0.05,"quantize_base":"nf4"}})"},
      // torchtune's LoRA recipe at long sequences with its activation offloading (streams), pure bf16
      {"l8b_fsdp2_lora_act_offload", "llama3-8b", "8xH100-SXM",
       R"({"activation_checkpointing":"full","activation_offloading":"streams","param_dtype":"bf16","reduce_dtype":"bf16",
           "master_weights_dtype":"bf16","micro_batch":4,"seq_len":8192,"grad_accum":2,"grad_sync":true,
           "free_logits_before_backward":true,"frozen_units":["root"],"cross_entropy":"chunked",
           "lora":{"rank":8,"targets":["q","v"]}})"},
  };
  return k;
}

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;   // FNV-1a 64-bit offset basis / prime (public-domain spec)
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return h;
}

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Every op and buffer field, kernels through the program's kernel lists, as one text.
std::string program_dump(const StepProgram& p) {
  std::ostringstream o;
  o << p.world << ' ' << p.shard_size << ' ' << p.replicate_size << ' ' << p.gpus_per_node << ' '
    << p.micro_batches << ' ' << p.tokens_per_rank << ' ' << p.model_flops_per_rank << '\n';
  for (const auto& s : p.streams) o << "S " << s.id << ' ' << static_cast<int>(s.role) << ' ' << s.name << '\n';
  for (const auto& b : p.buffers)
    o << "B " << b.id << ' ' << b.name << ' ' << b.bytes << ' ' << static_cast<int>(b.category) << ' ' << b.unit
      << ' ' << b.pool_stream << ' ' << b.persistent << '\n';
  auto ints = [&](const char* tag, const std::vector<int>& v) {
    o << ' ' << tag;
    for (int x : v) o << ',' << x;
  };
  for (const auto& op : p.ops) {
    o << "O " << op.id << ' ' << static_cast<int>(op.kind) << ' ' << op.stream << ' ' << op.unit << ' '
      << op.micro_batch << ' ' << op.name;
    ints("w", op.waits);
    ints("cw", op.cpu_waits);
    ints("a", op.allocs);
    o << " f";
    for (const auto& f : op.frees) o << ',' << f.buffer << '/' << f.reuse_after_op;
    ints("i", op.inputs);
    ints("out", op.outputs);
    o << ' ' << op.comm_bytes << ' ' << static_cast<int>(op.group) << ' ' << op.group_size << ' '
      << op.nodes_spanned << ' ' << op.copy_bytes << ' ' << op.params << ' ' << op.cpu_hooks << ' '
      << op.kernel_launches << '\n';
    for (const auto& k : op.kernel_list())
      o << "  K " << static_cast<int>(k.kind) << ' ' << k.name << ' ' << k.m << ' ' << k.n << ' ' << k.k << ' '
        << k.count << ' ' << k.batch << ' ' << k.seq << ' ' << k.heads << ' ' << k.kv_heads << ' ' << k.head_dim
        << ' ' << k.backward << ' ' << k.flops << ' ' << k.bytes << ' ' << static_cast<int>(k.dtype) << '\n';
  }
  for (const auto& n : p.notes) o << "N " << n << '\n';
  return o.str();
}

nlohmann::json golden_of(const GoldenCase& gc) {
  const auto model = models::load_model(gc.model);
  const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(gc.cluster));
  const Plan plan = parse_plan(nlohmann::json::parse(gc.plan));
  const SimResult r = simulate(model, hw, plan);   // trace and timeline recorded
  nlohmann::json full = sim_result_to_json(r, true);
  nlohmann::json g;
  g["case"] = {{"model", gc.model}, {"cluster", gc.cluster}, {"plan", nlohmann::json::parse(gc.plan)}};
  nlohmann::json trace = full.contains("trace") ? full["trace"] : nlohmann::json();
  nlohmann::json timeline = full.contains("memory_timeline") ? full["memory_timeline"] : nlohmann::json();
  full.erase("trace");
  full.erase("memory_timeline");
  g["result"] = full;
  g["trace_spans"] = r.trace.size();
  g["trace_fnv1a64"] = hex(fnv1a(trace.dump()));
  g["timeline_samples"] = r.memory_timeline.size();
  g["timeline_fnv1a64"] = hex(fnv1a(timeline.dump()));
  if (std::string(gc.model) == "tiny-llama") g["trace"] = trace;
  // The lowered program, as simulate() builds it.
  const auto& cl = hw.cluster();
  const Plan rp = resolve_plan(plan, cl.world(), cl.gpus_per_node);
  const models::ModelSpec m = models::with_seq_len(model, rp.seq_len);
  const models::WrapGraph graph = models::build_wrap_graph(m, rp.auto_wrap_policy);
  const StepProgram prog = lower(m, graph, rp, Topology{cl.world(), cl.gpus_per_node});
  g["program_ops"] = prog.ops.size();
  g["program_fnv1a64"] = hex(fnv1a(program_dump(prog)));
  return g;
}

std::string golden_path(const GoldenCase& gc) {
  return std::string(FSDPSIM_SOURCE_DIR) + "/tests/sim/golden/" + gc.name + ".json";
}

class Golden : public ::testing::TestWithParam<int> {};

TEST_P(Golden, SimulateMatchesGoldenBytes) {
  const GoldenCase& gc = cases()[static_cast<std::size_t>(GetParam())];
  const std::string now = golden_of(gc).dump(1) + "\n";
  const std::string path = golden_path(gc);
  if (const char* u = std::getenv("FSDPSIM_UPDATE_GOLDEN"); u && std::string(u) == "1") {
    std::ofstream(path, std::ios::binary) << now;
    GTEST_SKIP() << "wrote " << path;
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in.good()) << "missing golden " << path;
  std::stringstream want;
  want << in.rdbuf();
  EXPECT_EQ(now, want.str()) << "simulate() output changed for " << gc.name;
}

// The planner's inner loop (no trace, no timeline) must produce the same figures.
TEST_P(Golden, QuietRunGivesTheSameFigures) {
  const GoldenCase& gc = cases()[static_cast<std::size_t>(GetParam())];
  const auto model = models::load_model(gc.model);
  const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(gc.cluster));
  const Plan plan = parse_plan(nlohmann::json::parse(gc.plan));
  SimOptions quiet;
  quiet.record_trace = false;
  quiet.record_memory_timeline = false;
  nlohmann::json a = sim_result_to_json(simulate(model, hw, plan, quiet), true);
  nlohmann::json b = sim_result_to_json(simulate(model, hw, plan), true);
  for (auto* j : {&a, &b}) {
    j->erase("trace");
    j->erase("memory_timeline");
    j->erase("memory_timeline_steps");   // (what the timeline covers, and where its steady step starts)
    j->erase("steady_step_start_ns");
    for (const char* at : {"peak_at", "first_step_peak_at"})   // (op names exist only in a full program)
      if (j->contains(at))
        for (auto& [k, v] : (*j)[at].items()) v.erase("name");
  }
  EXPECT_EQ(a.dump(1), b.dump(1));
}

// simulate() keeps per-thread caches (wrap graphs, recycled op storage): threads interleaving
// different models and plans — as the planner's workers do — must each get the golden figures.
TEST(GoldenThreads, ConcurrentInterleavedCallsMatchSequential) {
  const auto& cs = cases();
  std::vector<std::string> want(cs.size());
  SimOptions quiet;
  quiet.record_trace = false;
  quiet.record_memory_timeline = false;
  auto run = [&](std::size_t i) {
    const auto model = models::load_model(cs[i].model);
    const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(cs[i].cluster));
    return sim_result_to_json(simulate(model, hw, parse_plan(nlohmann::json::parse(cs[i].plan)), quiet)).dump();
  };
  for (std::size_t i = 0; i < cs.size(); ++i) want[i] = run(i);
  constexpr int kThreads = 3;
  std::vector<std::vector<std::string>> got(kThreads, std::vector<std::string>(cs.size()));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      // Each thread walks the cases in a different order (reverse, strided) to mix cache contents; a stride
      // coprime with the number of cases visits each once.
      std::size_t stride = 2 * static_cast<std::size_t>(t) + 1;
      while (std::gcd(stride, cs.size()) != 1) stride += 2;
      for (std::size_t k = 0; k < cs.size(); ++k) {
        std::size_t i = t == 0 ? cs.size() - 1 - k : (k * stride) % cs.size();
        got[t][i] = run(i);
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t)
    for (std::size_t i = 0; i < cs.size(); ++i)
      EXPECT_EQ(got[t][i], want[i]) << "thread " << t << " case " << cs[i].name;
}

INSTANTIATE_TEST_SUITE_P(Plans, Golden, ::testing::Range(0, static_cast<int>(cases().size())),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(cases()[static_cast<std::size_t>(i.param)].name);
                         });

}  // namespace
}  // namespace fsdpsim::sim

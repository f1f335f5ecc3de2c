// The stretch (sim/stretch.h): simulate() without a trace lowers a shorter model (fewer layers, fewer
// micro-batches) and stretches its program to the model's layers and the plan's micro-batches. Oracles:
//  (1) the whole lowering: compile_program(lower(model)) and its op costs must equal the stretched
//      program record by record, list entry by list entry, buffer by buffer, on the cases below and on
//      random plans (grad_accum up to 64); its runs (CompiledProgram::runs) must repeat as promised;
//  (2) simulate() with the stretch off: the whole result JSON must be identical, over random plans of
//      the zoo's models on several clusters (FSDP1/FSDP2, every strategy, mesh, prefetch and
//      checkpointing mode, dtypes, accumulation, offload, fp8, LoRA fraction, wrap policy, ...).
// Each group also counts how often the stretch acted, so no comparison passes vacuously.
// FSDPSIM_RANDOM_PLANS and FSDPSIM_RANDOM_SEED run the random groups longer (STRETCH_WHY prints refusals).
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "common/errors.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "sim/executor.h"
#include "program/lowering.h"
#include "program/plan.h"
#include "sim/profile_cost_model.h"
#include "sim/simulator.h"
#include "random_plans.h"
#include "zoo_cases.h"

namespace fsdpsim::sim {
namespace {

using Case = ZooCase;

std::string describe(const Case& c) { return c.model + " on " + c.cluster + " " + c.plan; }

// compile_program of the whole lowering, with its op costs.
void whole_program(const Case& c, CompiledProgram& out, OpCosts& costs) {
  const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(c.cluster));
  const auto& cl = hw.cluster();
  const Plan rp = resolve_plan(parse_plan(nlohmann::json::parse(c.plan)), cl.world(), cl.gpus_per_node);
  const models::ModelSpec m = models::with_seq_len(models::load_model(c.model), rp.seq_len);
  const StepProgram p = lower(m, models::build_wrap_graph(m, rp.auto_wrap_policy), rp, topology_of(hw));
  compile_program(p, out);
  out.notes = p.notes;
  ProfileCostModel cost(hw);
  costs = compute_op_costs(p, cost);
}

// Record-by-record comparison; returns "" when equal, else the first difference.
std::string first_difference(const CompiledProgram& a, const OpCosts& ca, const CompiledProgram& b, const OpCosts& cb) {
  if (a.num_streams != b.num_streams) return "streams";
  if (a.num_ops() != b.num_ops()) return "ops: " + std::to_string(a.num_ops()) + " vs " + std::to_string(b.num_ops());
  for (int i = 0; i < a.num_ops(); ++i) {
    const OpRec& x = a.ops[i];
    const OpRec& y = b.ops[i];
    const int xs = i == 0 ? 0 : a.ops[i - 1].end, ys = i == 0 ? 0 : b.ops[i - 1].end;
    if (x.stream != y.stream || x.flags != y.flags || x.group != y.group || x.cpu_waits - xs != y.cpu_waits - ys ||
        x.allocs - xs != y.allocs - ys || x.frees - xs != y.frees - ys || x.end - xs != y.end - ys)
      return "op " + std::to_string(i) + " record";
    for (int k = 0; k < x.end - xs; ++k)
      if (a.lists[xs + k] != b.lists[ys + k])
        return "op " + std::to_string(i) + " list entry " + std::to_string(k) + ": " + std::to_string(a.lists[xs + k]) +
               " vs " + std::to_string(b.lists[ys + k]);
    if (ca.gpu_ns[i] != cb.gpu_ns[i] || ca.cpu_ns[i] != cb.cpu_ns[i]) return "op " + std::to_string(i) + " costs";
  }
  if (a.buffers.size() != b.buffers.size())
    return "buffers: " + std::to_string(a.buffers.size()) + " vs " + std::to_string(b.buffers.size());
  for (std::size_t i = 0; i < a.buffers.size(); ++i) {
    const CompiledBuffer& x = a.buffers[i];
    const CompiledBuffer& y = b.buffers[i];
    if (x.bytes != y.bytes || x.pool_stream != y.pool_stream || x.category != y.category || x.persistent != y.persistent)
      return "buffer " + std::to_string(i);
  }
  if (a.comm_sent != b.comm_sent) return "comm_sent";
  if (a.notes != b.notes) return "notes";
  if (ca.overlap_slowdown != cb.overlap_slowdown) return "overlap_slowdown";
  return "";
}

// The promise of CompiledProgram::runs: each op of a run after its first period repeats the op one
// period before (record, costs, list lengths; allocated buffers of the same facts).
std::string runs_not_periodic(const CompiledProgram& p, const OpCosts& c) {
  for (const PeriodicRun& r : p.runs) {
    if (r.begin < 0 || r.period < 1 || r.count < 1 || r.begin + r.period * r.count > p.num_ops())
      return "run at op " + std::to_string(r.begin) + " out of range";
    for (int x = r.begin + r.period; x < r.begin + r.period * r.count; ++x) {
      const int y = x - r.period;
      const OpRec& a = p.ops[x];
      const OpRec& b = p.ops[y];
      const int as = a.wait_pos, bs = b.wait_pos;
      if (a.stream != b.stream || a.flags != b.flags || a.group != b.group || c.gpu_ns[x] != c.gpu_ns[y] ||
          c.cpu_ns[x] != c.cpu_ns[y] || a.cpu_waits - as != b.cpu_waits - bs || a.allocs - as != b.allocs - bs ||
          a.frees - as != b.frees - bs || a.end - as != b.end - bs)
        return "op " + std::to_string(x) + " does not repeat op " + std::to_string(y);
      for (int k = 0; k < a.frees - a.allocs; ++k) {
        const CompiledBuffer& u = p.buffers[p.lists[a.allocs + k]];
        const CompiledBuffer& v = p.buffers[p.lists[b.allocs + k]];
        if (u.bytes != v.bytes || u.pool_stream != v.pool_stream || u.category != v.category)
          return "op " + std::to_string(x) + " allocates another buffer than op " + std::to_string(y);
      }
    }
  }
  return "";
}

const std::vector<Case> kCases = zoo_cases_and({
    {"llama2-70b", "8xH100-SXM", R"({"fsdp_version":1,"sharding_strategy":"NO_SHARD","grad_accum":3})"},
    {"qwen2-7b", "2x8xH100-SXM-ETH-10G", R"({"fsdp_version":1,"mesh":{"replicate":2,"shard":8},)"
                                        R"("sharding_strategy":"_HYBRID_SHARD_ZERO2","grad_accum":2})"},
    {"llama3-8b", "8xH100-SXM", R"({"cpu_offload":true,"activation_checkpointing":{"mode":"full","outside_fsdp":true}})"},
    {"llama3-8b", "8xH100-SXM", R"({"fp8_all_gather":true,"optimizer":"sgd","micro_batch":2})"},
    {"llama3-8b", "8xH100-SXM", R"({"auto_wrap_policy":{"modules":["layers.*"]},"activation_checkpointing":"every_3"})"},
    {"mixtral-8x7b", "2x8xH100-SXM-IB-NDR400", R"({"cpu_offload":{"params":false,"optimizer":true},"grad_accum":2})"},
    {"gpt2-xl", "8xA100-80GB", R"({"fsdp_version":1,"use_orig_params":false,"cross_entropy":"fused","grad_accum":4})"},
    // Micro-batches stretched too (grad_accum > 3 with grad_sync, > 4 without).
    {"llama3-8b", "8xH100-SXM", R"({"grad_accum":16,"grad_sync":true,"activation_checkpointing":"full"})"},
    {"llama3-8b", "8xH100-SXM", R"({"grad_accum":64,"grad_sync":false,"reduce_dtype":"fp32"})"},
    {"llama3-8b", "8xH100-SXM", R"({"grad_accum":9,"grad_sync":false,"reduce_dtype":"bf16"})"},
    {"llama3-70b", "128x8xH100-SXM-IB-NDR400",
     R"({"mesh":{"replicate":16,"shard":64},"sharding_strategy":"HYBRID_SHARD","activation_checkpointing":"full",)"
     R"("seq_len":4096,"grad_accum":8,"grad_sync":true})"},
    {"mistral-7b", "8xA100-80GB", R"({"fsdp_version":1,"backward_prefetch":"BACKWARD_PRE","limit_all_gathers":true,)"
                                  R"("grad_accum":12,"grad_sync":true})"},
    {"mistral-7b", "8xA100-80GB", R"({"fsdp_version":1,"backward_prefetch":"BACKWARD_POST","limit_all_gathers":true,)"
                                  R"("grad_accum":7,"grad_sync":false})"},
    {"qwen2-7b", "2x8xH100-SXM-ETH-10G", R"({"fsdp_version":1,"mesh":{"replicate":2,"shard":8},)"
                                        R"("sharding_strategy":"HYBRID_SHARD","grad_accum":6,"grad_sync":false})"},
    {"llama2-70b", "8xH100-SXM", R"({"fsdp_version":1,"sharding_strategy":"NO_SHARD","grad_accum":5,"grad_sync":true})"},
    {"mixtral-8x7b", "2x8xH100-SXM-IB-NDR400", R"({"cpu_offload":true,"grad_accum":10,"grad_sync":true})"},
    {"llama3-8b", "2x8xH100-SXM-IB-NDR400", R"({"reshard_after_forward":8,"grad_accum":5,"grad_sync":false,"fp8_all_gather":true})"},
    // FSDP1's rate limiter with params kept after forward: the next forward's all-gathers wait on the
    // previous backward's free events in queue order (block l on block L-2-l: a mirror).
    {"llama3-8b", "8xH100-SXM", R"({"fsdp_version":1,"sharding_strategy":"SHARD_GRAD_OP","limit_all_gathers":true,)"
                                R"("grad_accum":2,"grad_sync":true})"},
    {"qwen2-7b", "2x8xH100-SXM-ETH-10G", R"({"fsdp_version":1,"sharding_strategy":"_HYBRID_SHARD_ZERO2",)"
                                        R"("limit_all_gathers":true,"backward_prefetch":"BACKWARD_POST","forward_prefetch":true,)"
                                        R"("activation_checkpointing":"full","grad_accum":3,"grad_sync":true,)"
                                        R"("master_weights_dtype":"bf16"})"},
    // (its queue holds one event more than a forward takes: the root's all-gather in micro-batch m waits on
    // micro-batch m-2's root event, so micro-batches repeat from the third on: a source of 5)
    {"mistral-7b", "2x8xH100-SXM-IB-NDR400", R"({"fsdp_version":1,"sharding_strategy":"_HYBRID_SHARD_ZERO2",)"
                                            R"("limit_all_gathers":true,"backward_prefetch":"NONE","grad_accum":16,)"
                                            R"("grad_sync":true,"activation_checkpointing":"full"})"},
    {"mistral-7b", "2x8xH100-SXM-IB-NDR400", R"({"fsdp_version":1,"sharding_strategy":"_HYBRID_SHARD_ZERO2",)"
                                            R"("limit_all_gathers":true,"backward_prefetch":"NONE","grad_accum":16,)"
                                            R"("grad_sync":true,"activation_checkpointing":{"mode":"full","outside_fsdp":true}})"},
    {"llama3-70b", "8xH100-SXM", R"({"fsdp_version":1,"sharding_strategy":"SHARD_GRAD_OP","limit_all_gathers":true,)"
                                 R"("backward_prefetch":"BACKWARD_PRE","grad_accum":6,"grad_sync":false})"},
    // HSDP's held all-reduce outputs, freed at the end of backward one per block: with every_4
    // checkpointing the buffer sits elsewhere in checkpointed blocks (a run repeating with the period).
    {"llama3-8b", "4x8xA100-40GB-IB-HDR200",
     R"({"activation_checkpointing":"every_4","fsdp_version":2,"grad_accum":2,"grad_sync":false,)"
     R"("master_weights_dtype":"bf16","mesh":{"replicate":4,"shard":8},"micro_batch":4,"optimizer":"sgd",)"
     R"("reduce_dtype":"fp16","seq_len":512})"},
    // Frozen weights (models/trainable.h): which blocks train depends on the number of layers, so only the
    // micro-batches are stretched.
    {"llama3-8b", "8xH100-SXM", R"({"trainable_fraction":0.1,"grad_accum":8,"grad_sync":true})"},
    {"llama3-8b", "8xH100-SXM", R"({"fsdp_version":1,"trainable_fraction":0.02,"grad_accum":8,"activation_checkpointing":"full"})"},
    {"llama3-8b", "2x8xH100-SXM-IB-NDR400", R"({"fsdp_version":2,"grad_accum":3,"grad_sync":false,"master_weights_dtype":"bf16",)"
                                           R"("mesh":{"replicate":2,"shard":8},"prefetch_depth":2,"seq_len":3584})"},
    // Micro-batches alone (no regular block period: the whole root).
    {"llama3-8b", "8xH100-SXM", R"({"auto_wrap_policy":"none","grad_accum":8,"grad_sync":true})"},
});

TEST(Stretch, ProgramEqualsTheWholeLowering) {
  int stretched = 0;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(c.cluster));
    const Plan plan = parse_plan(nlohmann::json::parse(c.plan));
    CompiledProgram got, want;
    OpCosts got_costs, want_costs;
    std::string why;
    SimulateStats st;
    if (!stretched_program(models::load_model(c.model), hw, plan, got, got_costs, &why, &st)) {
      ADD_FAILURE() << "not stretched: " << why;
      continue;
    }
    ++stretched;
    if (std::getenv("STRETCH_WHY"))
      std::printf("stretched from %d layers, %d micro-batches: %s\n", st.source_layers, st.source_micro_batches,
                  describe(c).c_str());
    // From 6 micro-batches on the source has fewer (4 or 5: sim/simulator.cpp).
    if (plan.grad_accum >= 6) {
      EXPECT_LT(st.source_micro_batches, plan.grad_accum);
    }
    whole_program(c, want, want_costs);
    EXPECT_EQ(first_difference(got, got_costs, want, want_costs), "");
    EXPECT_EQ(runs_not_periodic(got, got_costs), "");
    EXPECT_FALSE(got.runs.empty());
  }
  EXPECT_EQ(stretched, static_cast<int>(kCases.size()));
}

TEST(Stretch, RefusesWhatItCannotStretch) {
  // Too few layers for a source with periodic blocks around a template.
  const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster("8xH100-SXM"));
  CompiledProgram p;
  OpCosts costs;
  std::string why;
  EXPECT_FALSE(stretched_program(models::load_model("tiny-llama"), hw, Plan{}, p, costs, &why));
  EXPECT_NE(why, "");
  // No wrapping: the root unit holds every block, so its size grows with the layers (not a period).
  Plan none;
  none.auto_wrap_policy.kind = models::WrapPolicy::Kind::None;
  EXPECT_FALSE(stretched_program(models::load_model("llama3-8b"), hw, none, p, costs, &why));
  EXPECT_NE(why, "");
  // Frozen weights with one micro-batch: the blocks are not stretched, and there are no micro-batches to.
  Plan lora;
  lora.trainable_fraction = 0.1;
  EXPECT_FALSE(stretched_program(models::load_model("llama3-8b"), hw, lora, p, costs, &why));
  EXPECT_EQ(why, "frozen weights differ from block to block");
}

// Random plans, each stretched program compared with the whole lowering record by record (the random
// plans below compare simulate() results; this checks the program itself, and its runs).
TEST(Stretch, RandomProgramsEqualTheWholeLowering) {
  const char* models[] = {"llama3-8b", "llama3-70b", "mistral-7b", "qwen2-7b", "gemma-2b", "gpt2-xl", "mixtral-8x7b"};
  const char* clusters[] = {"8xH100-SXM", "2x8xH100-SXM-IB-NDR400", "4x8xA100-40GB-IB-HDR200", "2x8xH100-SXM-ETH-10G"};
  std::mt19937 rng(random_seed(20261125u, 1));
  int compared = 0, mb_stretched = 0;
  const int kPlans = random_plan_count(120);
  for (int i = 0; i < kPlans; ++i) {
    const std::string model = random_name(rng, models);
    const std::string cluster = random_name(rng, clusters);
    const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(cluster));
    const std::string text = random_plan(rng, hw.cluster().world(), hw.cluster().gpus_per_node);
    SCOPED_TRACE(model + " on " + cluster + " " + text);
    Plan plan;
    CompiledProgram got, want;
    OpCosts got_costs, want_costs;
    SimulateStats st;
    try {
      plan = parse_plan(nlohmann::json::parse(text));
      if (!stretched_program(models::load_model(model), hw, plan, got, got_costs, nullptr, &st)) continue;
    } catch (const InputError&) {
      continue;
    }
    ++compared;
    if (st.source_micro_batches < plan.grad_accum) ++mb_stretched;
    whole_program(Case{model, cluster, text}, want, want_costs);
    EXPECT_EQ(first_difference(got, got_costs, want, want_costs), "");
    EXPECT_EQ(runs_not_periodic(got, got_costs), "");
  }
  EXPECT_GE(compared, kPlans / 3);
  EXPECT_GE(mb_stretched, compared / 4);
  std::printf("[ stretch ] %d random programs compared, %d with micro-batches stretched\n", compared, mb_stretched);
}

// One Simulator for every call, as the planner keeps one per thread: reused storage must not change a result.
std::string result_or_error(const models::ModelSpec& m, const calibrate::HardwareProfile& hw, const Plan& plan,
                            bool stretch, SimulateStats* stats = nullptr) {
  static Simulator sim;
  SimOptions o;
  o.record_trace = false;
  o.record_memory_timeline = false;
  o.stretch = stretch;
  if (stats) *stats = SimulateStats{};
  try {
    SimResult r = sim.simulate(m, hw, plan, o);
    if (stats) *stats = r.simulate_stats;
    return sim_result_to_json(r).dump();
  } catch (const InputError& e) {
    return std::string("InputError: ") + e.what();
  }
}

TEST(Stretch, RandomPlansGiveIdenticalResults) {
  std::mt19937 rng(random_seed(20261124u));
  int stretched = 0, valid = 0, sources = 0;
  const int kPlans = random_plan_count(160);
  for (int i = 0; i < kPlans; ++i) {
    const RandomCase rc = random_case(rng);
    const auto& [model, cluster, text, hw] = rc;
    SCOPED_TRACE(model + " on " + cluster + " " + text);
    const models::ModelSpec m = models::load_model(model);
    Plan plan;
    try {
      plan = parse_plan(nlohmann::json::parse(text));
    } catch (const InputError&) {
      continue;
    }
    const std::string off = result_or_error(m, hw, plan, false);
    SimulateStats st;
    const std::string on = result_or_error(m, hw, plan, true, &st);
    EXPECT_EQ(off, on);
    if (off.rfind("InputError", 0) != 0) ++valid;
    sources += st.sources;
    if (st.stretched) ++stretched;
    else if (std::getenv("STRETCH_WHY"))
      std::printf("refused: %s | %s on %s %s\n", st.refused.c_str(), model.c_str(), cluster.c_str(),
                  text.c_str());
  }
  EXPECT_GE(valid, kPlans / 2);
  EXPECT_GE(stretched, valid / 2);
  std::printf("[ stretch ] %d of %d valid random plans stretched (%d sources lowered)\n", stretched, valid, sources);
}

}  // namespace
}  // namespace fsdpsim::sim

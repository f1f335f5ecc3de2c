// simulate() end to end on zoo models and built-in clusters: determinism, the fits flag, the JSON
// contract keys, MFU against the dense peak of param_dtype, and the ZeRO memory identity (sharded fp32
// master params = 4·P/N bytes, AdamW state = 8·P/N bytes, up to padding).
#include <gtest/gtest.h>

#include <string>

#include "calibrate/hardware_profile.h"
#include "common/errors.h"
#include "models/model_spec.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "sim/simulator.h"

namespace fsdpsim::sim {
namespace {

calibrate::HardwareProfile profile(const std::string& cluster) {
  return calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(cluster));
}

SimOptions quiet() {
  SimOptions o;
  o.record_trace = false;
  o.record_memory_timeline = false;
  return o;
}

TEST(Simulate, Llama3_8bOn8xH100FitsWithSaneFigures) {
  const auto model = models::load_model("llama3-8b");
  const auto hw = profile("8xH100-SXM");
  Plan plan;   // FSDP2 FULL_SHARD, micro_batch 1, seq_len 2048, bf16 params, fp32 master + AdamW
  SimResult r = simulate(model, hw, plan);
  EXPECT_TRUE(r.fits);
  EXPECT_GT(r.step_time_ns, 0);
  EXPECT_EQ(r.capacity, hw.memory_capacity());
  EXPECT_EQ(r.context_bytes, hw.cuda_context_bytes());
  EXPECT_EQ(r.peak_total_device, r.peak_reserved + r.context_bytes);
  EXPECT_GE(r.peak_reserved, r.peak_allocated);
  EXPECT_EQ(r.breakdown_at_peak.at("cuda_context"), hw.cuda_context_bytes());
  // Global tokens: micro_batch · seq_len · grad_accum · world.
  EXPECT_DOUBLE_EQ(r.tokens_per_step, 1.0 * 2048 * 1 * 8);
  EXPECT_NEAR(r.tokens_per_s_per_gpu, 2048 / to_seconds(r.step_time_ns), 1e-6 * r.tokens_per_s_per_gpu);
  // MFU against the dense bf16 peak; a plausible range for an 8B model on one H100 node.
  EXPECT_EQ(r.peak_flops_dtype, "bf16");
  EXPECT_DOUBLE_EQ(r.peak_flops, hw.peak_flops(Dtype::BF16));
  EXPECT_GT(r.mfu, 0.15);
  EXPECT_LT(r.mfu, 0.80);
  EXPECT_NEAR(r.mfu, r.model_flops_per_step_per_gpu / (to_seconds(r.step_time_ns) * r.peak_flops), 1e-12);
  EXPECT_GE(r.hardware_flops_per_step_per_gpu, 0.95 * r.model_flops_per_step_per_gpu);
  // ZeRO identity: the sharded fp32 params are 4·P/8 bytes and AdamW's two fp32 states 8·P/8 bytes
  // (padding adds < 0.1 %).
  const double p = static_cast<double>(models::count_params(model).total);
  EXPECT_NEAR(static_cast<double>(r.breakdown_at_peak.at("sharded_params")), 4 * p / 8, 0.001 * 4 * p / 8);
  EXPECT_NEAR(static_cast<double>(r.breakdown_at_peak.at("optimizer_state")), 8 * p / 8, 0.001 * 8 * p / 8);
  // Bytes sent per rank by the all-gathers: FULL_SHARD gathers every unit in forward and again in
  // backward, except the root unit, which FSDP2 does not reshard after forward (F2.6):
  // (n−1)/n · 2 B · (2 P − P_root).
  const double p_root = static_cast<double>(models::build_wrap_graph(model, plan.auto_wrap_policy).units[0].params);
  const double ag = 7.0 / 8 * 2 * (2 * p - p_root);
  EXPECT_NEAR(static_cast<double>(r.comm_bytes_by_kind.at("all_gather")), ag, 0.001 * ag);
  // Exposed comm cannot exceed the idle time of the compute stream, nor the comm time.
  EXPECT_LE(r.exposed_comm_ns, r.step_time_ns - r.compute_ns);
  EXPECT_LE(r.exposed_comm_ns, r.comm_ns);
  // Trace and memory timeline were recorded (default options).
  EXPECT_FALSE(r.trace.empty());
  EXPECT_FALSE(r.memory_timeline.empty());
  EXPECT_LE(r.memory_timeline.size(), 4096u);
}

TEST(Simulate, DeterministicAndJsonKeysPresent) {
  const auto model = models::load_model("llama-1b");
  const auto hw = profile("8xH100-SXM");
  Plan plan;
  plan.micro_batch = 2;
  SimResult a = simulate(model, hw, plan);
  SimResult b = simulate(model, hw, plan);
  EXPECT_EQ(sim_result_to_json(a, true).dump(), sim_result_to_json(b, true).dump());
  nlohmann::json j = sim_result_to_json(a);
  for (const char* k : {"fits", "step_time_s", "tokens_per_s_per_gpu", "mfu", "memory_breakdown_bytes",
                        "peak_flops_per_s", "peak_flops_dtype", "exposed_comm_s", "comm_bytes_sent_per_gpu"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_TRUE(j["peak_memory_bytes"].contains("allocated"));
  EXPECT_TRUE(j["peak_memory_bytes"].contains("reserved"));
  EXPECT_TRUE(j["memory_breakdown_bytes"].contains("allocator_slack"));
  // Without trace/timeline the figures are the same.
  SimResult q = simulate(model, hw, plan, quiet());
  EXPECT_TRUE(q.trace.empty());
  EXPECT_EQ(q.step_time_ns, a.step_time_ns);
  EXPECT_EQ(q.peak_reserved, a.peak_reserved);
}

TEST(Simulate, Llama3_70bOn8xH100DoesNotFit) {
  // 70B params × 16 B (bf16 compute, fp32 master + AdamW) / 8 GPUs ≈ 141 GB of sharded state alone.
  SimResult r = simulate(models::load_model("llama3-70b"), profile("8xH100-SXM"), Plan{}, quiet());
  EXPECT_FALSE(r.fits);
  EXPECT_GT(r.peak_total_device, r.capacity);
  bool noted = false;
  for (const auto& n : r.notes) noted |= n.find("does not fit") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(Simulate, MemoryMarginTightensFits) {
  const auto model = models::load_model("llama3-8b");
  const auto hw = profile("8xH100-SXM");
  SimResult r = simulate(model, hw, Plan{}, quiet());
  ASSERT_TRUE(r.fits);
  SimOptions o = quiet();
  // A margin that leaves less than the predicted peak usable flips the verdict.
  o.memory_margin = 1.0 - static_cast<double>(r.peak_total_device) / static_cast<double>(r.capacity) + 0.01;
  EXPECT_FALSE(simulate(model, hw, Plan{}, o).fits);
  o.memory_margin = 1.5;
  EXPECT_THROW(simulate(model, hw, Plan{}, o), InputError);
}

TEST(Simulate, InvalidPlanForTheClusterIsInputError) {
  Plan plan;
  plan.mesh_replicate = 1;
  plan.mesh_shard = 3;   // 3 does not make 8 GPUs
  EXPECT_THROW(simulate(models::load_model("tiny-llama"), profile("8xH100-SXM"), plan, quiet()), InputError);
}

TEST(Simulate, MoreGpusShrinkShardedStateAndMultiNodeCommIsSlower) {
  const auto model = models::load_model("llama3-8b");
  SimResult one = simulate(model, profile("8xH100-SXM"), Plan{}, quiet());
  SimResult two = simulate(model, profile("2x8xH100-SXM-ETH-10G"), Plan{}, quiet());
  EXPECT_LT(two.breakdown_at_peak.at("optimizer_state"), one.breakdown_at_peak.at("optimizer_state"));
  EXPECT_GT(two.comm_ns, one.comm_ns);   // the same bytes over 10 GbE instead of NVLink
}

}  // namespace
}  // namespace fsdpsim::sim

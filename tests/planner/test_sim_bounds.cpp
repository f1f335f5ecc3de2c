// The pruning bounds against exhaustive simulation on small spaces: the memory lower bound never
// exceeds the simulated peak (so pruning never drops a plan that would fit) and the step-time lower
// bound never exceeds the simulated step time (so dominance skipping is sound).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "calibrate/hardware_profile.h"
#include "common/errors.h"
#include "models/zoo.h"
#include "planner/bounds.h"
#include "planner/search_space.h"
#include "program/plan.h"
#include "sim/simulator.h"

using namespace fsdpsim;
using namespace fsdpsim::planner;

namespace {

void check_space(const std::string& model_name, const std::string& cluster_name, std::int64_t seq, std::int64_t seqs,
                 std::vector<std::string> precisions, double trainable_fraction = 1.0, const char* lora = nullptr) {
  auto model = models::with_seq_len(models::load_model(model_name), seq);
  auto cluster = calibrate::load_cluster(cluster_name);
  auto hw = calibrate::HardwareProfile::for_cluster(cluster);
  SpaceOptions o;
  o.batch = resolve_batch_target(seq, 0, seqs, cluster.world());
  o.precisions = precisions;
  o.base.trainable_fraction = trainable_fraction;
  if (lora) o.base.lora = sim::parse_lora(nlohmann::json::parse(lora), "lora");
  auto cands = enumerate_candidates(o, cluster.nodes, cluster.gpus_per_node);
  Bounds b(model, hw, o.base.auto_wrap_policy);
  sim::SimOptions so;
  so.record_trace = false;
  so.record_memory_timeline = false;
  int checked = 0;
  for (const auto& c : cands) {
    sim::SimResult r;
    try {
      r = sim::simulate(model, hw, c.plan, so);
    } catch (const InputError& e) {
      ADD_FAILURE() << c.label << " rejected by the simulator: " << e.what();
      continue;
    }
    MemoryBound m = b.memory(c.plan);
    EXPECT_LE(m.total(), r.peak_total_device) << c.label << " moment A " << m.moment_a() << " B " << m.moment_b();
    EXPECT_LE(b.step_time(c.plan), r.step_time_ns) << c.label;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(cands.size()));
}

}  // namespace

TEST(Bounds, NeverAboveSimulationTinyLlamaOneNode) {
  check_space("tiny-llama", "8xH100-SXM", 1024, 16, {"bf16", "bf16-true", "fp32", "fp8-ag"});
}

// Frozen weights (models/trainable.h): fewer saved activations, weight-gradient GEMMs and optimizer state.
TEST(Bounds, NeverAboveSimulationWithFrozenWeights) {
  check_space("tiny-llama", "8xH100-SXM", 1024, 16, {"bf16", "bf16-true"}, 0.05);
  check_space("gpt2", "2x4xH100-SXM-IB-NDR400", 1024, 16, {"bf16"}, 0.01);
}

// QLoRA, both layouts (FSDP2 torchao, FSDP1 bitsandbytes with and without use_orig_params and offload): an NF4
// weight holds just over half a byte per element, the bound counts half a byte for every parameter.
TEST(Bounds, NeverAboveSimulationWithNf4Weights) {
  check_space("llama-1b", "8xH100-SXM", 1024, 16, {"bf16-true"}, 1.0,
              R"({"rank": 8, "targets": ["q", "v"], "quantize_base": "nf4"})");
}

TEST(Bounds, NeverAboveSimulationGpt2TwoNodes) {
  check_space("gpt2", "2x4xH100-SXM-IB-NDR400", 1024, 16, {"bf16"});
}

// The pruning bounds against exhaustive simulation on small spaces: the memory lower bound never
// exceeds the simulated peak (so pruning never drops a plan that would fit) and the step-time lower
// bound never exceeds the simulated step time (so dominance skipping is sound).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

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
                 std::vector<std::string> precisions, double trainable_fraction = 1.0, const char* lora = nullptr,
                 sim::Optimizer optimizer = sim::Optimizer::AdamW,
                 sim::ActivationOffload offload = sim::ActivationOffload::None) {
  auto model = models::with_seq_len(models::load_model(model_name), seq);
  auto cluster = calibrate::load_cluster(cluster_name);
  auto hw = calibrate::HardwareProfile::for_cluster(cluster);
  SpaceOptions o;
  o.batch = resolve_batch_target(seq, 0, seqs, cluster.world());
  o.precisions = precisions;
  o.base.trainable_fraction = trainable_fraction;
  if (lora) o.base.lora = sim::parse_lora(nlohmann::json::parse(lora), "lora");
  o.base.optimizer = optimizer;
  o.base.activation_offloading = offload;
  auto cands = enumerate_candidates(o, cluster.nodes, cluster.gpus_per_node);
  Bounds b(model, hw, o.base.auto_wrap_policy);
  sim::SimOptions so;
  so.record_trace = false;
  so.record_memory_timeline = false;
  // FSDPSIM_RANDOM_PLANS_MAX (scripts/sanitize.sh: the sanitized run looks for memory errors on the paths the
  // plain run checks whole): every k-th candidate only, at most that many; the counts of the bound's terms
  // below are then not asserted (the plain run asserts them on the whole space).
  std::size_t stride = 1;
  if (const char* cap = std::getenv("FSDPSIM_RANDOM_PLANS_MAX")) {
    const std::size_t n = static_cast<std::size_t>(std::max(1, std::atoi(cap)));
    stride = (cands.size() + n - 1) / n;
  }
  int checked = 0, kept = 0, carried = 0, loss_moment = 0;
  for (std::size_t i = 0; i < cands.size(); i += stride) {
    const auto& c = cands[i];
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
    kept += m.kept_unsharded > 0;
    carried += m.carried_grads > 0;
    loss_moment += m.moment_c() > std::max(m.moment_a(), m.moment_b());
  }
  EXPECT_EQ(checked, static_cast<int>((cands.size() + stride - 1) / stride));
  EXPECT_GT(checked, 0);
  if (stride > 1) return;
  // Each term of the bound is put to the test by some plans of every space.
  EXPECT_GT(kept, 0);
  if (trainable_fraction >= 1.0 && !lora) {
    EXPECT_GT(carried, 0);   // (counted with every weight trained)
  }
  if (!lora && offload == sim::ActivationOffload::None) {
    EXPECT_GT(loss_moment, 0);
  }
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

// The low-bit and paged AdamWs (program/optimizer_state.h): the bound counts the fewest bytes per element.
TEST(Bounds, NeverAboveSimulationWithLowBitOptimizers) {
  for (sim::Optimizer o : {sim::Optimizer::BnbAdamW8bit, sim::Optimizer::BnbPagedAdamW, sim::Optimizer::TorchaoAdamW4bit})
    check_space("tiny-llama", "8xH100-SXM", 1024, 16, {"bf16", "bf16-true"}, 1.0, nullptr, o);
}

// torchtune's activation offloading: the checkpointed inputs leave the GPU but for the stash's few (the bound counts
// none of them: mistral-7b's 32 blocks at 8192 tokens, where counting them put the bound above the peak), and the
// space keeps to full checkpointing (every candidate valid).
TEST(Bounds, NeverAboveSimulationWithActivationOffloading) {
  for (sim::ActivationOffload m : {sim::ActivationOffload::Streams, sim::ActivationOffload::Sync})
    check_space("mistral-7b", "8xH100-SXM", 8192, 64, {"bf16-true"}, 1.0, nullptr, sim::Optimizer::AdamW, m);
}

TEST(Bounds, NeverAboveSimulationGpt2TwoNodes) {
  check_space("gpt2", "2x4xH100-SXM-IB-NDR400", 1024, 16, {"bf16"});
}

// The terms a search prunes most with, counted by hand on tiny-llama (hidden 256, 4 layers, vocab 4096,
// untied: 4,999,424 parameters, the root unit 2,097,408 of them, the four blocks 2,902,016) at micro-batch 2
// x 1024 tokens (T = 2048), bf16 compute, fp32 reduce and master, 8 GPUs.
TEST(Bounds, KeptUnitsCarriedGradientsAndTheLossBackwardByHand) {
  auto model = models::load_model("tiny-llama");
  auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster("8xH100-SXM"));
  sim::Plan p;
  p.fsdp_version = sim::FsdpVersion::FSDP2;
  p.mesh_shard = 8;
  p.micro_batch = 2;
  p.seq_len = 1024;
  p.param_dtype = Dtype::BF16;
  p.reduce_dtype = Dtype::FP32;
  p.master_weights_dtype = Dtype::FP32;
  Bounds b(model, hw, p.auto_wrap_policy);

  MemoryBound m = b.memory(p);   // reshard_after_forward true, one micro-batch
  EXPECT_EQ(m.kept_unsharded, 0);
  EXPECT_EQ(m.carried_grads, 0);
  // HF's loss upcasts: the bf16 logits (2048 x 4096 x 2), the saved fp32 log-probabilities and the two fp32
  // loss-backward gradients (2048 x 4096 x 4 each).
  EXPECT_EQ(m.loss_backward, 16777216 + 3 * 33554432);
  EXPECT_EQ(m.moment_c(), m.context + m.sharded_params + m.optimizer_state + m.activations + 117440512);

  p.reshard_after_forward = sim::ReshardAfterForward::no();
  EXPECT_EQ(b.memory(p).kept_unsharded, 2902016 * 2);   // every block unsharded in bf16 until its backward
  p.reshard_after_forward = sim::ReshardAfterForward::group(4);
  EXPECT_EQ(b.memory(p).kept_unsharded, 2902016 * 2 / 4);   // a quarter of each kept after forward
  p.reshard_after_forward = sim::ReshardAfterForward::yes();

  p.grad_accum = 2;
  p.grad_sync = true;   // the first micro-batch's sharded fp32 gradients: 4,999,424 / 8 x 4
  EXPECT_EQ(b.memory(p).carried_grads, 624928 * 4);
  p.grad_sync = false;   // no_sync: unsharded, in bf16 (the narrowest of param, reduce and master)
  EXPECT_EQ(b.memory(p).carried_grads, 4999424 * 2);
  p.cpu_offload.params = p.cpu_offload.optimizer = true;   // (no_sync's gradients stay on the GPU)
  EXPECT_EQ(b.memory(p).carried_grads, 4999424 * 2);
  p.grad_sync = true;   // the sharded ones go to the CPU
  EXPECT_EQ(b.memory(p).carried_grads, 0);

  p.fsdp_version = sim::FsdpVersion::FSDP1;
  p.sharding_strategy = sim::ShardingStrategy::SHARD_GRAD_OP;
  EXPECT_EQ(b.memory(p).kept_unsharded, 2902016 * 2);
  p.cross_entropy = models::LossImpl::Chunked;   // not bounded by the loss moment
  EXPECT_EQ(b.memory(p).loss_backward, 0);
}

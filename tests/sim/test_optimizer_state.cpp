// The low-bit and paged AdamWs (program/optimizer_state.h): each state's bytes from bitsandbytes' and
// torchao's sources by hand, what the lowering allocates for them, what the step moves, what stays out of
// PyTorch's allocator, and where they are refused.
#include <gtest/gtest.h>

#include "common/errors.h"
#include "models/trainable.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "program/lower_context.h"
#include "program/lowering.h"
#include "program/optimizer_state.h"
#include "sim/host_memory.h"
#include "test_lowering_fixtures.h"

namespace fsdpsim::sim {
namespace {

using namespace testing;

TEST(OptimizerState, LayoutsFromTheSourcesByHand) {
  // torch.optim: the parameter's dtype.
  EXPECT_EQ(optimizer_state_bytes(Optimizer::AdamW, 1000, 2).total(), 2000);
  EXPECT_EQ(optimizer_state_bytes(Optimizer::SGD, 1000, 4).total(), 4000);
  // bitsandbytes 8-bit: a code byte per element and a float32 absmax per 2048 (the last block partial) ...
  OptimizerStateBytes b = optimizer_state_bytes(Optimizer::BnbAdamW8bit, 10000, 2);
  EXPECT_EQ(b.values, 10000);
  EXPECT_EQ(b.scales, 5 * 4);   // ceil(10000 / 2048) = 5
  EXPECT_EQ(b.paged, 0);
  // ... below min_8bit_size (4096) float32 states whatever the parameter's dtype, no absmax.
  b = optimizer_state_bytes(Optimizer::BnbAdamW8bit, 4095, 2);
  EXPECT_EQ(b.values, 4095 * 4);
  EXPECT_EQ(b.scales, 0);
  EXPECT_EQ(optimizer_state_bytes(Optimizer::BnbAdamW8bit, 4096, 2).values, 4096);
  // Paged: get_state_buffer pages a buffer of at least 1e5 elements; the absmax stays a torch tensor.
  b = optimizer_state_bytes(Optimizer::BnbPagedAdamW8bit, 100000, 2);
  EXPECT_EQ(b.paged, 100000);
  EXPECT_EQ(b.values, 0);
  EXPECT_EQ(b.scales, 49 * 4);   // ceil(100000 / 2048) = 49
  b = optimizer_state_bytes(Optimizer::BnbPagedAdamW8bit, 99999, 2);
  EXPECT_EQ(b.values, 99999);
  EXPECT_EQ(b.paged, 0);
  // 32-bit bitsandbytes states are float32 even for bf16 parameters.
  EXPECT_EQ(optimizer_state_bytes(Optimizer::BnbPagedAdamW, 100000, 2).paged, 400000);
  EXPECT_EQ(optimizer_state_bytes(Optimizer::BnbPagedAdamW, 1000, 2).values, 4000);
  // torchao 8-bit: codes, a float32 scale per 256 and the 256-entry float32 qmap, when the local tensor has at
  // least 4096 elements and whole blocks; else zeros_like the parameter.
  b = optimizer_state_bytes(Optimizer::TorchaoAdamW8bit, 8192, 2);
  EXPECT_EQ(b.values, 8192);
  EXPECT_EQ(b.scales, 32 * 4 + 1024);
  EXPECT_EQ(optimizer_state_bytes(Optimizer::TorchaoAdamW8bit, 8200, 2).values, 8200 * 2);   // not whole blocks
  EXPECT_EQ(optimizer_state_bytes(Optimizer::TorchaoAdamW8bit, 2048, 4).values, 2048 * 4);   // under 4096
  // torchao 4-bit: two codes per byte, a float32 scale per 128, a 16-entry qmap.
  b = optimizer_state_bytes(Optimizer::TorchaoAdamW4bit, 8192, 2);
  EXPECT_EQ(b.values, 4096);
  EXPECT_EQ(b.scales, 64 * 4 + 64);
  // The step: the parameter read and written, its gradient read, each of the two states read and written.
  EXPECT_EQ(optimizer_step_bytes(Optimizer::AdamW, 1000, 4), 7 * 4000);
  EXPECT_EQ(optimizer_step_bytes(Optimizer::BnbAdamW8bit, 10000, 2), 3 * 20000 + 4 * 10020);
  // The planner's bound: the fewest bytes per element any tensor can get.
  EXPECT_EQ(optimizer_state_lower_bound(Optimizer::BnbAdamW8bit, 1000, 2), 1000);
  EXPECT_EQ(optimizer_state_lower_bound(Optimizer::BnbPagedAdamW, 1000, 2), 0);
  EXPECT_EQ(optimizer_state_lower_bound(Optimizer::TorchaoAdamW4bit, 1000, 2), 500);
  for (Optimizer o : {Optimizer::AdamW, Optimizer::BnbAdamW8bit, Optimizer::BnbPagedAdamW8bit, Optimizer::TorchaoAdamW8bit,
                      Optimizer::TorchaoAdamW4bit})
    for (std::int64_t n : {1, 4095, 4096, 8192, 99999, 100000, 1234567})
      EXPECT_LE(optimizer_state_lower_bound(o, n, 2), optimizer_state_bytes(o, n, 2).values + optimizer_state_bytes(o, n, 2).scales)
          << optimizer_class(o) << " " << n;
}

// tiny-llama (hidden 256, 4 layers, vocab 4096, untied) under FSDP1 with use_orig_params false on 8 GPUs: the
// optimizer steps one FlatParameter shard per unit, the root's 2,097,408 / 8 = 262,176 elements and each
// block's 725,504 / 8 = 90,688.
TEST(OptimizerState, LoweringAllocatesEachStateTensorByHand) {
  const models::ModelSpec m = models::load_model("tiny-llama");
  const auto lower_with = [&](const std::string& optimizer) {
    const Plan p = resolved(R"({"fsdp_version": 1, "use_orig_params": false, "micro_batch": 1, "seq_len": 256,
                                "master_weights_dtype": "bf16", "optimizer": ")" + optimizer + "\"}",
                            8, 8);
    return lower(m, models::build_wrap_graph(m, p.auto_wrap_policy), p, Topology{8, 8});
  };
  // AdamW (bf16 states): 2 x 2 B x (262,176 + 4 x 90,688)
  EXPECT_EQ(persistent_bytes(lower_with("adamw"), MemCategory::OptimizerState), 2 * 2 * (262176 + 4 * 90688));

  // AdamW8bit: per state, the codes and ceil(n / 2048) float32 absmax: root 262,176 + 129 x 4, block 90,688 + 45 x 4.
  const StepProgram a8 = lower_with("bnb_adamw8bit");
  EXPECT_EQ(persistent_bytes(a8, MemCategory::OptimizerState), 2 * ((262176 + 516) + 4 * (90688 + 180)));
  int scales = 0;
  for (const Buffer& b : a8.buffers)
    if (b.category == MemCategory::OptimizerState) {
      EXPECT_TRUE(b.persistent && b.first_step_lazy) << b.name;   // created by the first step
      scales += b.name.find("opt_scales") != std::string::npos;
    }
  EXPECT_EQ(scales, 2 * 5);   // an absmax tensor per state per unit
  // The step: one kernel per tensor; params and gradients in bf16 (3 x 2 B), each state's codes and absmax
  // read and written.
  const Op* step = ops_of(a8, OpKind::OptimizerStep).front();
  EXPECT_EQ(step->kernel_launches, 5);
  EXPECT_EQ(step->copy_bytes, 3 * 2 * (262176 + 4 * 90688) + 2 * 2 * ((262176 + 516) + 4 * (90688 + 180)));

  // PagedAdamW8bit: the root's codes (>= 1e5 elements) are paged, the blocks' are not; every absmax is a tensor.
  const StepProgram p8 = lower_with("bnb_paged_adamw8bit");
  EXPECT_EQ(persistent_bytes(p8, MemCategory::OptimizerState), 2 * (516 + 4 * (90688 + 180)));
  // PagedAdamW: float32 states, the root's paged.
  const StepProgram p32 = lower_with("bnb_paged_adamw");
  EXPECT_EQ(persistent_bytes(p32, MemCategory::OptimizerState), 2 * 4 * 4 * 90688);

  // What stays in unified memory, counted over the whole model as simulate() reports it.
  const auto paged = [&](const std::string& optimizer) {
    const Plan p = resolved(R"({"fsdp_version": 1, "use_orig_params": false, "master_weights_dtype": "bf16",
                                "optimizer": ")" + optimizer + "\"}",
                            8, 8);
    const models::WrapGraph g = models::build_wrap_graph(m, p.auto_wrap_policy);
    return paged_optimizer_bytes(g, p, lowering::plan_trainable_set(m, g, p));
  };
  EXPECT_EQ(paged("bnb_paged_adamw8bit"), 2 * 262176);
  EXPECT_EQ(paged("bnb_paged_adamw"), 2 * 4 * 262176);
  EXPECT_EQ(paged("bnb_adamw8bit"), 0);
  EXPECT_EQ(paged("adamw"), 0);
}

TEST(OptimizerState, RefusedWhereNotModelled) {
  const models::ModelSpec m = models::load_model("tiny-llama");
  const auto lowers = [&](const std::string& plan_json) {
    const Plan p = resolved(plan_json, 8, 8);
    lower(m, models::build_wrap_graph(m, p.auto_wrap_policy), p, Topology{8, 8});
  };
  const auto refused = [&](const std::string& plan_json, const std::string& words) {
    try {
      lowers(plan_json);
      ADD_FAILURE() << plan_json << " was lowered";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("plan.optimizer"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(R"({"fsdp_version": 2, "optimizer": "bnb_adamw8bit"})", "DTensor");
  refused(R"({"fsdp_version": 1, "optimizer": "bnb_paged_adamw", "cpu_offload": true})", "CPU offload");
  refused(R"({"fsdp_version": 2, "optimizer": "torchao_adamw8bit", "cpu_offload": true})", "CPU offload");
  refused(R"({"fsdp_version": 1, "optimizer": "torchao_adamw4bit", "implementation": "runtime"})", "runtime");
  EXPECT_NO_THROW(lowers(R"({"fsdp_version": 2, "optimizer": "torchao_adamw4bit"})"));
  EXPECT_NO_THROW(lowers(R"({"fsdp_version": 1, "optimizer": "bnb_paged_adamw8bit"})"));
  EXPECT_THROW(parse_plan(nlohmann::json::parse(R"({"optimizer": "adamw16bit"})")), InputError);
}

}  // namespace
}  // namespace fsdpsim::sim

// Plan parsing (every key, defaults, bad values with the field named) and resolve_plan's checks.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "common/errors.h"
#include "program/plan.h"

namespace fsdpsim::sim {
namespace {

Plan parse(const std::string& text) { return parse_plan(nlohmann::json::parse(text)); }

// The InputError's field for a plan text, or "" if it parsed.
std::string error_field(const std::string& text) {
  try {
    parse(text);
  } catch (const InputError& e) {
    return e.field();
  }
  return "";
}

std::string resolve_error_field(const std::string& text, int gpus, int gpn) {
  try {
    resolve_plan(parse(text), gpus, gpn);
  } catch (const InputError& e) {
    return e.field();
  }
  return "";
}

TEST(PlanParse, EmptyObjectGivesDocumentedDefaults) {
  Plan p = parse("{}");
  EXPECT_EQ(p.fsdp_version, FsdpVersion::FSDP2);
  EXPECT_EQ(p.mesh_replicate, 0);
  EXPECT_EQ(p.mesh_shard, 0);
  EXPECT_EQ(p.sharding_strategy, ShardingStrategy::FULL_SHARD);
  EXPECT_EQ(p.reshard_after_forward, ReshardAfterForward::yes());
  EXPECT_EQ(p.backward_prefetch, BackwardPrefetch::BACKWARD_PRE);
  EXPECT_FALSE(p.forward_prefetch);
  EXPECT_TRUE(p.limit_all_gathers);
  EXPECT_EQ(p.prefetch_depth, 1);
  EXPECT_EQ(p.activation_checkpointing.mode, ActivationCheckpointing::Mode::None);
  EXPECT_EQ(p.param_dtype, Dtype::BF16);
  EXPECT_EQ(p.reduce_dtype, Dtype::FP32);
  EXPECT_EQ(p.master_weights_dtype, Dtype::FP32);
  EXPECT_EQ(p.micro_batch, 1);
  EXPECT_EQ(p.seq_len, 2048);
  EXPECT_EQ(p.grad_accum, 1);
  EXPECT_FALSE(p.grad_sync);
  EXPECT_FALSE(p.cpu_offload.params);
  EXPECT_FALSE(p.cpu_offload.optimizer);
  EXPECT_FALSE(p.fp8_all_gather);
  EXPECT_EQ(p.trainable_fraction, 1.0);
  EXPECT_EQ(p.optimizer, Optimizer::AdamW);
  EXPECT_EQ(p.auto_wrap_policy.kind, models::WrapPolicy::Kind::TransformerBlock);
  EXPECT_TRUE(p.use_orig_params);
}

TEST(PlanParse, EveryKeyIsRead) {
  Plan p = parse(R"({"fsdp_version": 1, "mesh": {"replicate": 2, "shard": 4}, "sharding_strategy": "HYBRID_SHARD",
    "backward_prefetch": "BACKWARD_POST", "forward_prefetch": true, "limit_all_gathers": false,
    "prefetch_depth": 1, "activation_checkpointing": "every_3", "param_dtype": "fp16", "reduce_dtype": "bf16",
    "master_weights_dtype": "fp32", "micro_batch": 4, "seq_len": 4096, "grad_accum": 8, "grad_sync": true,
    "cpu_offload": {"params": false, "optimizer": true}, "fp8_all_gather": false, "trainable_fraction": 0.25,
    "optimizer": "sgd", "auto_wrap_policy": {"min_num_params": 1000000}, "use_orig_params": false})");
  EXPECT_EQ(p.fsdp_version, FsdpVersion::FSDP1);
  EXPECT_EQ(p.mesh_replicate, 2);
  EXPECT_EQ(p.mesh_shard, 4);
  EXPECT_EQ(p.sharding_strategy, ShardingStrategy::HYBRID_SHARD);
  EXPECT_EQ(p.backward_prefetch, BackwardPrefetch::BACKWARD_POST);
  EXPECT_TRUE(p.forward_prefetch);
  EXPECT_FALSE(p.limit_all_gathers);
  EXPECT_EQ(p.activation_checkpointing.mode, ActivationCheckpointing::Mode::EveryK);
  EXPECT_EQ(p.activation_checkpointing.every_k, 3);
  EXPECT_EQ(p.param_dtype, Dtype::FP16);
  EXPECT_EQ(p.reduce_dtype, Dtype::BF16);
  EXPECT_EQ(p.micro_batch, 4);
  EXPECT_EQ(p.seq_len, 4096);
  EXPECT_EQ(p.grad_accum, 8);
  EXPECT_TRUE(p.grad_sync);
  EXPECT_FALSE(p.cpu_offload.params);
  EXPECT_TRUE(p.cpu_offload.optimizer);
  EXPECT_DOUBLE_EQ(p.trainable_fraction, 0.25);
  EXPECT_EQ(p.optimizer, Optimizer::SGD);
  EXPECT_EQ(p.auto_wrap_policy.kind, models::WrapPolicy::Kind::Size);
  EXPECT_EQ(p.auto_wrap_policy.min_num_params, 1000000);
  EXPECT_FALSE(p.use_orig_params);
}

TEST(PlanParse, AlternativeForms) {
  Plan a = parse(R"({"mesh": [2, 4]})");
  EXPECT_EQ(a.mesh_replicate, 2);
  EXPECT_EQ(a.mesh_shard, 4);
  EXPECT_EQ(parse(R"({"backward_prefetch": null})").backward_prefetch, BackwardPrefetch::NONE);
  EXPECT_EQ(parse(R"({"backward_prefetch": "NONE"})").backward_prefetch, BackwardPrefetch::NONE);
  EXPECT_EQ(parse(R"({"reshard_after_forward": false})").reshard_after_forward, ReshardAfterForward::no());
  EXPECT_EQ(parse(R"({"reshard_after_forward": 8})").reshard_after_forward, ReshardAfterForward::group(8));
  Plan off = parse(R"({"cpu_offload": true})");
  EXPECT_TRUE(off.cpu_offload.params);
  EXPECT_TRUE(off.cpu_offload.optimizer);
  auto ac = parse(R"({"activation_checkpointing": {"mode": "full", "outside_fsdp": true}})").activation_checkpointing;
  EXPECT_EQ(ac.mode, ActivationCheckpointing::Mode::Full);
  EXPECT_TRUE(ac.outside_fsdp);
  EXPECT_FALSE(ac.outside_compile);
  auto around = parse(R"({"compile": true, "activation_checkpointing": {"mode": "every_k", "every_k": 3, "outside_compile": true}})")
                    .activation_checkpointing;
  EXPECT_TRUE(around.outside_compile);
  EXPECT_FALSE(around.outside_fsdp);
  EXPECT_EQ(around.every_k, 3);
  auto k = parse(R"({"activation_checkpointing": {"mode": "every_k", "every_k": 2}})").activation_checkpointing;
  EXPECT_EQ(k.mode, ActivationCheckpointing::Mode::EveryK);
  EXPECT_EQ(k.every_k, 2);
  EXPECT_EQ(parse(R"({"activation_checkpointing": "selective_op"})").activation_checkpointing.mode,
            ActivationCheckpointing::Mode::SelectiveOp);
  auto w = parse(R"({"auto_wrap_policy": {"modules": ["layers.*", "lm_head"]}})").auto_wrap_policy;
  EXPECT_EQ(w.kind, models::WrapPolicy::Kind::Modules);
  ASSERT_EQ(w.modules.size(), 2u);
  EXPECT_EQ(w.modules[1], "lm_head");
  EXPECT_EQ(parse(R"({"auto_wrap_policy": "none"})").auto_wrap_policy.kind, models::WrapPolicy::Kind::None);
  EXPECT_EQ(parse(R"({"param_dtype": "torch.bfloat16"})").param_dtype, Dtype::BF16);
  // FSDP2: a strategy name maps onto reshard_after_forward (F2.12).
  EXPECT_EQ(parse(R"({"sharding_strategy": "SHARD_GRAD_OP"})").reshard_after_forward, ReshardAfterForward::no());
  EXPECT_EQ(parse(R"({"sharding_strategy": "HYBRID_SHARD"})").reshard_after_forward, ReshardAfterForward::yes());
}

TEST(PlanParse, BadValuesNameTheField) {
  EXPECT_EQ(error_field(R"({"fsdp_versoin": 2})"), "plan.fsdp_versoin");
  EXPECT_EQ(error_field(R"({"fsdp_version": 3})"), "plan.fsdp_version");
  EXPECT_EQ(error_field(R"({"mesh": [2]})"), "plan.mesh");
  EXPECT_EQ(error_field(R"({"mesh": [0, 8]})"), "plan.mesh.replicate");
  EXPECT_EQ(error_field(R"({"mesh": {"replicate": 1, "shard": -2}})"), "plan.mesh.shard");
  EXPECT_EQ(error_field(R"({"mesh": {"replicate": 1, "shard": 2, "tp": 2}})"), "plan.mesh.tp");
  EXPECT_EQ(error_field(R"({"mesh": "2x4"})"), "plan.mesh");
  EXPECT_EQ(error_field(R"({"sharding_strategy": "ZERO3"})"), "plan.sharding_strategy");
  EXPECT_EQ(error_field(R"({"reshard_after_forward": 1})"), "plan.reshard_after_forward");
  EXPECT_EQ(error_field(R"({"reshard_after_forward": "yes"})"), "plan.reshard_after_forward");
  EXPECT_EQ(error_field(R"({"fsdp_version": 1, "reshard_after_forward": false})"), "plan.reshard_after_forward");
  EXPECT_EQ(error_field(R"({"sharding_strategy": "SHARD_GRAD_OP", "reshard_after_forward": true})"),
            "plan.sharding_strategy");
  EXPECT_EQ(error_field(R"({"backward_prefetch": "BACKWARD"})"), "plan.backward_prefetch");
  EXPECT_EQ(error_field(R"({"forward_prefetch": 1})"), "plan.forward_prefetch");
  EXPECT_EQ(error_field(R"({"limit_all_gathers": "true"})"), "plan.limit_all_gathers");
  EXPECT_EQ(error_field(R"({"prefetch_depth": 0})"), "plan.prefetch_depth");
  EXPECT_EQ(error_field(R"({"prefetch_depth": 17})"), "plan.prefetch_depth");
  EXPECT_EQ(error_field(R"({"activation_checkpointing": "every_0"})"), "plan.activation_checkpointing");
  EXPECT_EQ(error_field(R"({"activation_checkpointing": "every_x"})"), "plan.activation_checkpointing");
  EXPECT_EQ(error_field(R"({"activation_checkpointing": "some"})"), "plan.activation_checkpointing");
  EXPECT_EQ(error_field(R"({"activation_checkpointing": {"mode": "full", "every_k": 2}})"),
            "plan.activation_checkpointing.every_k");
  EXPECT_EQ(error_field(R"({"activation_checkpointing": {"mode": "fully"}})"), "plan.activation_checkpointing.mode");
  EXPECT_EQ(error_field(R"({"activation_checkpointing": {"mode": "full", "outside": true}})"),
            "plan.activation_checkpointing.outside");
  EXPECT_EQ(error_field(R"({"param_dtype": "int8"})"), "plan.param_dtype");
  EXPECT_EQ(error_field(R"({"param_dtype": "fp8"})"), "plan.param_dtype");
  EXPECT_EQ(error_field(R"({"reduce_dtype": "fp8"})"), "plan.reduce_dtype");
  EXPECT_EQ(error_field(R"({"master_weights_dtype": 32})"), "plan.master_weights_dtype");
  EXPECT_EQ(error_field(R"({"micro_batch": 0})"), "plan.micro_batch");
  EXPECT_EQ(error_field(R"({"micro_batch": 65537})"), "plan.micro_batch");
  EXPECT_EQ(error_field(R"({"micro_batch": 1.5})"), "plan.micro_batch");
  EXPECT_EQ(error_field(R"({"seq_len": 4194305})"), "plan.seq_len");
  EXPECT_EQ(error_field(R"({"grad_accum": 0})"), "plan.grad_accum");
  EXPECT_EQ(error_field(R"({"grad_sync": null, "grad_accum": -1})"), "plan.grad_accum");
  EXPECT_EQ(error_field(R"({"cpu_offload": "yes"})"), "plan.cpu_offload");
  EXPECT_EQ(error_field(R"({"cpu_offload": {"params": true, "optimizer": false}})"), "plan.cpu_offload.optimizer");
  EXPECT_EQ(error_field(R"({"cpu_offload": {"grads": true}})"), "plan.cpu_offload.grads");
  EXPECT_EQ(error_field(R"({"fp8_all_gather": "on"})"), "plan.fp8_all_gather");
  EXPECT_EQ(error_field(R"({"trainable_fraction": 0})"), "plan.trainable_fraction");
  EXPECT_EQ(error_field(R"({"trainable_fraction": 1.5})"), "plan.trainable_fraction");
  EXPECT_EQ(error_field(R"({"optimizer": "adam"})"), "plan.optimizer");
  EXPECT_EQ(error_field(R"({"auto_wrap_policy": "block"})"), "plan.auto_wrap_policy");
  EXPECT_EQ(error_field(R"({"auto_wrap_policy": {"min_num_params": 0}})"), "plan.auto_wrap_policy.min_num_params");
  EXPECT_EQ(error_field(R"({"auto_wrap_policy": {"modules": []}})"), "plan.auto_wrap_policy.modules");
  EXPECT_EQ(error_field(R"({"auto_wrap_policy": {"modules": [3]}})"), "plan.auto_wrap_policy.modules");
  EXPECT_EQ(error_field(R"({"use_orig_params": 0})"), "plan.use_orig_params");
  EXPECT_EQ(error_field(R"([1, 2])"), "plan");
}

TEST(PlanLoad, InlineFileAndErrors) {
  EXPECT_EQ(load_plan(R"(  {"micro_batch": 3})").micro_batch, 3);
  std::string path = std::string(FSDPSIM_BINARY_DIR) + "/test_plan_load.tmp.json";
  {
    std::ofstream f(path);
    f << R"({"seq_len": 1024})";
  }
  EXPECT_EQ(load_plan(path).seq_len, 1024);
  std::remove(path.c_str());
  try {
    load_plan("/nonexistent/plan.json", "--plan");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--plan");
  }
  EXPECT_THROW(load_plan("{not json", "--plan"), InputError);
}

TEST(PlanJson, RoundTripsEveryKey) {
  const char* texts[] = {
      R"({"fsdp_version": 1, "mesh": [2, 4], "sharding_strategy": "_HYBRID_SHARD_ZERO2", "backward_prefetch": "BACKWARD_POST",
          "forward_prefetch": true, "limit_all_gathers": false, "activation_checkpointing": {"mode": "every_k", "every_k": 2, "outside_fsdp": true},
          "param_dtype": "bf16", "reduce_dtype": "bf16", "master_weights_dtype": "bf16", "micro_batch": 2, "seq_len": 512,
          "grad_accum": 4, "grad_sync": false, "cpu_offload": true, "trainable_fraction": 0.5, "optimizer": "sgd",
          "auto_wrap_policy": {"modules": ["layers.*"]}, "use_orig_params": false})",
      R"({"fsdp_version": 2, "reshard_after_forward": 4, "prefetch_depth": 3, "fp8_all_gather": true,
          "activation_checkpointing": "selective_op", "backward_prefetch": null})",
      R"({"compile": true, "activation_checkpointing": {"mode": "full", "outside_compile": true}})",
  };
  for (const char* t : texts) {
    Plan a = parse(t);
    nlohmann::json j = plan_to_json(a);
    Plan b = parse_plan(j);
    EXPECT_EQ(plan_to_json(b), j) << t;
    EXPECT_EQ(b.reshard_after_forward, a.reshard_after_forward);
    EXPECT_EQ(b.activation_checkpointing.every_k, a.activation_checkpointing.every_k);
    EXPECT_EQ(b.activation_checkpointing.outside_fsdp, a.activation_checkpointing.outside_fsdp);
    EXPECT_EQ(b.activation_checkpointing.outside_compile, a.activation_checkpointing.outside_compile);
    EXPECT_EQ(b.cpu_offload.params, a.cpu_offload.params);
    EXPECT_EQ(b.backward_prefetch, a.backward_prefetch);
    EXPECT_EQ(b.auto_wrap_policy.modules, a.auto_wrap_policy.modules);
  }
}

TEST(PlanResolve, MeshDefaults) {
  Plan f1 = resolve_plan(parse(R"({"fsdp_version": 1})"), 16, 8);
  EXPECT_EQ(f1.mesh_replicate, 1);
  EXPECT_EQ(f1.mesh_shard, 16);
  Plan ns = resolve_plan(parse(R"({"fsdp_version": 1, "sharding_strategy": "NO_SHARD"})"), 16, 8);
  EXPECT_EQ(ns.mesh_replicate, 16);
  EXPECT_EQ(ns.mesh_shard, 1);
  Plan h = resolve_plan(parse(R"({"fsdp_version": 1, "sharding_strategy": "HYBRID_SHARD"})"), 16, 8);
  EXPECT_EQ(h.mesh_replicate, 2);
  EXPECT_EQ(h.mesh_shard, 8);
  Plan f2 = resolve_plan(parse("{}"), 16, 8);
  EXPECT_EQ(f2.mesh_replicate, 1);
  EXPECT_EQ(f2.mesh_shard, 16);
  EXPECT_EQ(f2.sharding_strategy, ShardingStrategy::FULL_SHARD);
  Plan f2h = resolve_plan(parse(R"({"sharding_strategy": "HYBRID_SHARD"})"), 16, 8);
  EXPECT_EQ(f2h.mesh_replicate, 2);
  EXPECT_EQ(f2h.mesh_shard, 8);
}

TEST(PlanResolve, Fsdp2EffectiveStrategy) {
  // F2.12: FULL_SHARD = 1-D + True; SHARD_GRAD_OP = 1-D + False; HYBRID = 2-D + True; ZERO2 = 2-D + False.
  EXPECT_EQ(resolve_plan(parse(R"({"mesh": [1, 8]})"), 8, 8).sharding_strategy, ShardingStrategy::FULL_SHARD);
  EXPECT_EQ(resolve_plan(parse(R"({"mesh": [1, 8], "reshard_after_forward": false})"), 8, 8).sharding_strategy,
            ShardingStrategy::SHARD_GRAD_OP);
  EXPECT_EQ(resolve_plan(parse(R"({"mesh": [2, 4]})"), 8, 4).sharding_strategy, ShardingStrategy::HYBRID_SHARD);
  EXPECT_EQ(resolve_plan(parse(R"({"mesh": [2, 4], "reshard_after_forward": false})"), 8, 4).sharding_strategy,
            ShardingStrategy::_HYBRID_SHARD_ZERO2);
  EXPECT_EQ(resolve_plan(parse(R"({"mesh": [8, 1]})"), 8, 8).sharding_strategy, ShardingStrategy::NO_SHARD);
  EXPECT_EQ(resolve_plan(parse(R"({"reshard_after_forward": 4})"), 16, 8).sharding_strategy,
            ShardingStrategy::FULL_SHARD);
}

TEST(PlanResolve, BadCombinationsNameTheField) {
  try {
    resolve_plan(parse(R"({"mesh": [2, 3]})"), 8, 8);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "plan.mesh");
    EXPECT_EQ(e.value(), "(2, 3)");
    EXPECT_NE(e.allowed().find("replicate x shard must equal 8 GPUs"), std::string::npos);
  }
  EXPECT_EQ(resolve_error_field(R"({"fsdp_version": 1, "mesh": [2, 4]})", 8, 4), "plan.mesh");   // use HYBRID_SHARD
  EXPECT_EQ(resolve_error_field(R"({"fsdp_version": 1, "sharding_strategy": "HYBRID_SHARD", "mesh": [8, 1]})", 8, 8),
            "plan.mesh");
  EXPECT_EQ(resolve_error_field(R"({"fsdp_version": 1, "sharding_strategy": "NO_SHARD", "mesh": [1, 8]})", 8, 8),
            "plan.mesh");
  EXPECT_EQ(resolve_error_field(R"({"sharding_strategy": "HYBRID_SHARD"})", 12, 8), "plan.mesh");
  EXPECT_EQ(resolve_error_field(R"({"reshard_after_forward": 3})", 8, 8), "plan.reshard_after_forward");
  EXPECT_EQ(resolve_error_field(R"({"reshard_after_forward": 8})", 8, 8), "plan.reshard_after_forward");
  EXPECT_EQ(resolve_error_field(R"({"fp8_all_gather": true, "param_dtype": "fp16"})", 8, 8), "plan.fp8_all_gather");
  EXPECT_EQ(resolve_error_field(R"({"fsdp_version": 1, "fp8_all_gather": true})", 8, 8), "plan.fp8_all_gather");
  EXPECT_EQ(resolve_error_field(R"({"fsdp_version": 1, "cpu_offload": true, "grad_accum": 2, "grad_sync": true})", 8, 8),
            "plan.cpu_offload");
  EXPECT_EQ(resolve_error_field(R"({"param_dtype": "fp32", "master_weights_dtype": "bf16"})", 8, 8),
            "plan.master_weights_dtype");
  EXPECT_EQ(resolve_error_field(R"({"param_dtype": "bf16", "master_weights_dtype": "fp16"})", 8, 8),
            "plan.master_weights_dtype");
  EXPECT_EQ(resolve_error_field(R"({"fsdp_version": 1, "prefetch_depth": 2})", 8, 8), "plan.prefetch_depth");
  EXPECT_EQ(resolve_error_field(R"({"backward_prefetch": "BACKWARD_POST"})", 8, 8), "plan.backward_prefetch");
  EXPECT_EQ(resolve_error_field(R"({"use_orig_params": false})", 8, 8), "plan.use_orig_params");
  EXPECT_EQ(resolve_error_field(R"({"activation_checkpointing": {"mode": "selective_op", "outside_fsdp": true}})", 8, 8),
            "plan.activation_checkpointing.outside_fsdp");
  EXPECT_EQ(resolve_error_field(R"({"activation_checkpointing": {"mode": "none", "outside_fsdp": true}})", 8, 8),
            "plan.activation_checkpointing.outside_fsdp");
  // checkpoint(compile(block)): needs compile and whole-block checkpointing
  EXPECT_EQ(resolve_error_field(R"({"activation_checkpointing": {"mode": "full", "outside_compile": true}})", 8, 8),
            "plan.activation_checkpointing.outside_compile");
  EXPECT_EQ(resolve_error_field(
                R"({"compile": true, "activation_checkpointing": {"mode": "selective_op", "outside_compile": true}})", 8, 8),
            "plan.activation_checkpointing.outside_compile");
  EXPECT_EQ(resolve_error_field(R"({"compile": true, "activation_checkpointing": {"mode": "none", "outside_compile": true}})",
                                8, 8),
            "plan.activation_checkpointing.outside_compile");
  EXPECT_EQ(resolve_error_field(R"({"activation_checkpointing": {"mode": "full", "outside_compile": 1}})", 8, 8),
            "plan.activation_checkpointing.outside_compile");
  EXPECT_EQ(resolve_error_field(R"({"sharding_strategy": "SHARD_GRAD_OP", "mesh": [2, 4]})", 8, 4), "plan.mesh");
  EXPECT_EQ(resolve_error_field("{}", 0, 8), "cluster.gpus");
  EXPECT_EQ(resolve_error_field("{}", 8, 0), "cluster.gpus_per_node");
  // Valid corner cases resolve.
  EXPECT_EQ(resolve_error_field(R"({"reshard_after_forward": 4, "mesh": [1, 16]})", 16, 8), "");
  EXPECT_EQ(resolve_error_field(R"({"fsdp_version": 1, "cpu_offload": true, "grad_accum": 2})", 8, 8), "");
  EXPECT_EQ(resolve_error_field(R"({"param_dtype": "fp32"})", 1, 8), "");
}

TEST(PlanNames, Strings) {
  EXPECT_EQ(strategy_name(ShardingStrategy::_HYBRID_SHARD_ZERO2), "_HYBRID_SHARD_ZERO2");
  EXPECT_EQ(prefetch_name(BackwardPrefetch::BACKWARD_POST), "BACKWARD_POST");
  ActivationCheckpointing ac;
  ac.mode = ActivationCheckpointing::Mode::EveryK;
  ac.every_k = 4;
  EXPECT_EQ(checkpointing_name(ac), "every_4");
}

// The implementation / compile / float8 / allocator / loop / optimizer / per-module keys (issues 19, 20).
TEST(PlanParse, ImplementationAndRuntimeKeys) {
  Plan d = parse("{}");
  EXPECT_EQ(d.implementation, models::ModelImpl::HF);
  EXPECT_FALSE(d.compile);
  EXPECT_EQ(d.float8, models::Float8Recipe::None);
  EXPECT_EQ(d.alloc_conf, AllocConf{});
  EXPECT_FALSE(d.free_logits_before_backward.has_value());
  EXPECT_EQ(d.optimizer_impl, OptimizerImpl::Foreach);
  EXPECT_TRUE(d.module_overrides.empty());

  Plan p = parse(R"({"implementation": "torchtitan", "compile": true, "float8": "rowwise",
                     "alloc_conf": " expandable_segments:True , max_split_size_mb:512", "optimizer_impl": "fused",
                     "module_overrides": {"last_block": {"reshard_after_forward": false}}})");
  EXPECT_EQ(p.implementation, models::ModelImpl::TorchTitan);
  EXPECT_TRUE(p.compile);
  EXPECT_EQ(p.float8, models::Float8Recipe::Rowwise);
  EXPECT_TRUE(p.alloc_conf.expandable_segments);
  EXPECT_EQ(p.alloc_conf.max_split_size, 512 * kMiB);
  EXPECT_EQ(alloc_conf_text(p.alloc_conf), "expandable_segments:True,max_split_size_mb:512");
  EXPECT_EQ(p.optimizer_impl, OptimizerImpl::Fused);
  ASSERT_EQ(p.module_overrides.size(), 1u);
  EXPECT_EQ(p.module_overrides[0].module, "last_block");
  EXPECT_EQ(p.module_overrides[0].reshard_after_forward, ReshardAfterForward::no());
  // The loop's default follows the implementation: torchtitan's train step deletes `pred` before backward.
  EXPECT_TRUE(*resolve_plan(p, 8, 8).free_logits_before_backward);
  EXPECT_FALSE(*resolve_plan(d, 8, 8).free_logits_before_backward);
  EXPECT_FALSE(*resolve_plan(parse(R"({"implementation": "torchtitan", "free_logits_before_backward": false})"), 8, 8)
                    .free_logits_before_backward);

  EXPECT_EQ(error_field(R"({"implementation": "megatron"})"), "plan.implementation");
  EXPECT_EQ(error_field(R"({"float8": "mxfp8"})"), "plan.float8");
  EXPECT_EQ(error_field(R"({"alloc_conf": "expandable_segments:Yes"})"), "plan.alloc_conf");
  EXPECT_EQ(error_field(R"({"alloc_conf": "max_split_size_mb:20"})"), "plan.alloc_conf");
  EXPECT_EQ(error_field(R"({"alloc_conf": "roundup_power2_divisions:4"})"), "plan.alloc_conf");
  EXPECT_EQ(error_field(R"({"alloc_conf": "expandible_segments:True"})"), "plan.alloc_conf");
  EXPECT_EQ(error_field(R"({"module_overrides": {"model.layers.3": {"reshard": false}}})"),
            "plan.module_overrides.model.layers.3.reshard");
  EXPECT_EQ(error_field(R"({"module_overrides": []})"), "plan.module_overrides");
  EXPECT_EQ(resolve_error_field(R"({"fsdp_version": 1, "module_overrides": {"last_block": {"reshard_after_forward": false}}})", 8, 8),
            "plan.module_overrides.last_block.reshard_after_forward");
  // frozen_units: names kept as given (resolved against the wrap graph when lowering); they need the
  // whole model's trainable fraction below 1.
  EXPECT_TRUE(d.frozen_units.empty());
  const Plan fz = parse(R"({"trainable_fraction": 0.01, "frozen_units": ["root", "model.embed_tokens"]})");
  ASSERT_EQ(fz.frozen_units.size(), 2u);
  EXPECT_EQ(fz.frozen_units[1], "model.embed_tokens");
  EXPECT_EQ(plan_to_json(fz)["frozen_units"], nlohmann::json::array({"root", "model.embed_tokens"}));
  EXPECT_EQ(parse(plan_to_json(fz).dump()).frozen_units, fz.frozen_units);
  EXPECT_EQ(error_field(R"({"frozen_units": "root"})"), "plan.frozen_units");
  EXPECT_EQ(error_field(R"({"frozen_units": [""]})"), "plan.frozen_units");
  EXPECT_EQ(error_field(R"({"frozen_units": [3]})"), "plan.frozen_units");
  EXPECT_EQ(resolve_error_field(R"({"frozen_units": ["root"]})", 8, 8), "plan.frozen_units");
  // torchao: the float8 all-gather is a Float8Linear option with tensorwise scaling only.
  EXPECT_EQ(resolve_error_field(R"({"fp8_all_gather": true, "float8": "rowwise"})", 8, 8), "plan.fp8_all_gather");
  EXPECT_EQ(resolve_plan(parse(R"({"fp8_all_gather": true})"), 8, 8).float8, models::Float8Recipe::Tensorwise);
  EXPECT_EQ(resolve_error_field(R"({"float8": "tensorwise", "param_dtype": "fp16"})", 8, 8), "plan.float8");

  nlohmann::json j = plan_to_json(resolve_plan(p, 8, 8));
  EXPECT_EQ(plan_to_json(resolve_plan(parse_plan(j), 8, 8)), j);
}

}  // namespace
}  // namespace fsdpsim::sim

namespace fsdpsim::sim {
namespace {

// plan.lora: read, canonical targets ("mlp" = gate, up, down, in the fixed order), written back; bad input
// names the field (exit 2 through InputError).
TEST(PlanParse, LoraKeyAndItsErrors) {
  const Plan p = parse(R"({"lora": {"rank": 16, "targets": ["v", "mlp", "q"], "dropout": 0.05}})");
  EXPECT_EQ(p.lora.rank, 16);
  EXPECT_EQ(p.lora.targets, (std::vector<std::string>{"q", "v", "gate", "up", "down"}));
  EXPECT_DOUBLE_EQ(p.lora.dropout, 0.05);
  EXPECT_EQ(parse_plan(plan_to_json(p)).lora, p.lora);
  EXPECT_FALSE(parse("{}").lora.on());
  EXPECT_EQ(error_field(R"({"lora": 16})"), "plan.lora");
  EXPECT_EQ(error_field(R"({"lora": {"targets": ["q"]}})"), "plan.lora.rank");
  EXPECT_EQ(error_field(R"({"lora": {"rank": 0, "targets": ["q"]}})"), "plan.lora.rank");
  EXPECT_EQ(error_field(R"({"lora": {"rank": 1000000, "targets": ["q"]}})"), "plan.lora.rank");
  EXPECT_EQ(error_field(R"({"lora": {"rank": 8}})"), "plan.lora.targets");
  EXPECT_EQ(error_field(R"({"lora": {"rank": 8, "targets": []}})"), "plan.lora.targets");
  EXPECT_EQ(error_field(R"({"lora": {"rank": 8, "targets": ["q", "qkv_proj"]}})"), "plan.lora.targets");
  EXPECT_EQ(error_field(R"({"lora": {"rank": 8, "targets": ["q"], "dropout": 1.0}})"), "plan.lora.dropout");
  EXPECT_EQ(error_field(R"({"lora": {"rank": 8, "targets": ["q"], "alpha": 16}})"), "plan.lora.alpha");
  // QLoRA: quantize_base "nf4" (written back only when set), "none", anything else an error naming the field
  const Plan q = parse(R"({"lora": {"rank": 16, "targets": ["q", "v"], "quantize_base": "nf4"}})");
  EXPECT_TRUE(q.lora.quantize_nf4);
  EXPECT_FALSE(p.lora.quantize_nf4);
  EXPECT_EQ(plan_to_json(q)["lora"]["quantize_base"], "nf4");
  EXPECT_FALSE(plan_to_json(p)["lora"].contains("quantize_base"));
  EXPECT_EQ(parse_plan(plan_to_json(q)).lora, q.lora);
  EXPECT_FALSE(parse(R"({"lora": {"rank": 16, "targets": ["q"], "quantize_base": "none"}})").lora.quantize_nf4);
  EXPECT_EQ(error_field(R"({"lora": {"rank": 8, "targets": ["q"], "quantize_base": "int4"}})"), "plan.lora.quantize_base");
  EXPECT_EQ(error_field(R"({"lora": {"rank": 8, "targets": ["q"], "quantize_base": true}})"), "plan.lora.quantize_base");
  EXPECT_EQ(error_field(R"({"lora": {"rank": 8, "targets": ["q"]}, "trainable_fraction": 0.1})"),
            "plan.trainable_fraction");
  try {
    parse(R"({"lora": {"rank": 8, "targets": ["q", "qkv_proj"]}})");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("qkv_proj"), std::string::npos) << e.what();
  }
  // frozen_units with lora needs no trainable_fraction; lora on the bundled runtime is refused
  EXPECT_EQ(resolve_error_field(R"({"lora": {"rank": 8, "targets": ["q"]}, "frozen_units": ["root"]})", 8, 8), "");
  EXPECT_EQ(resolve_error_field(R"({"lora": {"rank": 8, "targets": ["q"]}, "implementation": "runtime"})", 8, 8),
            "plan.lora");
}

}  // namespace
}  // namespace fsdpsim::sim

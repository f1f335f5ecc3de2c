// The plan-key table (program/plan_keys.h): every key round-trips JSON -> Plan -> JSON, its text form agrees
// with its JSON form, its default is what an empty plan prints, and a key given to the FSDP version that
// does not have it is an InputError naming the key.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/errors.h"
#include "program/plan.h"
#include "program/plan_keys.h"

namespace fsdpsim::sim {
namespace {

Plan parse(const std::string& text) { return parse_plan(Json::parse(text)); }

// Plans that between them give every key a value other than its default.
std::vector<Plan> sample_plans() {
  std::vector<Plan> out;
  out.push_back(Plan{});
  out.push_back(parse(R"({"fsdp_version": 2, "mesh": [2, 8], "reshard_after_forward": 4, "prefetch_depth": 3,
      "backward_prefetch": null, "forward_prefetch": true, "activation_checkpointing": "every_3",
      "param_dtype": "bf16", "reduce_dtype": "bf16", "master_weights_dtype": "fp32", "micro_batch": 4, "seq_len": 8192,
      "grad_accum": 8, "grad_sync": true, "cpu_offload": {"params": false, "optimizer": true}, "fp8_all_gather": true,
      "float8": "tensorwise", "trainable_fraction": 1, "optimizer": "sgd", "auto_wrap_policy": {"modules": ["layers.*"]},
      "cross_entropy": "chunked", "cross_entropy_chunks": 4, "implementation": "torchtitan", "compile": true,
      "alloc_conf": "expandable_segments:True,max_split_size_mb:512", "free_logits_before_backward": false,
      "loss_in_model_forward": false,
      "optimizer_impl": "fused", "module_overrides": {"last_block": {"reshard_after_forward": false}, "model.layers.0": {}},
      "lora": {"rank": 8, "targets": ["q", "v", "mlp"], "dropout": 0.05}, "frozen_units": ["root"]})"));
  out.push_back(parse(R"({"fsdp_version": 1, "sharding_strategy": "_HYBRID_SHARD_ZERO2", "mesh": {"replicate": 4, "shard": 2},
      "backward_prefetch": "BACKWARD_POST", "limit_all_gathers": false, "use_orig_params": false,
      "activation_checkpointing": {"mode": "every_k", "every_k": 2, "outside_fsdp": true}, "param_dtype": "fp16",
      "reduce_dtype": "fp16", "master_weights_dtype": "fp16", "cpu_offload": true, "trainable_fraction": 0.25,
      "auto_wrap_policy": {"min_num_params": 1000000}, "cross_entropy": "fused_linear", "implementation": "runtime",
      "float8": "none", "frozen_units": ["model.embed_tokens", "lm_head"]})"));
  out.push_back(parse(R"({"sharding_strategy": "SHARD_GRAD_OP", "activation_checkpointing": "selective_op",
      "auto_wrap_policy": "none", "cross_entropy": "fused", "implementation": "litgpt", "float8": "rowwise",
      "activation_offloading": "sync"})"));
  return out;
}

TEST(PlanKeys, TableIsTheReadersKnownKeys) {
  std::set<std::string> names;
  for (const PlanKey& k : plan_keys()) {
    EXPECT_TRUE(names.insert(k.name).second) << "duplicate " << k.name;
    EXPECT_TRUE(k.read && k.write) << k.name;
    EXPECT_EQ(find_plan_key(k.name), &k);
  }
  EXPECT_EQ(names.size(), plan_key_names().size());
  EXPECT_EQ(find_plan_key("precision"), nullptr);   // the planner's preset key is not a plan key
  EXPECT_THROW(plan_key("no_such_key"), std::logic_error);
  try {
    parse(R"({"fsdp_verison": 2})");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "plan.fsdp_verison");
    for (const std::string& n : names) EXPECT_NE(e.allowed().find(n), std::string::npos) << n;
  }
}

TEST(PlanKeys, EveryKeyRoundTripsThroughJson) {
  std::set<std::string> printed;
  for (const Plan& p : sample_plans()) {
    const Json j = plan_to_json(p);
    const Json again = plan_to_json(parse_plan(j));
    EXPECT_EQ(again, j) << j.dump();
    for (const auto& [key, v] : j.items()) {
      printed.insert(key);
      // Each key on its own (with the version it needs) reads back to the same printed value.
      Json one = {{key, v}};
      if (key != "fsdp_version") one["fsdp_version"] = j["fsdp_version"];
      if (key == "cross_entropy_chunks") one["cross_entropy"] = "chunked";
      if (key == "frozen_units") one["trainable_fraction"] = 0.5;
      EXPECT_EQ(plan_to_json(parse_plan(one))[key], v) << key;
    }
  }
  for (const PlanKey& k : plan_keys()) EXPECT_TRUE(printed.count(k.name)) << k.name << " never printed by the samples";
}

// loss_in_model_forward: torchtune's chunked output has its loss computed by the recipe on the model's output.
TEST(PlanKeys, LossInTheModelsForwardIsRefusedWithTorchtunesChunkedOutput) {
  try {
    resolve_plan(parse(R"({"cross_entropy": "chunked", "loss_in_model_forward": true})"), 8, 8);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "plan.loss_in_model_forward");
    EXPECT_NE(std::string(e.what()).find("chunked"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(resolve_plan(parse(R"({"cross_entropy": "chunked", "loss_in_model_forward": false})"), 8, 8));
}

TEST(PlanKeys, DefaultsAreWhatAnEmptyPlanPrints) {
  for (const PlanKey& k : plan_keys()) {
    Plan empty;   // of the version that has the key
    if (k.versions == KeyVersions::Fsdp1Only) empty.fsdp_version = FsdpVersion::FSDP1;
    const Json j = plan_to_json(empty);
    if (k.default_json.empty()) {   // derived or printed only when set
      EXPECT_FALSE(j.contains(k.name)) << k.name;
      continue;
    }
    ASSERT_TRUE(j.contains(k.name)) << k.name;
    EXPECT_EQ(j[k.name], Json::parse(k.default_json)) << k.name;
  }
}

TEST(PlanKeys, TextAndJsonFormsAgree) {
  for (const Plan& p : sample_plans())
    for (const PlanKey& k : plan_keys()) {
      if (!k.text) continue;
      const std::string t = k.text(p);
      if (t == "n/a" || (k.name == "mesh" && p.mesh_shard == 0)) continue;   // no such setting / not resolved
      const std::string field = "--fix " + k.name;
      EXPECT_EQ(k.canonical(field, t), t) << k.name;   // canonical texts are fixed points
      // Setting the key from its text on another plan of the same version gives the same text and JSON.
      Plan q;
      q.fsdp_version = p.fsdp_version;
      q.mesh_replicate = p.mesh_replicate;
      q.mesh_shard = p.mesh_shard;
      q.sharding_strategy = p.sharding_strategy;
      q.reshard_after_forward = p.reshard_after_forward;
      k.set(q, t, field);
      EXPECT_EQ(k.text(q), t) << k.name;
      // The text of these is a reading of the JSON (the effective strategy, the parameters' offload, the
      // mode without outside_fsdp): the JSON agrees only where it says the same.
      static const std::set<std::string> readings = {"sharding_strategy", "reshard_after_forward", "cpu_offload",
                                                     "activation_checkpointing"};
      if (!readings.count(k.name)) {
        EXPECT_EQ(plan_to_json(q)[k.name], plan_to_json(p)[k.name]) << k.name;
      }
    }
  // Base keys take the JSON spelling of their values as text.
  for (const Plan& p : sample_plans())
    for (const PlanKey& k : plan_keys()) {
      if (k.search != SearchRole::Base) continue;
      const Json j = plan_to_json(p);
      if (!j.contains(k.name)) continue;
      const Json& v = j[k.name];
      if (!v.is_string() && !v.is_boolean()) continue;
      if (v == "runtime") continue;   // not an implementation a search trains with
      Plan q;
      q.fsdp_version = p.fsdp_version;
      k.set(q, v.is_string() ? v.get<std::string>() : v.dump(), "--fix " + k.name);
      EXPECT_EQ(plan_to_json(q)[k.name], v) << k.name;
    }
}

TEST(PlanKeys, TextFormsTakeTheUsersSpellings) {
  EXPECT_EQ(plan_key("sharding_strategy").canonical("f", "ShardingStrategy.HYBRID_SHARD_ZERO2"), "_HYBRID_SHARD_ZERO2");
  EXPECT_EQ(plan_key("backward_prefetch").canonical("f", "NO_PREFETCH"), "NONE");
  EXPECT_EQ(plan_key("activation_checkpointing").canonical("f", "every_1"), "full");
  EXPECT_EQ(plan_key("mesh").canonical("f", "(2, 8)"), "[2,8]");
  EXPECT_EQ(plan_key("reshard_after_forward").canonical("f", "8"), "8");
  EXPECT_EQ(plan_key("forward_prefetch").canonical("f", "on"), "true");
  Plan p;
  plan_key("lora").set(p, "16:q,v:0.1", "--fix lora");
  EXPECT_EQ(p.lora.rank, 16);
  EXPECT_EQ(p.lora.targets, (std::vector<std::string>{"q", "v"}));
  EXPECT_FALSE(p.lora.quantize_nf4);
  plan_key("lora").set(p, "16:q,v:0:nf4", "--fix lora");   // QLoRA, with and without the dropout
  EXPECT_TRUE(p.lora.quantize_nf4);
  EXPECT_DOUBLE_EQ(p.lora.dropout, 0.0);
  plan_key("lora").set(p, "8:q,k,v:nf4", "--fix lora");
  EXPECT_TRUE(p.lora.quantize_nf4);
  EXPECT_EQ(p.lora.targets, (std::vector<std::string>{"q", "k", "v"}));
  EXPECT_THROW(plan_key("lora").set(p, "8:q,v:0:nf5", "--fix lora"), InputError);
  plan_key("auto_wrap_policy").set(p, "min_num_params:1000", "--fix auto_wrap_policy");
  EXPECT_EQ(p.auto_wrap_policy.min_num_params, 1000);
  try {
    plan_key("reshard_after_forward").canonical("--fix reshard_after_forward", "1");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--fix reshard_after_forward");
    EXPECT_EQ(e.value(), "1");
  }
}

// The InputError's field for a plan that parse_plan and resolve_plan (8 GPUs, 8 per node) refuse.
std::string refused_field(const std::string& text) {
  try {
    resolve_plan(parse(text), 8, 8);
  } catch (const InputError& e) {
    return e.field() + " = " + e.value();
  }
  return "";
}

TEST(PlanKeys, OneVersionKeysAreRefusedByTheOtherVersion) {
  std::map<KeyVersions, std::set<std::string>> by;
  for (const PlanKey& k : plan_keys()) by[k.versions].insert(k.name);
  EXPECT_EQ(by[KeyVersions::Fsdp1Only], (std::set<std::string>{"backward_prefetch", "limit_all_gathers", "use_orig_params"}));
  EXPECT_EQ(by[KeyVersions::Fsdp2Only],
            (std::set<std::string>{"reshard_after_forward", "prefetch_depth", "fp8_all_gather", "module_overrides"}));
  // Each one-version key (but FSDP2's ignored limit_all_gathers) used under the other version.
  EXPECT_EQ(refused_field(R"({"fsdp_version": 2, "backward_prefetch": "BACKWARD_POST"})"),
            "plan.backward_prefetch = \"BACKWARD_POST\"");
  EXPECT_EQ(refused_field(R"({"fsdp_version": 2, "use_orig_params": false})"), "plan.use_orig_params = false");
  EXPECT_EQ(refused_field(R"({"fsdp_version": 1, "reshard_after_forward": true})"), "plan.reshard_after_forward = true");
  EXPECT_EQ(refused_field(R"({"fsdp_version": 1, "prefetch_depth": 2})"), "plan.prefetch_depth = 2");
  EXPECT_EQ(refused_field(R"({"fsdp_version": 1, "fp8_all_gather": true})"), "plan.fp8_all_gather = true");
  EXPECT_EQ(refused_field(R"({"fsdp_version": 1, "module_overrides": {"last_block": {"reshard_after_forward": false}}})"),
            "plan.module_overrides.last_block.reshard_after_forward = false");
  // Their own version, or a neutral value, is accepted.
  EXPECT_EQ(refused_field(R"({"fsdp_version": 2, "limit_all_gathers": false, "use_orig_params": true, "prefetch_depth": 2})"), "");
  EXPECT_EQ(refused_field(R"({"fsdp_version": 1, "backward_prefetch": "BACKWARD_POST", "prefetch_depth": 1,
                              "module_overrides": {"last_block": {}}})"), "");
  // The per-module keys are the ones module_overrides takes.
  for (const PlanKey& k : plan_keys()) {
    if (k.per_module) {
      EXPECT_EQ(k.name, "reshard_after_forward");
    }
  }
  EXPECT_EQ(refused_field(R"({"module_overrides": {"last_block": {"prefetch_depth": 2}}})"),
            "plan.module_overrides.last_block.prefetch_depth = 2");
}

TEST(PlanKeys, ReshardAfterForwardValues) {
  using R = ReshardAfterForward;
  EXPECT_EQ(R::of(true), R::yes());
  EXPECT_EQ(R::of(false), R::no());
  EXPECT_NE(R::yes(), R::unset());
  EXPECT_TRUE(R::group(8).is_group());
  EXPECT_EQ(R::group(8).group_size(), 8);
  EXPECT_EQ(R::yes().group_size(), 0);
  EXPECT_FALSE(R::yes().is_group());
  EXPECT_TRUE(R::no().keeps());
  EXPECT_FALSE(R::unset().keeps());
  EXPECT_TRUE(R::unset().is_unset());
  EXPECT_EQ(R::of_strategy(ShardingStrategy::_HYBRID_SHARD_ZERO2), R::no());
  EXPECT_EQ(R::of_strategy(ShardingStrategy::HYBRID_SHARD), R::yes());
  EXPECT_THROW(R::group(1), std::invalid_argument);   // 1 is no group size
  EXPECT_EQ(R::yes().text(), "true");
  EXPECT_EQ(R::no().text(), "false");
  EXPECT_EQ(R::group(8).text(), "8");
  EXPECT_EQ(plan_to_json(parse(R"({"reshard_after_forward": 4})"))["reshard_after_forward"], 4);
  EXPECT_EQ(plan_to_json(parse(R"({"reshard_after_forward": false})"))["reshard_after_forward"], false);
  EXPECT_EQ(parse_reshard_text("f", "8"), R::group(8));
}

TEST(PlanKeys, FrameworkSpellingsAreOnePerKey) {
  std::map<Framework, std::set<std::string>> seen;
  for (const PlanKey& k : plan_keys())
    for (const Spelling& s : k.spellings) EXPECT_TRUE(seen[s.framework].insert(s.key).second) << s.key;
  EXPECT_EQ(spelling("sharding_strategy", Framework::Accelerate), "fsdp_config.fsdp_sharding_strategy");
  EXPECT_EQ(spelling("reshard_after_forward", Framework::TorchTitan), "parallelism.fsdp_reshard_after_forward");
  EXPECT_EQ(spelling("mesh", Framework::Lightning), "");
  EXPECT_EQ(section_key("cpu_offload", Framework::TorchTitan), "enable_cpu_offload");
  EXPECT_EQ(section_key("grad_accum", Framework::Lightning), "accumulate_grad_batches");
}

}  // namespace
}  // namespace fsdpsim::sim

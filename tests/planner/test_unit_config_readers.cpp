// Readers of users' configurations (no simulation): each fixture's keys land in the plan, and bad
// values are InputError naming the key.
#include <gtest/gtest.h>

#include "common/errors.h"
#include "planner/user_config.h"

using namespace fsdpsim;
using namespace fsdpsim::planner;

namespace {

models::ModelSpec spec(const std::string& name, const std::string& type, const std::string& block) {
  models::ModelSpec m;
  m.name = name;
  m.model_type = type;
  m.block_class = block;
  return m;
}
std::string fixture(const std::string& f) { return std::string(FSDPSIM_SOURCE_DIR) + "/tests/planner/fixtures/" + f; }
const models::ModelSpec kLlama = spec("llama3-8b", "llama", "LlamaDecoderLayer");
const models::ModelSpec kGpt2 = spec("gpt2", "gpt2", "GPT2Block");

}  // namespace

TEST(Readers, LightningSnippetWrapNothing) {
  auto c = read_user_config(fixture("lightning_wrap_nothing.py"), {}, kLlama);
  EXPECT_EQ(c.format, "lightning");
  EXPECT_EQ(c.plan.fsdp_version, sim::FsdpVersion::FSDP1);
  EXPECT_EQ(c.plan.sharding_strategy, sim::ShardingStrategy::FULL_SHARD);
  EXPECT_TRUE(c.wraps_nothing);
  EXPECT_EQ(c.plan.auto_wrap_policy.kind, models::WrapPolicy::Kind::None);
  EXPECT_EQ(c.wrap_classes, std::vector<std::string>{"Block"});
  EXPECT_EQ(c.plan.activation_checkpointing.mode, sim::ActivationCheckpointing::Mode::None);
  EXPECT_EQ(c.plan.param_dtype, Dtype::BF16);          // bf16-mixed (Lightning >= 2.6)
  EXPECT_EQ(c.plan.reduce_dtype, Dtype::BF16);
  EXPECT_EQ(c.plan.master_weights_dtype, Dtype::FP32);
  EXPECT_EQ(c.plan.micro_batch, 1);                    // DataLoader(batch_size=1)
  EXPECT_EQ(c.plan.seq_len, 2048);                     // # fsdpsim: seq_len=2048
  EXPECT_EQ(c.gpus_per_node, 8);
}

TEST(Readers, Lightning16Mixed) {
  auto c = read_user_config(fixture("lightning_16mixed.py"), {}, kLlama);
  EXPECT_FALSE(c.wraps_nothing);
  EXPECT_EQ(c.plan.auto_wrap_policy.kind, models::WrapPolicy::Kind::TransformerBlock);
  EXPECT_EQ(c.plan.activation_checkpointing.mode, sim::ActivationCheckpointing::Mode::Full);
  EXPECT_EQ(c.precision, "16-mixed");
  EXPECT_EQ(c.plan.param_dtype, Dtype::FP16);
  EXPECT_EQ(c.plan.master_weights_dtype, Dtype::FP32);
  EXPECT_EQ(c.plan.grad_accum, 4);
  EXPECT_EQ(c.plan.backward_prefetch, sim::BackwardPrefetch::BACKWARD_PRE);
  // Command-line options override the file.
  ReadOptions o;
  o.micro_batch = 3;
  o.seq_len = 4096;
  c = read_user_config(fixture("lightning_16mixed.py"), o, kLlama);
  EXPECT_EQ(c.plan.micro_batch, 3);
  EXPECT_EQ(c.plan.seq_len, 4096);
}

TEST(Readers, AccelerateAndLightningYaml) {
  auto a = read_user_config(fixture("accelerate_no_ac.yaml"), {}, kLlama);
  EXPECT_EQ(a.format, "accelerate");
  EXPECT_EQ(a.plan.fsdp_version, sim::FsdpVersion::FSDP2);
  EXPECT_EQ(a.plan.reshard_after_forward, -1);
  EXPECT_EQ(a.plan.activation_checkpointing.mode, sim::ActivationCheckpointing::Mode::None);
  EXPECT_EQ(a.plan.micro_batch, 4);
  EXPECT_EQ(a.plan.seq_len, 8192);
  EXPECT_EQ(a.gpus_per_node, 8);
  auto b = read_user_config(fixture("accelerate_full_shard_small.yaml"), {}, kGpt2);
  EXPECT_EQ(b.plan.fsdp_version, sim::FsdpVersion::FSDP1);
  EXPECT_EQ(b.plan.sharding_strategy, sim::ShardingStrategy::FULL_SHARD);
  EXPECT_FALSE(b.wraps_nothing);
  auto l = read_user_config(fixture("lightning_no_shard_small.yaml"), {}, kGpt2);
  EXPECT_EQ(l.format, "lightning-yaml");
  EXPECT_EQ(l.plan.sharding_strategy, sim::ShardingStrategy::NO_SHARD);
  EXPECT_EQ(l.plan.micro_batch, 8);
  EXPECT_EQ(l.plan.seq_len, 1024);
  EXPECT_FALSE(l.wraps_nothing);
}

TEST(Readers, Torchtitan) {
  auto t = read_user_config(fixture("torchtitan_full_shard_eth.toml"), {}, kLlama);
  EXPECT_EQ(t.format, "torchtitan");
  EXPECT_EQ(t.plan.fsdp_version, sim::FsdpVersion::FSDP2);
  EXPECT_EQ(t.plan.mesh_replicate, 1);
  EXPECT_EQ(t.plan.mesh_shard, -1);  // "leftover": resolved against the cluster by diagnose
  EXPECT_EQ(t.plan.activation_checkpointing.mode, sim::ActivationCheckpointing::Mode::Full);
  EXPECT_EQ(t.plan.micro_batch, 1);
  EXPECT_EQ(t.plan.seq_len, 4096);
  EXPECT_EQ(t.plan.reduce_dtype, Dtype::FP32);
  EXPECT_EQ(t.plan.master_weights_dtype, Dtype::FP32);
}

TEST(Readers, BadInputNamesTheKey) {
  auto expect_field = [](const std::string& file, const std::string& field) {
    try {
      read_user_config(fixture(file), {}, kLlama);
      ADD_FAILURE() << file << " did not throw";
    } catch (const InputError& e) {
      EXPECT_NE(e.field().find(field), std::string::npos) << e.what();
    }
  };
  expect_field("bad_accelerate.yaml", "fsdp_config.fsdp_sharding_strategy");
  expect_field("bad_torchtitan.toml", "parallelism.fsdp_reshard_after_forward");
  EXPECT_THROW(parse_user_config_text("trainer = Trainer()", "lightning", "x.py", kLlama), InputError);
  EXPECT_THROW(parse_user_config_text("FSDPStrategy(cpu_offload=maybe)\nTrainer()", "lightning", "x.py", kLlama), InputError);
  EXPECT_THROW(parse_user_config_text("FSDPStrategy(device_mesh=(2,))", "lightning", "x.py", kLlama), InputError);
  EXPECT_THROW(parse_user_config_text("FSDPStrategy()\nTrainer(precision=\"bf17-mixed\")", "lightning", "x.py", kLlama), InputError);
  EXPECT_THROW(parse_user_config_text("a: [unclosed", "accelerate", "x.yaml", kLlama), InputError);
  EXPECT_THROW(parse_user_config_text("[training\n", "torchtitan", "x.toml", kLlama), InputError);
  EXPECT_THROW(read_user_config(fixture("missing.yaml"), {}, kLlama), InputError);
  EXPECT_THROW(read_user_config(fixture("lightning_16mixed.py"), {"word", 0, 0, 0}, kLlama), InputError);
}

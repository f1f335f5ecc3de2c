// Readers of users' configurations (no simulation): each fixture's keys land in the plan, and bad
// values are InputError naming the key.
#include <gtest/gtest.h>

#include "common/errors.h"
#include "models/zoo.h"
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
  EXPECT_EQ(a.plan.reshard_after_forward, sim::ReshardAfterForward::yes());
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

// A framework value the plan key refuses, or an empty one: the error names the framework's field alone
// (not the plan key after it) and the value as written.
TEST(Readers, BadFrameworkValueNamesTheFrameworkField) {
  const std::string head = "distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n";
  auto error_of = [&](const std::string& line) -> std::pair<std::string, std::string> {
    try {
      parse_user_config_text(head + line, "accelerate", "x.yaml", kLlama);
    } catch (const InputError& e) {
      return {e.field(), e.value()};
    }
    return {"", ""};
  };
  EXPECT_EQ(error_of("  fsdp_sharding_strategy: BOGUS\n"),
            (std::pair<std::string, std::string>{"fsdp_config.fsdp_sharding_strategy", "BOGUS"}));
  EXPECT_EQ(error_of("  fsdp_sharding_strategy: \"\"\n"),
            (std::pair<std::string, std::string>{"fsdp_config.fsdp_sharding_strategy", "\"\""}));
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

// Lightning's registered strategy names: strategy="fsdp" is FSDPStrategy() with its defaults - no
// wrap policy, no checkpointing - and "fsdp_cpu_offload" the same with cpu_offload=True.
TEST(Readers, LightningStrategyStrings) {
  auto c = parse_user_config_text("import lightning as L\ntrainer = L.Trainer(devices=8, strategy=\"fsdp\")\n", "lightning", "x.py", kLlama);
  EXPECT_EQ(c.plan.fsdp_version, sim::FsdpVersion::FSDP1);
  EXPECT_EQ(c.plan.auto_wrap_policy.kind, models::WrapPolicy::Kind::None);
  EXPECT_TRUE(c.wraps_nothing);
  EXPECT_EQ(c.precision, "32-true");
  EXPECT_EQ(c.plan.param_dtype, Dtype::FP32);
  c = parse_user_config_text("trainer = Trainer(strategy='FSDP_CPU_OFFLOAD', accumulate_grad_batches=4)", "lightning", "x.py", kLlama);
  EXPECT_TRUE(c.plan.cpu_offload.params);
  EXPECT_FALSE(c.plan.grad_sync);   // the Trainer accumulates inside FSDP's no_sync()
  // Not FSDP at all, and an FSDPStrategy named only in a comment: InputError naming the key or file.
  EXPECT_THROW(parse_user_config_text("trainer = Trainer(strategy=\"ddp\")", "lightning", "x.py", kLlama), InputError);
  EXPECT_THROW(parse_user_config_text("# FSDPStrategy(auto_wrap_policy={X})\ntrainer = Trainer()", "lightning", "x.py", kLlama), InputError);
  // Fabric: gradients reduced every micro-batch unless the script uses no_backward_sync.
  c = parse_user_config_text("fabric = L.Fabric(strategy=FSDPStrategy(cpu_offload=True))\n", "lightning", "x.py", kLlama);
  EXPECT_TRUE(c.plan.grad_sync);
  c = parse_user_config_text("fabric = L.Fabric(strategy=FSDPStrategy())\nwith fabric.no_backward_sync(model):\n  pass\n", "lightning",
                             "x.py", kLlama);
  EXPECT_FALSE(c.plan.grad_sync);
}

TEST(Readers, LightningScriptSequenceLengthCompileAndLitgpt) {
  auto c = parse_user_config_text("from litgpt.model import Block\nMAX_SEQ_LENGTH = 4_096\n# seq_len = 99\n"
                                  "s = FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block})\n"
                                  "model = torch.compile(model)\nTrainer(strategy=s)\n",
                                  "lightning", "x.py", kLlama);
  EXPECT_EQ(c.plan.seq_len, 4096);
  EXPECT_TRUE(c.seq_len_given);
  EXPECT_EQ(c.plan.implementation, models::ModelImpl::LitGPT);
  EXPECT_EQ(c.plan.auto_wrap_policy.kind, models::WrapPolicy::Kind::TransformerBlock);   // litgpt's Block
  EXPECT_EQ(c.plan.activation_checkpointing.mode, sim::ActivationCheckpointing::Mode::Full);
  EXPECT_TRUE(c.plan.compile);
  EXPECT_FALSE(c.plan.activation_checkpointing.outside_compile);   // torch.compile(model): around the checkpoints
  // block.compile() in configure_model: FSDPStrategy checkpoints the compiled blocks after it.
  const std::string strategy = "from litgpt.model import Block\n"
                               "s = FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block})\n";
  const std::string in_place = "    def configure_model(self):\n        for block in self.model.layers:\n"
                               "            block.compile()\nTrainer(strategy=s)\n";
  c = parse_user_config_text(strategy + in_place, "lightning", "x.py", kLlama);
  EXPECT_TRUE(c.plan.compile);
  EXPECT_TRUE(c.plan.activation_checkpointing.outside_compile);
  EXPECT_NO_THROW(sim::resolve_plan(c.plan, 8, 8));
  c = parse_user_config_text("from litgpt.model import Block\ns = FSDPStrategy(auto_wrap_policy={Block})\n" + in_place,
                             "lightning", "x.py", kLlama);
  EXPECT_FALSE(c.plan.activation_checkpointing.outside_compile);   // nothing checkpointed
}

// torchtune recipe configs: FSDP2, pure dtype, every micro-batch reduced, the checkpoint around the compiled layer,
// the loss, packing, custom sharded layers, LoRA read by the shared reader with the root frozen.
TEST(Readers, TorchtuneRecipeConfig) {
  auto c = read_user_config(fixture("torchtune_8b_qlora_compile.yaml"), {}, models::load_model("llama3-8b"));
  EXPECT_EQ(c.format, "torchtune");
  const sim::Plan& p = c.plan;
  EXPECT_EQ(p.fsdp_version, sim::FsdpVersion::FSDP2);
  EXPECT_EQ(p.implementation, models::ModelImpl::HF);
  EXPECT_EQ(p.param_dtype, Dtype::BF16);
  EXPECT_EQ(p.reduce_dtype, Dtype::BF16);
  EXPECT_EQ(p.master_weights_dtype, Dtype::BF16);
  EXPECT_EQ(p.micro_batch, 2);
  EXPECT_EQ(p.grad_accum, 4);
  EXPECT_TRUE(p.grad_sync);
  EXPECT_EQ(p.seq_len, 4096);
  EXPECT_TRUE(c.seq_len_given);
  EXPECT_EQ(p.reshard_after_forward, sim::ReshardAfterForward::no());
  EXPECT_TRUE(p.compile);
  EXPECT_EQ(p.activation_checkpointing.mode, sim::ActivationCheckpointing::Mode::Full);
  EXPECT_TRUE(p.activation_checkpointing.outside_compile);
  EXPECT_EQ(p.cross_entropy, models::LossImpl::Chunked);
  EXPECT_EQ(p.cross_entropy_chunks, 16);
  EXPECT_TRUE(p.free_logits_before_backward);
  EXPECT_EQ(p.auto_wrap_policy.kind, models::WrapPolicy::Kind::Modules);
  EXPECT_EQ(p.auto_wrap_policy.modules, (std::vector<std::string>{"layers.*", "embed_tokens", "lm_head"}));
  EXPECT_EQ(p.lora.rank, 8);
  EXPECT_TRUE(p.lora.quantize_nf4);
  // custom_sharded_layers wraps the embedding and output apart: those units are frozen with the root.
  EXPECT_EQ(p.frozen_units, (std::vector<std::string>{"root", "model.embed_tokens", "lm_head"}));
  EXPECT_EQ(p.optimizer_impl, sim::OptimizerImpl::Fused);
  bool near = false;   // a misspelled key is named with the one it is close to
  for (const auto& w : c.warnings) near = near || w.find("log_every_n_stpes") != std::string::npos;
  EXPECT_TRUE(near);
  EXPECT_NO_THROW(sim::resolve_plan(p, 8, 8));

  // Defaults: bf16, reshard after forward, each layer an FSDP unit, no checkpointing, compile alone (no order).
  c = parse_user_config_text("model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\ncompile: True\n", "torchtune",
                             "x.yaml", kLlama);
  EXPECT_EQ(c.plan.master_weights_dtype, Dtype::BF16);
  EXPECT_EQ(c.plan.reshard_after_forward, sim::ReshardAfterForward::yes());
  EXPECT_EQ(c.plan.auto_wrap_policy.kind, models::WrapPolicy::Kind::TransformerBlock);
  EXPECT_FALSE(c.plan.activation_checkpointing.outside_compile);
  EXPECT_FALSE(c.seq_len_given);
  EXPECT_FALSE(c.plan.lora.on());
  EXPECT_TRUE(c.plan.frozen_units.empty());
  // The newer mapping form of compile, the mesh, and LinearCrossEntropyLoss.
  c = parse_user_config_text("compile:\n  loss: False\ndata_parallel_replicate_dim: 2\ndata_parallel_shard_dim: 4\n"
                             "loss:\n  _component_: torchtune.modules.loss.LinearCrossEntropyLoss\n",
                             "torchtune", "x.yaml", kLlama);
  EXPECT_TRUE(c.plan.compile);
  EXPECT_EQ(c.plan.mesh_replicate, 2);
  EXPECT_EQ(c.plan.mesh_shard, 4);
  EXPECT_EQ(c.plan.cross_entropy, models::LossImpl::FusedLinear);

  // Activation offloading: with checkpointing, OffloadActivations' use_streams (default True); without, said.
  c = parse_user_config_text("enable_activation_checkpointing: True\nenable_activation_offloading: True\n", "torchtune",
                             "x.yaml", kLlama);
  EXPECT_EQ(c.plan.activation_offloading, sim::ActivationOffload::Streams);
  EXPECT_NO_THROW(sim::resolve_plan(c.plan, 8, 8));
  c = parse_user_config_text("enable_activation_checkpointing: True\nenable_activation_offloading: True\n"
                             "activation_offloading_use_streams: False\n",
                             "torchtune", "x.yaml", kLlama);
  EXPECT_EQ(c.plan.activation_offloading, sim::ActivationOffload::Sync);
  // without checkpointing: every tensor the layers save goes through the hooks (modelled so)
  c = parse_user_config_text("enable_activation_offloading: True\n", "torchtune", "x.yaml", kLlama);
  EXPECT_EQ(c.plan.activation_offloading, sim::ActivationOffload::Streams);
  EXPECT_EQ(c.plan.activation_checkpointing.mode, sim::ActivationCheckpointing::Mode::None);
  EXPECT_NO_THROW(sim::resolve_plan(c.plan, 8, 8));

  // What is not modelled is said: a single-device recipe's config, quantization-aware training.
  c = parse_user_config_text("#   tune run lora_finetune_single_device --config llama3_1/8B_lora_single_device\n"
                             "quantizer:\n  _component_: torchtune.training.quantization.Int8DynActInt4WeightQATQuantizer\n",
                             "torchtune", "x.yaml", kLlama);
  std::string said;
  for (const auto& w : c.warnings) said += w + "\n";
  EXPECT_NE(said.find("lora_finetune_single_device, which trains on one GPU without FSDP"), std::string::npos) << said;
  EXPECT_NE(said.find("quantizer: quantization-aware training"), std::string::npos) << said;
  EXPECT_EQ(yaml_format_of("model:\n  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n"), "torchtune");
  EXPECT_EQ(yaml_format_of("fsdp_config:\n  fsdp_version: 2\n"), "accelerate");
  EXPECT_EQ(yaml_format_of("trainer:\n  precision: bf16-true\n"), "lightning-yaml");

  // Bad values name the key.
  for (const auto& [text, field] : {std::pair{"dtype: fp16\n", "dtype"}, std::pair{"batch_size: 0\n", "batch_size"},
                                    std::pair{"dataset:\n  packed: True\n", "dataset.packed"},
                                    std::pair{"data_parallel_shard_dim: 0\n", "data_parallel_shard_dim"},
                                    std::pair{"enable_activation_checkpointing: maybe\n", "enable_activation_checkpointing"},
                                    std::pair{"custom_sharded_layers: output\n", "custom_sharded_layers"}}) {
    try {
      parse_user_config_text(text, "torchtune", "x.yaml", kLlama);
      ADD_FAILURE() << text;
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), field) << text;
    }
  }
}

// accelerate: no fsdp_auto_wrap_policy is NO_WRAP (FullyShardedDataParallelPlugin's default), a misspelled
// key is never read (so also NO_WRAP), and the value is compared in upper case.
TEST(Readers, AccelerateWrapPolicyDefaultIsNoWrap) {
  const std::string head = "distributed_type: FSDP\nmixed_precision: bf16\nfsdp_config:\n  fsdp_version: 2\n";
  auto c = parse_user_config_text(head, "accelerate", "x.yaml", kLlama);
  EXPECT_EQ(c.plan.auto_wrap_policy.kind, models::WrapPolicy::Kind::None);
  EXPECT_TRUE(c.wraps_nothing);
  c = parse_user_config_text(head + "  fsdp_auto_wrap_polcy: TRANSFORMER_BASED_WRAP\n", "accelerate", "x.yaml", kLlama);
  EXPECT_EQ(c.plan.auto_wrap_policy.kind, models::WrapPolicy::Kind::None);
  c = parse_user_config_text(head + "  fsdp_auto_wrap_policy: transformer_based_wrap\n", "accelerate", "x.yaml", kLlama);
  EXPECT_EQ(c.plan.auto_wrap_policy.kind, models::WrapPolicy::Kind::TransformerBlock);
  EXPECT_THROW(parse_user_config_text(head + "  fsdp_auto_wrap_policy: BLOCK_WRAP\n", "accelerate", "x.yaml", kLlama), InputError);
  c = parse_user_config_text(head + "dynamo_config:\n  dynamo_backend: INDUCTOR\n", "accelerate", "x.yaml", kLlama);
  EXPECT_TRUE(c.plan.compile);
  c = parse_user_config_text("distributed_type: FSDP\nmixed_precision: fp8\nfp8_config:\n  backend: AO\nfsdp_config:\n  fsdp_version: 2\n",
                             "accelerate", "x.yaml", kLlama);
  EXPECT_EQ(c.plan.float8, models::Float8Recipe::Tensorwise);
  EXPECT_TRUE(c.plan.fp8_all_gather);
}

// torchtitan: [compile], float8 in either layout ([float8] before 2025-09, [quantize.linear.float8] after),
// [optimizer], reshard "default" as the last block kept, unknown sections named.
TEST(Readers, TorchtitanCompileFloat8OptimizerSections) {
  auto c = parse_user_config_text("[model]\nconverters = [\"quantize.linear.float8\"]\n[quantize.linear.float8]\nrecipe_name = \"rowwise\"\n"
                                  "[compile]\nenable = true\ncomponents = [\"loss\"]\n[optimizer]\nimplementation = \"foreach\"\n"
                                  "[my_extras]\nx = 1\n",
                                  "torchtitan", "x.toml", kLlama);
  EXPECT_EQ(c.plan.float8, models::Float8Recipe::Rowwise);
  EXPECT_FALSE(c.plan.fp8_all_gather);
  EXPECT_FALSE(c.plan.compile);   // only the loss is compiled
  EXPECT_EQ(c.plan.optimizer_impl, sim::OptimizerImpl::Foreach);
  EXPECT_EQ(c.plan.implementation, models::ModelImpl::TorchTitan);
  ASSERT_EQ(c.plan.module_overrides.size(), 1u);
  EXPECT_EQ(c.plan.module_overrides[0].module, "last_block");
  EXPECT_EQ(c.plan.module_overrides[0].reshard_after_forward, sim::ReshardAfterForward::no());
  bool named = false;
  for (const auto& w : c.warnings) named = named || w.find("[my_extras]") != std::string::npos;
  EXPECT_TRUE(named);
  // A [float8] section without the converter is read and reported, float8 stays off.
  c = parse_user_config_text("[float8]\nenable_fsdp_float8_all_gather = true\n[parallelism]\nfsdp_reshard_after_forward = \"always\"\n",
                             "torchtitan", "x.toml", kLlama);
  EXPECT_EQ(c.plan.float8, models::Float8Recipe::None);
  EXPECT_TRUE(c.plan.module_overrides.empty());
  EXPECT_THROW(parse_user_config_text("[model]\nconverters = [\"float8\"]\n[float8]\nrecipe_name = \"rowwise\"\n"
                                      "enable_fsdp_float8_all_gather = true\n",
                                      "torchtitan", "x.toml", kLlama),
               InputError);
  EXPECT_THROW(parse_user_config_text("[optimizer]\nname = \"Lion\"\n", "torchtitan", "x.toml", kLlama), InputError);
}

// LoRA settings in a user's config become plan.lora: litgpt's finetune globals, torchtune's model arguments,
// PEFT's LoraConfig (module names mapped to q, k, v, o, gate, up, down, head); a bad rank names the field.
TEST(Readers, LoraFromLitgptTorchtuneAndPeft) {
  const std::string strat = "strategy = FSDPStrategy(auto_wrap_policy={Block})\ntrainer = L.Trainer(strategy=strategy)\n";
  auto c = parse_user_config_text(strat + "lora_r = 8\nlora_alpha = 16\nlora_dropout = 0.05\nlora_query = True\n"
                                  "lora_key = False\nlora_value = True\nlora_mlp = False\n",
                                  "lightning", "x.py", kLlama);
  EXPECT_EQ(c.plan.lora.rank, 8);
  EXPECT_EQ(c.plan.lora.targets, (std::vector<std::string>{"q", "v"}));
  EXPECT_DOUBLE_EQ(c.plan.lora.dropout, 0.05);
  const std::string head = "distributed_type: FSDP\nmixed_precision: bf16\nfsdp_config:\n  fsdp_version: 2\n";
  c = parse_user_config_text(head + "model:\n  lora_attn_modules: ['q_proj', 'v_proj', 'k_proj']\n"
                                    "  apply_lora_to_mlp: True\n  lora_rank: 16\n",
                             "accelerate", "x.yaml", kLlama);
  EXPECT_EQ(c.plan.lora.rank, 16);
  EXPECT_EQ(c.plan.lora.targets, (std::vector<std::string>{"q", "k", "v", "gate", "up", "down"}));
  EXPECT_FALSE(c.plan.lora.quantize_nf4);
  // torchtune's QLoRA builders: NF4 base weights; bitsandbytes' under FSDP1 too, under FSDP2 a warning
  c = parse_user_config_text(head + "model:\n  _component_: torchtune.models.llama3_1.qlora_llama3_1_405b\n"
                                    "  lora_attn_modules: ['q_proj', 'v_proj']\n  lora_rank: 16\n  lora_dropout: 0.05\n",
                             "accelerate", "x.yaml", kLlama);
  EXPECT_TRUE(c.plan.lora.quantize_nf4);
  EXPECT_DOUBLE_EQ(c.plan.lora.dropout, 0.05);
  c = parse_user_config_text(head + "model:\n  lora_attn_modules: ['q_proj']\n  lora_rank: 8\n  quantize_base: True\n",
                             "accelerate", "x.yaml", kLlama);
  EXPECT_TRUE(c.plan.lora.quantize_nf4);
  const std::string bnb = "bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"nf4\")\n"
                          "cfg = LoraConfig(r=4, target_modules=[\"q_proj\"])\n";
  c = parse_user_config_text(strat + bnb, "lightning", "x.py", kLlama);   // FSDP1: modelled
  EXPECT_TRUE(c.plan.lora.quantize_nf4);
  c = parse_user_config_text(head + "# train.py:\n# " + bnb.substr(0, bnb.find('\n') + 1) + "# " + bnb.substr(bnb.find('\n') + 1),
                             "accelerate", "x.yaml", kLlama);   // FSDP2: not
  EXPECT_FALSE(c.plan.lora.quantize_nf4);
  bool warned = false;
  for (const auto& w : c.warnings) warned = warned || w.find("bitsandbytes 4-bit base weights under FSDP2") != std::string::npos;
  EXPECT_TRUE(warned);
  c = parse_user_config_text(strat + "cfg = LoraConfig(r=4, lora_alpha=8, target_modules=[\"q_proj\", \"o_proj\"], "
                                     "lora_dropout=0.1)\n",
                             "lightning", "x.py", kLlama);
  EXPECT_EQ(c.plan.lora.rank, 4);
  EXPECT_EQ(c.plan.lora.targets, (std::vector<std::string>{"q", "o"}));
  EXPECT_DOUBLE_EQ(c.plan.lora.dropout, 0.1);
  c = parse_user_config_text(strat, "lightning", "x.py", kLlama);
  EXPECT_FALSE(c.plan.lora.on());
  EXPECT_THROW(parse_user_config_text(strat + "cfg = LoraConfig(r=0, target_modules=[\"q_proj\"])\n", "lightning", "x.py", kLlama),
               InputError);
}

// The optimizer a config builds: class paths (a script's constructor, torchtune's _component_, LightningCLI's
// class_path) and Hugging Face TrainingArguments' optim; what is not modelled stays torch.optim.AdamW, warned.
TEST(Readers, OptimizerClassesAndHuggingFaceOptim) {
  const std::string strat = "strategy = FSDPStrategy(auto_wrap_policy={Block})\ntrainer = L.Trainer(strategy=strategy)\n";
  const auto warned = [](const UserConfig& c, const std::string& what) {
    for (const auto& w : c.warnings)
      if (w.find(what) != std::string::npos) return true;
    return false;
  };
  // torchtune under FSDP2 (an accelerate-style head): torchao's are modelled, bitsandbytes' are not.
  const std::string fsdp2 = "distributed_type: FSDP\nmixed_precision: bf16\nfsdp_config:\n  fsdp_version: 2\n";
  struct Case {
    std::string text, format;
    sim::Optimizer want;
    const char* warning;   // nullptr: none about the optimizer
  };
  const std::vector<Case> cases = {
      {strat + "opt = bitsandbytes.optim.PagedAdamW8bit(model.parameters(), lr=1e-4)\n", "lightning",
       sim::Optimizer::BnbPagedAdamW8bit, nullptr},
      {strat + "from bitsandbytes.optim import AdamW8bit\nopt = AdamW8bit(model.parameters())\n", "lightning",
       sim::Optimizer::BnbAdamW8bit, nullptr},
      {strat + "args = TrainingArguments(output_dir='o', optim=\"paged_adamw_32bit\")\n", "lightning",
       sim::Optimizer::BnbPagedAdamW, nullptr},
      {strat + "opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)\n", "lightning", sim::Optimizer::AdamW,
       nullptr},
      {strat + "opt = bitsandbytes.optim.Lion8bit(model.parameters())\n", "lightning", sim::Optimizer::AdamW,
       "bitsandbytes.optim.Lion8bit: this optimizer is not modelled"},
      {fsdp2 + "optimizer:\n  _component_: torchao.optim.AdamW4bit\n  lr: 2e-5\n", "accelerate",
       sim::Optimizer::TorchaoAdamW4bit, nullptr},
      {fsdp2 + "optimizer:\n  _component_: bitsandbytes.optim.PagedAdamW8bit\n", "accelerate", sim::Optimizer::AdamW,
       "over FSDP2's DTensor parameters are not modelled"},
  };
  for (const Case& k : cases) {
    const UserConfig c = parse_user_config_text(k.text, k.format, "x", kLlama);
    EXPECT_EQ(c.plan.optimizer, k.want) << k.text;
    if (k.warning) {
      EXPECT_TRUE(warned(c, k.warning)) << k.text;
    }
  }
  EXPECT_EQ(parse_user_config_text(cases[3].text, "lightning", "x.py", kLlama).plan.optimizer_impl, sim::OptimizerImpl::Fused);
}

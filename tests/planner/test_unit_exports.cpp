// Exports: each front-end's text equals its golden file (FSDPSIM_UPDATE_GOLDEN=1 rewrites them) and
// parses in its own format with python3 (ast.parse, yaml.safe_load, tomllib), with the plan's values.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "planner/export_expressible.h"
#include "planner/exports.h"
#include <filesystem>

// Debian's interpreter, whose yaml/jsonschema come from scripts/deps.sh --test (a python3 earlier on
// PATH, e.g. a pyenv shim, may lack them); python3 from PATH otherwise.
static std::string python3_path() {
  return std::filesystem::exists("/usr/bin/python3") ? std::string("/usr/bin/python3") : std::string("python3");
}

using namespace fsdpsim;
using namespace fsdpsim::planner;

namespace {

models::ModelSpec llama(const std::string& name, std::int64_t hidden, std::int64_t layers) {
  models::ModelSpec m;
  m.name = name;
  m.model_type = "llama";
  m.block_class = "LlamaDecoderLayer";
  m.hidden = hidden;
  m.n_layers = layers;
  return m;
}

calibrate::Cluster cluster(int nodes, int gpn) {
  calibrate::Cluster c;
  c.nodes = nodes;
  c.gpus_per_node = gpn;
  c.gpu = "H100-SXM";
  return c;
}

struct Fixture {
  std::string name;
  ExportInput in;
};

std::vector<Fixture> fixtures() {
  std::vector<Fixture> f;
  {  // FSDP2 FULL_SHARD on one node, full AC, no_sync accumulation, bf16 + fp32 reduce.
    ExportInput in{llama("llama3-8b", 4096, 32), cluster(1, 8), {}, "FSDP2 FULL_SHARD mesh(1,8) rAF=true AC=full mb=2 ga=4 no_sync bf16"};
    in.plan.fsdp_version = sim::FsdpVersion::FSDP2;
    in.plan.mesh_replicate = 1;
    in.plan.mesh_shard = 8;
    in.plan.activation_checkpointing.mode = sim::ActivationCheckpointing::Mode::Full;
    in.plan.micro_batch = 2;
    in.plan.grad_accum = 4;
    in.plan.seq_len = 8192;
    f.push_back({"fsdp2_full_shard", in});
  }
  {  // FSDP1 HYBRID_SHARD (2, 8), BACKWARD_POST + forward_prefetch, every_2 AC, pure bf16, sync each micro-batch.
    ExportInput in{llama("llama3-70b", 8192, 80), cluster(2, 8), {}, "FSDP1 HYBRID_SHARD mesh(2,8) BACKWARD_POST forward_prefetch AC=every_2 mb=1 ga=8 sync bf16-true"};
    auto& p = in.plan;
    p.fsdp_version = sim::FsdpVersion::FSDP1;
    p.sharding_strategy = sim::ShardingStrategy::HYBRID_SHARD;
    p.mesh_replicate = 2;
    p.mesh_shard = 8;
    p.backward_prefetch = sim::BackwardPrefetch::BACKWARD_POST;
    p.forward_prefetch = true;
    p.activation_checkpointing.mode = sim::ActivationCheckpointing::Mode::EveryK;
    p.activation_checkpointing.every_k = 2;
    p.param_dtype = p.reduce_dtype = p.master_weights_dtype = Dtype::BF16;
    p.micro_batch = 1;
    p.grad_accum = 8;
    p.grad_sync = true;
    p.seq_len = 4096;
    f.push_back({"fsdp1_hybrid", in});
  }
  {  // FSDP2 hpZ: mesh (2, 16), reshard_after_forward=8, prefetch 2, selective op AC, fp8 all-gather, CPU offload.
    models::ModelSpec m = llama("mistral-7b", 4096, 32);
    m.model_type = "mistral";
    m.block_class = "MistralDecoderLayer";
    ExportInput in{m, cluster(4, 8), {}, "FSDP2 HYBRID_SHARD mesh(2,16) rAF=8 prefetch=2 AC=selective_op mb=4 ga=1 offload fp8-ag"};
    auto& p = in.plan;
    p.fsdp_version = sim::FsdpVersion::FSDP2;
    p.mesh_replicate = 2;
    p.mesh_shard = 16;
    p.reshard_after_forward = sim::ReshardAfterForward::group(8);
    p.prefetch_depth = 2;
    p.activation_checkpointing.mode = sim::ActivationCheckpointing::Mode::SelectiveOp;
    p.fp8_all_gather = true;
    p.cpu_offload.params = true;
    p.micro_batch = 4;
    p.grad_accum = 1;
    p.seq_len = 2048;
    f.push_back({"fsdp2_hpz_offload", in});
  }
  {  // FSDP2 with the newer plan keys: torch.compile, float8 (tensorwise + float8 all-gathers), expandable
     // segments, the fused optimizer, the last block kept unsharded after forward.
    ExportInput in{llama("llama3-8b", 4096, 32), cluster(1, 8), {}, "FSDP2 FULL_SHARD mesh(1,8) rAF=true AC=none mb=2 ga=1 fp8-ag"};
    auto& p = in.plan;
    p.fsdp_version = sim::FsdpVersion::FSDP2;
    p.mesh_replicate = 1;
    p.mesh_shard = 8;
    p.compile = true;
    p.float8 = models::Float8Recipe::Tensorwise;
    p.fp8_all_gather = true;
    p.alloc_conf.expandable_segments = true;
    p.optimizer_impl = sim::OptimizerImpl::Fused;
    p.module_overrides = {sim::ModuleOverride{"last_block", sim::ReshardAfterForward::no()}};
    p.micro_batch = 2;
    p.seq_len = 8192;
    f.push_back({"fsdp2_compile_float8", in});
  }
  return f;
}

std::string golden_dir() { return std::string(FSDPSIM_SOURCE_DIR) + "/tests/planner/golden/"; }

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void check_golden(const std::string& name, const std::string& text) {
  std::string path = golden_dir() + name;
  const char* upd = std::getenv("FSDPSIM_UPDATE_GOLDEN");
  if (upd && std::string(upd) == "1") {
    std::ofstream(path) << text;
    return;
  }
  EXPECT_EQ(read_file(path), text) << "golden file " << path << " differs (FSDPSIM_UPDATE_GOLDEN=1 rewrites it)";
}

// Collects texts and python3 checks; run() checks them all in one python3 process (the script sees
// each file's path as `path`). Parsing uses ast.parse, yaml.safe_load and tomllib.
struct PythonChecks {
  std::string script = "import ast, sys, tomllib, yaml\nfailed = 0\n";
  int n = 0;
  void add(const std::string& text, const std::string& ext, const std::string& body) {
    std::string path = std::string(FSDPSIM_BINARY_DIR) + "/planner_export_check_" + std::to_string(n++) + "." + ext;
    std::ofstream(path) << text;
    script += "path = '" + path + "'\ntry:\n";
    std::stringstream ss(body);
    std::string line;
    while (std::getline(ss, line)) script += "    " + line + "\n";
    script += "except Exception as e:\n    failed += 1\n    print(path, repr(e))\n";
  }
  void run() {
    script += "sys.exit(1 if failed else 0)\n";
    std::string py = std::string(FSDPSIM_BINARY_DIR) + "/planner_export_check.py";
    std::ofstream(py) << script;
    std::string out = std::string(FSDPSIM_BINARY_DIR) + "/planner_export_check.out";
    int rc = std::system((python3_path() + " " + py + " > " + out + " 2>&1").c_str());
    EXPECT_EQ(rc, 0) << read_file(out);
  }
};

}  // namespace

TEST(Exports, GoldenFilesAndTheyParse) {
  PythonChecks checks;
  for (const auto& f : fixtures()) {
    SCOPED_TRACE(f.name);
    const auto& p = f.in.plan;
    Export a = export_fsdp2(f.in), b = export_lightning(f.in), c = export_accelerate(f.in), d = export_torchtitan(f.in);
    EXPECT_EQ(a.format, "python");
    EXPECT_EQ(b.format, "python");
    EXPECT_EQ(c.format, "yaml");
    EXPECT_EQ(d.format, "toml");
    check_golden(f.name + ".fsdp2.py", a.text);
    check_golden(f.name + ".lightning.py", b.text);
    check_golden(f.name + ".accelerate.yaml", c.text);
    check_golden(f.name + ".torchtitan.toml", d.text);
    checks.add(a.text, "py", "ast.parse(open(path).read())");
    checks.add(b.text, "py", "ast.parse(open(path).read())");
    std::string v = p.fsdp_version == sim::FsdpVersion::FSDP1 ? "1" : "2";
    checks.add(c.text, "yaml",
                 "d = yaml.safe_load(open(path))\n"
                 "assert d['distributed_type'] == 'FSDP'\n"
                 "assert d['fsdp_config']['fsdp_version'] == " + v + "\n"
                 "assert d['num_processes'] == " + std::to_string(f.in.cluster.nodes * f.in.cluster.gpus_per_node));
    checks.add(d.text, "toml",
                 "d = tomllib.loads(open(path).read())\n"
                 "assert d['parallelism']['data_parallel_replicate_degree'] == " + std::to_string(p.mesh_replicate) + "\n"
                 "assert d['parallelism']['data_parallel_shard_degree'] == " + std::to_string(p.mesh_shard) + "\n"
                 "assert d['training']['local_batch_size'] == " + std::to_string(p.micro_batch) + "\n"
                 "assert d['training']['seq_len'] == " + std::to_string(p.seq_len));
  }
  checks.run();
}

TEST(Exports, UnsupportedSettingsAreListedNotDropped) {
  auto f = fixtures();
  // FSDP1 BACKWARD_POST / forward_prefetch cannot be expressed by torchtitan (FSDP2-only).
  Export t = export_torchtitan(f[1].in);
  bool found = false;
  for (const auto& u : t.unsupported) found |= u.find("BACKWARD_POST") != std::string::npos;
  EXPECT_TRUE(found);
  EXPECT_NE(t.text.find("# not expressible here"), std::string::npos);
  // Lightning cannot checkpoint every 2nd block through a class set; nor can accelerate.
  Export l = export_lightning(f[1].in);
  found = false;
  for (const auto& u : l.unsupported) found |= u.find("every_2") != std::string::npos;
  EXPECT_TRUE(found);
  EXPECT_NE(l.text.find("device_mesh=(2, 8)"), std::string::npos);
  EXPECT_NE(l.text.find("precision=\"bf16-true\""), std::string::npos);
  // accelerate: rAF=8 and prefetch_depth 2 have no YAML key.
  Export a = export_accelerate(f[2].in);
  EXPECT_GE(a.unsupported.size(), 3u);
  // The raw FSDP2 export expresses hpZ, prefetch and offload directly.
  Export r = export_fsdp2(f[2].in);
  EXPECT_NE(r.text.find("reshard_after_forward=8"), std::string::npos);
  EXPECT_NE(r.text.find("set_modules_to_backward_prefetch"), std::string::npos);
  EXPECT_NE(r.text.find("CPUOffloadPolicy()"), std::string::npos);
  EXPECT_NE(r.text.find("init_device_mesh(\"cuda\", (2, 16)"), std::string::npos);
}

// Each exporter spells the newer plan keys in its own form.
TEST(Exports, CompileFloat8AllocConfOptimizerAndOverrides) {
  const ExportInput in = fixtures()[3].in;
  const Export r = export_fsdp2(in), l = export_lightning(in), a = export_accelerate(in), t = export_torchtitan(in);
  for (const Export* e : {&r, &l})
    for (const char* s : {"block.compile()", "convert_to_float8_training(", "enable_fsdp_float8_all_gather=True", "fused=True"})
      EXPECT_NE(e->text.find(s), std::string::npos) << s << "\n" << e->text;
  EXPECT_NE(r.text.find("PYTORCH_CUDA_ALLOC_CONF=\"expandable_segments:True\" torchrun"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("{31: False}.get(i, True)"), std::string::npos) << r.text;   // the last block kept
  for (const char* s : {"mixed_precision: fp8", "backend: AO", "dynamo_backend: INDUCTOR", "fused=True", "PYTORCH_CUDA_ALLOC_CONF"})
    EXPECT_NE(a.text.find(s), std::string::npos) << s << "\n" << a.text;
  for (const char* s : {"[compile]\nenable = true", "converters = [\"quantize.linear.float8\"]", "[quantize.linear.float8]",
                        "enable_fsdp_float8_all_gather = true", "implementation = \"fused\"", "fsdp_reshard_after_forward = \"default\"",
                        "PYTORCH_CUDA_ALLOC_CONF"})
    EXPECT_NE(t.text.find(s), std::string::npos) << s << "\n" << t.text;
  // Without the override torchtitan's spelling is "always": "default" keeps the last block.
  ExportInput b = in;
  b.plan.module_overrides.clear();
  EXPECT_NE(export_torchtitan(b).text.find("fsdp_reshard_after_forward = \"always\""), std::string::npos);
}

// What each front-end can express (export_expressible.h): the nearest plan, and what changed.
TEST(Exports, ExpressiblePlanPerFramework) {
  const auto f = fixtures();
  const calibrate::Cluster two = cluster(2, 8), four = cluster(4, 8);
  // FSDP1 HYBRID_SHARD, every_2 AC, sync every micro-batch: Lightning's Trainer checkpoints whole blocks and
  // accumulates inside no_sync.
  Expressed e = express_plan("lightning", f[1].in.plan, two);
  EXPECT_EQ(e.plan.activation_checkpointing.mode, sim::ActivationCheckpointing::Mode::Full);
  EXPECT_FALSE(e.plan.grad_sync);
  EXPECT_EQ(e.plan.sharding_strategy, sim::ShardingStrategy::HYBRID_SHARD);
  EXPECT_EQ(e.changes.size(), 2u);
  // torchtitan: FSDP2 only, reduce every micro-batch, its own model code.
  e = express_plan("torchtitan", f[1].in.plan, two);
  EXPECT_EQ(e.plan.fsdp_version, sim::FsdpVersion::FSDP2);
  EXPECT_EQ(e.plan.activation_checkpointing.mode, sim::ActivationCheckpointing::Mode::EveryK);   // torchtitan has it
  EXPECT_EQ(e.plan.implementation, models::ModelImpl::TorchTitan);
  // hpZ (rAF 8), prefetch 2, selective op AC: accelerate says which three it changed.
  e = express_plan("accelerate", f[2].in.plan, four);
  EXPECT_EQ(e.plan.reshard_after_forward, sim::ReshardAfterForward::yes());
  EXPECT_EQ(e.plan.prefetch_depth, 1);
  EXPECT_EQ(e.plan.activation_checkpointing.mode, sim::ActivationCheckpointing::Mode::Full);
  EXPECT_GE(e.changes.size(), 3u);
  // Lightning: FSDP2 HSDP becomes FSDPStrategy HYBRID_SHARD; fp8 all-gathers go (FSDP1).
  e = express_plan("lightning", f[2].in.plan, four);
  EXPECT_EQ(e.plan.fsdp_version, sim::FsdpVersion::FSDP1);
  EXPECT_EQ(e.plan.sharding_strategy, sim::ShardingStrategy::HYBRID_SHARD);
  EXPECT_FALSE(e.plan.fp8_all_gather);
  // The raw FSDP2 export expresses an FSDP2 plan without selective AC as is.
  e = express_plan("fsdp2", f[0].in.plan, cluster(1, 8));
  EXPECT_TRUE(e.changes.empty());
  // What only torchtune's code does, no front-end here runs (there is no torchtune export): every export translates it
  // away and says so.
  const auto translated_away = [&](const sim::Plan& in, const std::string& words, auto&& gone) {
    for (const std::string& fw : export_frameworks()) {
      const auto x = express_plan(fw, in, cluster(1, 8));
      EXPECT_TRUE(gone(x.plan)) << fw;
      bool said = false;
      for (const auto& c : x.changes) said = said || c.find(words) != std::string::npos;
      EXPECT_TRUE(said) << fw << ": " << words;
    }
  };
  // torchtune's chunked loss needs torchtune's TransformerDecoder.
  sim::Plan chunked = f[0].in.plan;
  chunked.cross_entropy = models::LossImpl::Chunked;
  translated_away(chunked, "cross_entropy chunked -> torch",
                  [](const sim::Plan& q) { return q.cross_entropy == models::LossImpl::Torch; });
  // torchtune's activation offloading (its own saved-tensor hooks).
  sim::Plan offloaded = f[0].in.plan;
  offloaded.activation_checkpointing.mode = sim::ActivationCheckpointing::Mode::Full;
  offloaded.activation_offloading = sim::ActivationOffload::Streams;
  translated_away(offloaded, "activation_offloading streams -> none",
                  [](const sim::Plan& q) { return q.activation_offloading == sim::ActivationOffload::None; });
}

// Where the checkpoint sits relative to torch.compile (activation_checkpointing.outside_compile): the raw FSDP2
// export compiles each block before wrapping it (AC(compile(block))) or after (compile(AC(block)), torchtitan's);
// torchtitan and accelerate only compile around the checkpoint; Lightning's FSDPStrategy checkpoints the blocks
// its configure_model compiled.
TEST(Exports, CheckpointAroundOrInsideCompile) {
  ExportInput in = fixtures()[0].in;   // FSDP2, full AC
  in.plan.compile = true;
  for (bool around : {false, true}) {
    in.plan.activation_checkpointing.outside_compile = around;
    const std::string text = export_fsdp2(in).text;
    const auto compiled = text.find("block.compile()"), wrapped = text.find("checkpoint_wrapper(block)");
    ASSERT_NE(compiled, std::string::npos) << text;
    ASSERT_NE(wrapped, std::string::npos) << text;
    EXPECT_EQ(compiled < wrapped, around) << text;
    EXPECT_EQ(text.find("block.compile()", compiled + 1), std::string::npos) << text;   // once
    for (const std::string fw : {"torchtitan", "accelerate"}) {
      const Expressed e = express_plan(fw, in.plan, cluster(1, 8));
      EXPECT_FALSE(e.plan.activation_checkpointing.outside_compile) << fw;
      bool said = false;
      for (const auto& c : e.changes) said = said || c.find("outside_compile true -> false") != std::string::npos;
      EXPECT_EQ(said, around) << fw;
    }
    EXPECT_EQ(express_plan("fsdp2", in.plan, cluster(1, 8)).plan.activation_checkpointing.outside_compile, around);
  }
  sim::Plan v1 = in.plan;
  v1.fsdp_version = sim::FsdpVersion::FSDP1;
  v1.activation_checkpointing.outside_compile = false;
  const Expressed l = express_plan("lightning", v1, cluster(1, 8));
  EXPECT_TRUE(l.plan.activation_checkpointing.outside_compile);
  ExportInput lin = in;
  lin.plan = l.plan;
  EXPECT_NE(export_lightning(lin).text.find("(checkpointed around it after this: AC(compile(block)))"), std::string::npos);
}

// plan.lora in the exports: PEFT's LoraConfig with the model's module names (accelerate, raw FSDP2, Lightning),
// litgpt's finetune flags (Lightning), a note where the framework has none (torchtitan, and fully_shard itself);
// express_plan drops lora for torchtitan (it trains every parameter) and turns FSDP1's use_orig_params on where
// whole blocks are wrapped.
TEST(UnitExports, LoraIsSpelledOrNoted) {
  ExportInput in{llama("llama3-8b", 4096, 32), cluster(1, 8), {}, "FSDP2 lora"};
  in.plan.fsdp_version = sim::FsdpVersion::FSDP2;
  in.plan.mesh_replicate = 1;
  in.plan.mesh_shard = 8;
  in.plan.lora.rank = 16;
  in.plan.lora.targets = {"q", "v"};
  in.plan.lora.dropout = 0.05;
  const std::string peft = R"(LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "v_proj"]))";
  const auto noted = [](const Export& e, const std::string& what) {
    for (const auto& u : e.unsupported)
      if (u.find(what) != std::string::npos) return true;
    return false;
  };
  Export acc = export_accelerate(in);
  EXPECT_NE(acc.text.find(peft), std::string::npos) << acc.text;
  Export f2 = export_fsdp2(in);
  EXPECT_NE(f2.text.find("model = get_peft_model(model, " + peft), std::string::npos) << f2.text;
  EXPECT_TRUE(noted(f2, "lora: FSDP2 (fully_shard) has no LoRA"));
  Export tt = export_torchtitan(in);
  EXPECT_TRUE(noted(tt, "torchtitan has no LoRA"));
  EXPECT_NE(tt.text.find("# not expressible here: lora"), std::string::npos);
  in.plan.fsdp_version = sim::FsdpVersion::FSDP1;
  Export lt = export_lightning(in);
  EXPECT_NE(lt.text.find("litgpt finetune lora --lora_r 16 --lora_alpha 32 --lora_dropout 0.05 --lora_query true "
                         "--lora_key false --lora_value true --lora_projection false --lora_mlp false --lora_head false"),
            std::string::npos)
      << lt.text;
  EXPECT_NE(lt.text.find(peft), std::string::npos);
  // QLoRA: the fsdp2 export turns the blocks' frozen linears into torchao NF4Tensors before fully_shard; Lightning,
  // and accelerate under FSDP2, keep bf16 base weights and say so; accelerate under FSDP1 spells bitsandbytes'.
  {
    ExportInput q = in;
    q.plan.fsdp_version = sim::FsdpVersion::FSDP2;
    q.plan.lora.quantize_nf4 = true;
    Export qf = export_fsdp2(q);
    EXPECT_NE(qf.text.find("to_nf4(lin.weight.detach())"), std::string::npos) << qf.text;
    EXPECT_NE(qf.text.find("linear_nf4(x, lin.weight)"), std::string::npos) << qf.text;
    for (const char* fw : {"accelerate", "lightning"}) {
      const Expressed x = express_plan(fw, q.plan, cluster(1, 8));
      EXPECT_FALSE(x.plan.lora.quantize_nf4) << fw;
      EXPECT_TRUE(x.plan.lora.on()) << fw;
      bool said = false;
      for (const auto& c : x.changes) said = said || c.find("lora.quantize_base nf4 -> none") != std::string::npos;
      EXPECT_TRUE(said) << fw;
    }
    EXPECT_TRUE(express_plan("fsdp2", q.plan, cluster(1, 8)).plan.lora.quantize_nf4);
    // FSDP1 in accelerate: bitsandbytes' 4-bit weights (modelled), spelled as transformers' BitsAndBytesConfig
    q.plan.fsdp_version = sim::FsdpVersion::FSDP1;
    q.plan.use_orig_params = true;
    EXPECT_TRUE(express_plan("accelerate", q.plan, cluster(1, 8)).plan.lora.quantize_nf4);
    Export qa = export_accelerate(q);
    EXPECT_NE(qa.text.find("bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16, "
                           "bnb_4bit_quant_storage=torch.bfloat16"),
              std::string::npos)
        << qa.text;
  }
  // express_plan: torchtitan drops the adapters; accelerate keeps them and needs use_orig_params under FSDP1.
  Expressed e = express_plan("torchtitan", in.plan, cluster(1, 8));
  EXPECT_FALSE(e.plan.lora.on());
  in.plan.use_orig_params = false;
  e = express_plan("accelerate", in.plan, cluster(1, 8));
  EXPECT_TRUE(e.plan.lora.on());
  EXPECT_TRUE(e.plan.use_orig_params);
  // GPT-2's fused c_attn: PEFT adapts q, k and v together, and the export says so.
  ExportInput g = in;
  g.model.model_type = "gpt2";
  g.plan.use_orig_params = true;
  Export ga = export_accelerate(g);
  EXPECT_NE(ga.text.find(R"(target_modules=["c_attn"])"), std::string::npos) << ga.text;
  EXPECT_TRUE(noted(ga, "c_attn holds q, k and v"));
  // GPT-NeoX's fused query_key_value and its dense projections; Phi's separate q/k/v, dense, fc1 and fc2; each
  // block class imported from its transformers module.
  g.plan.lora.targets = {"q", "v", "o", "up", "down"};
  g.model.model_type = "gpt_neox";
  g.model.block_class = "GPTNeoXLayer";
  Export gn = export_accelerate(g);
  EXPECT_NE(gn.text.find(R"(target_modules=["query_key_value", "attention.dense", "dense_h_to_4h", "dense_4h_to_h"])"),
            std::string::npos) << gn.text;
  EXPECT_TRUE(noted(gn, "query_key_value holds q, k and v"));
  EXPECT_NE(export_lightning(g).text.find("from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXLayer"),
            std::string::npos);
  g.model.model_type = "phi";
  g.model.block_class = "PhiDecoderLayer";
  Export ph = export_accelerate(g);
  EXPECT_NE(ph.text.find(R"(target_modules=["q_proj", "v_proj", "self_attn.dense", "fc1", "fc2"])"), std::string::npos)
      << ph.text;
}

// A low-bit or paged AdamW (program/optimizer_state.h): its class and import in every export that constructs the
// optimizer; bitsandbytes' moves to torchao's 8-bit AdamW (or torch.optim's for its 32-bit paged one) where the
// export runs FSDP2, and torchtitan builds torch.optim's AdamW; each change said.
TEST(UnitExports, LowBitOptimizersAreSpelledOrChanged) {
  ExportInput in{llama("llama3-8b", 4096, 32), cluster(1, 8), {}, "FSDP1 paged 8-bit"};
  in.plan.fsdp_version = sim::FsdpVersion::FSDP1;
  in.plan.mesh_replicate = 1;
  in.plan.mesh_shard = 8;
  in.plan.optimizer = sim::Optimizer::BnbPagedAdamW8bit;
  const Export lt = export_lightning(in), acc = export_accelerate(in);
  EXPECT_NE(lt.text.find("import bitsandbytes\n"), std::string::npos) << lt.text;
  EXPECT_NE(lt.text.find("return bitsandbytes.optim.PagedAdamW8bit(self.parameters(), lr=3e-4)"), std::string::npos) << lt.text;
  EXPECT_NE(acc.text.find("# optimizer in your script: bitsandbytes.optim.PagedAdamW8bit(model.parameters(), lr=3e-4)  # "
                          "import bitsandbytes"),
            std::string::npos)
      << acc.text;
  const auto changed = [](const Expressed& x, const std::string& what) {
    for (const auto& c : x.changes)
      if (c.find(what) != std::string::npos) return true;
    return false;
  };
  Expressed x = express_plan("fsdp2", in.plan, cluster(1, 8));
  EXPECT_EQ(x.plan.optimizer, sim::Optimizer::TorchaoAdamW8bit);
  EXPECT_TRUE(changed(x, "optimizer bnb_paged_adamw8bit -> torchao_adamw8bit")) << x.changes.size();
  x = express_plan("torchtitan", in.plan, cluster(1, 8));
  EXPECT_EQ(x.plan.optimizer, sim::Optimizer::AdamW);
  EXPECT_TRUE(changed(x, "optimizer bnb_paged_adamw8bit -> adamw"));
  in.plan.optimizer = sim::Optimizer::BnbPagedAdamW;
  EXPECT_EQ(express_plan("fsdp2", in.plan, cluster(1, 8)).plan.optimizer, sim::Optimizer::AdamW);
  // torchao's under FSDP2 as is.
  in.plan.fsdp_version = sim::FsdpVersion::FSDP2;
  in.plan.optimizer = sim::Optimizer::TorchaoAdamW4bit;
  const Export f2 = export_fsdp2(in);
  EXPECT_NE(f2.text.find("import torchao.optim\n"), std::string::npos) << f2.text;
  EXPECT_NE(f2.text.find("optimizer = torchao.optim.AdamW4bit(model.parameters(), lr=3e-4)"), std::string::npos) << f2.text;
  EXPECT_TRUE(express_plan("fsdp2", in.plan, cluster(1, 8)).changes.empty());
}

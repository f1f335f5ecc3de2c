// Peak-memory prediction error of fsdpsim on the MEMORY records of ../shared/data/published-dev-set-2.jsonl
// (in-tree copy: tests/calibrate/data/published_dev_set_2.jsonl, the records carrying a memory figure).
// Each compared record is simulated with the plan its source implies (plans built as in
// devset_published2.cpp) and its figure compared like with like: torch.cuda.max_memory_allocated with
// fsdpsim's peak allocated, reserved with peak reserved, nvidia-smi with peak_total_device. A figure
// that is a maximum over the whole run is compared with the larger of the first-step and steady-step
// peaks. A report, not a gate: no constant of the simulator is tuned here and no correction applied.
//   calibrate_devset_memory [path/to/published_dev_set_2.jsonl]
// Exit 0 normally, 2 when the data file cannot be read or a record is malformed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "sim/lower_context.h"
#include "sim/simulator.h"

using namespace fsdpsim;

namespace {

enum class Kind { Allocated, Reserved, NvidiaSmi };
const char* kind_name(Kind k) {
  return k == Kind::Allocated ? "allocated" : k == Kind::Reserved ? "reserved" : "nvidia-smi";
}

struct Mapping {
  const char* id;
  const char* model;     // zoo name ("" = skipped)
  const char* cluster;   // built-in cluster name
  const char* plan;      // plan JSON
  Kind kind;             // what the record's figure measures
  const char* summary;   // short plan summary for the row
  const char* assumes;   // every assumption beyond the record
  const char* skip;      // non-null: skipped, with this reason
  const char* lora = nullptr;   // the plan's `lora` object (the framework's LoRA config at the cited commit)
};

// litgpt finetune/lora.py at lit-gpt 8641822 (the commit resource-tables.md names), Lightning pinned at
// 71aed751 by its requirements.txt, PyTorch 2.1.0:
//  - FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block}, state_dict_type="full",
//    limit_all_gathers=True, cpu_offload=False): FSDP1 FULL_SHARD, use_orig_params=True (Fabric's default on
//    torch >= 2.0), full AC per Block, precision bf16-true (params, reduce and master weights bf16), AdamW;
//  - batch_size 128, gradient_accumulation_iters = batch_size // micro_batch_size, every micro-batch but the
//    last of an optimizer step under fabric.no_backward_sync(model) -> FullyShardedDataParallel.no_sync():
//    grad_accum = 128 / micro_batch, grad_sync false (the unsharded flat grads are kept across the
//    micro-batches, M12; with use_orig_params a Block's flat grad is full size although only its LoRA
//    tensors train, M13);
//  - lora_head False and mark_only_lora_as_trainable: the root unit (wte, ln_f, lm_head) has no trainable
//    tensor, so its FlatParameter does not require grad: frozen_units ["root"];
//  - finetune/lora.py's defaults: lora_r 8, lora_alpha 16, lora_dropout 0.05, lora_query and lora_value True,
//    key, projection, mlp, head False: plan lora {"rank": 8, "targets": ["q", "v"], "dropout": 0.05}, the
//    adapters in litgpt's LoRAQKVLinear of every Block (4,194,304 trainable parameters for Llama-2-7B,
//    6,553,600 for Llama-2-13B).
// Figure: torch.cuda.max_memory_allocated()/1e9 printed after train(), a maximum over the whole run.
#define LITGPT_PLAN(MB, SEQ, GA)                                                                                 \
  R"({"fsdp_version":1,"sharding_strategy":"FULL_SHARD","activation_checkpointing":"full","implementation":"litgpt",)" \
  R"("param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16","optimizer":"adamw","micro_batch":)" #MB \
  R"(,"seq_len":)" #SEQ R"(,"grad_accum":)" #GA R"(,"grad_sync":false,"frozen_units":["root"],)"                  \
  R"("lora":{"rank":8,"targets":["q","v"],"dropout":0.05}})"
const char* kLitgptAssumes =
    "litgpt finetune/lora.py (8641822): FSDP1 FULL_SHARD use_orig_params, full AC per Block, bf16-true, AdamW; "
    "grad_accum = 128 / micro_batch under fabric.no_backward_sync -> FSDP no_sync (unsharded flat grads of every "
    "Block kept until the last micro-batch); root (wte, ln_f, lm_head) frozen (lora_head False); seq_len = longest "
    "alpaca sample for the Llama-2 tokenizer (1304) for every micro-batch (only the first micro-batch is forced to "
    "it: later ones are random alpaca batches, shorter: activations over-predicted, more with larger micro-batches); "
    "figure = max_memory_allocated/1e9 over the whole run -> max(first, steady) peak allocated";

// torchtune (2024-09 table: FSDP2, compile; 2024-05: FSDP1), pure bf16, AC per layer, Hugging Face-like
// modules (implementation "hf"). The 2024-09 configs' loss is CEWithChunkedOutputLoss (cross_entropy "chunked",
// 8 chunks); the 2024-05 recipe (0217d44c) computes CrossEntropyLoss on the whole logits (cross_entropy torch). Its "peak memory" column: which statistic (training.get_memory_stats logs
// peak_memory_active / alloc / reserved, reset every logged step) is not stated; compared with peak
// allocated, the reserved prediction printed beside it. LoRA (both tables): lora_attn_modules q_proj, k_proj,
// v_proj, rank 16, no MLP / output LoRA (recipes/configs/llama2/70B_lora.yaml at 0217d44c,
// llama3_1/70B_lora.yaml at 30b8519e): 80 x (16 x (8192 + 8192) + 2 x 16 x (8192 + 1024)) = 44,564,480
// trainable parameters; lora_dropout 0.05 in 2024-05 (lora_llama2_70b's default, the config sets none), 0.0
// in 2024-09 (the config's): plan lora {"rank": 16, "targets": ["q", "k", "v"], "dropout": ...}.
const Mapping kRows[] = {
    {"gt0448", "llama3-70b", "8xA100-80GB",
     R"({"fsdp_version":2,"micro_batch":2,"seq_len":2048,"activation_checkpointing":"full","compile":true,
         "implementation":"hf","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16",
         "cpu_offload":true,"optimizer_impl":"fused","free_logits_before_backward":true,
         "cross_entropy":"chunked","cross_entropy_chunks":8,
         "auto_wrap_policy":{"modules":["layers.*","embed_tokens","lm_head"]}})",
     Kind::Allocated, "FSDP2 full-FT cpu_offload AC mb2 s2048 bf16",
     "Llama 3.1 70B as llama3-70b; A100 80GB (record: assumed); packed 2048 (README note); llama3_1/70B_full.yaml "
     "(30b8519): fsdp_cpu_offload (params, grads, optimizer on CPU; fused AdamW on CPU), custom_sharded_layers "
     "tok_embeddings and output -> their own FSDP units (layers.*, embed_tokens, lm_head); full_finetune_distributed.py "
     "`del logits` before backward; loss CEWithChunkedOutputLoss (num_output_chunks 8, set_num_output_chunks -> "
     "TransformerDecoder.chunked_output) -> cross_entropy chunked, 8 chunks; approximate: compile_loss compiles "
     "compute_cross_entropy, modelled as eager (fp32 copy and log-softmax per chunk), and the output unit, called "
     "once per chunk by chunked_output (an FSDP2 unshard and reduce-scatter per call), modelled as called once; "
     "figure read as peak allocated in GiB",
     nullptr},
    {"gt0449", "llama3-70b", "8xA100-80GB",
     R"({"fsdp_version":2,"micro_batch":2,"seq_len":2048,"activation_checkpointing":"full","compile":true,
         "implementation":"hf","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16",
         "optimizer_impl":"fused","free_logits_before_backward":true,"frozen_units":["root"],
         "cross_entropy":"chunked","cross_entropy_chunks":8,
         "lora":{"rank":16,"targets":["q","k","v"],"dropout":0.0}})",
     Kind::Allocated, "FSDP2 LoRA AC mb2 s2048 bf16",
     "Llama 3.1 70B as llama3-70b; A100 80GB (assumed); packed 2048 (README note); llama3_1/70B_lora.yaml (30b8519): "
     "LoRA r16 on q,k,v, fused AdamW; layers.* sharded, root (embedding, norm, output) frozen and kept unsharded "
     "after forward (FSDP2 root); lora_finetune_distributed.py `del logits` before backward; loss "
     "CEWithChunkedOutputLoss (8 chunks) -> cross_entropy chunked, 8 chunks (the frozen output: no weight "
     "gradient); approximate: the compiled compute_cross_entropy modelled as eager; figure read as peak allocated "
     "in GiB",
     nullptr},
    {"gt0450", "", "", "", Kind::Allocated, "", "", "QLoRA (4-bit NF4 base weights) is not modelled"},
    {"gt0451", "", "", "", Kind::Allocated, "", "", "RTX 4090 24GB: no built-in GPU profile / cluster"},
    {"gt0452", "", "", "", Kind::Allocated, "", "", "RTX 4090 24GB: no built-in GPU profile / cluster"},
    {"gt0453", "llama2-70b", "8xA100-80GB",
     R"({"fsdp_version":1,"sharding_strategy":"FULL_SHARD","micro_batch":4,"seq_len":512,"activation_checkpointing":"full",
         "implementation":"hf","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16",
         "use_orig_params":false,"frozen_units":["root"],"lora":{"rank":16,"targets":["q","k","v"],"dropout":0.05}})",
     Kind::Allocated, "FSDP1 LoRA AC mb4 s512 bf16",
     "A100 80GB (assumed); lora_finetune_distributed.py (0217d44c): FSDP1 FULL_SHARD with FSDP's default "
     "use_orig_params=False, lora_fsdp_wrap_policy wraps every LoRA A/B linear in its own unit -> the frozen flat "
     "params get no gradient (use_orig_params false: the adapters' gradients only; root frozen); "
     "llama2/70B_lora.yaml: LoRA r16 on q,k,v; batch_size 4 per the README row; seq_len 512 = alpaca_dataset's "
     "default max_seq_len (torchtune/datasets/_alpaca.py, not overridden by the config; unpacked, padded to the "
     "batch's longest, so at most 512; the README's 'Seq Length = 4096' is not reachable with alpaca); figure read "
     "as peak allocated in GB (get_memory_stats divides by 1e9 at this commit)",
     nullptr},
    {"gt0454", "", "", "", Kind::Allocated, "", "", "PagedAdamW (bitsandbytes) optimizer is not modelled"},
    {"gt0483", "", "", "", Kind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0484", "", "", "", Kind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0485", "", "", "", Kind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0486", "", "", "", Kind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0487", "", "", "", Kind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0488", "", "", "", Kind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0489", "", "", "", Kind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0490", "", "", "", Kind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0491", "", "", "", Kind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0492", "", "", "", Kind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0507", "", "", "", Kind::Allocated, "", "", "phi-1.5 is not in the model zoo"},
    {"gt0508", "", "", "", Kind::Allocated, "", "", "phi-1.5 is not in the model zoo"},
    {"gt0509", "", "", "", Kind::Allocated, "", "", "phi-1.5 is not in the model zoo"},
    {"gt0510", "", "", "", Kind::Allocated, "", "", "StableLM Alpha 3B is not in the model zoo"},
    {"gt0511", "", "", "", Kind::Allocated, "", "", "StableLM Alpha 3B is not in the model zoo"},
    {"gt0512", "", "", "", Kind::Allocated, "", "", "StableLM Alpha 3B is not in the model zoo"},
    {"gt0513", "llama2-7b", "2xA100-40GB", LITGPT_PLAN(1, 1304, 128), Kind::Allocated, "FSDP1 LoRA AC mb1 s1304 bf16-true",
     kLitgptAssumes, nullptr},
    {"gt0514", "llama2-7b", "2xA100-40GB", LITGPT_PLAN(2, 1304, 64), Kind::Allocated, "FSDP1 LoRA AC mb2 s1304 bf16-true",
     kLitgptAssumes, nullptr},
    {"gt0515", "llama2-7b", "2xA100-40GB", LITGPT_PLAN(4, 1304, 32), Kind::Allocated, "FSDP1 LoRA AC mb4 s1304 bf16-true",
     kLitgptAssumes, nullptr},
    {"gt0516", "llama2-13b", "2xA100-40GB", LITGPT_PLAN(1, 1304, 128), Kind::Allocated, "FSDP1 LoRA AC mb1 s1304 bf16-true",
     kLitgptAssumes, nullptr},
    {"gt0517", "llama2-13b", "4xA100-40GB", LITGPT_PLAN(1, 1304, 128), Kind::Allocated, "FSDP1 LoRA AC mb1 s1304 bf16-true",
     kLitgptAssumes, nullptr},
    {"gt0518", "", "", "", Kind::Allocated, "", "",
     "only a ratio ('3x more memory' than plain FSDP), no absolute per-GPU figure"},
};


// The memory figure of a record: value in bytes (or OOM), and the unit's assumption.
struct Figure {
  bool present = false;
  bool oom = false;
  double bytes = 0;
  std::string key, unit;
};

[[noreturn]] void malformed(const std::string& path, int line_no, const std::string& why) {
  std::cerr << "calibrate_devset_memory: malformed data file " << path << " line " << line_no << ": " << why << "\n";
  std::exit(2);
}

Figure memory_figure(const nlohmann::json& m) {
  Figure f;
  struct K {
    const char* key;
    double scale;
    const char* unit;
  };
  for (const K& k : {K{"max_gpu_ram_gb", 1e9, "GB (1e9)"}, K{"peak_memory_gb", 1e9, "GB (1e9)"},
                     K{"peak_memory_gib", 1073741824.0, "GiB (2^30)"}}) {
    if (!m.contains(k.key)) continue;
    f.present = true;
    f.key = k.key;
    f.unit = k.unit;
    const auto& v = m[k.key];
    if (v.is_string() && v.get<std::string>() == "OOM")
      f.oom = true;
    else if (v.is_number())
      f.bytes = v.get<double>() * k.scale;
    else
      throw std::runtime_error(std::string("metric ") + k.key + " is neither a number nor \"OOM\"");
    return f;
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path =
      argc > 1 ? argv[1] : std::string(FSDPSIM_SOURCE_DIR) + "/tests/calibrate/data/published_dev_set_2.jsonl";
  std::ifstream in(path);
  if (!in) {
    std::cerr << "calibrate_devset_memory: cannot read " << path << "\n";
    return 2;
  }
  std::vector<nlohmann::json> records;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      malformed(path, line_no, e.what());
    }
    if (!j.is_object() || !j.contains("id") || !j["id"].is_string()) malformed(path, line_no, "no string \"id\"");
    if (!j.contains("metrics") || !j["metrics"].is_object()) malformed(path, line_no, "no object \"metrics\"");
    if (!j.contains("source") || !j["source"].is_string()) malformed(path, line_no, "no string \"source\"");
    try {
      memory_figure(j["metrics"]);
    } catch (const std::exception& e) {
      malformed(path, line_no, e.what());
    }
    records.push_back(j);
  }
  if (records.empty()) {
    std::cerr << "calibrate_devset_memory: no records in " << path << "\n";
    return 2;
  }
  std::map<std::string, const Mapping*> by_id;
  for (const auto& r : kRows) by_id[r.id] = &r;

  std::printf("fsdpsim peak-memory prediction vs published memory records (%s)\n", path.c_str());
  std::printf("Assumptions common to all rows:\n"
              "  - like with like: allocated figure vs fsdpsim peak_allocated, reserved vs peak_reserved, nvidia-smi vs\n"
              "    peak_total_device (reserved + CUDA context); a whole-run maximum vs max(first-step, steady-step) peak\n"
              "  - GB = 1e9 bytes, GiB = 2^30 bytes, per the record's metric key; printed figures in GB (1e9)\n"
              "  - built-in hardware profiles and clusters; no constant tuned, no correction factor\n"
              "  - 'ran' = the source reports a figure (the run completed); OOM rows compare only the fits verdict\n"
              "  - fits = fsdpsim SimResult::fits with SimOptions defaults (memory_margin 0: peak_total_device <= capacity)\n"
              "  - pred rsv = max(first, steady) peak_reserved, printed for reference (torchtune rows: which peak is uncertain)\n\n");
  std::printf("%-7s %-11s %-12s %-44s %-9s %9s %9s %9s %8s %-5s %-4s\n", "id", "model", "cluster", "plan", "kind",
              "meas GB", "pred GB", "pred rsv", "err%", "fits", "ran");

  struct Stat {
    int n = 0;
    double abs_sum = 0;
    int verdict_ok = 0, verdicts = 0;
  };
  std::map<std::string, Stat> per_source;
  std::vector<std::pair<std::string, std::string>> skipped;
  std::vector<std::pair<std::string, std::string>> assumptions;
  for (const auto& j : records) {
    const std::string id = j["id"].get<std::string>();
    const std::string source = j["source"].get<std::string>();
    const Figure fig = memory_figure(j["metrics"]);
    auto it = by_id.find(id);
    if (it == by_id.end()) {
      skipped.push_back({id, fig.present ? "memory record with no mapping in devset_memory.cpp"
                                         : "no per-GPU memory figure in bytes"});
      continue;
    }
    const Mapping& r = *it->second;
    if (r.skip) {
      skipped.push_back({id, r.skip});
      continue;
    }
    if (!fig.present) {
      skipped.push_back({id, "mapped, but the record has no memory figure"});
      continue;
    }
    try {
      calibrate::Cluster c = calibrate::load_cluster(r.cluster);
      auto hw = calibrate::HardwareProfile::for_cluster(c);
      const models::ModelSpec model = models::load_model(r.model);
      nlohmann::json pj = nlohmann::json::parse(r.plan);
      std::string extra;
      if (pj.contains("lora")) {
        const sim::Plan parsed = sim::load_plan(pj.dump());
        const models::WrapGraph g = models::build_wrap_graph(model, parsed.auto_wrap_policy);
        const models::TrainableSet ts = sim::lowering::plan_trainable_set(model, g, parsed);
        char b[160];
        std::snprintf(b, sizeof b, "; LoRA r%lld on %s: %lld trainable", static_cast<long long>(parsed.lora.rank),
                      pj["lora"]["targets"].dump().c_str(), static_cast<long long>(ts.trainable));
        extra = b;
      }
      sim::Plan plan = sim::resolve_plan(sim::load_plan(pj.dump()), c.world(), c.gpus_per_node);
      sim::SimOptions opts;
      opts.record_trace = false;
      opts.record_memory_timeline = false;
      const auto res = sim::simulate(model, hw, plan, opts);
      const double alloc = static_cast<double>(std::max(res.peak_allocated, res.first_step_peak_allocated));
      const double rsv = static_cast<double>(std::max(res.peak_reserved, res.first_step_peak_reserved));
      const double predicted = r.kind == Kind::Allocated ? alloc
                               : r.kind == Kind::Reserved ? rsv
                                                          : rsv + static_cast<double>(res.context_bytes);
      Stat& s = per_source[source];
      const bool ran = !fig.oom;
      s.verdicts++;
      if (res.fits == ran) s.verdict_ok++;
      if (fig.oom) {
        std::printf("%-7s %-11s %-12s %-44s %-9s %9s %9.2f %9.2f %8s %-5s %-4s\n", id.c_str(), r.model, r.cluster,
                    r.summary, kind_name(r.kind), "OOM", predicted / 1e9, rsv / 1e9, "-", res.fits ? "yes" : "NO",
                    "no");
      } else {
        const double err = 100.0 * (predicted - fig.bytes) / fig.bytes;
        s.n++;
        s.abs_sum += std::fabs(err);
        std::printf("%-7s %-11s %-12s %-44s %-9s %9.2f %9.2f %9.2f %+8.1f %-5s %-4s\n", id.c_str(), r.model, r.cluster,
                    r.summary, kind_name(r.kind), fig.bytes / 1e9, predicted / 1e9, rsv / 1e9, err,
                    res.fits ? "yes" : "NO", "yes");
      }
      assumptions.push_back({id, std::string(r.assumes) + "; metric " + fig.key + " in " + fig.unit + extra});
    } catch (const std::exception& e) {
      skipped.push_back({id, std::string("simulation failed: ") + e.what()});
    }
  }

  std::printf("\nPer source (err%% = (predicted - measured) / measured; OOM rows count only in the fits verdicts):\n");
  int compared = 0;
  for (const auto& [src, s] : per_source) {
    compared += s.verdicts;
    std::printf("  %-55s rows %2d  MAE %6.1f%%  fits verdict agrees %d/%d\n", src.c_str(), s.n,
                s.n ? s.abs_sum / s.n : 0.0, s.verdict_ok, s.verdicts);
  }
  std::printf("\nAssumptions per compared row:\n");
  for (const auto& [id, a] : assumptions) std::printf("  %s: %s\n", id.c_str(), a.c_str());
  std::printf("\nSkipped (%zu of %zu records):\n", skipped.size(), records.size());
  for (const auto& [id, why] : skipped) std::printf("  %s: %s\n", id.c_str(), why.c_str());
  std::printf("\nCompared %d of %zu records.\n", compared, records.size());
  return 0;
}

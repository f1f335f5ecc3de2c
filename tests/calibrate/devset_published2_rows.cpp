// The rows of published-dev-set-2.jsonl as their sources imply them (devset_published2_rows.h).
#include "tests/calibrate/devset_published2_rows.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include "models/model_spec.h"
#include "models/wrap_graph.h"
#include "program/lower_context.h"
#include "program/plan.h"

namespace fsdpsim::devset {
namespace {

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

// The same table's Phi-1.5 and StableLM-Base-Alpha-3B rows (litgpt's configs: parallel_residual, LayerNorm,
// GptNeoxMLP, partial RoPE; Phi-1.5 with shared_attention_norm; lit_gpt/config.py at 8641822). resource-tables.md
// (e567dbe) gives each tokenizer's longest alpaca sample, the one the first micro-batch is forced to: phi1.5 1044
// tokens, StableLM Alpha 1034 (Llama 2 1304).
const char* kLitgptSmallVocabAssumes =
    "litgpt finetune/lora.py (8641822): FSDP1 FULL_SHARD use_orig_params, full AC per Block, bf16-true, AdamW; "
    "grad_accum = 128 / micro_batch under fabric.no_backward_sync -> FSDP no_sync; root frozen (lora_head False); "
    "litgpt's parallel-residual Block with partial RoPE (Phi-1.5: one shared norm); seq_len = the longest alpaca "
    "sample for the model's tokenizer, as resource-tables.md states it (phi1.5 1044, StableLM Alpha 1034 tokens), for "
    "every micro-batch (only the first is forced to it); figure = max_memory_allocated/1e9 over the whole run -> "
    "max(first, steady) peak allocated";

// Time (litgpt's "time for 1k iterations"): finetune/lora.py's loop counts one iteration per micro-batch
// (iter_num over get_batch of micro_batch_size samples; the optimizer steps every 128 / micro_batch of them),
// so the simulated figure is the step time over grad_accum. Only the first micro-batch is forced to the longest
// sample (get_batch's longest_seq_ix); the others are random alpaca samples padded to the longest in the
// micro-batch, whose lengths the record does not give: the time rows run at an assumed 512.
const char* kLitgptTimePatch = R"({"seq_len":512})";
const char* kLitgptTimeAssumes =
    "time per micro-batch iteration = step time / grad_accum (an optimizer step every 128 / micro_batch iterations); "
    "padded sample length assumed 512 (alpaca's lengths are not in the record: uncertain, the largest assumption)";

// torchtune (2024-09 table: FSDP2, compile; 2024-05: FSDP1), pure bf16, AC per layer, Hugging Face-like
// modules (implementation "hf"). The 2024-09 configs' loss is CEWithChunkedOutputLoss (cross_entropy "chunked",
// 8 chunks); the 2024-05 recipe (0217d44c) computes CrossEntropyLoss on the whole logits (cross_entropy torch). Its "peak memory" column: which statistic (training.get_memory_stats logs
// peak_memory_active / alloc / reserved, reset every logged step) is not stated; compared with peak
// allocated, the reserved prediction printed beside it. LoRA (both tables): lora_attn_modules q_proj, k_proj,
// v_proj, rank 16, no MLP / output LoRA (recipes/configs/llama2/70B_lora.yaml at 0217d44c,
// llama3_1/70B_lora.yaml at 30b8519e): 80 x (16 x (8192 + 8192) + 2 x 16 x (8192 + 1024)) = 44,564,480
// trainable parameters; lora_dropout 0.05 in 2024-05 (lora_llama2_70b's default, the config sets none), 0.0
// in 2024-09 (the config's): plan lora {"rank": 16, "targets": ["q", "k", "v"], "dropout": ...}.
// Compile and checkpointing in the 2024-09 recipes (full_ and lora_finetune_distributed.py _setup_model at 30b8519e):
// training.compile_model(model) runs before training.set_activation_checkpointing(model, ...); compile_model
// compiles each TransformerSelfAttentionLayer (torch >= 2.5; the whole model before 2.5), and the checkpoint wrapper
// then goes around the compiled layer: checkpoint(compile(layer)), activation_checkpointing.outside_compile.
// Assumed: the table ran torch >= 2.5 (nightlies then; the README recommends them), so per-layer compile.
const std::vector<Row> kRows = {
    {"gt0448", "llama3-70b", "8xA100-80GB",
     R"({"fsdp_version":2,"micro_batch":2,"seq_len":2048,"activation_checkpointing":{"mode":"full","outside_compile":true},"compile":true,
         "implementation":"hf","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16",
         "cpu_offload":true,"optimizer_impl":"fused","free_logits_before_backward":true,
         "cross_entropy":"chunked","cross_entropy_chunks":8,
         "auto_wrap_policy":{"modules":["layers.*","embed_tokens","lm_head"]}})",
     MemoryKind::Allocated, "FSDP2 full-FT cpu_offload AC mb2 s2048 bf16",
     "Llama 3.1 70B as llama3-70b; A100 80GB (record: assumed); packed 2048 (README note); llama3_1/70B_full.yaml "
     "(30b8519): fsdp_cpu_offload (params, grads, optimizer on CPU; fused AdamW on CPU), custom_sharded_layers "
     "tok_embeddings and output -> their own FSDP units (layers.*, embed_tokens, lm_head); full_finetune_distributed.py "
     "`del logits` before backward; loss CEWithChunkedOutputLoss (num_output_chunks 8, set_num_output_chunks -> "
     "TransformerDecoder.chunked_output) -> cross_entropy chunked, 8 chunks; approximate: compile_loss compiles "
     "compute_cross_entropy, modelled as eager (fp32 copy and log-softmax per chunk), and the output unit, called "
     "once per chunk by chunked_output (an FSDP2 unshard and reduce-scatter per call), modelled as called once; "
     "figure read as peak allocated in GiB",
     nullptr, TimeMetric::TokensPerSecond},
    {"gt0449", "llama3-70b", "8xA100-80GB",
     R"({"fsdp_version":2,"micro_batch":2,"seq_len":2048,"activation_checkpointing":{"mode":"full","outside_compile":true},"compile":true,
         "implementation":"hf","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16",
         "optimizer_impl":"fused","free_logits_before_backward":true,"frozen_units":["root"],
         "cross_entropy":"chunked","cross_entropy_chunks":8,
         "lora":{"rank":16,"targets":["q","k","v"],"dropout":0.0}})",
     MemoryKind::Allocated, "FSDP2 LoRA AC mb2 s2048 bf16",
     "Llama 3.1 70B as llama3-70b; A100 80GB (assumed); packed 2048 (README note); llama3_1/70B_lora.yaml (30b8519): "
     "LoRA r16 on q,k,v, fused AdamW; layers.* sharded, root (embedding, norm, output) frozen and kept unsharded "
     "after forward (FSDP2 root); lora_finetune_distributed.py `del logits` before backward; loss "
     "CEWithChunkedOutputLoss (8 chunks) -> cross_entropy chunked, 8 chunks (the frozen output: no weight "
     "gradient); approximate: the compiled compute_cross_entropy modelled as eager; figure read as peak allocated "
     "in GiB; PyTorch 2.11 itself, on this plan in torchtitan's order (compile(checkpoint(layer))) at W = 8 (H200, fake process group, 2026-11-27; fixtures "
     "l70b-fsdp2-lora-r16-qkv-ac-mb2-hf and -compile), allocates 30.46 GiB without compile and 30.22 GiB with it, "
     "the simulator 30.46 and 29.83: the gap to the README's 27.6 GiB lies between this reading of the run and the "
     "published run, not in the model of the plan",
     nullptr, TimeMetric::TokensPerSecond},
    {"gt0450", "llama3.1-405b", "8xA100-80GB",
     R"({"fsdp_version":2,"micro_batch":2,"seq_len":2048,"activation_checkpointing":{"mode":"full","outside_compile":true},"compile":true,
         "implementation":"hf","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16",
         "optimizer_impl":"fused","free_logits_before_backward":true,"frozen_units":["root"],
         "lora":{"rank":16,"targets":["q","k","v","o","mlp"],"dropout":0.0,"quantize_base":"nf4"}})",
     MemoryKind::Allocated, "FSDP2 QLoRA(NF4) AC mb2 s2048 bf16",
     "Llama 3.1 405B as llama3.1-405b; A100 80GB (assumed); batch 2, packed 2048, compile (the README table's note); "
     "llama3_1/405B_qlora.yaml (30b8519): qlora_llama3_1_405b, LoRA r16 on q, k, v, output_proj and the MLP "
     "(apply_lora_to_mlp; lora_dropout the builder's 0.0), every block linear an NF4Tensor (torchao to_nf4, block 64, "
     "scalers per 256), the output projection, embedding and norms bf16; fused AdamW; loss torch.nn.CrossEntropyLoss "
     "on the .float() logits, `del logits` before backward; lora_finetune_distributed.py shard_model: fully_shard per "
     "layers.i and the root (embedding, norm, output: frozen, kept gathered from forward to backward as FSDP2 then "
     "did for the root); the compiled layers dequantize in one fused kernel; figure read as peak allocated in GiB (the "
     "README prints 'GB' on this row, GiB on the others); uncertain: the plan as described cannot allocate less than "
     "about 48.7 GiB: its NF4 shards (126 x 1,644,032,000 B / 8 = 24.11 GiB), the root's shard (0.98 GiB), the "
     "checkpointed layer inputs (126 x 2 x 2048 x 16384 x 2 B = 15.75 GiB) and the root's gathered embedding and "
     "output (7.83 GiB) alone; at the config's batch_size 1 the prediction is 47.46 GiB",
     nullptr, TimeMetric::TokensPerSecond},
    {"gt0451", "llama2-7b", "2xRTX4090",
     R"({"fsdp_version":1,"sharding_strategy":"FULL_SHARD","micro_batch":4,"seq_len":512,"activation_checkpointing":"none",
         "implementation":"hf","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16","grad_accum":32,
         "grad_sync":true,"use_orig_params":false,"frozen_units":["root"],"lora":{"rank":8,"targets":["q","v"],"dropout":0.05}})",
     MemoryKind::Allocated, "FSDP1 LoRA mb4 s512 bf16",
     "RTX 4090 24GB (built-in profile RTX4090, PCIe4 without peer-to-peer); lora_finetune_distributed.py (0217d44c): "
     "FSDP1 FULL_SHARD, FSDP's default use_orig_params=False, mixed_precision None with the model in bf16, "
     "lora_fsdp_wrap_policy (LoRA linears wrapped apart: the frozen layers have no gradient), gradient accumulation "
     "without no_sync (a reduce-scatter every micro-batch); llama2/7B_lora.yaml: lora_llama2_7b r 8 on q_proj and "
     "v_proj (dropout 0.05, the builder's default), enable_activation_checkpointing False (the record says on: the "
     "config at the cited commit says off), gradient_accumulation_steps 32, alpaca_cleaned_dataset at its default "
     "max_seq_len 512 (the README's 'Seq Length = 2048' is not reachable with it); batch 4 per the README row; figure "
     "read as peak allocated in GB; uncertain: with checkpointing on, as the record says, the prediction is 9.68 GB "
     "(-40%): the measured 16.2 GB lies between the two readings",
     nullptr, TimeMetric::TokensPerSecond},
    {"gt0452", "llama2-7b", "4xRTX4090",
     R"({"fsdp_version":1,"sharding_strategy":"FULL_SHARD","micro_batch":4,"seq_len":512,"activation_checkpointing":"full",
         "implementation":"hf","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16"})",
     MemoryKind::Allocated, "FSDP1 full-FT AC mb4 s512 bf16",
     "RTX 4090 24GB (built-in profile RTX4090, PCIe4 without peer-to-peer); full_finetune_distributed.py (0217d44c): "
     "FSDP1 FULL_SHARD wrapping each TransformerDecoderLayer (memory_efficient_fsdp_wrap False), the model in bf16 "
     "(params, gradients and torch.optim.AdamW's states bf16), activation checkpointing per layer; llama2/7B_full.yaml "
     "with alpaca_dataset at its default max_seq_len 512; batch 4 per the README row (the config says 2); figure read "
     "as peak allocated in GB; uncertain: at the README's 2048 tokens the prediction is 17.46 GB allocated and 24.13 GB "
     "reserved (the measured 24.1 GB is then the reserved figure, at the card's limit: the README does not say which "
     "peak it prints); the predicted peak is AdamW's step (foreach temporaries over the sharded states)",
     nullptr, TimeMetric::TokensPerSecond},
    {"gt0453", "llama2-70b", "8xA100-80GB",
     R"({"fsdp_version":1,"sharding_strategy":"FULL_SHARD","micro_batch":4,"seq_len":512,"activation_checkpointing":"full",
         "implementation":"hf","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16",
         "use_orig_params":false,"frozen_units":["root"],"lora":{"rank":16,"targets":["q","k","v"],"dropout":0.05}})",
     MemoryKind::Allocated, "FSDP1 LoRA AC mb4 s512 bf16",
     "A100 80GB (assumed); lora_finetune_distributed.py (0217d44c): FSDP1 FULL_SHARD with FSDP's default "
     "use_orig_params=False, lora_fsdp_wrap_policy wraps every LoRA A/B linear in its own unit -> the frozen flat "
     "params get no gradient (use_orig_params false: the adapters' gradients only; root frozen); "
     "llama2/70B_lora.yaml: LoRA r16 on q,k,v; batch_size 4 per the README row; seq_len 512 = alpaca_dataset's "
     "default max_seq_len (torchtune/datasets/_alpaca.py, not overridden by the config; unpacked, padded to the "
     "batch's longest, so at most 512; the README's 'Seq Length = 4096' is not reachable with alpaca); figure read "
     "as peak allocated in GB (get_memory_stats divides by 1e9 at this commit)",
     nullptr, TimeMetric::TokensPerSecond},
    {"gt0454", "llama2-70b", "8xA100-80GB",
     R"({"fsdp_version":1,"sharding_strategy":"FULL_SHARD","micro_batch":4,"seq_len":4096,"activation_checkpointing":"full",
         "implementation":"hf","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16",
         "use_orig_params":false,"optimizer":"bnb_paged_adamw"})",
     MemoryKind::Allocated, "FSDP1 full-FT AC mb4 s4096 bf16 PagedAdamW",
     "A100 80GB (assumed); torchtune 0217d44c has no 70B full-finetune config: the README row's batch 4 x seq 4096 "
     "taken as stated (an upper bound if the dataset is alpaca at its default max_seq_len 512, as for gt0453); "
     "full_finetune_distributed.py (0217d44c): FSDP1 FULL_SHARD per TransformerDecoderLayer, FSDP's default "
     "use_orig_params=False, mixed_precision None with the model in bf16; the README's '*' = bitsandbytes PagedAdamW "
     "(32-bit states, float32, each FlatParameter shard's paged: unified memory, not in PyTorch's allocated figure); "
     "figure read as peak allocated in GB (get_memory_stats divides by 1e9 at this commit)",
     nullptr, TimeMetric::TokensPerSecond, "{}", "the paged state's page traffic is not timed"},
    {"gt0483", "", "", "", MemoryKind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0484", "", "", "", MemoryKind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0485", "", "", "", MemoryKind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0486", "", "", "", MemoryKind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0487", "", "", "", MemoryKind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0488", "", "", "", MemoryKind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0489", "", "", "", MemoryKind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0490", "", "", "", MemoryKind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0491", "", "", "", MemoryKind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0492", "", "", "", MemoryKind::Allocated, "", "", "max-batch-that-fit figure on Titan RTX (no profile); seq_len unknown"},
    {"gt0507", "phi-1.5", "2xA100-40GB", LITGPT_PLAN(1, 1044, 128), MemoryKind::Allocated, "FSDP1 LoRA AC mb1 s1044 bf16-true",
     kLitgptSmallVocabAssumes, nullptr, TimeMetric::SecondsPerMicroBatchIteration, kLitgptTimePatch, kLitgptTimeAssumes},
    {"gt0508", "phi-1.5", "2xA100-40GB", LITGPT_PLAN(2, 1044, 64), MemoryKind::Allocated, "FSDP1 LoRA AC mb2 s1044 bf16-true",
     kLitgptSmallVocabAssumes, nullptr, TimeMetric::SecondsPerMicroBatchIteration, kLitgptTimePatch, kLitgptTimeAssumes},
    {"gt0509", "phi-1.5", "2xA100-40GB", LITGPT_PLAN(4, 1044, 32), MemoryKind::Allocated, "FSDP1 LoRA AC mb4 s1044 bf16-true",
     kLitgptSmallVocabAssumes, nullptr, TimeMetric::SecondsPerMicroBatchIteration, kLitgptTimePatch, kLitgptTimeAssumes},
    {"gt0510", "stablelm-alpha-3b", "2xA100-40GB", LITGPT_PLAN(1, 1034, 128), MemoryKind::Allocated, "FSDP1 LoRA AC mb1 s1034 bf16-true",
     kLitgptSmallVocabAssumes, nullptr, TimeMetric::SecondsPerMicroBatchIteration, kLitgptTimePatch, kLitgptTimeAssumes},
    {"gt0511", "stablelm-alpha-3b", "2xA100-40GB", LITGPT_PLAN(2, 1034, 64), MemoryKind::Allocated, "FSDP1 LoRA AC mb2 s1034 bf16-true",
     kLitgptSmallVocabAssumes, nullptr, TimeMetric::SecondsPerMicroBatchIteration, kLitgptTimePatch, kLitgptTimeAssumes},
    {"gt0512", "stablelm-alpha-3b", "2xA100-40GB", LITGPT_PLAN(4, 1034, 32), MemoryKind::Allocated, "FSDP1 LoRA AC mb4 s1034 bf16-true",
     kLitgptSmallVocabAssumes, nullptr, TimeMetric::SecondsPerMicroBatchIteration, kLitgptTimePatch, kLitgptTimeAssumes},
    {"gt0513", "llama2-7b", "2xA100-40GB", LITGPT_PLAN(1, 1304, 128), MemoryKind::Allocated, "FSDP1 LoRA AC mb1 s1304 bf16-true",
     kLitgptAssumes, nullptr, TimeMetric::SecondsPerMicroBatchIteration, kLitgptTimePatch,
     kLitgptTimeAssumes},
    {"gt0514", "llama2-7b", "2xA100-40GB", LITGPT_PLAN(2, 1304, 64), MemoryKind::Allocated, "FSDP1 LoRA AC mb2 s1304 bf16-true",
     kLitgptAssumes, nullptr, TimeMetric::SecondsPerMicroBatchIteration, kLitgptTimePatch,
     kLitgptTimeAssumes},
    {"gt0515", "llama2-7b", "2xA100-40GB", LITGPT_PLAN(4, 1304, 32), MemoryKind::Allocated, "FSDP1 LoRA AC mb4 s1304 bf16-true",
     kLitgptAssumes, nullptr, TimeMetric::SecondsPerMicroBatchIteration, kLitgptTimePatch,
     kLitgptTimeAssumes},
    {"gt0516", "llama2-13b", "2xA100-40GB", LITGPT_PLAN(1, 1304, 128), MemoryKind::Allocated, "FSDP1 LoRA AC mb1 s1304 bf16-true",
     kLitgptAssumes, nullptr, TimeMetric::SecondsPerMicroBatchIteration, kLitgptTimePatch,
     kLitgptTimeAssumes},
    {"gt0517", "llama2-13b", "4xA100-40GB", LITGPT_PLAN(1, 1304, 128), MemoryKind::Allocated, "FSDP1 LoRA AC mb1 s1304 bf16-true",
     kLitgptAssumes, nullptr, TimeMetric::SecondsPerMicroBatchIteration, kLitgptTimePatch,
     kLitgptTimeAssumes},
    {"gt0518", "", "", "", MemoryKind::Allocated, "", "",
     "only a ratio ('3x more memory' than plain FSDP), no absolute per-GPU figure"},
};


}  // namespace

const char* memory_kind_name(MemoryKind k) {
  return k == MemoryKind::Allocated ? "allocated" : k == MemoryKind::Reserved ? "reserved" : "nvidia-smi";
}

const std::vector<Row>& rows() { return kRows; }

std::vector<nlohmann::json> read_records(const std::string& path, const char* tool,
                                         const std::function<void(const nlohmann::json&)>& check) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << tool << ": cannot read " << path << "\n";
    std::exit(2);
  }
  std::vector<nlohmann::json> records;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      nlohmann::json j = nlohmann::json::parse(line);
      if (!j.is_object() || !j.contains("id") || !j["id"].is_string()) throw std::runtime_error("no string \"id\"");
      if (!j.contains("metrics") || !j["metrics"].is_object()) throw std::runtime_error("no object \"metrics\"");
      if (!j.contains("source") || !j["source"].is_string()) throw std::runtime_error("no string \"source\"");
      if (check) check(j);
      records.push_back(std::move(j));
    } catch (const std::exception& e) {
      std::cerr << tool << ": malformed data file " << path << " line " << line_no << ": " << e.what() << "\n";
      std::exit(2);
    }
  }
  if (records.empty()) {
    std::cerr << tool << ": no records in " << path << "\n";
    std::exit(2);
  }
  return records;
}

const Row* find_row(const std::string& id) {
  for (const Row& r : kRows)
    if (id == r.id) return &r;
  return nullptr;
}

nlohmann::json row_plan(const Row& r, const models::ModelSpec& model, bool for_time, std::string* note) {
  nlohmann::json pj = nlohmann::json::parse(r.plan);
  if (for_time) pj.merge_patch(nlohmann::json::parse(r.time_patch));
  if (note) note->clear();
  if (note && pj.contains("lora")) {
    const sim::Plan parsed = sim::load_plan(pj.dump());
    const models::WrapGraph g = models::build_wrap_graph(model, parsed.auto_wrap_policy, parsed.implementation);
    const models::TrainableSet ts = sim::lowering::plan_trainable_set(model, g, parsed);
    char b[200];
    std::snprintf(b, sizeof b, "LoRA r%lld on %s: %lld trainable parameters", static_cast<long long>(parsed.lora.rank),
                  pj["lora"]["targets"].dump().c_str(), static_cast<long long>(ts.trainable));
    *note = b;
  }
  return pj;
}

}  // namespace fsdpsim::devset

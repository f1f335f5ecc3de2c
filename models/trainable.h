// Which parameters train when a plan's trainable_fraction is below 1 (LoRA-like frozen weights, issue 19),
// and what autograd then sees in each part of the step.
//
// The rule (written here once; models/trainable.cpp): every parameter is frozen, then whole weight
// matrices of the transformer blocks are unfrozen kind by kind, in the order LoRA usually targets them
// (q and v, then the rest of attention, then the MLP; `Weight` below lists them in that order), each kind
// in all blocks while it fits, else in `count` evenly spaced blocks (i * L / count for i < count), until
// the trainable count is as close to trainable_fraction x total as whole matrices allow from below; below
// one matrix, the smallest matrix of block 0 trains. Norms, biases, the embedding and the LM head stay
// frozen. This is what the ground-truth harness does (scripts/torch_memory/parallel.py
// `freeze_to_fraction`, TRAIN_ORDER), on the weight matrices as the implementation recipe's code holds
// them (models/block_recipes.cpp: litgpt and torchtitan one fused qkv matrix, Hugging Face q, k, v).
// The fraction is taken to 6 decimals (what the harness records of the fraction it ran,
// scripts/torch_memory/train.py `plan_as_run`): a matrix that fits within 5e-7 x total of the target
// counts as fitting.
//
// What autograd then does (PyTorch): a weight that does not require grad gets no weight-gradient GEMM,
// and the input of a linear is saved only for its weight's gradient (tools/autograd/derivatives.yaml
// `mm` / `addmm`: `self` / `mat1` appears only in `mat2`'s formula; tools/autograd/gen_variable_type.py
// `emit_save_inputs` / `guard_for` saves it only under `grad_fn->should_compute_output(k)`, k the
// weight's edge); an op none of whose inputs requires grad records no graph and saves nothing
// (torch/csrc/autograd/functions/utils.h `compute_requires_grad`, which every generated VariableType
// kernel checks before it makes a grad_fn), so with a frozen embedding nothing is saved before the first
// trainable weight.
// GradFlow carries that per part of the step; models/autograd_tape.h and models/kernels.h follow it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/model_spec.h"

namespace fsdpsim::models {

// The weights of the step. The block's weight matrices come first, in the rule's unfreezing order
// (TRAIN_ORDER's kinds by role): Q, V, fused QKV, K, the attention output, the MLP's gate, up / first
// (plain MLP: Fc) and down matrices, then a MoE router and its experts (all experts' matrices as one
// kind; the harness builds dense models only). Norm weights and biases never train under the rule.
enum class Weight : std::uint8_t {
  Q, V, QKV, K, Out, Gate, Up, Fc, Down, Router, Experts,
  AttnNorm, MlpNorm,                 // the block's norm before attention / before the MLP (and any other norm)
  Embedding, FinalNorm, LmHead,      // outside the blocks
  Adapter,                           // LoRA adapters (plan key `lora`): every A and B matrix of the part
  Count
};
using WeightMask = std::uint32_t;
constexpr WeightMask weight_bit(Weight w) { return WeightMask{1} << static_cast<unsigned>(w); }
constexpr WeightMask kAllWeights = (WeightMask{1} << static_cast<unsigned>(Weight::Count)) - 1;

// What autograd sees in one part of the step (a transformer block, the embedding, the final norm and LM
// head): which of its weights require grad, and whether its input does (the embedding's input, token ids,
// never does). The default is full training.
struct GradFlow {
  WeightMask trains = kAllWeights;
  bool input_requires_grad = true;
  // A trained linear's or norm's bias trains too (full training; FSDP1's views of a FlatParameter that requires
  // grad). Not under a partial set trained per parameter (FSDP2): trainable_set's rule never trains a bias
  // (tensor_weight), and LoRA's base biases are frozen.
  bool biases_train = true;
  bool trains_weight(Weight w) const { return (trains & weight_bit(w)) != 0; }
  bool operator==(const GradFlow&) const = default;
};

// LoRA adapters (plan key `lora`, issue 19): a low-rank pair A (rank x in) and B (out x rank) beside each
// targeted linear of every block (and of the LM head when targeted); the base weights are frozen and only
// the adapters train. The adapter path is B(A(dropout(x))) * (alpha / rank) added to the base output
// (litgpt lit_gpt/lora.py LoRALinear.forward, torchtune torchtune/modules/peft/lora.py LoRALinear.forward,
// PEFT peft/tuners/lora/layer.py Linear.forward).
struct LoraShape {
  std::int64_t rank = 0;      // 0: no adapters
  WeightMask targets = 0;     // the adapted base weights: Q, K, V, Out, Gate, Up and Fc, Down, LmHead
  bool dropout = false;       // lora_dropout > 0: nn.Dropout runs in the adapter path (p = 0 returns x itself,
                              // aten/src/ATen/native/Dropout.cpp _dropout_impl)
  bool nf4 = false;           // QLoRA: every block linear's frozen base weight is stored in NF4 (models/nf4.h):
  bool nf4_bnb = false;       // as bitsandbytes' Params4bit (FSDP1) rather than torchao's NF4Tensor (FSDP2)
  bool on() const { return rank > 0; }
  bool adapts(Weight w) const { return rank > 0 && (targets & weight_bit(w)) != 0; }
  bool operator==(const LoraShape&) const = default;
};
// One adapter matrix as the implementation registers it: `base` the weight it adapts (QKV for litgpt's
// fused LoRAQKVLinear), shape [rows, cols] as nn.Parameter / nn.Linear.weight stores it.
struct AdapterMatrix {
  Weight base;
  std::int64_t rows, cols;
  bool is_a;                  // A (rank rows) or B (rank columns)
  std::int64_t numel() const { return rows * cols; }
};
// The adapters of one block (`head` false) or of the LM head, A then B per adapted linear, in the block's
// linear order. litgpt's CausalSelfAttention holds q, k and v in one LoRAQKVLinear (lit_gpt/lora.py at
// 8641822, LoRAQKVLinear.__init__): one A of (rank x #enabled, hidden) and one B of (the enabled parts'
// widths summed, rank); every other implementation (torchtune LoRALinear per projection, PEFT per
// target module) one pair per linear. A recipe with a fused q/k/v matrix other than litgpt's (GPT-2's
// c_attn, MPT's Wqkv, torchtitan's fused wqkv) adapts the whole matrix with one pair, as PEFT does for a
// target naming the fused module.
std::vector<AdapterMatrix> lora_adapters(const ModelSpec& m, ModelImpl impl, const LoraShape& l, bool head);

// The trainable set the rule gives for a plan's trainable_fraction (per parameter: what requires_grad
// says; FSDP1's flat parameters widen it, see program/lower_context.cpp grad_flows).
struct TrainableSet {
  bool all = true;                   // trainable_fraction 1: every parameter trains
  double fraction = 1.0;
  std::vector<WeightMask> layers;    // per block: the weight matrices that train (empty when `all`)
  std::int64_t trainable = 0;        // parameters that train (the rule's whole matrices)
  std::int64_t total = 0;            // all parameters (a tied weight once; adapters included)
  WeightMask outside = 0;            // weights outside the blocks that train (LoRA on the head: Adapter)
  LoraShape lora;                    // the plan's adapters (rank 0: none)
  std::vector<AdapterMatrix> block_adapters, head_adapters;   // lora_adapters of a block / of the head
  WeightMask layer(std::int64_t l) const { return all ? kAllWeights : layers[static_cast<std::size_t>(l)]; }
  // The first block with a trainable weight (n_layers when none; 0 when `all`).
  std::int64_t first_trained_layer() const;
};

// The rule above for `m` as `impl`'s code builds its blocks. fraction in (0, 1].
TrainableSet trainable_set(const ModelSpec& m, ModelImpl impl, double fraction);
// LoRA: every block's (and the head's, when targeted) adapters train, nothing else (litgpt
// mark_only_lora_as_trainable, torchtune set_trainable_params(get_adapter_params), PEFT
// _mark_only_adapters_as_trainable with bias "none").
TrainableSet lora_trainable_set(const ModelSpec& m, ModelImpl impl, const LoraShape& l);

// A parameter tensor of the module tree (ParamTensor::name, models/module_tree.cpp naming): the block it
// belongs to (-1 outside the blocks) and the weights whose training makes it train (a fused q/k/v tensor
// belongs to Q, K, V and QKV; MPT's plain MLP up_proj to Up and Fc; a norm to AttnNorm or MlpNorm; a
// linear's bias to none: biases never train under the rule; a name with "lora_" to Adapter).
struct TensorWeight {
  int layer = -1;
  WeightMask weights = 0;
};
TensorWeight tensor_weight(const std::string& name);
// Whether that tensor is stored in NF4 under `l` (QLoRA): a weight matrix of a block's linears (q, k, v or the
// fused qkv, the attention output, the MLP's), not a bias, a norm, an adapter, the embedding or the LM head
// (torchtune's lora_llama3_1 leaves its output projection in bf16: "quantize_base is not applied to final
// output_proj"; bitsandbytes' Hugging Face integration skips the LM head).
bool tensor_nf4(const LoraShape& l, const std::string& name);
// Whether that tensor requires grad under `s` (a tensor of a kind `s` trains in its block).
bool tensor_trains(const TrainableSet& s, const std::string& name);

// Fraction of the forward's matmul weights (ParamCounts::matmul_active: a MoE block's active experts and
// router, and the LM head) whose weights train under the per-block masks `layers` and `head`: the
// fraction whose weight-gradient GEMMs run (trained_flops_per_token).
double trained_matmul_fraction(const ModelSpec& m, ModelImpl impl, const std::vector<WeightMask>& layers, bool head);

}  // namespace fsdpsim::models

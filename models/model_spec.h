// ModelSpec: an exact description of a decoder-only transformer (design.md, models/).
// Everything here is about the model only: no parallelism, no hardware.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/units.h"

namespace fsdpsim::models {

enum class NormKind { RMSNorm, LayerNorm };          // LayerNorm has a bias, RMSNorm does not
enum class MlpKind { SwiGLU, GeGLU, Plain };         // gated (3 matrices) or plain (2 matrices, GELU)
enum class PositionKind { Rotary, Learned };         // learned = a [max_positions, hidden] table
// Norms on the attention's queries and keys: qwen3 normalizes each head (RMSNorm(head_dim), one weight
// shared by the heads, for q and for k); olmo2 normalizes all of q (RMSNorm(n_heads*head_dim)) and all of k
// (RMSNorm(n_kv_heads*head_dim)) (transformers modeling_qwen3.py / modeling_olmo2.py).
enum class QkNorm { None, PerHead, Full };

struct ModelSpec {
  std::string name;              // zoo name or the config's _name_or_path / file name
  std::string model_type;        // HF model_type: llama, mistral, qwen2, gemma, gpt2, mixtral
  std::string block_class;       // PyTorch class of one block, e.g. "LlamaDecoderLayer" (for wrap-policy exports)
  std::int64_t vocab_size = 0;
  std::int64_t hidden = 0;       // d_model
  std::int64_t n_layers = 0;
  std::int64_t n_heads = 0;
  std::int64_t n_kv_heads = 0;   // == n_heads for MHA, 1 for MQA
  std::int64_t head_dim = 0;     // usually hidden / n_heads (gemma: 256)
  std::int64_t ffn_hidden = 0;   // intermediate size (per expert for MoE)
  std::int64_t max_positions = 0;
  bool qkv_bias = false;         // qwen2: true; gpt2: true
  bool out_bias = false;         // attention output projection bias (gpt2)
  bool mlp_bias = false;         // gpt2
  bool norm_bias = true;         // LayerNorm only: false for MPT with no_bias (llm-foundry LPLayerNorm bias=None)
  bool conv1d_weights = false;   // GPT-2's Conv1D stores a weight as [in, out] instead of nn.Linear's [out, in]
  std::string hidden_act;        // "silu", "gelu", "gelu_new", ... (informative: FLOPs and bytes do not depend on it)
  NormKind norm = NormKind::RMSNorm;
  MlpKind mlp = MlpKind::SwiGLU;
  PositionKind positions = PositionKind::Rotary;
  bool tied_embeddings = false;
  std::int64_t n_experts = 0;    // 0 = dense MLP; >0 = MoE with a router
  std::int64_t experts_top_k = 0;
  // llm-foundry's MPT sizes its learned position table by max_seq_len, which its benchmark tables set
  // to the training sequence length; with_seq_len() below resizes the table for such models.
  bool positions_follow_seq_len = false;
  // Hidden-size norms in one block: 2 (before attention and before the MLP) for most; gemma2 also
  // normalizes after each (4); olmo2 only after each (2).
  std::int64_t block_norms = 2;
  QkNorm qk_norm = QkNorm::None;
  // Dropout probabilities, kept on in training (the model's train() mode). resid_dropout: nn.Dropout on each
  // residual branch (after the attention's output projection and after the MLP: GPT-2's resid_pdrop, MPT's
  // resid_pdrop); embd_dropout: after the embeddings (GPT-2's embd_pdrop, MPT's emb_pdrop). Each such dropout
  // saves a 1-byte mask per element for its backward (native_dropout). attn_dropout runs inside SDPA (its
  // flash / cuDNN / efficient kernels regenerate the mask from the philox seed: no tensor is saved): kept for
  // the record, it changes no byte.
  double resid_dropout = 0.0;
  double embd_dropout = 0.0;
  double attn_dropout = 0.0;
  // Parallel attention and MLP (GPT-NeoX's use_parallel_residual, Phi, litgpt's parallel_residual): both
  // branches read the block's input, y = x + attn(norm_1(x)) + mlp(norm_2(x)); with block_norms = 1 one norm
  // feeds both (Phi's input_layernorm, litgpt's shared_attention_norm).
  bool parallel_residual = false;
  // Head dimensions RoPE rotates (GPT-NeoX rotary_pct, Phi partial_rotary_factor, litgpt rotary_percentage
  // times head_dim); 0 = all of head_dim. The rest passes through and is concatenated back (a copy).
  std::int64_t rotary_dim = 0;
  bool lm_head_bias = false;     // Phi's lm_head is nn.Linear(bias=True)
  std::int64_t rope_dims() const { return rotary_dim > 0 ? rotary_dim : head_dim; }

  bool is_moe() const { return n_experts > 0; }
  // Field-by-field (defaulted, so new fields are compared too): sim::simulate keys its per-thread
  // wrap-graph cache on it.
  bool operator==(const ModelSpec&) const = default;
};

// For a model whose position table follows the training sequence length (positions_follow_seq_len,
// MPT in llm-foundry), a copy with max_positions = seq_len; any other model is returned unchanged.
ModelSpec with_seq_len(const ModelSpec& m, std::int64_t seq_len);

// Parameter counts, exact (see model_params.cpp for the per-tensor derivation).
struct ParamCounts {
  std::int64_t total = 0;
  std::int64_t embedding = 0;        // token embedding (+ learned positions)
  std::int64_t per_block = 0;        // one transformer block (all experts for MoE)
  std::int64_t blocks = 0;           // n_layers * per_block
  std::int64_t final_norm = 0;
  std::int64_t lm_head = 0;          // 0 when tied
  std::int64_t active_per_block = 0; // MoE: only top_k experts (+router); dense: == per_block
  std::int64_t positions = 0;        // learned position table (part of `embedding`)
  std::int64_t block_norms = 0;      // norm weights (+biases) of one block (part of `per_block`)
  std::int64_t block_biases = 0;     // linear biases of one block (part of `per_block`)
  // Weights of the matrix multiplies one token goes through (all blocks' linear weights, active
  // experts and router only, plus the LM head even when it is tied); no biases, norms or lookups.
  std::int64_t matmul_active = 0;
};
ParamCounts count_params(const ModelSpec& m);

// FLOPs per token (multiply-add = 2 FLOPs). Forward: 2 * (matmul params active per token, LM head
// included) + attention's sequence term 4 * n_layers * seq_len * n_heads * head_dim (QK^T and AV,
// no causal halving, as PaLM/llm-foundry count). fwd+bwd = 3 * forward. Derivation in model_flops.cpp.
struct FlopsPerToken {
  double forward = 0;
  double forward_backward = 0;
  double matmul_forward = 0;     // 2 * ParamCounts::matmul_active
  double attention_forward = 0;  // 4 * n_layers * seq_len * n_heads * head_dim
};
FlopsPerToken flops_per_token(const ModelSpec& m, std::int64_t seq_len);
// forward_backward FLOPs per token of the computation that runs when only `trainable_fraction` of the
// forward's matmul FLOPs have weights that train (LoRA-like, D5; the simulator passes
// models::trained_matmul_fraction of the weights autograd sees trainable, models/trainable.h): frozen
// weights skip their weight-gradient matmuls, which cost as much as the forward matmuls. MFU counts these
// (the model FLOPs of the work done).
double trained_flops_per_token(const ModelSpec& m, std::int64_t seq_len, double trainable_fraction);

enum class CheckpointMode { None, Full, SelectiveOp };

// Bytes saved for backward by ONE block for one micro-batch (b sequences of s tokens) with
// activations in `dtype`, under the checkpointing mode (formula and kernel assumptions in
// model_activations.cpp: flash/memory-efficient attention saves no S x S scores).
Bytes block_saved_activation_bytes(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len,
                                   Dtype dtype, CheckpointMode mode);
// Peak transient bytes of recomputing + back-propagating one block (what a checkpointed block
// needs on top of its saved input during its backward).
Bytes block_backward_working_bytes(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len, Dtype dtype);
// The gradient transients alone: the peak a block's backward adds on top of its saved activations
// when it was NOT checkpointed (max over its MLP and attention phases; model_activations.cpp).
Bytes block_backward_grad_bytes(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len, Dtype dtype);
// How the loss is computed, which decides what the logits cost in memory (model_activations.cpp):
//  * Torch: PyTorch's F.cross_entropy on the logits (the default of HF, torchtitan, Lightning);
//  * Fused: a fused cross-entropy kernel on the materialized logits that saves only the logits and a
//    per-token logsumexp (flash-attn's CrossEntropyLoss, llm-foundry's default `fused_crossentropy`);
//  * FusedLinear: the LM head and the loss fused and chunked over tokens, so the full logits never
//    exist (Liger-Kernel's LigerFusedLinearCrossEntropyLoss);
//  * Chunked: torchtune's CEWithChunkedOutputLoss on TransformerDecoder.chunked_output (torchtune at
//    30b8519e): the head projects each of `chunks` sequence chunks apart (bf16 logits chunks) and the loss
//    upcasts and runs F.cross_entropy one chunk at a time (program/lower_context.h LossMemory, lower_walk.cpp).
enum class LossImpl { Torch, Fused, FusedLinear, Chunked };
std::string loss_impl_name(LossImpl l);   // "torch", "fused", "fused_linear", "chunked"
// torchtune's CEWithChunkedOutputLoss default num_output_chunks (torchtune/modules/loss/ce_chunked_output_loss.py).
constexpr int kDefaultLossChunks = 8;

// The logits and the loss, held from the LM head's forward until the loss's backward (T = b*s tokens):
//  * Torch: T*V*bytes(dtype) for the logits the training loop holds, plus T*V*4 for the fp32
//    log-softmax output cross-entropy saves for its backward;
//  * Fused: T*V*bytes(dtype) for the logits plus T*4 for the logsumexp;
//  * FusedLinear: T*C*bytes(dtype) for the input gradient computed during the forward plus T*4;
//  * Chunked: as Torch, in chunks: the bf16 logits chunks and every chunk's saved fp32 log-softmax.
Bytes logits_bytes(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len, Dtype dtype,
                   LossImpl loss = LossImpl::Torch);
// The peak during the loss: logits_bytes plus the transient of computing it:
//  * Torch: the fp32 upcast copy (T*V*4; none when dtype is already fp32);
//  * Fused: the logits' gradient (T*V*bytes(dtype)) written by the backward;
//  * FusedLinear: one chunk's fp32 logits, chunk = ceil(T / ceil(V / C)) tokens (Liger's chunking);
//  * Chunked: one chunk's fp32 upcast copy (micro_batch x ceil(seq_len / chunks) rows; none for fp32).
Bytes logits_peak_bytes(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len, Dtype dtype,
                        LossImpl loss = LossImpl::Torch, int chunks = kDefaultLossChunks);
std::string checkpoint_mode_name(CheckpointMode mode);  // "none", "full", "selective_op"

// Which code implements the model (issue 19 item 3): the same architecture saves different tensors for
// backward in torchtitan's, Hugging Face transformers', litgpt's or a fused (Liger / compiled) block.
// models/implementation.cpp derives each recipe's saved tensors from that code.
// Runtime: fsdpsim's own bundled runtime (runtime/layers, runtime/cuda): one activation buffer per block laid
// out as models/model_activations.cpp's formula, and the logits with the loss's log-probabilities in one.
enum class ModelImpl { TorchTitan, HF, LitGPT, Fused, Runtime };
std::string model_impl_name(ModelImpl impl);   // "torchtitan", "hf", "litgpt", "fused", "runtime"
// torchao float8 training (Float8Linear; torchtitan's [float8]): how the linears' inputs are scaled.
enum class Float8Recipe { None, Tensorwise, Rowwise };
std::string float8_recipe_name(Float8Recipe r);   // "none", "tensorwise", "rowwise"

}  // namespace fsdpsim::models

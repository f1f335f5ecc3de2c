// Activation memory of one block, the logits and the loss (bytes, exact for the stated kernels).
//
// Legacy: the block functions below are one fixed assumption used for every model. It matches no
// framework's code exactly: it is torchtitan's block (models/implementation.cpp) without the per-block
// RoPE gather cache[positions] (T * d/2 * 8 B) that torchtitan's ComplexRoPE saves today
// (tests/models/test_implementation.cpp, LegacyAssumptionIsTorchtitanWithoutItsRopeGather). The
// per-recipe, per-tensor account is models/implementation.h.
//
// Notation: T = b*s tokens of a micro-batch, e = bytes of the activation dtype, h = hidden,
// a = n_heads, g = n_kv_heads, d = head_dim, f = ffn_hidden, E = n_experts, k = experts_top_k.
//
// Kernels assumed (what FSDP training stacks run: torchtitan, HF with sdpa/flash, llm-foundry):
//   * flash / memory-efficient SDPA: it saves q, k, v, its output and the fp32 logsumexp [b, a, s];
//     never the S x S score matrix;
//   * fused norms (F.rms_norm / F.layer_norm): save their input plus fp32 statistics per token
//     (RMSNorm: rstd, 4 B; LayerNorm: mean + rstd, 8 B);
//   * no dropout (p = 0, the pretraining default of llama-family configs; GPT-2's 0.1 would add a
//     1-byte mask per dropped element: not modelled);
//   * RoPE's cos/sin tables are computed once per model forward and shared by all blocks: not per block.
//
// What autograd saves for one block without checkpointing (elements per token, dtype e):
//   block input x (pre-attention norm input)            h
//   pre-attention norm output (input of q/k/v proj)     h
//   q, k, v after RoPE (SDPA inputs)                    (a + 2g) * d
//   attention output (SDPA output = o_proj input)       a * d     (one tensor, saved once)
//   residual after attention (pre-MLP norm input)       h
//   pre-MLP norm output (MLP / router input)            h
//   gated MLP: gate out (act input), act out, up out, product (down input)    4f
//   plain MLP: fc out (GELU input), GELU out (fc2 input)                      2f
//   MoE (per token, k expert slots): gathered input h, 4f of the expert's gated MLP (2f plain),
//     expert output h (multiplied by the routing weight); router: fp32 softmax probs [E], top-k int64
//     indices [k], fp32 normalised weights [k]
// plus fp32: two norms' statistics and the logsumexp (4a bytes per token).
//
// Full checkpointing (torch.utils.checkpoint around each block) saves only the block input: T*h*e.
// Selective op checkpointing (torchtitan's op-level SAC policy, fsdp-semantics.md A4): the block input,
// the outputs of SDPA (output + logsumexp) and of aten.mm, except every second mm counted in forward
// order within the block (1st, 3rd, 5th ... saved). Linears with a bias run aten.addmm, which that
// policy neither saves nor counts.
#include <algorithm>
#include <vector>

#include "models/model_spec.h"

namespace fsdpsim::models {
namespace {

struct BlockShape {
  double T, e, h, a, g, d, f, E, k;
};

BlockShape shape(const ModelSpec& m, std::int64_t b, std::int64_t s, Dtype dtype) {
  return {static_cast<double>(b) * static_cast<double>(s), static_cast<double>(dtype_bytes(dtype)),
          static_cast<double>(m.hidden),  static_cast<double>(m.n_heads),  static_cast<double>(m.n_kv_heads),
          static_cast<double>(m.head_dim), static_cast<double>(m.ffn_hidden), static_cast<double>(m.n_experts),
          static_cast<double>(m.experts_top_k)};
}

double norm_stats_bytes(const ModelSpec& m) { return m.norm == NormKind::RMSNorm ? 4.0 : 8.0; }
double mlp_saved_elems(const ModelSpec& m, double f) { return m.mlp == MlpKind::Plain ? 2 * f : 4 * f; }

// Bytes per token, split by where they live in the block (backward frees them in reverse order).
struct SavedPerToken {
  double input = 0;      // block input
  double attention = 0;  // pre-attention norm output + stats, q/k/v, attention output, logsumexp
  double mlp = 0;        // residual, pre-MLP norm output + stats, MLP or MoE tensors
};

SavedPerToken saved_none(const ModelSpec& m, const BlockShape& x) {
  SavedPerToken p;
  p.input = x.h * x.e;
  p.attention = (x.h + (x.a + 2 * x.g) * x.d + x.a * x.d) * x.e + norm_stats_bytes(m) + 4 * x.a;
  // the MLP's norm: its input (the residual h) and output; a parallel block's norm_2 reads x (counted as the
  // input), and one shared norm (Phi) adds nothing
  p.mlp = !m.parallel_residual ? 2 * x.h * x.e + norm_stats_bytes(m)
          : m.block_norms == 1 ? 0.0 : x.h * x.e + norm_stats_bytes(m);
  if (m.is_moe()) {
    p.mlp += x.k * (2 * x.h + mlp_saved_elems(m, x.f)) * x.e + 4 * x.E + 8 * x.k + 4 * x.k;
  } else {
    p.mlp += mlp_saved_elems(m, x.f) * x.e;
  }
  return p;
}

// The block's forward matmuls in execution order: (has bias, output elements per token).
std::vector<std::pair<bool, double>> forward_matmuls(const ModelSpec& m, const BlockShape& x) {
  std::vector<std::pair<bool, double>> mm;
  mm.push_back({m.qkv_bias, x.a * x.d});
  mm.push_back({m.qkv_bias, x.g * x.d});
  mm.push_back({m.qkv_bias, x.g * x.d});
  mm.push_back({m.out_bias, x.h});
  auto mlp = [&](double share) {  // share: fraction of the tokens this MLP sees
    if (m.mlp != MlpKind::Plain) {
      mm.push_back({m.mlp_bias, x.f * share});  // gate
      mm.push_back({m.mlp_bias, x.f * share});  // up
    } else {
      mm.push_back({m.mlp_bias, x.f * share});  // fc
    }
    mm.push_back({m.mlp_bias, x.h * share});    // down / fc2
  };
  if (m.is_moe()) {
    mm.push_back({false, x.E});  // router
    for (std::int64_t i = 0; i < m.n_experts; ++i) mlp(x.k / x.E);  // each expert sees T*k/E tokens on average
  } else {
    mlp(1.0);
  }
  return mm;
}

double selective_per_token(const ModelSpec& m, const BlockShape& x) {
  double bytes = x.h * x.e + x.a * x.d * x.e + 4 * x.a;  // block input, SDPA output + logsumexp
  int mm_count = 0;
  for (const auto& [biased, out_elems] : forward_matmuls(m, x)) {
    if (biased) continue;  // aten.addmm: not in the save list, not counted
    ++mm_count;
    if (mm_count % 2 == 1) bytes += out_elems * x.e;
  }
  return bytes;
}

Bytes round_bytes(double v) { return static_cast<Bytes>(v + 0.5); }

}  // namespace

Bytes block_saved_activation_bytes(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len,
                                   Dtype dtype, CheckpointMode mode) {
  const BlockShape x = shape(m, micro_batch, seq_len, dtype);
  switch (mode) {
    case CheckpointMode::Full: return round_bytes(x.T * x.h * x.e);
    case CheckpointMode::SelectiveOp: return round_bytes(x.T * selective_per_token(m, x));
    case CheckpointMode::None: break;
  }
  const SavedPerToken p = saved_none(m, x);
  return round_bytes(x.T * (p.input + p.attention + p.mlp));
}

// Backward of a checkpointed block: the recompute re-creates every tensor of the no-checkpointing
// case except the input it already holds; then gradients come and go. Gradient transients:
//   always: the incoming grad of the block output and the residual-stream grad being built, 2h;
//   MLP phase (runs first, every recomputed tensor still alive): grad of the down input plus grads
//     of gate and up (3f; plain MLP 2f; MoE k*(3f + h) per token);
//   attention phase (the MLP's tensors are freed by then): dO, dq, dk, dv ((2a + 2g) * d) plus the
//     fp32 dq accumulator of flash-attention 2's backward (4 * a * d bytes).
// peak = max(recompute + MLP grads, recompute - MLP tensors + attention grads). Allocator rounding
// and kernel workspaces are not included.
namespace {

struct BackwardPhases {
  double mlp_grads_per_token = 0;   // bytes alive in the MLP phase besides saved tensors
  double attn_grads_per_token = 0;  // bytes alive in the attention phase besides saved tensors
};

BackwardPhases backward_phases(const ModelSpec& m, const BlockShape& x) {
  const double mlp_grads = m.is_moe() ? x.k * ((m.mlp == MlpKind::Plain ? 2 : 3) * x.f + x.h)
                                      : (m.mlp == MlpKind::Plain ? 2 : 3) * x.f;
  return {(2 * x.h + mlp_grads) * x.e, (2 * x.h + (2 * x.a + 2 * x.g) * x.d) * x.e + 4 * x.a * x.d};
}

}  // namespace

Bytes block_backward_working_bytes(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len, Dtype dtype) {
  const BlockShape x = shape(m, micro_batch, seq_len, dtype);
  const SavedPerToken p = saved_none(m, x);
  const BackwardPhases g = backward_phases(m, x);
  const double mlp_phase = p.attention + p.mlp + g.mlp_grads_per_token;
  const double attn_phase = p.attention + g.attn_grads_per_token;
  return round_bytes(x.T * std::max(mlp_phase, attn_phase));
}

// Without checkpointing the saved tensors are already counted; the MLP's are freed by the time the
// attention phase runs, so that phase may exceed them by less: max(MLP grads, attention grads - MLP saved).
Bytes block_backward_grad_bytes(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len, Dtype dtype) {
  const BlockShape x = shape(m, micro_batch, seq_len, dtype);
  const SavedPerToken p = saved_none(m, x);
  const BackwardPhases g = backward_phases(m, x);
  return round_bytes(x.T * std::max(g.mlp_grads_per_token, g.attn_grads_per_token - p.mlp));
}

// The loop holds the logits in the compute dtype (HF returns them; torchtitan keeps `pred` until the
// loss is computed); cross_entropy on the fp32 upcast saves its fp32 log_softmax output for backward.
// A fused cross-entropy kernel (flash-attn's) keeps the logits and a per-token fp32 logsumexp and
// writes the logits' gradient in its backward. A fused linear cross-entropy (Liger) computes the
// loss and the head's input gradient chunk by chunk during the forward: what stays is that gradient
// (T x C) and the logsumexp; the transient is one chunk of fp32 logits.
Bytes logits_bytes(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len, Dtype dtype, LossImpl loss) {
  const Bytes t = micro_batch * seq_len;
  const Bytes tv = t * m.vocab_size;
  switch (loss) {
    case LossImpl::Fused: return tv * dtype_bytes(dtype) + t * 4;
    case LossImpl::FusedLinear: return t * m.hidden * dtype_bytes(dtype) + t * 4;
    case LossImpl::Torch: case LossImpl::Chunked: break;   // Chunked: the same bytes, in chunks
  }
  return tv * dtype_bytes(dtype) + tv * 4;
}

// While cross_entropy runs, the upcast copy (.float()) is alive too; fp32 logits need no copy.
Bytes logits_peak_bytes(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len, Dtype dtype, LossImpl loss,
                        int chunks) {
  const Bytes t = micro_batch * seq_len;
  const Bytes tv = t * m.vocab_size;
  const Bytes held = logits_bytes(m, micro_batch, seq_len, dtype, loss);
  switch (loss) {
    case LossImpl::Fused: return held + tv * dtype_bytes(dtype);
    case LossImpl::FusedLinear: {
      const std::int64_t c = std::max<std::int64_t>(1, m.hidden);
      const std::int64_t chunks = (m.vocab_size + c - 1) / c;
      const std::int64_t chunk_tokens = (t + chunks - 1) / chunks;
      return held + chunk_tokens * m.vocab_size * 4;
    }
    case LossImpl::Chunked: {
      // torch.chunk(chunks, dim=1) on the sequence: ceil(seq_len / chunks) positions per chunk
      const std::int64_t n = std::max(1, chunks);
      const std::int64_t chunk_tokens = micro_batch * ((seq_len + n - 1) / n);
      return held + (dtype == Dtype::FP32 ? 0 : chunk_tokens * m.vocab_size * 4);
    }
    case LossImpl::Torch: break;
  }
  return held + (dtype == Dtype::FP32 ? 0 : tv * 4);
}

std::string loss_impl_name(LossImpl l) {
  switch (l) {
    case LossImpl::Fused: return "fused";
    case LossImpl::FusedLinear: return "fused_linear";
    case LossImpl::Chunked: return "chunked";
    case LossImpl::Torch: break;
  }
  return "torch";
}

}  // namespace fsdpsim::models

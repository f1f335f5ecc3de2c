// Kernel lists per model part, forward and backward, with FLOPs and HBM bytes.
//
// Conventions (T = b*s tokens, e = activation dtype bytes; names follow the module tree's naming):
//   * GEMM C[m,n] = A[m,k] B[k,n]: flops = 2*m*n*k*count; bytes = (m*k + k*n + m*n) * e * count (each
//     operand read or written once; a fused bias epilogue adds nothing that matters).
//     Forward: m = T, n = out_features, k = in_features. Backward: dgrad m = T, n = in, k = out;
//     wgrad m = out, n = in, k = T (only when weight_grads).
//   * Attention (flash/memory-efficient SDPA, causal): flops are the EXECUTED ones, half of the full
//     square: forward 2 matmuls * 2 * b*a*s*s*d / 2 = 2*b*a*s^2*d; backward 5 matmuls (recompute of
//     QK^T, dV, dP, dQ, dK) = 2.5x forward. This is what a kernel costs; the MFU convention in
//     model_flops.cpp counts the full square instead. bytes: q, k, v, o (+ dO, dq, dk, dv in backward)
//     in e plus the fp32 logsumexp.
//   * Elementwise, embedding and cross-entropy kernels are memory-bound: bytes are filled in exactly
//     (every input read once, every output written once); their FLOPs are left at 0 (below 0.1% of a
//     step, and not part of model FLOPs).
//   * MoE: balanced routing assumed, each expert sees ceil(T*k/E) tokens; expert GEMMs are one entry
//     with count = E; router GEMM m = T, n = E, k = h; permute/unpermute move T*k rows of h.
#include "models/kernels.h"

#include <string>

namespace fsdpsim::models {
namespace {

struct Ctx {
  const ModelSpec& m;
  std::int64_t b, s, T, e;
  Dtype dtype;
  std::vector<KernelDesc>* out;
  bool backward;

  void gemm(const std::string& name, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t count = 1) {
    KernelDesc k;
    k.kind = KernelKind::Gemm;
    k.name = name;
    k.m = M, k.n = N, k.k = K, k.count = count;
    k.flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) * static_cast<double>(count);
    k.bytes = (M * K + K * N + M * N) * e * count;
    k.backward = backward;
    k.dtype = dtype;
    out->push_back(k);
  }
  void elementwise(const std::string& name, Bytes bytes, KernelKind kind = KernelKind::Elementwise) {
    KernelDesc k;
    k.kind = kind;
    k.name = name;
    k.bytes = bytes;
    k.backward = backward;
    k.dtype = dtype;
    out->push_back(k);
  }
  void attention() {
    const std::int64_t a = m.n_heads, g = m.n_kv_heads, d = m.head_dim;
    KernelDesc k;
    k.kind = KernelKind::Attention;
    k.name = backward ? "attn_bwd" : "attn_fwd";
    k.batch = b, k.seq = s, k.heads = a, k.kv_heads = g, k.head_dim = d;
    const double fwd = 2.0 * static_cast<double>(b) * a * static_cast<double>(s) * static_cast<double>(s) * d;
    k.flops = backward ? 2.5 * fwd : fwd;
    const Bytes lse = 4 * b * a * s;
    // forward: read q, k, v; write o + lse. backward: read q, k, v, o, dO, lse; write dq, dk, dv.
    k.bytes = backward ? T * (4 * a * d + 4 * g * d) * e + lse : T * (2 * a * d + 2 * g * d) * e + lse;
    k.backward = backward;
    k.dtype = dtype;
    out->push_back(k);
  }
  // A linear layer: forward GEMM, or its dgrad (+ wgrad) in backward.
  void linear(const std::string& name, std::int64_t in, std::int64_t outf, bool wgrad, std::int64_t tokens = -1,
              std::int64_t count = 1) {
    const std::int64_t t = tokens < 0 ? T : tokens;
    if (!backward) {
      gemm(name, t, outf, in, count);
      return;
    }
    gemm(name + "_dgrad", t, in, outf, count);
    if (wgrad) gemm(name + "_wgrad", outf, in, t, count);
  }
};

bool gpt2_naming(const ModelSpec& m) { return m.model_type == "gpt2"; }
bool mpt_naming(const ModelSpec& m) { return m.model_type == "mpt"; }

// Norm: forward reads x, writes y; backward reads x, dy, writes dx (+ the weight grad, reduced).
void norm(Ctx& c, const std::string& name, bool wgrad) {
  const Bytes act = c.T * c.m.hidden * c.e;
  const Bytes w = c.m.hidden * c.e * (c.m.norm == NormKind::LayerNorm && c.m.norm_bias ? 2 : 1);
  if (!c.backward) c.elementwise(name, 2 * act + w);
  else c.elementwise(name + "_bwd", 3 * act + w + (wgrad ? w : 0));
}

void mlp(Ctx& c, const std::string& prefix, std::int64_t tokens, std::int64_t count, bool wgrad) {
  const ModelSpec& m = c.m;
  const std::int64_t h = m.hidden, f = m.ffn_hidden;
  const Bytes tf = tokens * f * c.e * count;
  const bool moe = m.is_moe();
  if (m.mlp == MlpKind::Plain) {
    const std::string fc = moe ? "w1" : (gpt2_naming(m) ? "c_fc" : "up_proj");
    const std::string fc2 = moe ? "w2" : (gpt2_naming(m) ? "c_proj" : "down_proj");
    if (!c.backward) {
      c.linear(prefix + fc, h, f, wgrad, tokens, count);
      c.elementwise(prefix + "gelu", 2 * tf);
      c.linear(prefix + fc2, f, h, wgrad, tokens, count);
    } else {
      c.linear(prefix + fc2, f, h, wgrad, tokens, count);
      c.elementwise(prefix + "gelu_bwd", 3 * tf);
      c.linear(prefix + fc, h, f, wgrad, tokens, count);
    }
    return;
  }
  const std::string gate = moe ? "w1" : "gate_proj", up = moe ? "w3" : "up_proj", down = moe ? "w2" : "down_proj";
  const std::string act = m.mlp == MlpKind::SwiGLU ? "silu_mul" : "gelu_mul";
  if (!c.backward) {
    c.linear(prefix + gate, h, f, wgrad, tokens, count);
    c.linear(prefix + up, h, f, wgrad, tokens, count);
    c.elementwise(prefix + act, 3 * tf);  // read gate, up; write product
    c.linear(prefix + down, f, h, wgrad, tokens, count);
  } else {
    c.linear(prefix + down, f, h, wgrad, tokens, count);
    c.elementwise(prefix + act + "_bwd", 5 * tf);  // read gate, up, d(product); write d(gate), d(up)
    c.linear(prefix + up, h, f, wgrad, tokens, count);
    c.linear(prefix + gate, h, f, wgrad, tokens, count);
  }
}

void moe(Ctx& c, bool wgrad) {
  const ModelSpec& m = c.m;
  const std::int64_t h = m.hidden, E = m.n_experts, k = m.experts_top_k;
  const std::int64_t per_expert = (c.T * k + E - 1) / E;
  const Bytes rows = c.T * k * h * c.e;
  // router probabilities: read logits (e), write fp32 softmax, top-k indices (int64) and weights (fp32)
  const Bytes router_ew = c.T * E * (c.e + 4) + c.T * k * (8 + 4);
  if (!c.backward) {
    c.linear("block_sparse_moe.gate", h, E, wgrad);
    c.elementwise("router_softmax_topk", router_ew);
    c.elementwise("moe_permute", 2 * rows);
    mlp(c, "experts.", per_expert, E, wgrad);
    c.elementwise("moe_unpermute", 2 * rows + c.T * h * c.e);  // weighted index_add into [T, h]
  } else {
    c.elementwise("moe_unpermute_bwd", 2 * rows + c.T * h * c.e);
    mlp(c, "experts.", per_expert, E, wgrad);
    c.elementwise("moe_permute_bwd", 2 * rows);
    c.elementwise("router_softmax_topk_bwd", router_ew);
    c.linear("block_sparse_moe.gate", h, E, wgrad);
  }
}

void attention_part(Ctx& c, bool wgrad) {
  const ModelSpec& m = c.m;
  const std::int64_t h = m.hidden, a = m.n_heads, g = m.n_kv_heads, d = m.head_dim;
  const bool fused_qkv = gpt2_naming(m) || mpt_naming(m);
  const std::string qkv = gpt2_naming(m) ? "c_attn" : "Wqkv";
  const std::string o = gpt2_naming(m) ? "c_proj" : (mpt_naming(m) ? "out_proj" : "o_proj");
  const Bytes rope = 2 * c.T * (a + g) * d * c.e;  // read + write q and k
  if (!c.backward) {
    if (fused_qkv) c.linear(qkv, h, (a + 2 * g) * d, wgrad);
    else {
      c.linear("q_proj", h, a * d, wgrad);
      c.linear("k_proj", h, g * d, wgrad);
      c.linear("v_proj", h, g * d, wgrad);
    }
    if (m.positions == PositionKind::Rotary) c.elementwise("rope", rope);
    c.attention();
    c.linear(o, a * d, h, wgrad);
  } else {
    c.linear(o, a * d, h, wgrad);
    c.attention();
    if (m.positions == PositionKind::Rotary) c.elementwise("rope_bwd", rope);
    if (fused_qkv) c.linear(qkv, h, (a + 2 * g) * d, wgrad);
    else {
      c.linear("v_proj", h, g * d, wgrad);
      c.linear("k_proj", h, g * d, wgrad);
      c.linear("q_proj", h, a * d, wgrad);
    }
  }
}

void block(Ctx& c, bool wgrad) {
  const Bytes residual = 3 * c.T * c.m.hidden * c.e;  // read 2, write 1
  if (!c.backward) {
    norm(c, "input_norm", wgrad);
    attention_part(c, wgrad);
    c.elementwise("residual_add", residual);
    norm(c, "post_attention_norm", wgrad);
    if (c.m.is_moe()) moe(c, wgrad);
    else mlp(c, "", c.T, 1, wgrad);
    c.elementwise("residual_add", residual);
  } else {
    if (c.m.is_moe()) moe(c, wgrad);
    else mlp(c, "", c.T, 1, wgrad);
    norm(c, "post_attention_norm", wgrad);
    c.elementwise("residual_grad_add", residual);
    attention_part(c, wgrad);
    norm(c, "input_norm", wgrad);
    c.elementwise("residual_grad_add", residual);
  }
}

void embedding(Ctx& c, bool wgrad) {
  const ModelSpec& m = c.m;
  const Bytes act = c.T * m.hidden * c.e;
  const Bytes ids = c.T * 8;  // int64 token ids
  if (!c.backward) {
    c.elementwise("embed_tokens", ids + 2 * act, KernelKind::Embedding);  // gather rows, write [T, h]
    if (m.positions == PositionKind::Learned) {
      c.elementwise("embed_positions", ids + 2 * act, KernelKind::Embedding);
      c.elementwise("add_positions", 3 * act);
    }
    if (m.model_type == "gemma") c.elementwise("embed_scale", 2 * act);  // x * sqrt(hidden)
    return;
  }
  if (!wgrad) return;  // token ids have no gradient: nothing to do without weight grads
  // dense embedding backward: zero the [V, h] grad, then index_add T rows of the incoming grad
  const Bytes table = m.vocab_size * m.hidden * c.e;
  c.elementwise("embed_tokens_bwd", table + ids + act + act, KernelKind::Embedding);
  if (m.positions == PositionKind::Learned)
    c.elementwise("embed_positions_bwd", m.max_positions * m.hidden * c.e + ids + 2 * act, KernelKind::Embedding);
}

void final_norm_and_head(Ctx& c, bool wgrad) {
  const ModelSpec& m = c.m;
  const Bytes tv = c.T * m.vocab_size;
  // cross-entropy forward: read logits (e), write the fp32 upcast and the fp32 log_softmax output.
  // backward: read log_softmax (fp32), write fp32 grad, cast it to e.
  if (!c.backward) {
    norm(c, "final_norm", wgrad);
    c.linear("lm_head", m.hidden, m.vocab_size, wgrad);
    c.elementwise("cross_entropy", tv * (c.e + 4 + 4) + c.T * 8, KernelKind::CrossEntropy);
  } else {
    c.elementwise("cross_entropy_bwd", tv * (4 + 4 + 4 + c.e) + c.T * 8, KernelKind::CrossEntropy);
    c.linear("lm_head", m.hidden, m.vocab_size, wgrad);
    norm(c, "final_norm", wgrad);
  }
}

std::vector<KernelDesc> kernels(const ModelSpec& m, ModulePart part, std::int64_t b, std::int64_t s, Dtype dtype,
                                bool backward, bool wgrad) {
  std::vector<KernelDesc> out;
  Ctx c{m, b, s, b * s, dtype_bytes(dtype), dtype, &out, backward};
  switch (part) {
    case ModulePart::Embedding: embedding(c, wgrad); break;
    case ModulePart::Block: block(c, wgrad); break;
    case ModulePart::FinalNormAndHead: final_norm_and_head(c, wgrad); break;
  }
  return out;
}

}  // namespace

std::vector<KernelDesc> forward_kernels(const ModelSpec& m, ModulePart part, std::int64_t micro_batch,
                                        std::int64_t seq_len, Dtype dtype) {
  return kernels(m, part, micro_batch, seq_len, dtype, false, true);
}

std::vector<KernelDesc> backward_kernels(const ModelSpec& m, ModulePart part, std::int64_t micro_batch,
                                         std::int64_t seq_len, Dtype dtype, bool weight_grads) {
  return kernels(m, part, micro_batch, seq_len, dtype, true, weight_grads);
}

Flops total_flops(const std::vector<KernelDesc>& ks) {
  Flops f = 0;
  for (const auto& k : ks) f += k.flops;
  return f;
}

}  // namespace fsdpsim::models

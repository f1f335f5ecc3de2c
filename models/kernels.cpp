// Kernel lists per model part, forward and backward, with FLOPs and HBM bytes.
//
// Conventions (T = b*s tokens, e = activation dtype bytes; names follow the module tree's naming):
//   * GEMM C[m,n] = A[m,k] B[k,n]: flops = 2*m*n*k*count; bytes = (m*k + k*n + m*n) * e * count (each
//     operand read or written once; a fused bias epilogue adds nothing that matters). A float8 GEMM
//     (torch._scaled_mm) reads fp8 operands (1 byte) and writes bf16.
//     Forward: m = T, n = out_features, k = in_features. Backward: dgrad m = T, n = in, k = out;
//     wgrad m = out, n = in, k = T (only when weight_grads).
//   * Attention (flash/memory-efficient SDPA, causal): flops are the EXECUTED ones, half of the full
//     square: forward 2 matmuls * 2 * b*a*s*s*d / 2 = 2*b*a*s^2*d; backward 5 matmuls (recompute of
//     QK^T, dV, dP, dQ, dK) = 2.5x forward. This is what a kernel costs; the MFU convention in
//     model_flops.cpp counts the full square instead. bytes: q, k, v, o (+ dO, dq, dk, dv in backward)
//     in e plus the fp32 logsumexp.
//   * Elementwise, embedding and cross-entropy kernels are memory-bound: bytes are filled in exactly
//     (every input read once, every output written once); their FLOPs are left at 0 (below 0.1% of a
//     step, and not part of model FLOPs). Which of them run (eager op chains of each implementation,
//     or inductor's fused kernels under torch.compile): models/kernels_elementwise.cpp.
//   * Float8 (torchao Float8Linear on the blocks' linears, not the LM head nor a MoE router, as
//     torchtitan's recipes filter them): models/kernels_float8.cpp.
//   * MoE: balanced routing assumed, each expert sees ceil(T*k/E) tokens; expert GEMMs are one entry
//     with count = E; router GEMM m = T, n = E, k = h; permute/unpermute move T*k rows of h.
#include "models/kernels.h"

#include <string>

#include "models/kernel_builder.h"
#include "models/nf4.h"

namespace fsdpsim::models {
namespace detail {

KernelDesc& KernelBuilder::push(KernelDesc k, std::int64_t sac_saved) {
  k.backward = backward;
  out->push_back(std::move(k));
  if (notes) notes->push_back(ForwardNote{sac_saved, escaping});
  return out->back();
}

void KernelBuilder::gemm(const std::string& name, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t count,
                         Dtype gemm_dtype, bool fp8, std::int64_t sac_saved) {
  KernelDesc k;
  k.kind = KernelKind::Gemm;
  k.name = name;
  k.m = M, k.n = N, k.k = K, k.count = count;
  k.flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) * static_cast<double>(count);
  // fp8 operands (1 byte each), bf16 output; otherwise all three in the activation dtype.
  k.bytes = fp8 ? (M * K + K * N + M * N * 2) * count : (M * K + K * N + M * N) * e * count;
  k.dtype = fp8 ? Dtype::FP8 : gemm_dtype;
  push(std::move(k), sac_saved);
}

void KernelBuilder::elementwise(const std::string& name, Bytes bytes, MemoryClass cls, KernelKind kind,
                                std::int64_t sac_saved) {
  KernelDesc k;
  k.kind = kind;
  k.mem_class = cls;
  k.name = name;
  k.bytes = bytes;
  k.dtype = dtype;
  push(std::move(k), sac_saved);
}

void KernelBuilder::attention() {
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
  k.dtype = dtype;
  push(std::move(k), 1);   // SDPA (flash / efficient) is in every SAC save list
}

void KernelBuilder::linear(const std::string& name, std::int64_t in, std::int64_t outf, bool wgrad, std::int64_t tokens,
                           std::int64_t count, bool bias, bool float8_allowed, std::int64_t sac_saved, bool dgrad) {
  const std::int64_t t = tokens < 0 ? T : tokens;
  const bool fp8 = float8_allowed && opt.float8 != Float8Recipe::None;
  // QLoRA: a block linear's NF4 weight is dequantized before its forward GEMM and before its input-gradient
  // GEMM (models/nf4.h; the LM head and a MoE router, float8_allowed false, stay in bf16).
  // Compiled (torchao's layout), the backward reads the forward's dequantized copy, which the compiled block
  // saves (models/block_recipes.cpp linear): no second dequantization. And under full checkpointing the
  // dequantization and the GEMM escape the checkpoint (TapeOp::escapes_checkpoint): marked in the notes, so that
  // the recompute does not rerun them (kernels_recompute.cpp).
  const bool nf4 = opt.lora.nf4 && float8_allowed && count == 1;
  const bool compiled_torchao = nf4 && opt.compile && !opt.lora.nf4_bnb;
  escaping = !backward && compiled_torchao;
  if (nf4 && (!backward || (dgrad && !compiled_torchao))) nf4_dequant(name, in * outf);
  if (!backward) {
    // torchtitan's op-level SAC policy (fsdp-semantics.md A4, model_activations.cpp): a bias-free matmul
    // (aten.mm) is counted in forward order within the block and saved when its number is odd;
    // aten.addmm is neither counted nor saved.
    std::int64_t saved = sac_saved;
    if (saved < 0) {
      saved = 0;
      for (std::int64_t i = 0; i < count && !bias; ++i)
        if (++mm_count % 2 == 1) ++saved;
    }
    if (fp8) float8_casts(name, t, in, outf, count, false);
    gemm(name, t, outf, in, count, dtype, fp8, saved);
    escaping = false;
    return;
  }
  if (!dgrad && !wgrad) return;
  if (fp8) float8_casts(name, t, in, outf, count, wgrad);
  if (dgrad) gemm(name + "_dgrad", t, in, outf, count, dtype, fp8);
  if (wgrad) gemm(name + "_wgrad", outf, in, t, count, dtype, fp8);
}

void KernelBuilder::nf4_dequant(const std::string& name, std::int64_t elems) {
  if (opt.lora.nf4_bnb) {   // bitsandbytes: the absmax's second level into fp32, then the codes into the dtype
    const std::int64_t blocks = (elems + kNf4BlockSize - 1) / kNf4BlockSize;
    elementwise(name + ".bnb4_absmax", blocks + bnb4_absmax_fp32_bytes(elems), MemoryClass::Copy);
    elementwise(name + ".bnb4_dequant", elems / 2 + bnb4_absmax_fp32_bytes(elems) + elems * e, MemoryClass::Copy);
    return;
  }
  if (opt.compile) {   // one fused kernel: read the NF4 bytes, write the compute dtype
    elementwise(name + ".nf4_dequant", nf4_bytes(elems) + elems * e, MemoryClass::Copy);
    return;
  }
  // get_original_weight's eager chain (models/nf4.h kNf4EagerDequant*): per half of the elements, the shift
  // or mask, the int64 cast, the table lookup, the scalers' flatten and the scaling; then the stack.
  const std::int64_t half = elems / 2;
  for (const char* part : {".nf4_hi", ".nf4_lo"}) {
    elementwise(name + part + "_unpack", 2 * half, MemoryClass::Copy);        // uint8 -> uint8
    elementwise(name + part + "_to_long", half + 8 * half, MemoryClass::Copy); // uint8 -> int64
    elementwise(name + part + "_lookup", 8 * half + half * e, MemoryClass::Copy);
    elementwise(name + part + "_scalers", half * e, MemoryClass::Copy);       // the expanded scalers, flattened
    elementwise(name + part + "_scale", 3 * half * e, MemoryClass::Copy);
  }
  elementwise(name + ".nf4_stack", 2 * elems * e, MemoryClass::Copy);
}

void KernelBuilder::adapter(const std::string& name, Weight base, std::int64_t outf, bool in_rg) {
  if (!opt.lora.on()) return;
  const AdapterMatrix* a = nullptr;
  const AdapterMatrix* bm = nullptr;
  const std::vector<AdapterMatrix> all = lora_adapters(m, opt.implementation, opt.lora, base == Weight::LmHead);
  for (const AdapterMatrix& x : all) {
    const bool mine = x.base == base || (base == Weight::Up && x.base == Weight::Fc);
    if (!mine) continue;
    if (x.is_a && !a) a = &x;
    else if (!x.is_a && !bm) bm = &x;
  }
  if (!a || !bm) return;
  // (litgpt's B is a grouped conv1d, and with grouped-query attention one conv1d per enabled part then a cat,
  // LoRAQKVLinear.conv1d: modelled as one GEMM of the same FLOPs; the scaling and the sum as two eager kernels)
  // r: A's rows (litgpt's fused A: rank x parts); rb: B's columns (the rank: each output sees its part's rank)
  const std::int64_t r = a->rows, rb = bm->cols, in = a->cols, width = bm->rows;
  const bool pad = width < outf;   // litgpt's zero_pad of the enabled q/k/v parts to the fused width
  if (!backward) {
    if (opt.lora.dropout) elementwise(name + ".lora_dropout", T * in * (2 * e + 1), MemoryClass::Copy);  // x -> out, mask
    gemm(name + ".lora_a", T, r, in, 1, dtype);
    gemm(name + ".lora_b", T, width, rb, 1, dtype);
    if (pad) elementwise(name + ".lora_pad", T * (width + outf) * e, MemoryClass::Copy);
    elementwise(name + ".lora_scale", 2 * T * outf * e, MemoryClass::Copy);
    elementwise(name + ".lora_add", 3 * T * outf * e, MemoryClass::Residual);
    return;
  }
  const bool wgrad = trains(Weight::Adapter);
  if (!wgrad && !in_rg) return;
  elementwise(name + ".lora_scale_bwd", 2 * T * outf * e, MemoryClass::Copy);
  if (pad) elementwise(name + ".lora_pad_bwd", T * (width + outf) * e, MemoryClass::Copy);   // index_select
  gemm(name + ".lora_b_dgrad", T, rb, width, 1, dtype);
  if (wgrad) gemm(name + ".lora_b_wgrad", width, rb, T, 1, dtype);
  if (wgrad) gemm(name + ".lora_a_wgrad", r, in, T, 1, dtype);
  if (!in_rg) return;
  gemm(name + ".lora_a_dgrad", T, in, r, 1, dtype);
  if (opt.lora.dropout) elementwise(name + ".lora_dropout_bwd", T * in * (2 * e + 1), MemoryClass::Copy);
  elementwise(name + ".lora_grad_add", 3 * T * in * e, MemoryClass::Residual);   // into the input's gradient
}

namespace {

using Ctx = KernelBuilder;

bool gpt2_naming(const ModelSpec& m) { return m.model_type == "gpt2"; }
bool mpt_naming(const ModelSpec& m) { return m.model_type == "mpt"; }

// Marks where a full checkpoint's early stop cuts the block's recompute: the last linear of the MLP
// saves its input and weight before it runs (autograd packs an op's inputs before calling it), and
// nothing after it saves a tensor (the residual add saves none), so the recompute ends here.
void mark_early_stop(Ctx& c) {
  if (!c.backward && c.notes) c.early_stop_end = static_cast<int>(c.out->size());
}

// SAC numbering of an MLP's linears with `count` expert copies: HF's Mixtral runs expert after expert
// (its `per_expert` linears each), so expert i's j-th linear is matmul base + per_expert*i + j + 1
// (model_activations.cpp counts them in the same order); the odd-numbered ones are saved. Biased
// linears (aten.addmm) are neither counted nor saved.
std::int64_t sac_saved_copies(std::int64_t base, std::int64_t per_expert, std::int64_t j, std::int64_t count, bool bias) {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < count && !bias; ++i) n += (base + per_expert * i + j + 1) % 2 == 1;
  return n;
}

// The MLP (or `count` expert copies of it). Backward: `in_rg` = its input requires grad (the dgrads of its
// first linears run only then); a weight gets its wgrad only when it trains (Weight::Experts for experts).
void mlp(Ctx& c, const std::string& prefix, std::int64_t tokens, std::int64_t count, bool in_rg) {
  const ModelSpec& m = c.m;
  const std::int64_t h = m.hidden, f = m.ffn_hidden;
  const bool moe = m.is_moe();
  const auto trains = [&](Weight w) { return c.trains(moe ? Weight::Experts : w); };
  if (m.mlp == MlpKind::Plain) {
    const bool neox = m.model_type == "gpt_neox", phi = m.model_type == "phi";
    const std::string fc = moe ? "w1" : gpt2_naming(m) ? "c_fc" : neox ? "dense_h_to_4h" : phi ? "fc1" : "up_proj";
    const std::string fc2 = moe ? "w2" : gpt2_naming(m) ? "c_proj" : neox ? "dense_4h_to_h" : phi ? "fc2" : "down_proj";
    if (!c.backward) {
      const std::int64_t base = c.mm_count;
      auto saved = [&](std::int64_t j) { return sac_saved_copies(base, 2, j, count, m.mlp_bias); };
      c.linear(prefix + fc, h, f, true, tokens, count, m.mlp_bias, true, saved(0));
      if (!moe) c.adapter(prefix + fc, Weight::Fc, f, true);
      activation(c, prefix, tokens, count);
      mark_early_stop(c);
      c.linear(prefix + fc2, f, h, true, tokens, count, m.mlp_bias, true, saved(1));
      if (!moe) c.adapter(prefix + fc2, Weight::Down, h, true);
      if (!m.mlp_bias) c.mm_count = static_cast<int>(base + 2 * count);
    } else {
      const bool act_rg = in_rg || trains(Weight::Fc) || c.adapted(Weight::Fc);
      c.linear(prefix + fc2, f, h, trains(Weight::Down), tokens, count, m.mlp_bias, true, -1, act_rg);
      if (!moe) c.adapter(prefix + fc2, Weight::Down, h, act_rg);
      if (act_rg) activation(c, prefix, tokens, count);
      c.linear(prefix + fc, h, f, trains(Weight::Fc), tokens, count, m.mlp_bias, true, -1, in_rg);
      if (!moe) c.adapter(prefix + fc, Weight::Fc, f, in_rg);
    }
    return;
  }
  const std::string gate = moe ? "w1" : "gate_proj", up = moe ? "w3" : "up_proj", down = moe ? "w2" : "down_proj";
  if (!c.backward) {
    const std::int64_t base = c.mm_count;
    auto saved = [&](std::int64_t j) { return sac_saved_copies(base, 3, j, count, m.mlp_bias); };
    c.linear(prefix + gate, h, f, true, tokens, count, m.mlp_bias, true, saved(0));
    if (!moe) c.adapter(prefix + gate, Weight::Gate, f, true);
    c.linear(prefix + up, h, f, true, tokens, count, m.mlp_bias, true, saved(1));
    if (!moe) c.adapter(prefix + up, Weight::Up, f, true);
    activation(c, prefix, tokens, count);
    mark_early_stop(c);
    c.linear(prefix + down, f, h, true, tokens, count, m.mlp_bias, true, saved(2));
    if (!moe) c.adapter(prefix + down, Weight::Down, h, true);
    if (!m.mlp_bias) c.mm_count = static_cast<int>(base + 3 * count);
  } else {
    const bool prod_rg = in_rg || trains(Weight::Gate) || trains(Weight::Up) || c.adapted(Weight::Gate) ||
                         c.adapted(Weight::Up);
    c.linear(prefix + down, f, h, trains(Weight::Down), tokens, count, m.mlp_bias, true, -1, prod_rg);
    if (!moe) c.adapter(prefix + down, Weight::Down, h, prod_rg);
    if (prod_rg) activation(c, prefix, tokens, count);
    c.linear(prefix + up, h, f, trains(Weight::Up), tokens, count, m.mlp_bias, true, -1, in_rg);
    if (!moe) c.adapter(prefix + up, Weight::Up, f, in_rg);
    c.linear(prefix + gate, h, f, trains(Weight::Gate), tokens, count, m.mlp_bias, true, -1, in_rg);
    if (!moe) c.adapter(prefix + gate, Weight::Gate, f, in_rg);
  }
}

// Linears reading the MLP's input (the post-attention norm's output): their input grads are summed.
std::int64_t mlp_input_uses(const ModelSpec& m) {
  if (m.is_moe()) return 2;                      // the router and the permuted expert inputs
  return m.mlp == MlpKind::Plain ? 1 : 2;        // gate and up
}

void moe(Ctx& c, bool in_rg) {
  const ModelSpec& m = c.m;
  const std::int64_t h = m.hidden, E = m.n_experts, k = m.experts_top_k;
  const std::int64_t per_expert = (c.T * k + E - 1) / E;
  const Bytes rows = c.T * k * h * c.e;
  // router probabilities: read logits (e), write fp32 softmax, top-k indices (int64) and weights (fp32)
  const Bytes router_ew = c.T * E * (c.e + 4) + c.T * k * (8 + 4);
  // The router is small (n = E): float8 recipes leave it in high precision (torchtitan filters router.gate).
  if (!c.backward) {
    c.linear("block_sparse_moe.gate", h, E, true, -1, 1, false, false);
    c.elementwise("router_softmax_topk", router_ew, MemoryClass::Activation);
    c.elementwise("moe_permute", 2 * rows, MemoryClass::Copy);
    mlp(c, "experts.", per_expert, E, true);
    c.elementwise("moe_unpermute", 2 * rows + c.T * h * c.e, MemoryClass::Copy);  // weighted index_add into [T, h]
  } else {
    const bool router_rg = in_rg || c.trains(Weight::Router);
    c.elementwise("moe_unpermute_bwd", 2 * rows + c.T * h * c.e, MemoryClass::Copy);
    mlp(c, "experts.", per_expert, E, in_rg);
    if (in_rg) c.elementwise("moe_permute_bwd", 2 * rows, MemoryClass::Copy);
    if (router_rg) c.elementwise("router_softmax_topk_bwd", router_ew, MemoryClass::Activation);
    c.linear("block_sparse_moe.gate", h, E, c.trains(Weight::Router), -1, 1, false, false, -1, in_rg);
  }
}

// Whether the MLP's (or MoE's) output requires grad: its input does, or one of its weights trains or is adapted.
bool mlp_out_rg(const Ctx& c, bool in_rg) {
  constexpr WeightMask kMlp = weight_bit(Weight::Gate) | weight_bit(Weight::Up) | weight_bit(Weight::Fc) |
                              weight_bit(Weight::Down) | weight_bit(Weight::Router) | weight_bit(Weight::Experts);
  return in_rg || (c.flow.trains & kMlp) != 0 || c.adapted(Weight::Gate) || c.adapted(Weight::Up) ||
         c.adapted(Weight::Fc) || c.adapted(Weight::Down);
}

bool fused_qkv(const ModelSpec& m) { return gpt2_naming(m) || mpt_naming(m) || m.model_type == "gpt_neox"; }

// Whether the q, k, v projections' weights train: the recipe's Q/K/V or fused QKV matrix (the kernel list
// names HF's separate projections, or GPT-2's / MPT's fused one, whatever the recipe fuses).
bool q_trains(const Ctx& c) { return c.trains(Weight::Q) || c.trains(Weight::QKV); }
bool k_trains(const Ctx& c) { return c.trains(Weight::K) || c.trains(Weight::QKV); }
bool v_trains(const Ctx& c) { return c.trains(Weight::V) || c.trains(Weight::QKV); }
// LoRA adapters on any of q, k, v that train: the projections' outputs then require grad
bool qkv_adapted(const Ctx& c) {
  return c.adapted(Weight::Q) || c.adapted(Weight::K) || c.adapted(Weight::V) || c.adapted(Weight::QKV);
}

// Backward: `in_rg` = the attention's input (the norm's output) requires grad.
void attention_part(Ctx& c, bool in_rg) {
  const ModelSpec& m = c.m;
  const std::int64_t h = m.hidden, a = m.n_heads, g = m.n_kv_heads, d = m.head_dim;
  const bool neox = m.model_type == "gpt_neox";
  const std::string qkv = gpt2_naming(m) ? "c_attn" : neox ? "query_key_value" : "Wqkv";
  const std::string o = gpt2_naming(m) ? "c_proj" : mpt_naming(m) ? "out_proj" : neox || m.model_type == "phi" ? "dense" : "o_proj";
  // LoRA: a fused-qkv adapter (litgpt's LoRAQKVLinear; GPT-2's / MPT's fused matrix) is laid out once
  // for the three projections (adapter() finds nothing for the bases a recipe does not adapt)
  const auto qkv_adapters = [&](bool rg) {
    c.adapter("qkv", Weight::QKV, (a + 2 * g) * d, rg);
    c.adapter("q_proj", Weight::Q, a * d, rg);
    c.adapter("k_proj", Weight::K, g * d, rg);
    c.adapter("v_proj", Weight::V, g * d, rg);
  };
  if (!c.backward) {
    if (fused_qkv(m)) c.linear(qkv, h, (a + 2 * g) * d, true, -1, 1, m.qkv_bias);
    else {
      c.linear("q_proj", h, a * d, true, -1, 1, m.qkv_bias);
      c.linear("k_proj", h, g * d, true, -1, 1, m.qkv_bias);
      c.linear("v_proj", h, g * d, true, -1, 1, m.qkv_bias);
    }
    qkv_adapters(true);
    if (m.positions == PositionKind::Rotary) rotary(c);
    c.attention();
    c.linear(o, a * d, h, true, -1, 1, m.out_bias);
    c.adapter(o, Weight::Out, h, true);
  } else {
    const bool attn_rg = in_rg || q_trains(c) || k_trains(c) || v_trains(c) || qkv_adapted(c);
    c.linear(o, a * d, h, c.trains(Weight::Out), -1, 1, m.out_bias, true, -1, attn_rg);
    c.adapter(o, Weight::Out, h, attn_rg);
    if (attn_rg) {
      c.attention();
      if (m.positions == PositionKind::Rotary) rotary(c);
    }
    if (fused_qkv(m)) c.linear(qkv, h, (a + 2 * g) * d, q_trains(c) || k_trains(c) || v_trains(c), -1, 1, m.qkv_bias, true, -1, in_rg);
    else {
      c.linear("v_proj", h, g * d, v_trains(c), -1, 1, m.qkv_bias, true, -1, in_rg);
      c.linear("k_proj", h, g * d, k_trains(c), -1, 1, m.qkv_bias, true, -1, in_rg);
      c.linear("q_proj", h, a * d, q_trains(c), -1, 1, m.qkv_bias, true, -1, in_rg);
    }
    qkv_adapters(in_rg);
  }
}

// nn.Dropout in training on a [T, h] tensor (ModelSpec::resid_dropout / embd_dropout): native_dropout
// reads x and writes the output and a 1-byte mask; native_dropout_backward reads the gradient and the
// mask and writes the input's gradient. Under torch.compile inductor generates the random numbers inside
// the neighbouring fused kernel: no kernel of its own (the mask's write is not counted: approximate).
void dropout(Ctx& c, const std::string& name, double p) {
  if (p <= 0.0 || c.opt.compile) return;
  const Bytes n = c.T * c.m.hidden;
  c.elementwise(name + (c.backward ? "_bwd" : ""), n * (2 * c.e + 1), MemoryClass::Residual);
}

// The block's backward follows c.flow (models/trainable.h): a gradient is computed for a tensor that
// requires grad (an input gradient only where the input does, a weight gradient only where the weight
// trains); a block whose output does not require grad has no backward at all.
// A parallel-residual block (ModelSpec::parallel_residual): y = x + attn(norm_1(x)) + mlp(norm_2(x)), norm_2 =
// norm_1 when the block has one norm. Forward: the MLP's norm reads x (no residual add before it), and the two
// branches are summed, then x is added (two adds). Backward: both branches receive y's gradient as it is; the
// shared norm's output gradient sums the attention's and the MLP's input gradients; x's gradient sums the
// norms' and the residual's.
void parallel_block(Ctx& c) {
  const ModelSpec& m = c.m;
  const std::int64_t qkv_uses = fused_qkv(m) ? 1 : 3;
  const bool shared = m.block_norms == 1;
  const double p = m.resid_dropout;
  if (!c.backward) {
    norm(c, "input_norm", true);
    attention_part(c, true);
    dropout(c, "attn.resid_drop", p);
    if (!shared) norm(c, "post_attention_norm", true);
    if (m.is_moe()) moe(c, true);
    else mlp(c, "", c.T, 1, true);
    dropout(c, "mlp.resid_drop", p);
    residual_add(c, "branch_add");
    residual_add(c, "residual_add");
    return;
  }
  const bool x_rg = c.flow.input_requires_grad;
  const bool n1_rg = x_rg || c.trains(Weight::AttnNorm);
  const bool n2_rg = shared ? n1_rg : x_rg || c.trains(Weight::MlpNorm);
  const bool attn_rg = n1_rg || q_trains(c) || k_trains(c) || v_trains(c) || qkv_adapted(c) || c.trains(Weight::Out) ||
                       c.adapted(Weight::Out);
  const bool mlp_rg = mlp_out_rg(c, n2_rg);
  if (!attn_rg && !mlp_rg) return;   // the output does not require grad: no backward
  if (mlp_rg) {
    dropout(c, "mlp.resid_drop", p);
    if (m.is_moe()) moe(c, n2_rg);
    else mlp(c, "", c.T, 1, n2_rg);
  }
  if (!shared && n2_rg) norm(c, "post_attention_norm", c.trains(Weight::MlpNorm), mlp_input_uses(m));
  if (attn_rg) dropout(c, "attn.resid_drop", p);
  attention_part(c, n1_rg);
  if (x_rg) norm(c, "input_norm", c.trains(Weight::AttnNorm), qkv_uses + (shared ? mlp_input_uses(m) : 0), /*residual=*/true);
  if (x_rg && !shared) residual_add(c, "norm_grad_add");   // x's gradient: both norms' and the residual's
}

void block(Ctx& c) {
  if (c.m.parallel_residual) {
    parallel_block(c);
    return;
  }
  const std::int64_t qkv_uses = fused_qkv(c.m) ? 1 : 3;
  const double p = c.m.resid_dropout;
  if (!c.backward) {
    norm(c, "input_norm", true);
    attention_part(c, true);
    dropout(c, "attn.resid_drop", p);
    norm(c, "post_attention_norm", true, 1, /*residual=*/true);
    if (c.m.is_moe()) moe(c, true);
    else mlp(c, "", c.T, 1, true);
    dropout(c, "mlp.resid_drop", p);
    residual_add(c, "residual_add");
    return;
  }
  const bool x_rg = c.flow.input_requires_grad;
  const bool n1_rg = x_rg || c.trains(Weight::AttnNorm);
  const bool attn_rg = n1_rg || q_trains(c) || k_trains(c) || v_trains(c) || qkv_adapted(c);
  const bool h_rg = x_rg || attn_rg || c.trains(Weight::Out) || c.adapted(Weight::Out);
  const bool n2_rg = h_rg || c.trains(Weight::MlpNorm);
  const bool y_rg = mlp_out_rg(c, n2_rg);
  if (!y_rg) return;
  dropout(c, "mlp.resid_drop", p);   // the MLP's output requires grad exactly when y does
  if (c.m.is_moe()) moe(c, n2_rg);
  else mlp(c, "", c.T, 1, n2_rg);
  if (h_rg) norm(c, "post_attention_norm", c.trains(Weight::MlpNorm), mlp_input_uses(c.m), /*residual=*/true);
  if (attn_rg || c.trains(Weight::Out) || c.adapted(Weight::Out)) dropout(c, "attn.resid_drop", p);
  attention_part(c, n1_rg);
  if (x_rg) norm(c, "input_norm", c.trains(Weight::AttnNorm), qkv_uses, /*residual=*/true);
}

void embedding(Ctx& c) {
  const ModelSpec& m = c.m;
  const Bytes act = c.act();
  const Bytes ids = c.T * 8;  // int64 token ids
  if (!c.backward) {
    c.elementwise("embed_tokens", ids + 2 * act, MemoryClass::Embedding, KernelKind::Embedding);  // gather rows, write [T, h]
    if (m.positions == PositionKind::Learned) {
      c.elementwise("embed_positions", ids + 2 * act, MemoryClass::Embedding, KernelKind::Embedding);
      c.elementwise("add_positions", 3 * act, MemoryClass::Residual);
    }
    if (m.model_type == "gemma") c.elementwise("embed_scale", 2 * act, MemoryClass::Copy);  // x * sqrt(hidden)
    dropout(c, "embd_drop", m.embd_dropout);
    return;
  }
  if (!c.trains(Weight::Embedding)) return;  // token ids have no gradient: nothing to do without weight grads
  dropout(c, "embd_drop", m.embd_dropout);
  // dense embedding backward: zero the [V, h] grad, then index_add T rows of the incoming grad
  const Bytes table = m.vocab_size * m.hidden * c.e;
  c.elementwise("embed_tokens_bwd", table + ids + act + act, MemoryClass::Embedding, KernelKind::Embedding);
  if (m.positions == PositionKind::Learned)
    c.elementwise("embed_positions_bwd", m.max_positions * m.hidden * c.e + ids + 2 * act, MemoryClass::Embedding,
                  KernelKind::Embedding);
}

void final_norm_and_head(Ctx& c) {
  const ModelSpec& m = c.m;
  const Bytes tv = c.T * m.vocab_size;
  // The final norm and the head are outside the compiled blocks (torchtitan compiles each
  // TransformerBlock): they run eager; the head stays in high precision under float8.
  Ctx eager = c;
  eager.opt.compile = false;
  // cross-entropy forward: read logits (e), write the fp32 upcast and the fp32 log_softmax output.
  // backward: read log_softmax (fp32), write fp32 grad, cast it to e.
  if (!c.backward) {
    norm(eager, "final_norm", true);
    c.linear("lm_head", m.hidden, m.vocab_size, true, -1, 1, false, false);
    c.adapter("lm_head", Weight::LmHead, m.vocab_size, true);
    c.elementwise("cross_entropy", tv * (c.e + 4 + 4) + c.T * 8, MemoryClass::CrossEntropy, KernelKind::CrossEntropy);
  } else {
    const bool x_rg = c.flow.input_requires_grad;
    const bool head_in_rg = x_rg || c.trains(Weight::FinalNorm);
    if (!head_in_rg && !c.trains(Weight::LmHead) && !c.adapted(Weight::LmHead)) return;   // the logits do not require grad
    c.elementwise("cross_entropy_bwd", tv * (4 + 4 + 4 + c.e) + c.T * 8, MemoryClass::CrossEntropy,
                  KernelKind::CrossEntropy);
    c.linear("lm_head", m.hidden, m.vocab_size, c.trains(Weight::LmHead), -1, 1, false, false, -1, head_in_rg);
    c.adapter("lm_head", Weight::LmHead, m.vocab_size, head_in_rg);
    if (x_rg) norm(eager, "final_norm", c.trains(Weight::FinalNorm));
  }
}

}  // namespace

std::vector<KernelDesc> build_kernels(const ModelSpec& m, ModulePart part, std::int64_t b, std::int64_t s, Dtype dtype,
                                      bool backward, const GradFlow& flow, const KernelOptions& opt,
                                      std::vector<ForwardNote>* notes, int* early_stop_end) {
  std::vector<KernelDesc> out;
  Ctx c{m, b, s, b * s, dtype_bytes(dtype), dtype, opt, backward, &out, notes, -1, 0, flow};
  switch (part) {
    case ModulePart::Embedding: embedding(c); break;
    case ModulePart::Block: block(c); break;
    case ModulePart::FinalNormAndHead: final_norm_and_head(c); break;
  }
  if (early_stop_end) *early_stop_end = c.early_stop_end;
  return out;
}

}  // namespace detail

std::vector<KernelDesc> forward_kernels(const ModelSpec& m, ModulePart part, std::int64_t micro_batch,
                                        std::int64_t seq_len, Dtype dtype, const KernelOptions& options) {
  return detail::build_kernels(m, part, micro_batch, seq_len, dtype, false, GradFlow{}, options, nullptr, nullptr);
}

std::vector<KernelDesc> backward_kernels(const ModelSpec& m, ModulePart part, std::int64_t micro_batch,
                                         std::int64_t seq_len, Dtype dtype, bool weight_grads,
                                         const KernelOptions& options) {
  return backward_kernels(m, part, micro_batch, seq_len, dtype, GradFlow{weight_grads ? kAllWeights : 0, true},
                          options);
}

std::vector<KernelDesc> backward_kernels(const ModelSpec& m, ModulePart part, std::int64_t micro_batch,
                                         std::int64_t seq_len, Dtype dtype, const GradFlow& flow,
                                         const KernelOptions& options) {
  return detail::build_kernels(m, part, micro_batch, seq_len, dtype, true, flow, options, nullptr, nullptr);
}

Flops total_flops(const std::vector<KernelDesc>& ks) {
  Flops f = 0;
  for (const auto& k : ks) f += k.flops;
  return f;
}

}  // namespace fsdpsim::models

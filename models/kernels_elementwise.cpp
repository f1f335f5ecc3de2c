// The memory-bound kernels of a block besides the GEMMs and the attention: norms, rotary embedding,
// MLP activation, residual adds, gradient sums. Which kernels run depends on whose code runs
// (KernelOptions::implementation) and on torch.compile (KernelOptions::compile).
//
// Bytes per element below: e = activation dtype bytes (bf16: 2), fp32 intermediates 4 bytes; every
// kernel reads each input once and writes each output once. Per-token scalars ([T, 1] statistics)
// and [h] weights are counted where they are a kernel's only traffic.
//
// Eager, per implementation (each op of the Python code is one kernel):
//  * RMSNorm, Hugging Face (transformers LlamaRMSNorm.forward) and torchtitan (nn.RMSNorm ->
//    F.rms_norm, ATen's composite rms_norm in aten/src/ATen/native/layer_norm.cpp): x.to(fp32),
//    pow(2), mean(-1), + eps, rsqrt, x * rstd, .to(dtype), * weight: 8 kernels, 4e + 24 bytes/element.
//    Its autograd backward: the mul/to/pow/mean backward formulas of
//    tools/autograd/derivatives.yaml plus the sum of the two paths into x: 12 kernels (+2 for the
//    weight gradient: g * y and its sum over tokens), 4e + 76 (+4e) bytes/element.
//  * RMSNorm, LitGPT (litgpt/model.py RMSNorm.forward): x.float(), x * x, mean, + eps, rsqrt, mul,
//    weight.float(), * weight, .to(dtype): 9 kernels, 2e + 36; backward taken as Hugging Face's
//    (approximation).
//  * RMSNorm "fused" (Liger's kernel) and LayerNorm everywhere (F.layer_norm, one CUDA kernel): one
//    kernel forward (read x, write y); backward two kernels, as PyTorch's layer_norm_backward_cuda
//    launches them: dx (read dy, x; write dx) and, with weight grads, dgamma (read dy, x again).
//  * Rotary, Hugging Face / LitGPT (rotate_half): q * cos, neg of one half, cat, rotated * sin, add:
//    5 kernels per tensor, 10e bytes/element; backward 9 kernels per tensor, 15e (two slice_backward
//    zero-fills and copies, the neg, two muls, two adds summing the three paths into x).
//  * Rotary, torchtitan (apply_rotary_emb): x.float(), complex multiply, .type_as(x): 3 kernels per
//    tensor, 2e + 16 bytes/element; backward the same three, reversed.
//  * Rotary "fused": one kernel for q and k (read and write both).
//  * Gated MLP, eager (F.silu(gate) * up in all three codes): 2 kernels, 5e bytes/element of [T, f];
//    backward mul's two grads and silu_backward: 3 kernels, 9e. "fused": 1 kernel 3e, backward 5e.
//  * GELU MLP: F.gelu / nn.GELU, one kernel everywhere (2e; backward 3e). (GPT-2's "gelu_new" in
//    transformers is a chain of 8 ops: not modelled, an approximation.)
//  * Residual adds: one kernel (3 activations); in backward autograd adds the residual grad to the
//    norm's input grad (3 activations) and sums the input grads of linears sharing an input (q, k, v;
//    gate, up), one add per extra use.
// Compiled (torch.compile of each block; torchtitan's apply_compile compiles every TransformerBlock):
// inductor turns every chain of pointwise and reduction ops between two extern kernels (cuBLAS GEMMs,
// SDPA) into one generated kernel reading its inputs once and writing only what leaves the chain
// (torch/_inductor/scheduler.py fusion of pointwise into reductions; GEMMs stay extern calls without
// epilogue fusion unless max-autotune). A compiled block thus runs: norm (1 kernel), rotary of q and k
// (1), residual add + norm (1, writing both the sum and the normed tensor), the activation (1), the
// final residual add (1). Backward: the activation backward (1), each norm backward with the sums of
// its input grads and of the residual grad fused into its dx kernel (1) plus the weight-gradient
// reduction (1), the rotary backward (1). Approximations (said in the simulation's notes): inductor's
// exact kernel split (split reductions, horizontal fusion of q and k) is assumed, not traced; the
// partitioner's recomputation of cheap pointwise ops in backward (a memory decision) adds no kernel.
#include "models/kernel_builder.h"

namespace fsdpsim::models::detail {
namespace {

// One kernel of an eager op chain: bytes per element = e_coef * e + fp32_bytes; per_token kernels
// touch only [T, 1] statistics (8 bytes per token: read and write one fp32).
struct Step {
  const char* name;
  double e_coef, fp32_bytes;
  bool per_token = false;
  bool wgrad_only = false;
};

void chain(KernelBuilder& b, const std::string& prefix, MemoryClass cls, std::int64_t elems, std::int64_t tokens,
           const Step* steps, int n, bool wgrad) {
  for (int i = 0; i < n; ++i) {
    const Step& s = steps[i];
    if (s.wgrad_only && !wgrad) continue;
    const Bytes bytes = s.per_token ? tokens * 8
                                    : static_cast<Bytes>((s.e_coef * static_cast<double>(b.e) + s.fp32_bytes) *
                                                         static_cast<double>(elems));
    b.elementwise(prefix + "." + s.name, bytes, cls);
  }
}

// Hugging Face / torchtitan composite RMSNorm (see the file comment).
constexpr Step kRmsComposite[] = {
    {"to_fp32", 1, 4}, {"pow", 0, 8}, {"mean", 0, 4}, {"add_eps", 0, 0, true}, {"rsqrt", 0, 0, true},
    {"mul_rstd", 0, 8}, {"to_dtype", 1, 4}, {"mul_weight", 2, 0}};
constexpr Step kRmsCompositeBwd[] = {
    {"mul_weight_bwd", 2, 0},   {"weight_grad_mul", 3, 0, false, true}, {"weight_grad_sum", 1, 0, false, true},
    {"to_dtype_bwd", 1, 4},     {"mul_rstd_bwd", 0, 8},  {"rstd_grad_mul", 0, 12}, {"rstd_grad_sum", 0, 4},
    {"rsqrt_bwd", 0, 0, true},  {"mean_bwd", 0, 4},      {"pow_bwd_pow", 0, 8},    {"pow_bwd_scale", 0, 8},
    {"pow_bwd_mul", 0, 12},     {"grad_sum", 0, 12},     {"to_fp32_bwd", 1, 4}};
constexpr Step kRmsLitgpt[] = {
    {"float", 1, 4}, {"square", 0, 8}, {"mean", 0, 4}, {"add_eps", 0, 0, true}, {"rsqrt", 0, 0, true},
    {"mul_rstd", 0, 8}, {"weight_float", 0, 0, true}, {"mul_weight", 0, 8}, {"to_dtype", 1, 4}};
// Rotary per tensor.
constexpr Step kRopeRotateHalf[] = {{"mul_cos", 2, 0}, {"neg", 1, 0}, {"cat", 2, 0}, {"mul_sin", 2, 0}, {"add", 3, 0}};
constexpr Step kRopeRotateHalfBwd[] = {{"mul_sin_bwd", 2, 0}, {"neg_bwd", 1, 0}, {"slice_bwd_zeros1", 1, 0},
                                       {"slice_bwd_copy1", 1, 0}, {"slice_bwd_zeros2", 1, 0}, {"slice_bwd_copy2", 1, 0},
                                       {"mul_cos_bwd", 2, 0}, {"grad_sum1", 3, 0}, {"grad_sum2", 3, 0}};
constexpr Step kRopeComplex[] = {{"float", 1, 4}, {"complex_mul", 0, 8}, {"type_as", 1, 4}};
constexpr Step kRopeComplexBwd[] = {{"type_as_bwd", 1, 4}, {"complex_mul_bwd", 0, 8}, {"float_bwd", 1, 4}};
// Gated activation, eager.
constexpr Step kGated[] = {{"act", 2, 0}, {"mul", 3, 0}};
constexpr Step kGatedBwd[] = {{"mul_bwd_up", 3, 0}, {"mul_bwd_act", 3, 0}, {"act_bwd", 3, 0}};

template <std::size_t N>
constexpr int count_of(const Step (&)[N]) {
  return static_cast<int>(N);
}

bool composite_rmsnorm(const KernelBuilder& b) {
  return b.eager() && b.m.norm == NormKind::RMSNorm && b.opt.implementation != ModelImpl::Fused;
}

// One fused norm kernel (LayerNorm, a fused or compiled RMSNorm). Forward reads x (with the residual
// add fused in: x and the branch output, and it writes the sum too); backward: dx reading `grad_reads`
// gradients (compiled: the sum of the linears' input grads is fused in), x and the weight (and the
// residual grad when fused), then the weight-gradient reduction reading dy and x again.
void fused_norm(KernelBuilder& b, const std::string& name, bool wgrad, bool residual, std::int64_t grad_reads) {
  const Bytes act = b.act();
  const Bytes w = b.m.hidden * b.e * (b.m.norm == NormKind::LayerNorm && b.m.norm_bias ? 2 : 1);
  if (!b.backward) {
    b.elementwise(name, (residual ? 4 : 2) * act + w, MemoryClass::Norm);
    return;
  }
  b.elementwise(name + "_bwd", (grad_reads + (residual ? 1 : 0) + 2) * act + w, MemoryClass::Norm);
  if (wgrad) b.elementwise(name + "_wgrad", 2 * act + w, MemoryClass::Norm);
}

}  // namespace

void norm(KernelBuilder& b, const std::string& name, bool wgrad, std::int64_t grad_uses, bool residual) {
  if (b.opt.compile) {
    fused_norm(b, name, wgrad, residual, b.backward ? grad_uses : 1);
    return;
  }
  if (!b.backward && residual) residual_add(b, "residual_add");
  if (b.backward) grad_accumulate(b, name + "_grad_sum", grad_uses);
  if (!composite_rmsnorm(b)) {
    fused_norm(b, name, wgrad, false, 1);
  } else {
    const std::int64_t elems = b.T * b.m.hidden;
    if (b.backward) chain(b, name, MemoryClass::Norm, elems, b.T, kRmsCompositeBwd, count_of(kRmsCompositeBwd), wgrad);
    else if (b.opt.implementation == ModelImpl::LitGPT)
      chain(b, name, MemoryClass::Norm, elems, b.T, kRmsLitgpt, count_of(kRmsLitgpt), wgrad);
    else chain(b, name, MemoryClass::Norm, elems, b.T, kRmsComposite, count_of(kRmsComposite), wgrad);
  }
  if (b.backward && residual) b.elementwise("residual_grad_add", 3 * b.act(), MemoryClass::Residual);
}

void residual_add(KernelBuilder& b, const std::string& name) { b.elementwise(name, 3 * b.act(), MemoryClass::Residual); }

void rotary(KernelBuilder& b) {
  if (!b.eager() || b.opt.implementation == ModelImpl::Fused) {
    // one kernel reads and writes the whole of q and k (a partial rotation's pass-through dimensions included)
    const std::int64_t qf = b.T * b.m.n_heads * b.m.head_dim, kf = b.T * b.m.n_kv_heads * b.m.head_dim;
    b.elementwise(b.backward ? "rope_bwd" : "rope", 2 * (qf + kf) * b.e, MemoryClass::Rotary);
    return;
  }
  // Eager: the chain on the rotated dimensions; a partial rotation (rotary_dim < head_dim) adds the torch.cat
  // that joins the pass-through dimensions back (reads and writes the whole of q and k).
  const std::int64_t rd = b.m.rope_dims();
  const std::int64_t q = b.T * b.m.n_heads * rd, k = b.T * b.m.n_kv_heads * rd;
  if (rd < b.m.head_dim) {
    const Bytes whole = b.T * (b.m.n_heads + b.m.n_kv_heads) * b.m.head_dim * b.e;
    b.elementwise(b.backward ? "rope_cat_bwd" : "rope_cat", 2 * whole, MemoryClass::Copy);
  }
  const bool complex = b.opt.implementation == ModelImpl::TorchTitan;
  for (const auto& [tensor, elems] : {std::pair<const char*, std::int64_t>{"rope_q", q}, {"rope_k", k}}) {
    const std::string name = std::string(tensor) + (b.backward ? "_bwd" : "");
    if (complex) {
      if (b.backward) chain(b, name, MemoryClass::Rotary, elems, b.T, kRopeComplexBwd, count_of(kRopeComplexBwd), false);
      else chain(b, name, MemoryClass::Rotary, elems, b.T, kRopeComplex, count_of(kRopeComplex), false);
    } else {
      if (b.backward) chain(b, name, MemoryClass::Rotary, elems, b.T, kRopeRotateHalfBwd, count_of(kRopeRotateHalfBwd), false);
      else chain(b, name, MemoryClass::Rotary, elems, b.T, kRopeRotateHalf, count_of(kRopeRotateHalf), false);
    }
  }
}

void activation(KernelBuilder& b, const std::string& prefix, std::int64_t tokens, std::int64_t count) {
  const Bytes tf = tokens * b.m.ffn_hidden * b.e * count;
  if (b.m.mlp == MlpKind::Plain) {
    b.elementwise(prefix + (b.backward ? "gelu_bwd" : "gelu"), (b.backward ? 3 : 2) * tf, MemoryClass::Activation);
    return;
  }
  const std::string act = b.m.mlp == MlpKind::SwiGLU ? "silu_mul" : "gelu_mul";
  if (!b.eager() || b.opt.implementation == ModelImpl::Fused) {
    // read gate, up; write the product (backward: read gate, up, d(product); write d(gate), d(up))
    b.elementwise(prefix + act + (b.backward ? "_bwd" : ""), (b.backward ? 5 : 3) * tf, MemoryClass::Activation);
    return;
  }
  const std::int64_t elems = tokens * b.m.ffn_hidden * count;
  if (b.backward) chain(b, prefix + act + "_bwd", MemoryClass::Activation, elems, tokens, kGatedBwd, count_of(kGatedBwd), false);
  else chain(b, prefix + act, MemoryClass::Activation, elems, tokens, kGated, count_of(kGated), false);
}

void grad_accumulate(KernelBuilder& b, const std::string& name, std::int64_t uses) {
  for (std::int64_t i = 1; i < uses; ++i) b.elementwise(name, 3 * b.act(), MemoryClass::Residual);
}

}  // namespace fsdpsim::models::detail

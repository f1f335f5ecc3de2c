// Each framework's block written op by op on an AutogradTape. What each aten op saves is
// tools/autograd/derivatives.yaml (PyTorch): mul saves the operands whose partner requires grad (a
// RoPE cos/sin table or the position cache does not), pow saves self, rsqrt/tanh save their result,
// silu/gelu save self, _to_copy / cat / clone / add / views save nothing, mean saves sizes only,
// mm/addmm save their input only for the weight's gradient (and the weight: FSDP's accounting; frozen
// weights, models/trainable.h), _fused_rms_norm saves input + rstd, native_layer_norm saves input +
// mean + rstd (fp32 for bf16 inputs: acc_type), flash SDPA saves q, k, v, out, logsumexp (fp32
// [b, heads, s]) plus a CPU philox seed/offset, flex attention saves q, k, v, out, logsumexp. Views
// keep their base (split / transpose of a fused QKV output).
//
// Sources, read 2026-08/11 (the snapshots fetched for issue 19):
//  * torchtitan (pytorch/torchtitan b5bcd76): models/llama3/model.py Llama3TransformerBlock.forward;
//    models/common/nn_modules.py RMSNorm (= nn.RMSNorm -> F.rms_norm, which on CUDA with matching
//    input/weight dtypes dispatches to aten::_fused_rms_norm: aten/src/ATen/native/layer_norm.cpp
//    rms_norm_symint); models/common/attention.py FusedQKVLinear.forward (split + reshape +
//    .contiguous() copies of q, k, v; the llama3 flavors set fuse_qkv=True), GQAttention.forward
//    (enable_gqa, no repeat_kv), FlexAttention (the default attn_backend "flex"; its output takes
//    the query's stride order: torch/_inductor/kernel/flex, so the trailing .contiguous() is free);
//    models/common/rope.py ComplexRoPE (query.float(), view_as_complex, a per-block gather
//    cache[positions] saved by the complex mul, type_as); models/common/feed_forward.py
//    FeedForward.forward (w2(silu(w1 x) * w3 x)); models/common/moe.py (fp32 router, grouped experts).
//  * HF transformers: models/llama/modeling_llama.py LlamaRMSNorm, apply_rotary_pos_emb / rotate_half,
//    LlamaAttention, LlamaMLP; integrations/sdpa_attention.py sdpa_attention_forward (enable_gqa when
//    the mask is None, i.e. unpadded batches; repeat_kv otherwise); models/gemma GemmaRMSNorm
//    (x.float() ... * (1 + weight.float())); models/gpt2/modeling_gpt2.py (Conv1D = addmm; c_attn
//    split into q/k/v views; NewGELUActivation, activations.py, written in Python); models/mixtral
//    (router softmax fp32, top-k, per-expert loop with index_add_).
//  * litgpt (Lightning-AI/litgpt 2605705): model.py Block.forward, CausalSelfAttention.forward (fused
//    qkv split into views, apply_rope then torch.cat copy, repeat_interleave of k/v for GQA),
//    RMSNorm.forward (x.float(), x*x, rsqrt, weight.float()), LLaMAMLP / GemmaMLP / GptNeoxMLP, LLaMAMoE.
//  * Liger-Kernel (linkedin/Liger-Kernel ead96b6): ops/rms_norm.py (saves X, RSTD fp32 in llama/gemma
//    casting mode; in_place backward writes dX into dY), ops/layer_norm.py (Mean, RSTD in X.dtype),
//    ops/rope.py (rotates q and k in place, saves cos/sin), ops/swiglu.py LigerSiLUMulFunction (saves
//    a, b; backward writes da, db into them), transformers/monkey_patch.py apply_liger_kernel_to_llama.
//  * torchao float8 (pytorch/ao 36027d8): float8/float8_linear.py matmul_with_hp_or_float8_args saves
//    the high-precision input and weight (not fp8 copies) and recasts in backward; float8_utils.py
//    tensor_to_amax (torch.max(torch.abs(x)) tensorwise, torch.amax(..., dim) rowwise);
//    float8_training_tensor.py _ToFloat8ConstrFunc (x.to(float32) * scale, clamp, .to(fp8)).
#include "models/block_recipes.h"

#include "models/cuda_reduce.h"
#include "models/nf4.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_set>

namespace fsdpsim::models {
namespace {

// Names of per-expert tensors are built at run time; they must outlive every BlockMemory.
const char* intern(const std::string& s) {
  static std::mutex mu;
  static std::unordered_set<std::string> pool;
  std::lock_guard<std::mutex> lock(mu);
  return pool.insert(s).first->c_str();
}

enum class NormImpl { FusedRms, LayerNorm, HfLlamaRms, HfGemmaRms, LitgptRms, LigerRms, LigerLayerNorm };
enum class QkvImpl { Separate, FusedViews };
enum class RopeImpl { None, RotateHalf, RotateHalfCat, Complex, LigerInPlace };
enum class AttnImpl { FlashSdpa, Flex };
enum class MlpImpl { GluUnfused, GluLiger, PlainGelu, PlainGeluNew };

struct Recipe {
  NormImpl norm = NormImpl::HfLlamaRms;
  QkvImpl qkv = QkvImpl::Separate;
  RopeImpl rope = RopeImpl::RotateHalf;
  bool repeat_kv = false;          // k/v expanded to the query heads before attention (litgpt)
  AttnImpl attn = AttnImpl::FlashSdpa;
  MlpImpl mlp = MlpImpl::GluUnfused;
  bool up_before_act = false;      // litgpt computes fc_1 and fc_2 before the activation
  bool grouped_experts = false;    // torchtitan: one grouped GEMM over all routed tokens
  bool router_fp32 = false;        // torchtitan: the router gate runs under fp32 autocast
  bool float8_block_linears = true;  // torchao swaps nn.Linear; HF GPT-2's Conv1D is not one
};

// The closest recipe for each model of the zoo: GPT-2 / MPT shapes (LayerNorm, learned positions,
// plain GELU MLP, fused QKV in HF's and llm-foundry's code) take the recipe's LayerNorm and plain-MLP
// parts; MoE models the recipe's MoE path (see moe()).
Recipe recipe_for(const ModelSpec& m, ModelImpl impl) {
  Recipe r;
  const bool rms = m.norm == NormKind::RMSNorm;
  const bool rotary = m.positions == PositionKind::Rotary;
  const bool plain = m.mlp == MlpKind::Plain;
  const bool hf_fused_qkv = m.model_type == "gpt2" || m.model_type == "mpt" || m.model_type == "gpt_neox";
  switch (impl) {
    case ModelImpl::TorchTitan:
      r.norm = rms ? NormImpl::FusedRms : NormImpl::LayerNorm;
      // wq, wk, wv: torchtitan's stock QKVLinear (its FusedQKVLinear, one wqkv, is an option; checkpoints keep
      // the stock layout). Under op-level SAC the three are three mms: q and v kept, k recomputed.
      r.qkv = QkvImpl::Separate;
      r.rope = rotary ? RopeImpl::Complex : RopeImpl::None;
      r.attn = AttnImpl::Flex;
      r.mlp = plain ? MlpImpl::PlainGelu : MlpImpl::GluUnfused;
      r.grouped_experts = true;
      r.router_fp32 = true;
      break;
    case ModelImpl::HF:
    case ModelImpl::Fused:
    case ModelImpl::Runtime:   // (models/implementation.cpp answers for the runtime without a tape)
      r.norm = !rms ? NormImpl::LayerNorm : m.model_type == "gemma" ? NormImpl::HfGemmaRms : NormImpl::HfLlamaRms;
      r.qkv = hf_fused_qkv ? QkvImpl::FusedViews : QkvImpl::Separate;
      r.rope = rotary ? RopeImpl::RotateHalf : RopeImpl::None;
      r.mlp = !plain ? MlpImpl::GluUnfused : m.hidden_act == "gelu_new" ? MlpImpl::PlainGeluNew : MlpImpl::PlainGelu;
      r.float8_block_linears = m.model_type != "gpt2";
      if (impl == ModelImpl::Fused) {  // the same HF model with Liger's kernels patched in
        r.norm = rms ? NormImpl::LigerRms : NormImpl::LigerLayerNorm;
        r.rope = rotary ? RopeImpl::LigerInPlace : RopeImpl::None;
        r.mlp = plain ? MlpImpl::PlainGelu : MlpImpl::GluLiger;
      }
      break;
    case ModelImpl::LitGPT:
      r.norm = rms ? NormImpl::LitgptRms : NormImpl::LayerNorm;
      r.qkv = QkvImpl::FusedViews;
      r.rope = rotary ? RopeImpl::RotateHalfCat : RopeImpl::None;
      r.repeat_kv = true;
      r.mlp = plain ? MlpImpl::PlainGelu : MlpImpl::GluUnfused;
      r.up_before_act = true;
      break;
  }
  return r;
}

constexpr Bytes kFp32 = 4;   // statistics, upcasts, logsumexp
constexpr Bytes kInt64 = 8;  // indices
constexpr Bytes kFp8 = 1;
constexpr Bytes kComplex64 = 8;
// torchao's eager cast keeps two fp32 copies of the tensor alive at once (x.to(float32) and its
// product with the scale; then the product and its clamp): 2 x 4 bytes per element.
constexpr Bytes kEagerCastBytesPerElem = 2 * kFp32;

TapeIn in(int t, GradRule g = GradRule::New, bool saved = false) { return {t, g, saved}; }
TapeIn saved_in(int t, GradRule g = GradRule::New, SaveIf when = SaveIf::GradFn) { return {t, g, true, when}; }
// A linear's input: saved for its weight's gradient only (derivatives.yaml mm / addmm).
TapeIn linear_in(int t) { return {t, GradRule::New, true, SaveIf::WeightTrains}; }
// An operand of mul: saved for the other operands' gradients only (derivatives.yaml mul.Tensor).
TapeIn mul_in(int t, GradRule g = GradRule::New) { return {t, g, true, SaveIf::OtherInput}; }
TapeOut out(const char* name, Bytes bytes, bool saved = false, bool diff = true) { return {name, bytes, saved, diff, -1}; }
TapeOut view(const char* name, Bytes bytes, int of) { return {name, bytes, false, true, of}; }

class BlockWriter {
 public:
  BlockWriter(const ModelSpec& m, std::int64_t tokens, Dtype act, const ImplOptions& o, const GradFlow& g)
      : m_(m), o_(o), g_(g), r_(recipe_for(m, o.impl)), T_(tokens), e_(dtype_bytes(act)) {}

  AutogradTape block() {
    const Bytes h = m_.hidden;
    const int x = t_.input("x", T_ * h * e_, g_.input_requires_grad);
    const int n1 = norm(x, "attn_norm", Weight::AttnNorm);
    const int attn = dropout(called(n1, attention(n1)), "attn.resid_drop");
    if (m_.parallel_residual) {
      // Both branches read x (litgpt Block.forward with parallel_residual: x = self.mlp(n_2) + attention_output
      // + x, n_2 = n_1 with shared_attention_norm; HF GPTNeoXLayer: mlp_output + attn_output + hidden_states;
      // HF PhiDecoderLayer: attn_outputs + feed_forward_hidden_states + residual): the attention's output
      // lives through the MLP, the two branches are summed first (a new tensor), then x is added.
      const int n2 = m_.block_norms == 1 ? n1 : norm(x, "mlp_norm", Weight::MlpNorm);
      const int ffn = dropout(called(n2, m_.is_moe() ? moe(n2) : mlp(n2, T_, "mlp")), "mlp.resid_drop");
      const int sum = t_.add1({OpKind::Pointwise, {in(ffn, GradRule::Alias), in(attn, GradRule::Alias)}, {out("h", T_ * h * e_)}});
      const int y = t_.add1({OpKind::Pointwise, {in(sum, GradRule::Alias), in(x, GradRule::Alias)}, {out("out", T_ * h * e_)}});
      t_.output(y);
      return std::move(t_);
    }
    const int hres = t_.add1({OpKind::Pointwise, {in(x, GradRule::Alias), in(attn, GradRule::Alias)}, {out("h", T_ * h * e_)}});
    const int n2 = norm(hres, "mlp_norm", Weight::MlpNorm);
    const int ffn = dropout(called(n2, m_.is_moe() ? moe(n2) : mlp(n2, T_, "mlp")), "mlp.resid_drop");
    const int y = t_.add1({OpKind::Pointwise, {in(hres, GradRule::Alias), in(ffn, GradRule::Alias)}, {out("out", T_ * h * e_)}});
    t_.output(y);
    return std::move(t_);
  }

  AutogradTape final_norm() {
    const int x = t_.input("x", T_ * m_.hidden * e_, g_.input_requires_grad);
    const int n = norm(x, "final_norm", Weight::FinalNorm);
    // The LM head's linear saves its input (for its weight's gradient); its output (the logits) is the
    // loss model's (logits_bytes). A LoRA adapter on the head (lora below) adds its dropout, mask and A's
    // output here; its T x V tensors (the base output, B's output, the scaled product and their sum, the
    // logits) are the lowering's (program/lower_walk.cpp head_lora_forward), as the logits are.
    TapeOp head{OpKind::Matmul, {linear_in(n)}, {out("logits", 0)}};
    head.weight = use(Weight::LmHead);
    head.weight_grad = m_.vocab_size * m_.hidden * e_;
    const int logits = lora(n, t_.add1(head), T_, m_.vocab_size, "lm_head", Weight::LmHead);
    t_.output(logits);
    return std::move(t_);
  }

 private:
  const char* nm(const char* prefix, const char* leaf) { return intern(std::string(prefix) + "." + leaf); }
  // A submodule's forward (the attention, the MLP) keeps its argument until it returns: the caller's variable
  // (HF's decoder layers rebind hidden_states only to the call's result) and the callee's parameter (torchtitan's
  // Attention.forward(x), litgpt's) both refer to it, so the norm's output is not freed at its last read (the
  // v or up projection) but after the submodule's last op. It matters where nothing saves it (a checkpointed
  // forward, frozen projections): in PyTorch 2.11's allocator history of l1b-fsdp2-ac-mb4-s4096-hf-offload-sync
  // (reports/validation/torch-memory-2026-11-28) the checkpointed first block's attn_norm output is freed after
  // o_proj. Inside a compiled block the graph has no frames: inductor frees each buffer at its last use.
  int called(int arg, int result) {
    held_to_return({arg});
    return result;
  }
  // Local variables of an eager Python forward that has just returned: alive until its last op.
  void held_to_return(std::initializer_list<int> locals) {
    if (o_.compile) return;
    for (int t : locals) t_.hold(t);
  }
  WeightUse use(Weight w) const { return g_.trains_weight(w) ? WeightUse::Trains : WeightUse::Frozen; }
  // `numel`: the parameters' elements (weight and bias), whose gradient the op's backward creates when w trains.
  TapeOp with_weight(TapeOp op, Weight w, Bytes numel) const {
    op.weight = use(w);
    op.weight_grad = numel * e_;
    return op;
  }
  const char* nm_(const char* prefix, const char* leaf) { return intern(std::string(prefix) + "_" + leaf); }

  int pointwise(std::initializer_list<TapeIn> ins, const char* name, Bytes bytes, bool saved_out = false) {
    TapeOp op{OpKind::Pointwise, ins, {out(name, bytes, saved_out)}};
    return t_.add1(op);
  }
  // nn.Dropout on a residual branch (ModelSpec::resid_dropout > 0, training mode): native_dropout returns
  // the output and a bool mask; its backward (native_dropout_backward: grad * mask * scale, a new tensor)
  // needs only the mask (tools/autograd/derivatives.yaml native_dropout: result1), 1 byte per element.
  int dropout(int x, const char* name) {
    if (m_.resid_dropout <= 0.0) return x;
    const Bytes n = T_ * m_.hidden;
    return t_.add({OpKind::Pointwise, {in(x)}, {out(name, n * e_), out(nm(name, "mask"), n, true, false)}})[0];
  }
  // x.to(dtype): a new tensor unless the dtype is already that one (then .to returns x itself).
  int cast(int x, Bytes numel, Bytes from, Bytes to, const char* name) {
    return from == to ? x : pointwise({in(x)}, name, numel * to);
  }

  // ---- norms ----------------------------------------------------------------------------------
  // `w`: the norm's weight. The fused norms' formulas read their saved tensors for input and weight alike
  // (derivatives.yaml _fused_rms_norm / native_layer_norm: one formula for `input, weight`; Liger's
  // Functions save unconditionally): they save whenever the op records a graph.
  int norm(int x, const char* p, Weight w) {
    const Bytes h = m_.hidden, n = T_ * h;
    const Bytes ln = m_.norm_bias && g_.biases_train ? 2 * h : h;   // LayerNorm's weight and (trained) bias
    switch (r_.norm) {
      case NormImpl::FusedRms:  // aten::_fused_rms_norm: saves input, rstd (fp32 [T, 1])
        return t_.add(with_weight({OpKind::Norm, {saved_in(x)}, {out(nm(p, "out"), n * e_), out(nm(p, "rstd"), T_ * kFp32, true, false)}}, w, h))[0];
      case NormImpl::LayerNorm:  // aten::native_layer_norm: saves input, mean, rstd (fp32)
        return t_.add(with_weight({OpKind::Norm, {saved_in(x)},
                                   {out(nm(p, "out"), n * e_), out(nm(p, "mean"), T_ * kFp32, true, false),
                                    out(nm(p, "rstd"), T_ * kFp32, true, false)}}, w, ln))[0];
      case NormImpl::LigerRms:  // LigerRMSNormFunction: saves X, RSTD (fp32); in-place backward (dX = dY)
        return t_.add(with_weight({OpKind::Kernel, {saved_in(x, GradRule::Alias)},
                                   {out(nm(p, "out"), n * e_), out(nm(p, "rstd"), T_ * kFp32, true, false)}}, w, h))[0];
      case NormImpl::LigerLayerNorm:  // LigerLayerNormFunction: saves X, Mean, RSTD in X.dtype
        return t_.add(with_weight({OpKind::Kernel, {saved_in(x)},
                                   {out(nm(p, "out"), n * e_), out(nm(p, "mean"), T_ * e_, true, false),
                                    out(nm(p, "rstd"), T_ * e_, true, false)}}, w, ln))[0];
      case NormImpl::HfLlamaRms:
      case NormImpl::HfGemmaRms:
      case NormImpl::LitgptRms: return python_rms(x, p, w);
    }
    return x;
  }

  // The Python RMSNorms: x.float(); mean(x^2) (pow in HF, x * x in litgpt); rsqrt; x * rstd; then
  //   HF Llama: weight * normed.to(bf16) (saves the bf16 normed tensor);
  //   HF Gemma: (normed * (1 + weight.float())).type_as(x) (saves the fp32 normed tensor and 1 + w);
  //   litgpt:   (normed * weight.float()).to(bf16) (saves the fp32 normed tensor and weight.float()).
  //   A frozen weight (mul.Tensor saves each operand for the other's gradient only): the normed tensor is
  //   not saved, and the weight-gradient product is not computed.
  int python_rms(int x, const char* p, Weight wt) {
    const Bytes h = m_.hidden, n = T_ * h;
    const bool trains = g_.trains_weight(wt);
    const int xf = cast(x, n, e_, kFp32, nm(p, "x_fp32"));
    // HF: pow(2) saves self; litgpt: x * x saves both operands (one storage) and back-propagates twice
    const int sq = r_.norm == NormImpl::LitgptRms ? pointwise({mul_in(xf), mul_in(xf)}, nm(p, "x_sq"), n * kFp32)
                                                  : pointwise({saved_in(xf)}, nm(p, "x_sq"), n * kFp32);
    // mean: its backward expands and divides, a new full-size gradient
    const int var = t_.add1({OpKind::Reduction, {in(sq)}, {out(nm(p, "variance"), T_ * kFp32)}});
    const int var_eps = pointwise({in(var, GradRule::Alias)}, nm(p, "variance_eps"), T_ * kFp32);
    const int rstd = pointwise({in(var_eps)}, nm(p, "rstd"), T_ * kFp32, /*saved_out=*/true);
    // mul: grad * rstd for x, and (grad * x).sum(-1) for the broadcast rstd (a full-size fp32 temporary)
    TapeOp mul{OpKind::Pointwise, {mul_in(xf), mul_in(rstd)}, {out(nm(p, "normed_fp32"), n * kFp32)}};
    mul.bwd_workspace = n * kFp32;
    const int normed = t_.add1(mul);
    if (r_.norm == NormImpl::HfLlamaRms) {
      const int nb = cast(normed, n, kFp32, e_, nm(p, "normed"));
      // self.weight * normed: normed saved for the weight's gradient
      TapeOp w{OpKind::Pointwise, {mul_in(nb)}, {out(nm(p, "out"), n * e_)}};
      w.weight = use(wt);
      w.weight_grad = h * e_;
      w.bwd_workspace = trains ? n * e_ : 0;  // the weight gradient's (grad * normed) before its sum over tokens
      const int y = t_.add1(w);
      held_to_return({var, normed});   // LlamaRMSNorm.forward's locals `variance` and `hidden_states`
      return y;
    }
    // weight.float() (litgpt) / 1 + weight.float() (Gemma): a [h] fp32 tensor that requires grad when the
    // weight does, saved by the mul (for normed's gradient). Its gradient is the mul's (grad * normed) summed
    // over the tokens, a [h] fp32 tensor (mul_tensor_backward, then sum_to_size); ToCopyBackward0 casts it into
    // the weight's dtype (the weight's gradient, which AccumulateGrad keeps) and it dies.
    TapeOp wcast{OpKind::Pointwise, {}, {out(nm(p, "weight_fp32"), h * kFp32)}};
    wcast.weight = use(wt);
    wcast.weight_grad = h * e_;
    const int wf = t_.add1(wcast);
    TapeOp w{OpKind::Pointwise, {mul_in(normed), mul_in(wf)},
             {out(nm(p, "out_fp32"), n * kFp32)}};
    w.bwd_workspace = trains ? n * kFp32 : 0;  // the weight gradient's (grad * normed) before its sum
    const int y = t_.add1(w);
    const int out_t = cast(y, n, kFp32, e_, nm(p, "out"));
    // litgpt's RMSNorm.forward keeps its locals x (the fp32 copy), norm_x and x_normed until it returns; HF Gemma's
    // _norm(x.float()) has returned before the weight is applied
    if (r_.norm == NormImpl::LitgptRms) held_to_return({xf, var, normed});
    return out_t;
  }

  // ---- linear layers --------------------------------------------------------------------------
  // nn.Linear (or HF Conv1D) on T x in_f: saves its input. Under torchao float8 (Float8Linear) the
  // input and the weight are cast to fp8 before the mm (amax, then the scaled cast); the autograd
  // function still saves the high-precision input, and its backward recasts grad_output (twice: one
  // per gemm), the weight and the input.
  // `wt`: the linear's weight: a frozen one saves no input (mm / addmm save `self` / `mat1` only for the
  // weight's gradient); torchao's Float8Linear is an autograd.Function that saves its input either way.
  // `copies`: how many such matrices the op multiplies with (torchtitan's grouped experts: one per expert).
  int linear(int x, Bytes tokens, Bytes in_f, Bytes out_f, bool bias, const char* name, Weight wt,
             OpKind kind = OpKind::Matmul, Bytes copies = 1) {
    const bool f8 = o_.float8 != Float8Recipe::None && kind == OpKind::Matmul && r_.float8_block_linears;
    const Bytes grad_numel = copies * (in_f * out_f + (bias && g_.biases_train ? out_f : 0));   // weight and trained bias
    if (!f8) {
      const OpKind k = kind == OpKind::Matmul && bias ? OpKind::MatmulBias : kind;  // aten.addmm
      std::vector<TapeIn> ins{linear_in(x)};
      // QLoRA (models/nf4.h): LinearNF4 dequantizes the NF4 weight into a new compute-dtype tensor that the
      // matmul reads and that dies after it (a non-differentiable output: only the NF4 weight is saved), and
      // dequantizes it again in its backward for the input's gradient. Eager, get_original_weight's locals
      // peak at 14 bytes per element (the output's 2 among them).
      // Compiled, the forward's dequantized weight is kept for the backward instead: measured on PyTorch 2.11 with
      // torchao's NF4Tensor (tests/fixtures/torch_memory/l1b-fsdp2-qlora-r16-qkv-{hf,tt}-compile.json, their
      // allocator histories in reports/validation/torch-memory-2026-11-27-torchao), a compiled block without
      // checkpointing holds one compute-dtype copy of every NF4 linear's weight from its forward to its
      // backward (2 bytes per element: 8 MiB for llama-1b's q, 2 MiB for k and v, 32 MiB for each MLP matrix)
      // and its backward dequantizes nothing. AOTAutograd's joint graph holds LinearNF4's forward and backward
      // dequantizations of one weight as one computation, and its partitioner saves that output rather than
      // recomputing the chain (why it does not recompute it is not traced here: the measured saved sizes are the
      // weights', and the bf16 twin l1b-fsdp2-lora-r16-qkv-hf-compile saves no weight): a saved,
      // non-recomputable output here (OpKind::Kernel), with no eager workspace (the chain is fused).
      const bool nf4 = o_.lora.nf4 && kind == OpKind::Matmul && copies == 1 && wt != Weight::LmHead;
      const Bytes w_elems = in_f * out_f;
      // bitsandbytes (FSDP1): one CUDA kernel (a library call inductor does not fuse) after the fp32 absmax.
      const bool bnb = o_.lora.nf4_bnb;
      const bool kept_compiled = nf4 && o_.compile && !bnb;
      if (nf4) {
        TapeOp dq{bnb || kept_compiled ? OpKind::Kernel : OpKind::Pointwise, {},
                  {out(intern(std::string(name) + ".weight_dequant"), w_elems * e_, false, false)}};
        dq.fwd_workspace = bnb            ? bnb4_absmax_fp32_bytes(w_elems)
                           : kept_compiled ? 0
                                           : w_elems * (kNf4EagerDequantPeakPerElem - e_);
        // Compiled inside a checkpointed block, LinearNF4's traced ops carry no checkpoint tag (the AOT forward
        // graph of l1b-fsdp2-qlora-r16-qkv-ac-hf-compile, reports/validation/torch-memory-2026-11-27-torchao,
        // logs-5): the dequantized weight and the GEMM's output are saved when the backward needs them.
        dq.escapes_checkpoint = kept_compiled;
        const int t = t_.add1(dq);
        ins.push_back(kept_compiled ? TapeIn{t, GradRule::None, true, SaveIf::GradFn} : in(t, GradRule::None));
      }
      TapeOp mm = with_weight({k, ins, {out(name, tokens * out_f * e_)}}, wt, grad_numel);
      mm.escapes_checkpoint = kept_compiled;
      if (nf4)
        mm.bwd_workspace = bnb            ? w_elems * e_ + bnb4_absmax_fp32_bytes(w_elems)
                           : kept_compiled ? 0
                                           : w_elems * kNf4EagerDequantPeakPerElem;
      // AddmmBackward0's bias gradient, grad.sum_to_size(bias): a sum over the tokens whose CUDA kernel
      // stages partial sums in a buffer from the caching allocator while it runs (models/cuda_reduce.h)
      if (k == OpKind::MatmulBias && mm.weight == WeightUse::Trains)
        mm.bwd_workspace = cuda_sum_rows_staging_bytes(tokens * copies, out_f, o_.sm_count);
      return lora(x, t_.add1(mm), tokens, out_f, name, wt);
    }
    const bool rowwise = o_.float8 == Float8Recipe::Rowwise;
    const bool eager = !o_.compile;
    const std::string base(name);
    // A Float8TrainingTensor: the fp8 data and its scale (both live until the mm has run).
    auto cast_fp8 = [&](int src, Bytes rows, Bytes cols, const std::string& what) {
      // amax: tensorwise torch.max(torch.abs(x)) (aten.max, a 0-dim tensor in x's dtype); rowwise
      // torch.amax(torch.abs(x), dim, keepdim) (one value per row). abs(x) is an eager temporary.
      TapeOp amax{rowwise ? OpKind::Reduction : OpKind::Amax, src >= 0 ? std::vector<TapeIn>{in(src, GradRule::None)} : std::vector<TapeIn>{},
                  {out(intern(base + "." + what + "_amax"), (rowwise ? rows : 1) * e_, false, false)}};
      amax.fwd_workspace = eager ? rows * cols * e_ : 0;
      const int a = t_.add1(amax);
      std::vector<TapeIn> ins{in(a, GradRule::None)};
      if (src >= 0) ins.insert(ins.begin(), in(src, GradRule::None));
      TapeOp c{OpKind::Pointwise, ins,
               {out(intern(base + "." + what + "_fp8"), rows * cols * kFp8, false, false),
                out(intern(base + "." + what + "_scale"), (rowwise ? rows : 1) * kFp32, false, false)}};
      c.fwd_workspace = rows * cols * kEagerCastBytesPerElem;  // zeroed when compiled (fused)
      return t_.add(c);
    };
    const std::vector<int> x8 = cast_fp8(x, tokens, in_f, "in");
    const std::vector<int> w8 = cast_fp8(-1, out_f, in_f, "w");  // the unsharded weight (FSDP's), cast every forward
    TapeOp mm{OpKind::Matmul,
              {saved_in(x), in(x8[0], GradRule::None), in(x8[1], GradRule::None), in(w8[0], GradRule::None), in(w8[1], GradRule::None)},
              {out(bias ? intern(base + ".mm") : name, tokens * out_f * e_)}};
    // backward: grad_output cast twice (dim0 for grad_input, dim1 for grad_weight), the weight and the
    // input recast; the fp8 copies live until the function returns; eager casts add two fp32 copies.
    const Bytes go = tokens * out_f, xi = tokens * in_f, w = in_f * out_f;
    mm.bwd_workspace = (2 * go + xi + w) * kFp8 + (eager ? std::max({go, xi, w}) * kEagerCastBytesPerElem : 0);
    mm.weight = use(wt);
    mm.weight_grad = grad_numel * e_;   // (the bias's gradient, from the add's backward, counted here too)
    const int y = t_.add1(mm);
    if (!bias) return lora(x, y, tokens, out_f, name, wt);
    return lora(x, pointwise({in(y, GradRule::Alias)}, name, tokens * out_f * e_), tokens, out_f, name, wt);  // + bias
  }

  // LoRA beside the linear that produced `y` from `x` (models/trainable.h LoraShape): pretrained + B(A(drop(x)))
  // * scaling. litgpt lit_gpt/lora.py LoRALinear.forward / LoRAQKVLinear.forward (8641822), torchtune
  // torchtune/modules/peft/lora.py LoRALinear.forward (0217d44c), PEFT lora/layer.py Linear.forward:
  //  * nn.Dropout(p > 0) in training is aten.native_dropout: a new tensor and a bool mask, the mask saved
  //    for its backward (derivatives.yaml native_dropout: native_dropout_backward(grad, result1, scale));
  //    p = 0 returns x itself (Dropout.cpp _dropout_impl);
  //  * A's linear saves its input (drop(x), or x itself) for A's gradient, B's saves A's r-wide output
  //    (litgpt's fused qkv: a grouped conv1d of A's output, which it saves for B's gradient);
  //  * litgpt's LoRAQKVLinear with only some of q, k, v enabled zero-pads B's output to the fused width
  //    (zero_pad: new_zeros + index_copy, a new full-width tensor); the product by the scaling (a Python
  //    float: mul.Scalar saves nothing) is a new tensor, and so is the sum with the pretrained output.
  // Adapters stay in the high precision under float8 (not modelled: a Float8Linear conversion of PEFT's or
  // torchtune's adapter linears). On the LM head the out_f-wide tensors (B's output, the scaled product, the
  // sum) are T x V: the tape counts them as 0 bytes, like the head's logits, and the lowering allocates them
  // one by one (program/lower_walk.cpp head_lora_forward / head_lora_backward).
  int lora(int x, int y, Bytes tokens, Bytes out_f, const char* name, Weight wt) {
    if (!o_.lora.on()) return y;
    const bool head = wt == Weight::LmHead;
    const AdapterMatrix* a = nullptr;
    const AdapterMatrix* b = nullptr;
    for (const AdapterMatrix& m : adapters(head)) {
      const bool mine = m.base == wt || (wt == Weight::Up && m.base == Weight::Fc) || (wt == Weight::Fc && m.base == Weight::Up);
      if (!mine) continue;
      if (m.is_a && !a) a = &m;
      else if (!m.is_a && !b) b = &m;
    }
    if (!a || !b) return y;
    const std::string base(name);
    const Bytes in_f = a->cols;
    int xd = x;
    if (o_.lora.dropout)
      xd = t_.add({OpKind::Pointwise, {in(x)},
                   {out(intern(base + ".lora_dropout"), tokens * in_f * e_),
                    out(intern(base + ".lora_mask"), tokens * in_f, true, false)}})[0];
    const int ya = t_.add1(with_weight({OpKind::Matmul, {linear_in(xd)}, {out(intern(base + ".lora_a"), tokens * a->rows * e_)}},
                                       Weight::Adapter, a->numel()));
    const Bytes wide = head ? 0 : tokens * out_f * e_;
    const Bytes yb_bytes = head ? 0 : tokens * b->rows * e_;
    const bool litgpt_qkv = wt == Weight::QKV && o_.impl == ModelImpl::LitGPT;
    int after_b = -1, update = -1;
    if (litgpt_qkv) {
      std::tie(after_b, update) = litgpt_qkv_update(ya, *b, tokens, out_f, base);
    } else {
      after_b = update = t_.add1(
          with_weight({OpKind::Matmul, {linear_in(ya)}, {out(intern(base + ".lora_b"), yb_bytes)}}, Weight::Adapter,
                      b->numel()));
      if (b->rows < out_f) update = pointwise({in(after_b)}, intern(base + ".lora_pad"), wide);
    }
    const int scaled = pointwise({in(update)}, intern(base + ".lora_scaled"), wide);
    const int sum = pointwise({in(y, GradRule::Alias), in(scaled, GradRule::Alias)}, intern(base + ".lora_sum"), wide);
    if (litgpt_qkv) held_to_return({ya, after_b});   // LoRAQKVLinear.forward's locals after_A, after_B
    return sum;
  }
  // litgpt's LoRAQKVLinear.forward between A and the scaling (litgpt/lora.py at 01e39f5; the same at 8641822):
  // `after_B` is conv1d (kernel 1) of A's transposed output: one grouped conv1d when every query head has its own k
  // and v, else A's output chunked per enabled part, one conv1d each (its own output) and a torch.cat (a new
  // tensor, the parts freed after it); zero_pad, unless every part is enabled: new_zeros of the fused width, the
  // update's transpose(0, 1).reshape (a copy: the transpose of a transposed conv output is not contiguous),
  // index_copy out of place (a new full-width tensor; the zeros and the copy die at its return). Returns (after_B,
  // the padded update). (The index tensor litgpt builds per call is a few KiB: not modelled.)
  std::pair<int, int> litgpt_qkv_update(int ya, const AdapterMatrix& b, Bytes tokens, Bytes out_f,
                                        const std::string& base) {
    const Bytes wide = tokens * out_f * e_, yb_bytes = tokens * b.rows * e_;
    TapeOp conv = with_weight({OpKind::Matmul, {linear_in(ya)}, {}}, Weight::Adapter, b.numel());
    const bool grouped = m_.n_kv_heads == m_.n_heads;
    if (grouped) {
      conv.out.push_back(out(intern(base + ".lora_b"), yb_bytes));
    } else {
      const Bytes widths[3] = {m_.n_heads * m_.head_dim, m_.n_kv_heads * m_.head_dim, m_.n_kv_heads * m_.head_dim};
      const Weight parts[3] = {Weight::Q, Weight::K, Weight::V};
      const char* names[3] = {".lora_b_q", ".lora_b_k", ".lora_b_v"};
      for (int i = 0; i < 3; ++i)
        if (o_.lora.adapts(parts[i])) conv.out.push_back(out(intern(base + names[i]), tokens * widths[i] * e_));
    }
    const std::vector<int> convs = t_.add(conv);
    int yb = convs[0];
    if (!grouped) {
      TapeOp cat{OpKind::Pointwise, {}, {out(intern(base + ".lora_b"), yb_bytes)}};
      for (int c : convs) cat.in.push_back(in(c, GradRule::Alias));
      yb = t_.add1(cat);
    }
    if (b.rows >= out_f) return {yb, yb};
    const int zeros = t_.add1({OpKind::Pointwise, {}, {out(intern(base + ".lora_zeros"), wide, false, false)}});
    const int flat = pointwise({in(yb, GradRule::Alias)}, intern(base + ".lora_flat"), yb_bytes);
    TapeOp pad{OpKind::Pointwise, {in(zeros, GradRule::None), in(flat)}, {out(intern(base + ".lora_pad"), wide)}};
    return {yb, t_.add1(pad)};
  }
  const std::vector<AdapterMatrix>& adapters(bool head) {
    if (!adapters_built_) {
      block_adapters_ = lora_adapters(m_, o_.impl, o_.lora, false);
      head_adapters_ = lora_adapters(m_, o_.impl, o_.lora, true);
      adapters_built_ = true;
    }
    return head ? head_adapters_ : block_adapters_;
  }
  bool adapters_built_ = false;
  std::vector<AdapterMatrix> block_adapters_, head_adapters_;

  // ---- attention ------------------------------------------------------------------------------
  int attention(int xn) {
    const Bytes h = m_.hidden, a = m_.n_heads, g = m_.n_kv_heads, d = m_.head_dim;
    const Bytes qb = T_ * a * d * e_, kb = T_ * g * d * e_;
    int q = -1, k = -1, v = -1, qkv = -1;
    if (r_.qkv == QkvImpl::Separate) {
      q = linear(xn, T_, h, a * d, m_.qkv_bias, "attn.q", Weight::Q);
      k = linear(xn, T_, h, g * d, m_.qkv_bias, "attn.k", Weight::K);
      v = linear(xn, T_, h, g * d, m_.qkv_bias, "attn.v", Weight::V);
    } else {
      qkv = linear(xn, T_, h, (a + 2 * g) * d, m_.qkv_bias, "attn.qkv", Weight::QKV);
      // split: views of qkv; its backward concatenates the three gradients into a new qkv-sized one
      const auto parts =
          t_.add({OpKind::View, {in(qkv)}, {view("attn.q", qb, qkv), view("attn.k", kb, qkv), view("attn.v", kb, qkv)}});
      q = parts[0], k = parts[1], v = parts[2];
    }
    int qr = q, kr = k;
    switch (r_.rope) {
      case RopeImpl::None: break;
      case RopeImpl::RotateHalf:
      case RopeImpl::RotateHalfCat: {
        const bool cat = r_.rope == RopeImpl::RotateHalfCat;
        qr = rotate_half(q, qb, "attn.q", cat);
        kr = rotate_half(k, kb, "attn.k", cat);
        t_.hold(q);  // the caller's query_states / q variables until the rotated pair is returned
        t_.hold(k);
        break;
      }
      case RopeImpl::Complex: {
        // one gather of the complex cache per block: cache[positions], [T, d/2] complex64
        const int cache = t_.add1({OpKind::Gather, {}, {out("attn.rope_cache", T_ * (d / 2) * kComplex64, false, false)}});
        const int qf = cast(q, T_ * a * d, e_, kFp32, "attn.q_fp32");
        const int kf = cast(k, T_ * g * d, e_, kFp32, "attn.k_fp32");
        const int qc = pointwise({in(qf), in(cache, GradRule::None, true)}, "attn.q_complex", T_ * a * d * kFp32);
        const int kc = pointwise({in(kf), in(cache, GradRule::None, true)}, "attn.k_complex", T_ * g * d * kFp32);
        qr = cast(qc, T_ * a * d, kFp32, e_, "attn.q_rope");
        kr = cast(kc, T_ * g * d, kFp32, e_, "attn.k_rope");
        for (int t : {q, k, qf, kf, qc, kc}) t_.hold(t);  // locals of apply_rotary_emb and its caller until return
        break;
      }
      case RopeImpl::LigerInPlace: {  // rotates q and k in their own storage; backward rotates dq, dk in place
        const auto r = t_.add({OpKind::Kernel, {in(q, GradRule::Alias), in(k, GradRule::Alias)},
                               {view("attn.q_rope", qb, q), view("attn.k_rope", kb, k)}});
        qr = r[0], kr = r[1];
        break;
      }
    }
    int kk = kr, vv = v;
    Bytes kernel_kv_heads = g;
    if (r_.repeat_kv && g != a) {  // litgpt: k.repeat_interleave(q_per_kv, dim=1), same for v
      kk = pointwise({in(kr)}, "attn.k_rep", qb);
      vv = pointwise({in(v)}, "attn.v_rep", qb);
      kernel_kv_heads = a;
    }
    TapeOp sdpa{OpKind::Attention, {saved_in(qr), saved_in(kk), saved_in(vv)},
                {out("attn.out", qb, true), out("attn.lse", T_ * a * kFp32, true, false)}};
    if (r_.attn == AttnImpl::FlashSdpa) {
      // flash_api.cpp mha_bwd: softmax_d fp32 [b, heads, s], dq_accum fp32 [b, s, heads, d], and for
      // GQA dk/dv at the query head count before the sum over groups (seq/head-dim rounding ignored)
      sdpa.bwd_workspace = T_ * a * kFp32 + T_ * a * d * kFp32 + (kernel_kv_heads != a ? 2 * qb : 0);
    } else {
      sdpa.bwd_workspace = T_ * a * kFp32;  // flex backward: delta = sum(out * grad_out), fp32 [b, heads, s]
    }
    const int o = t_.add(sdpa)[0];
    // The attention output takes the query's memory layout (flash_api.cpp mha_fwd: out = empty_like(q) of the
    // [b, s, heads, d] transpose; flex matches the query's stride order). HF's and torchtitan's queries are
    // [b, s, heads, d] in memory, so the .transpose(1, 2).contiguous() / .reshape() that follow are views;
    // a query that comes out of a torch.cat along the head dimension (litgpt's rope, and partial rotary in HF's
    // code as in litgpt's: rotate_half below) is a new [b, heads, s, d] tensor, so the output is too and
    // y.transpose(1, 2).reshape(B, T, C) / .contiguous() copies it (measured for litgpt: a 16 MiB tensor after the
    // logsumexp in block 1 of l1b-fsdp2-lora5pct-litgpt's allocator history, reports/validation/torch-memory-2026-11-26).
    const bool query_by_cat =
        r_.rope == RopeImpl::RotateHalfCat || (r_.rope == RopeImpl::RotateHalf && m_.rope_dims() < m_.head_dim);
    const int y = query_by_cat ? pointwise({in(o, GradRule::Alias)}, "attn.y", qb) : o;
    const int proj = linear(y, T_, a * d, h, m_.out_bias, "attn.proj", Weight::Out);
    // A fused projection's output stays referenced by the forward's locals until it returns (litgpt's `qkv`;
    // HF GPT-2's query/key/value views of it), even where every view the attention reads is a new tensor
    // (litgpt's roped q and k, repeated v): measured in the same history, the 24 MiB qkv is freed after o_proj.
    if (qkv >= 0) held_to_return({qkv});
    return proj;
  }

  // HF rotate_half / litgpt apply_rope: (x * cos) + (cat(-x2, x1) * sin); litgpt then copies the
  // result with torch.cat((roped, x[..., n_elem:])). Slices' backward allocates a full-size zero tensor.
  // Partial rotary (ModelSpec::rotary_dim < head_dim: HF GPTNeoXAttention / PhiAttention, litgpt with
  // rotary_percentage < 1) rotates the slice x[..., :rotary_dim] and concatenates the pass-through
  // x[..., rotary_dim:] back (torch.cat: a new full-size tensor), in HF's code as in litgpt's.
  int rotate_half(int x, Bytes xb, const char* p, bool litgpt) {
    const bool partial = m_.rope_dims() < m_.head_dim;
    const Bytes rb = xb / m_.head_dim * m_.rope_dims();   // the rotated slice's bytes
    const int xr = partial ? t_.add1({OpKind::View, {in(x)}, {view(nm_(p, "rot_in"), rb, x)}}) : x;
    auto step_cos = [&] { return pointwise({in(xr)}, nm_(p, "cos"), rb); };
    int xc = litgpt ? -1 : step_cos();
    const int x1 = t_.add1({OpKind::View, {in(xr)}, {view(nm_(p, "x1"), rb / 2, xr)}});
    const int x2 = t_.add1({OpKind::View, {in(xr)}, {view(nm_(p, "x2"), rb / 2, xr)}});
    const int neg = pointwise({in(x2)}, nm_(p, "neg"), rb / 2);
    const int rot = pointwise({in(neg, GradRule::Alias), in(x1, GradRule::Alias)}, nm_(p, "rot"), rb);
    if (litgpt) xc = step_cos();
    const int rs = pointwise({in(rot)}, nm_(p, "rot_sin"), rb);
    const bool cat = litgpt || partial;
    const int roped = pointwise({in(xc, GradRule::Alias), in(rs, GradRule::Alias)}, nm_(p, cat ? "roped" : "rope"), rb);
    // litgpt's apply_rope keeps `rotated` in a local until it returns (after the sum); HF's rotate_half(x) is a
    // temporary of the expression, freed by the multiplication by sin.
    if (litgpt) held_to_return({rot});
    if (!cat) return roped;
    if (!partial) return pointwise({in(roped, GradRule::Alias)}, nm_(p, "rope"), xb);
    const int pass = t_.add1({OpKind::View, {in(x)}, {view(nm_(p, "pass"), xb - rb, x)}});
    return pointwise({in(roped, GradRule::Alias), in(pass, GradRule::Alias)}, nm_(p, "rope"), xb);
  }

  // ---- MLP ------------------------------------------------------------------------------------
  // `expert`: a MoE expert's MLP (its matrices are Weight::Experts).
  int mlp(int xn, Bytes tokens, const char* p, bool expert = false) {
    const Bytes h = m_.hidden, f = m_.ffn_hidden, n = tokens * f;
    const bool bias = m_.mlp_bias;
    const auto wk = [&](Weight w) { return expert ? Weight::Experts : w; };
    // torchtitan's grouped experts: one grouped GEMM over every expert's matrix (their gradients at once)
    const Bytes copies = expert && r_.grouped_experts ? m_.n_experts : 1;
    switch (r_.mlp) {
      case MlpImpl::GluUnfused: {  // down(act(gate(x)) * up(x)); act = silu (SwiGLU) or gelu (GeGLU)
        const int gate = linear(xn, tokens, h, f, bias, nm(p, "gate"), wk(Weight::Gate), OpKind::Matmul, copies);
        int up = r_.up_before_act ? linear(xn, tokens, h, f, bias, nm(p, "up"), wk(Weight::Up), OpKind::Matmul, copies) : -1;
        const int act = pointwise({saved_in(gate)}, nm(p, "act"), n * e_);
        if (up < 0) up = linear(xn, tokens, h, f, bias, nm(p, "up"), wk(Weight::Up), OpKind::Matmul, copies);
        const int prod = pointwise({mul_in(act), mul_in(up)}, nm(p, "prod"), n * e_);
        return linear(prod, tokens, f, h, bias, nm(p, "down"), wk(Weight::Down), OpKind::Matmul, copies);
      }
      case MlpImpl::GluLiger: {  // LigerSiLUMulFunction / LigerGELUMulFunction
        const int gate = linear(xn, tokens, h, f, bias, nm(p, "gate"), wk(Weight::Gate), OpKind::Matmul, copies);
        const int up = linear(xn, tokens, h, f, bias, nm(p, "up"), wk(Weight::Up), OpKind::Matmul, copies);
        const int prod = t_.add1({OpKind::Kernel, {saved_in(gate, GradRule::IntoSaved), saved_in(up, GradRule::IntoSaved)},
                                  {out(nm(p, "prod"), n * e_)}});
        return linear(prod, tokens, f, h, bias, nm(p, "down"), wk(Weight::Down), OpKind::Matmul, copies);
      }
      case MlpImpl::PlainGelu: {  // nn.GELU / F.gelu: one kernel saving its input
        const int fc = linear(xn, tokens, h, f, bias, nm(p, "fc"), wk(Weight::Fc), OpKind::Matmul, copies);
        const int act = pointwise({saved_in(fc)}, nm(p, "act"), n * e_);
        return linear(act, tokens, f, h, bias, nm(p, "down"), wk(Weight::Down), OpKind::Matmul, copies);
      }
      case MlpImpl::PlainGeluNew: {
        // NewGELUActivation: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3)))), op by op
        const int fc = linear(xn, tokens, h, f, bias, nm(p, "fc"), wk(Weight::Fc), OpKind::Matmul, copies);
        const int half = pointwise({in(fc)}, nm(p, "gelu_half"), n * e_);
        const int cube = pointwise({saved_in(fc)}, nm(p, "gelu_cube"), n * e_);
        const int cube_s = pointwise({in(cube)}, nm(p, "gelu_cube_scaled"), n * e_);
        const int inner = pointwise({in(fc, GradRule::Alias), in(cube_s, GradRule::Alias)}, nm(p, "gelu_inner"), n * e_);
        const int inner_s = pointwise({in(inner)}, nm(p, "gelu_inner_scaled"), n * e_);
        const int th = pointwise({in(inner_s)}, nm(p, "gelu_tanh"), n * e_, /*saved_out=*/true);
        const int one_p = pointwise({in(th, GradRule::Alias)}, nm(p, "gelu_one_plus"), n * e_);
        const int act = pointwise({mul_in(half), mul_in(one_p)}, nm(p, "act"), n * e_);
        return linear(act, tokens, f, h, bias, nm(p, "down"), wk(Weight::Down), OpKind::Matmul, copies);
      }
    }
    return xn;
  }

  // ---- MoE ------------------------------------------------------------------------------------
  // Router: gate mm, softmax (fp32, saves its result), top-k (saves indices), weights. Experts, with
  // routing balanced (T*k routed tokens spread evenly): torchtitan gathers all routed tokens for one
  // grouped GEMM; HF / litgpt / Liger loop over experts (x[token_idx], the expert MLP, * weight,
  // index_add_ into a zero output). Approximate: torchtitan's token dispatcher and combine are
  // modelled as one gather and one weighted index_add, HF's fused gate_up projection as two
  // linears of the same bytes, and the expert MLP follows the recipe's dense MLP; float8 is not
  // applied to experts or the router (torchtitan filters the router; experts use a grouped converter).
  int moe(int xn) {
    const Bytes h = m_.hidden, E = m_.n_experts, k = m_.experts_top_k;
    int router_in = xn;
    if (r_.router_fp32) router_in = cast(xn, T_ * h, e_, kFp32, "moe.router_in_fp32");
    const Bytes logit_bytes = r_.router_fp32 ? kFp32 : e_;
    const int logits = t_.add1(with_weight({OpKind::RouterMatmul, {linear_in(router_in)}, {out("moe.router_logits", T_ * E * logit_bytes)}},
                                           Weight::Router, h * E));
    const int probs = pointwise({in(logits)}, "moe.probs", T_ * E * kFp32, /*saved_out=*/true);
    const auto top = t_.add({OpKind::Topk, {in(probs)},
                             {out("moe.topk_val", T_ * k * kFp32), out("moe.topk_idx", T_ * k * kInt64, true, false)}});
    const int sum = pointwise({in(top[0])}, "moe.topk_sum", T_ * kFp32);
    const int wts = pointwise({saved_in(top[0]), saved_in(sum)}, "moe.weights", T_ * k * kFp32);
    const int w = cast(wts, T_ * k, kFp32, e_, "moe.weights_act");
    const int y = t_.add1({OpKind::Pointwise, {}, {out("moe.out", T_ * h * e_)}});  // zeros; index_add_ in place
    const Bytes routed = T_ * k;
    const Bytes groups = r_.grouped_experts ? 1 : E;
    int acc = y;
    for (Bytes i = 0; i < groups; ++i) {
      const Bytes n = routed / groups + (i < routed % groups ? 1 : 0);
      if (n == 0) continue;
      const std::string p = r_.grouped_experts ? std::string("moe.experts") : "moe.e" + std::to_string(i);
      const char* pc = intern(p);
      // torch.where(expert_mask[i]) (data-dependent: not recomputable), then x[token_idx]: saves the
      // indices; its backward scatters into a zero tensor of x's size
      const int idx = t_.add1({OpKind::Reduction, {in(top[1], GradRule::None)}, {out(nm(pc, "token_idx"), n * kInt64, false, false)}});
      const int xe = pointwise({in(xn), in(idx, GradRule::None, true)}, nm(pc, "x"), n * h * e_);
      const int ye = mlp(xe, n, pc, /*expert=*/true);
      const int we = pointwise({in(w)}, nm(pc, "weight"), n * e_);
      const int ze = pointwise({mul_in(ye), mul_in(we)}, nm(pc, "weighted"), n * h * e_);
      acc = t_.add1({OpKind::Pointwise, {in(acc, GradRule::Alias), in(ze), in(idx, GradRule::None, true)},
                     {view(nm(pc, "index_add"), T_ * h * e_, acc)}});
    }
    return acc;
  }

  const ModelSpec& m_;
  const ImplOptions& o_;
  const GradFlow g_;
  const Recipe r_;
  const Bytes T_;
  const Bytes e_;
  AutogradTape t_;
};

}  // namespace

AutogradTape build_block_tape(const ModelSpec& m, std::int64_t tokens, Dtype act, const ImplOptions& o,
                              const GradFlow& g) {
  return BlockWriter(m, tokens, act, o, g).block();
}

AutogradTape build_final_norm_tape(const ModelSpec& m, std::int64_t tokens, Dtype act, const ImplOptions& o,
                                   const GradFlow& g) {
  return BlockWriter(m, tokens, act, o, g).final_norm();
}

// The linears BlockWriter writes (attention(), mlp(), moe()), in the recipe's registration order: q, k, v
// (or the fused qkv), the output projection, then the MLP's (gate, up, down / fc, down) or the router and
// the experts.
std::vector<BlockMatrix> block_matrices(const ModelSpec& m, ModelImpl impl) {
  const Recipe r = recipe_for(m, impl);
  const std::int64_t h = m.hidden, a = m.n_heads, g = m.n_kv_heads, d = m.head_dim, f = m.ffn_hidden;
  std::vector<BlockMatrix> v;
  if (r.qkv == QkvImpl::Separate) {
    v.push_back({Weight::Q, h * a * d});
    v.push_back({Weight::K, h * g * d});
    v.push_back({Weight::V, h * g * d});
  } else {
    v.push_back({Weight::QKV, h * (a + 2 * g) * d});
  }
  v.push_back({Weight::Out, a * d * h});
  const bool plain = r.mlp == MlpImpl::PlainGelu || r.mlp == MlpImpl::PlainGeluNew;
  if (m.is_moe()) {
    v.push_back({Weight::Router, h * m.n_experts});
    v.push_back({Weight::Experts, m.n_experts * (plain ? 2 : 3) * h * f});
  } else if (plain) {
    v.push_back({Weight::Fc, h * f});
    v.push_back({Weight::Down, f * h});
  } else {
    v.push_back({Weight::Gate, h * f});
    v.push_back({Weight::Up, h * f});
    v.push_back({Weight::Down, f * h});
  }
  return v;
}

}  // namespace fsdpsim::models

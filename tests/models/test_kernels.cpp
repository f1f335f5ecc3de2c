// Kernel lists: GEMM shapes and FLOPs add up to the model FLOPs; backward = dgrad + wgrad.
#include <gtest/gtest.h>

#include "models/kernels.h"
#include "models/zoo.h"

using namespace fsdpsim;
using namespace fsdpsim::models;

namespace {

Flops gemm_flops(const std::vector<KernelDesc>& ks) {
  Flops f = 0;
  for (const auto& k : ks)
    if (k.kind == KernelKind::Gemm) f += k.flops;
  return f;
}

const KernelDesc* find(const std::vector<KernelDesc>& ks, const std::string& name) {
  for (const auto& k : ks)
    if (k.name == name) return &k;
  return nullptr;
}

}  // namespace

TEST(Kernels, Llama3BlockShapesByHand) {
  const ModelSpec m = load_model("llama3-8b");
  const auto ks = forward_kernels(m, ModulePart::Block, 2, 4096, Dtype::BF16);
  const KernelDesc* q = find(ks, "q_proj");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->m, 8192);
  EXPECT_EQ(q->n, 4096);
  EXPECT_EQ(q->k, 4096);
  EXPECT_DOUBLE_EQ(q->flops, 2.0 * 8192 * 4096 * 4096);
  EXPECT_EQ(q->bytes, (8192LL * 4096 + 4096LL * 4096 + 8192LL * 4096) * 2);
  const KernelDesc* kp = find(ks, "k_proj");
  ASSERT_NE(kp, nullptr);
  EXPECT_EQ(kp->n, 1024);
  const KernelDesc* down = find(ks, "down_proj");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->n, 4096);
  EXPECT_EQ(down->k, 14336);
  const KernelDesc* at = find(ks, "attn_fwd");
  ASSERT_NE(at, nullptr);
  EXPECT_EQ(at->batch, 2);
  EXPECT_EQ(at->seq, 4096);
  EXPECT_EQ(at->heads, 32);
  EXPECT_EQ(at->kv_heads, 8);
  EXPECT_EQ(at->head_dim, 128);
  // causal, executed: 2 * b * a * s^2 * d
  EXPECT_DOUBLE_EQ(at->flops, 2.0 * 2 * 32 * 4096.0 * 4096.0 * 128);
  // q, k, v read + o written in bf16, fp32 logsumexp
  EXPECT_EQ(at->bytes, 8192LL * (2 * 4096 + 2 * 1024) * 2 + 4LL * 2 * 32 * 4096);
}

TEST(Kernels, ForwardGemmFlopsEqualModelMatmulFlops) {
  for (const auto& name : zoo_names()) {
    SCOPED_TRACE(name);
    const ModelSpec m = load_model(name);
    const std::int64_t b = 2, s = 256, T = b * s;
    Flops f = gemm_flops(forward_kernels(m, ModulePart::Embedding, b, s, Dtype::BF16)) +
              m.n_layers * gemm_flops(forward_kernels(m, ModulePart::Block, b, s, Dtype::BF16)) +
              gemm_flops(forward_kernels(m, ModulePart::FinalNormAndHead, b, s, Dtype::BF16));
    const double expect = flops_per_token(m, s).matmul_forward * T;
    if (m.is_moe()) {
      // experts: ceil(T*k/E) tokens each; T*k/E = 512*2/8 = 128 exactly here
      ASSERT_EQ(T * m.experts_top_k % m.n_experts, 0);
    }
    EXPECT_DOUBLE_EQ(f, expect);
  }
}

TEST(Kernels, AttentionKernelsAreHalfTheMfuAttentionTerm) {
  const ModelSpec m = load_model("llama3-8b");
  const std::int64_t b = 1, s = 8192;
  const Flops attn = find(forward_kernels(m, ModulePart::Block, b, s, Dtype::BF16), "attn_fwd")->flops;
  EXPECT_DOUBLE_EQ(m.n_layers * attn, 0.5 * flops_per_token(m, s).attention_forward * b * s);
  const Flops bwd = find(backward_kernels(m, ModulePart::Block, b, s, Dtype::BF16, true), "attn_bwd")->flops;
  EXPECT_DOUBLE_EQ(bwd, 2.5 * attn);
}

TEST(Kernels, BackwardIsDgradPlusWgrad) {
  for (const auto& name : {"llama3-8b", "gpt2", "mixtral-8x7b", "mpt-125m", "gemma-2b"}) {
    SCOPED_TRACE(name);
    const ModelSpec m = load_model(name);
    for (auto part : {ModulePart::Block, ModulePart::FinalNormAndHead}) {
      const Flops fwd = gemm_flops(forward_kernels(m, part, 2, 256, Dtype::BF16));
      EXPECT_DOUBLE_EQ(gemm_flops(backward_kernels(m, part, 2, 256, Dtype::BF16, true)), 2 * fwd);
      EXPECT_DOUBLE_EQ(gemm_flops(backward_kernels(m, part, 2, 256, Dtype::BF16, false)), fwd);
    }
  }
  const ModelSpec m = load_model("llama3-8b");
  const auto bw = backward_kernels(m, ModulePart::Block, 1, 1024, Dtype::BF16, true);
  const KernelDesc* wg = find(bw, "gate_proj_wgrad");
  ASSERT_NE(wg, nullptr);
  EXPECT_EQ(wg->m, 14336);
  EXPECT_EQ(wg->n, 4096);
  EXPECT_EQ(wg->k, 1024);
  const KernelDesc* dg = find(bw, "gate_proj_dgrad");
  ASSERT_NE(dg, nullptr);
  EXPECT_EQ(dg->m, 1024);
  EXPECT_EQ(dg->n, 4096);
  EXPECT_EQ(dg->k, 14336);
  EXPECT_TRUE(dg->backward);
  // no weight grads: the embedding has nothing to do in backward
  EXPECT_TRUE(backward_kernels(m, ModulePart::Embedding, 1, 1024, Dtype::BF16, false).empty());
  EXPECT_EQ(backward_kernels(m, ModulePart::Embedding, 1, 1024, Dtype::BF16, true).size(), 1u);
}

TEST(Kernels, MoeExpertGemms) {
  const ModelSpec m = load_model("mixtral-8x7b");
  const auto ks = forward_kernels(m, ModulePart::Block, 1, 4096, Dtype::BF16);
  const KernelDesc* w1 = find(ks, "experts.w1");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->m, 4096 * 2 / 8);  // tokens * top_k / n_experts
  EXPECT_EQ(w1->n, 14336);
  EXPECT_EQ(w1->k, 4096);
  EXPECT_EQ(w1->count, 8);
  EXPECT_DOUBLE_EQ(w1->flops, 2.0 * 1024 * 14336 * 4096 * 8);
  const KernelDesc* router = find(ks, "block_sparse_moe.gate");
  ASSERT_NE(router, nullptr);
  EXPECT_EQ(router->m, 4096);
  EXPECT_EQ(router->n, 8);
  EXPECT_EQ(router->k, 4096);
}

TEST(Kernels, HeadAndCrossEntropyBytes) {
  const ModelSpec m = load_model("gpt2");
  const auto ks = forward_kernels(m, ModulePart::FinalNormAndHead, 1, 1024, Dtype::BF16);
  const KernelDesc* head = find(ks, "lm_head");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->n, 50257);
  const KernelDesc* ce = find(ks, "cross_entropy");
  ASSERT_NE(ce, nullptr);
  EXPECT_EQ(ce->kind, KernelKind::CrossEntropy);
  // read bf16 logits, write fp32 upcast and fp32 log_softmax, read int64 labels
  EXPECT_EQ(ce->bytes, 1024LL * 50257 * (2 + 4 + 4) + 1024 * 8);
}

// ---- implementation, compile, float8, recompute (issue 20) ----------------------------------------
namespace {

// A llama block small enough to count by hand: h = 64, a = 4 heads of d = 16, g = 2 kv heads,
// f = 128; one sequence of 8 tokens in bf16: T = 8, e = 2, one [T, h] activation = 8*64*2 = 1024 B.
ModelSpec tiny_llama() {
  return import_hf_config(nlohmann::json::parse(R"({"model_type":"llama","hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,
      "tie_word_embeddings":false,"max_position_embeddings":64,"hidden_act":"silu"})"),
                          "tiny");
}

KernelOptions opts(ModelImpl impl, bool compile, Float8Recipe f8 = Float8Recipe::None) {
  KernelOptions o;
  o.implementation = impl;
  o.compile = compile;
  o.float8 = f8;
  return o;
}

Bytes sum_bytes(const std::vector<KernelDesc>& ks, const std::string& prefix) {
  Bytes b = 0;
  for (const auto& k : ks)
    if (k.name.rfind(prefix, 0) == 0) b += k.bytes;
  return b;
}
int count_prefix(const std::vector<KernelDesc>& ks, const std::string& prefix) {
  int n = 0;
  for (const auto& k : ks) n += k.name.rfind(prefix, 0) == 0;
  return n;
}

}  // namespace

TEST(Kernels, HfEagerRmsNormIsEightKernelsByHand) {
  const ModelSpec m = tiny_llama();
  const auto ks = forward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, opts(ModelImpl::HF, false));
  // x.to(fp32) 512*(2+4) = 3072; pow 512*8 = 4096; mean 512*4 = 2048; + eps and rsqrt on [8, 1] fp32:
  // 8*8 = 64 each; x * rstd 4096; .to(bf16) 3072; * weight 512*2*2 = 2048.
  EXPECT_EQ(count_prefix(ks, "input_norm."), 8);
  EXPECT_EQ(sum_bytes(ks, "input_norm."), 3072 + 4096 + 2048 + 64 + 64 + 4096 + 3072 + 2048);
  // rotary, rotate_half per tensor: 5 kernels, 10 e bytes per element; q 8*64 = 512, k 8*32 = 256 elements
  EXPECT_EQ(count_prefix(ks, "rope_q."), 5);
  EXPECT_EQ(sum_bytes(ks, "rope_q.") + sum_bytes(ks, "rope_k."), 10 * 2 * (512 + 256));
  // silu then mul on [8, 128]: (2 + 3) * 1024 elements * 2 bytes
  EXPECT_EQ(sum_bytes(ks, "silu_mul."), 5 * 1024 * 2);
  // whole block: 8 + 3 GEMMs + 10 rope + attention + o + add + 8 + gate, up + 2 + down + add = 38
  EXPECT_EQ(ks.size(), 38u);
  // torchtitan's rotary is 3 kernels per tensor, (2e + 16) bytes per element
  const auto tt = forward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, opts(ModelImpl::TorchTitan, false));
  EXPECT_EQ(count_prefix(tt, "rope_q."), 3);
  EXPECT_EQ(sum_bytes(tt, "rope_q.") + sum_bytes(tt, "rope_k."), (2 * 2 + 16) * (512 + 256));
}

TEST(Kernels, CompileFusesEachChainBetweenGemmsByHand) {
  const ModelSpec m = tiny_llama();
  for (auto impl : {ModelImpl::HF, ModelImpl::TorchTitan, ModelImpl::LitGPT, ModelImpl::Fused}) {
    const auto ks = forward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, opts(impl, true));
    // norm, q, k, v, rope, attention, o, add+norm, gate, up, silu_mul, down, add: 13 kernels
    ASSERT_EQ(ks.size(), 13u);
    const char* names[] = {"input_norm", "q_proj", "k_proj", "v_proj", "rope", "attn_fwd", "o_proj",
                           "post_attention_norm", "gate_proj", "up_proj", "silu_mul", "down_proj", "residual_add"};
    for (size_t i = 0; i < ks.size(); ++i) EXPECT_EQ(ks[i].name, names[i]);
    // norm: read x, write y (1024 each) + weight 64*2; the residual add fused into the second norm
    // reads x and the attention output, writes the sum and the normed tensor: 4 * 1024 + 128.
    EXPECT_EQ(find(ks, "input_norm")->bytes, 2 * 1024 + 128);
    EXPECT_EQ(find(ks, "post_attention_norm")->bytes, 4 * 1024 + 128);
    EXPECT_EQ(find(ks, "rope")->bytes, 2 * (512 + 256) * 2);
    EXPECT_EQ(find(ks, "silu_mul")->bytes, 3 * 1024 * 2);
  }
  // The same GEMMs as eager: compile changes the memory-bound kernels only.
  const auto eager = forward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, opts(ModelImpl::HF, false));
  const auto comp = forward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, opts(ModelImpl::HF, true));
  EXPECT_DOUBLE_EQ(total_flops(eager), total_flops(comp));
  // Backward, compiled: silu_mul_bwd, the MLP's dgrad/wgrad pairs, the post-attention norm's dx kernel
  // reading the two input grads (gate, up), the residual grad, x and writing dx: 5 * 1024 + 128, and its
  // weight-grad reduction (dy, x again): 2 * 1024 + 128; no separate grad sums or residual adds.
  const auto bw = backward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, true, opts(ModelImpl::HF, true));
  EXPECT_EQ(find(bw, "post_attention_norm_bwd")->bytes, 5 * 1024 + 128);
  EXPECT_EQ(find(bw, "post_attention_norm_wgrad")->bytes, 2 * 1024 + 128);
  EXPECT_EQ(find(bw, "input_norm_bwd")->bytes, (3 + 1 + 2) * 1024 + 128);   // q, k, v grads
  EXPECT_EQ(find(bw, "residual_grad_add"), nullptr);
  EXPECT_EQ(count_prefix(bw, "input_norm_grad_sum"), 0);
  // 7 linears x (dgrad + wgrad) + attention + rope + silu_mul + 2 x (dx + wgrad) = 21
  EXPECT_EQ(bw.size(), 21u);
  // Eager (fused kernels): the same plus the grad sums (gate+up: 1, q+k+v: 2) and two residual adds.
  const auto be = backward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, true, opts(ModelImpl::Fused, false));
  EXPECT_EQ(be.size(), 21u + 3u + 2u);
}

TEST(Kernels, Float8TensorwiseCastsAndGemmsByHand) {
  const ModelSpec m = tiny_llama();
  const auto ks = forward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16,
                                  opts(ModelImpl::Fused, true, Float8Recipe::Tensorwise));
  // q_proj: X [8, 64] bf16 (512 elements), W [64, 64] (4096 elements). Compiled tensorwise casts:
  // amax (read X: 1024 + a 4-byte scale), cast (read 1024, write 512 fp8, + 4); the same for W.
  EXPECT_EQ(find(ks, "q_proj.fp8_x_amax")->bytes, 1024 + 4);
  EXPECT_EQ(find(ks, "q_proj.fp8_x_cast")->bytes, 1024 + 512 + 4);
  EXPECT_EQ(find(ks, "q_proj.fp8_w_amax")->bytes, 8192 + 4);
  EXPECT_EQ(find(ks, "q_proj.fp8_w_cast")->bytes, 8192 + 4096 + 4);
  const KernelDesc* q = find(ks, "q_proj");
  EXPECT_EQ(q->dtype, Dtype::FP8);
  EXPECT_EQ(q->bytes, 512 + 4096 + 8 * 64 * 2);   // fp8 A and B, bf16 C
  EXPECT_DOUBLE_EQ(q->flops, 2.0 * 8 * 64 * 64);
  // 7 linears x 4 cast kernels on top of the 13 compiled kernels
  EXPECT_EQ(ks.size(), 13u + 7u * 4u);
  // Backward: G's amax shared by its two casts: G amax + 2 casts, W^T amax + cast, X^T amax + cast = 7
  const auto bw = backward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, true,
                                   opts(ModelImpl::Fused, true, Float8Recipe::Tensorwise));
  EXPECT_EQ(count_prefix(bw, "q_proj.fp8_"), 7);
  EXPECT_EQ(find(bw, "q_proj_dgrad")->dtype, Dtype::FP8);
  EXPECT_EQ(find(bw, "q_proj_wgrad")->dtype, Dtype::FP8);
  // The head stays bf16.
  const auto head = forward_kernels(m, ModulePart::FinalNormAndHead, 1, 8, Dtype::BF16,
                                    opts(ModelImpl::Fused, true, Float8Recipe::Tensorwise));
  EXPECT_EQ(find(head, "lm_head")->dtype, Dtype::BF16);
}

TEST(Kernels, Float8RowwiseDiffersFromTensorwise) {
  const ModelSpec m = tiny_llama();
  const auto o = opts(ModelImpl::Fused, true, Float8Recipe::Rowwise);
  const auto ks = forward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, o);
  // Forward casts run along the contiguous dim: one kernel each (amax and cast of a row together);
  // X: read 1024, write 512 fp8 + 8 row scales (fp32); W [64, 64]: 8192 + 4096 + 64 scales.
  EXPECT_EQ(count_prefix(ks, "q_proj.fp8_"), 2);
  EXPECT_EQ(find(ks, "q_proj.fp8_x_amax_cast")->bytes, 1024 + 512 + 8 * 4);
  EXPECT_EQ(find(ks, "q_proj.fp8_w_amax_cast")->bytes, 8192 + 4096 + 64 * 4);
  // Backward: G along its rows (1 kernel), W^T, G^T and X^T along dim 0 (amax + cast each): 7
  const auto bw = backward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, true, o);
  EXPECT_EQ(count_prefix(bw, "q_proj.fp8_"), 7);
  // Eager: abs, max, 7 scale kernels (power-of-2 rounding), 4 cast kernels = 13 per cast
  const auto eager = forward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, opts(ModelImpl::Fused, false, Float8Recipe::Rowwise));
  EXPECT_EQ(count_prefix(eager, "q_proj.fp8_x"), 13);
  const auto eager_tw = forward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16,
                                       opts(ModelImpl::Fused, false, Float8Recipe::Tensorwise));
  EXPECT_EQ(count_prefix(eager_tw, "q_proj.fp8_x"), 10);
}

TEST(Kernels, SelectiveRecomputeFlopsAreTheUnsavedOpsByHand) {
  const ModelSpec m = tiny_llama();
  const std::int64_t T = 8, h = 64, f = 128;
  // torchtitan's op SAC: matmuls in forward order q(1) k(2) v(3) o(4) gate(5) up(6) down(7); odd ones
  // and SDPA saved. Recomputed: k_proj 2*T*h*32 + o_proj 2*T*64*h + up_proj 2*T*h*f FLOPs.
  const double expect = 2.0 * T * h * 32 + 2.0 * T * 64 * h + 2.0 * T * h * f;
  for (auto o : {opts(ModelImpl::HF, false), opts(ModelImpl::TorchTitan, true), opts(ModelImpl::Fused, false)}) {
    const auto rec = recompute_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, CheckpointMode::SelectiveOp, o);
    EXPECT_DOUBLE_EQ(total_flops(rec), expect);
    EXPECT_EQ(find(rec, "attn_fwd"), nullptr);
    EXPECT_NE(find(rec, "k_proj"), nullptr);
    EXPECT_EQ(find(rec, "q_proj"), nullptr);
    // every memory-bound kernel of the forward reruns
    const auto fwd = forward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, o);
    int ew = 0;
    for (const auto& k : fwd) ew += k.kind == KernelKind::Elementwise;
    int rew = 0;
    for (const auto& k : rec) rew += k.kind == KernelKind::Elementwise;
    EXPECT_EQ(rew, ew);
  }
  // With float8 (tensorwise) the amax reductions (aten.max) are saved too; the casts rerun.
  const auto o8 = opts(ModelImpl::Fused, true, Float8Recipe::Tensorwise);
  const auto rec8 = recompute_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, CheckpointMode::SelectiveOp, o8);
  EXPECT_EQ(find(rec8, "k_proj.fp8_x_amax"), nullptr);
  EXPECT_NE(find(rec8, "k_proj.fp8_x_cast"), nullptr);
  EXPECT_DOUBLE_EQ(total_flops(rec8), expect);
  // MoE experts continue the count: mixtral's router is mm 5, expert i's w1, w3, w2 are 6 + 3i .. 8 + 3i,
  // so experts 0, 2, 4, 6 save w3 and rerun w1, w2; experts 1, 3, 5, 7 the opposite: 4 copies each.
  const ModelSpec mx = load_model("mixtral-8x7b");
  const auto rmx = recompute_kernels(mx, ModulePart::Block, 1, 512, Dtype::BF16, CheckpointMode::SelectiveOp);
  EXPECT_EQ(find(rmx, "experts.w1")->count, 4);
  EXPECT_EQ(find(rmx, "experts.w3")->count, 4);
  EXPECT_EQ(find(rmx, "experts.w2")->count, 4);
  EXPECT_EQ(find(rmx, "block_sparse_moe.gate"), nullptr);   // mm 5: saved
}

TEST(Kernels, FullRecomputeStopsEarlyUnlessTorchtitan) {
  const ModelSpec m = tiny_llama();
  const std::int64_t T = 8, h = 64, f = 128;
  KernelOptions o = opts(ModelImpl::HF, false);
  const auto fwd = forward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, o);
  const auto rec = recompute_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, CheckpointMode::Full, o);
  // the early stop skips down_proj (2*T*f*h FLOPs) and the residual add after it
  EXPECT_DOUBLE_EQ(total_flops(rec), total_flops(fwd) - 2.0 * T * f * h);
  EXPECT_EQ(rec.size(), fwd.size() - 2);
  EXPECT_EQ(rec.back().name, "silu_mul.mul");
  o.checkpoint_early_stop = false;   // torchtitan, reentrant
  EXPECT_EQ(recompute_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, CheckpointMode::Full, o).size(), fwd.size());
  o.compile = true;   // the compiled backward reruns only what it reads: the same cut
  const auto fc = forward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, o);
  EXPECT_EQ(recompute_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, CheckpointMode::Full, o).size(), fc.size() - 2);
  // float8: down_proj's casts are skipped too (its inputs are saved before the casts run)
  o.float8 = Float8Recipe::Tensorwise;
  const auto f8 = forward_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, o);
  EXPECT_EQ(recompute_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, CheckpointMode::Full, o).size(), f8.size() - 6);
  // nothing for other parts or without checkpointing
  EXPECT_TRUE(recompute_kernels(m, ModulePart::FinalNormAndHead, 1, 8, Dtype::BF16, CheckpointMode::Full).empty());
  EXPECT_TRUE(recompute_kernels(m, ModulePart::Block, 1, 8, Dtype::BF16, CheckpointMode::None).empty());
}

// A parallel-residual block runs the same GEMMs as a sequential block of the same shapes; its forward adds the
// two branches and then the residual (two adds), and Phi's one shared norm runs once (forward and backward). The
// HF recipe's eager partial RoPE adds the torch.cat that joins the pass-through dimensions back.
TEST(Kernels, ParallelBlocksKeepTheGemmsAndCountTheirNormsAndAdds) {
  auto count = [](const std::vector<KernelDesc>& ks, const std::string& name) {
    int n = 0;
    for (const auto& k : ks) n += k.name == name ? 1 : 0;
    return n;
  };
  KernelOptions hf;
  hf.implementation = ModelImpl::HF;
  for (const char* name : {"phi-1.5", "stablelm-alpha-3b"}) {
    SCOPED_TRACE(name);
    const ModelSpec par = load_model(name);
    ModelSpec seq = par;
    seq.parallel_residual = false;
    seq.block_norms = 2;
    const int norms = par.block_norms == 1 ? 0 : 1;
    const auto fp = forward_kernels(par, ModulePart::Block, 1, 1024, Dtype::BF16);
    const auto fs = forward_kernels(seq, ModulePart::Block, 1, 1024, Dtype::BF16);
    EXPECT_DOUBLE_EQ(gemm_flops(fp), gemm_flops(fs));
    EXPECT_EQ(count(fp, "branch_add"), 1);
    EXPECT_EQ(count(fs, "branch_add"), 0);
    EXPECT_EQ(count(fp, "post_attention_norm"), norms);
    const auto bp = backward_kernels(par, ModulePart::Block, 1, 1024, Dtype::BF16, true);
    const auto bs = backward_kernels(seq, ModulePart::Block, 1, 1024, Dtype::BF16, true);
    EXPECT_DOUBLE_EQ(gemm_flops(bp), gemm_flops(bs));
    EXPECT_EQ(count(bp, "post_attention_norm_bwd"), norms);
    EXPECT_EQ(count(bp, "norm_grad_add"), norms);   // x's gradient from both norms
    EXPECT_EQ(count(forward_kernels(par, ModulePart::Block, 1, 1024, Dtype::BF16, hf), "rope_cat"), 1);
    EXPECT_EQ(count(backward_kernels(par, ModulePart::Block, 1, 1024, Dtype::BF16, true, hf), "rope_cat_bwd"), 1);
    EXPECT_EQ(count(forward_kernels(load_model("llama3-8b"), ModulePart::Block, 1, 1024, Dtype::BF16, hf), "rope_cat"), 0);
  }
}

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

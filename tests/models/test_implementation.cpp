// Each implementation recipe's saved tensors, counted by hand tensor by tensor on a tiny model
// (models/block_recipes.cpp derives them from the frameworks' code).
//
// Tiny llama: hidden h = 8, heads a = 2, kv heads g = 1, head_dim d = 4, ffn f = 16, vocab 32;
// micro-batch 1 x seq 4 -> T = 4 tokens; bf16 (e = 2 B). Sizes in bytes for the 4 tokens:
//   a h-wide activation      T*h*e     = 4*8*2   = 64
//   fp32 h-wide (upcast)     T*h*4     = 4*8*4   = 128
//   q (a*d = 8 wide)         T*a*d*e   = 4*8*2   = 64
//   k or v (g*d = 4 wide)    T*g*d*e   = 4*4*2   = 32
//   fused qkv ((a+2g)*d=16)  T*16*e    = 128
//   an ffn-wide activation   T*f*e     = 4*16*2  = 128
//   per-token fp32 stat      T*4       = 16      (RMSNorm rstd, LayerNorm mean / rstd)
//   logsumexp                T*a*4     = 4*2*4   = 32
//   torchtitan RoPE gather   T*(d/2)*8 = 4*2*8   = 64 (complex64)
#include <gtest/gtest.h>

#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "common/errors.h"
#include "models/implementation.h"
#include "models/model_info.h"
#include "models/zoo.h"
#include "tests/models/tiny_models.h"

using namespace fsdpsim;
using namespace fsdpsim::models;
using namespace fsdpsim::models::testing;

namespace {

// GPT-2 shaped (HF GPT2Block): LayerNorm, learned positions, Conv1D with biases, gelu_new, MHA.
ModelSpec tiny_gpt2() {
  ModelSpec m = tiny_llama();
  m.model_type = "gpt2";
  m.n_kv_heads = 2;
  m.ffn_hidden = 32;
  m.norm = NormKind::LayerNorm;
  m.mlp = MlpKind::Plain;
  m.positions = PositionKind::Learned;
  m.hidden_act = "gelu_new";
  m.qkv_bias = m.out_bias = m.mlp_bias = true;
  m.conv1d_weights = true;
  return m;
}

BlockMemory block(const ModelSpec& m, CheckpointMode mode, ModelImpl impl, bool compile = false,
                  Float8Recipe f8 = Float8Recipe::None) {
  return block_memory(m, 1, 4, Dtype::BF16, mode, ImplOptions{impl, compile, f8});
}

std::vector<std::string> names(const BlockMemory& bm) {
  std::vector<std::string> v;
  for (const SavedTensor& t : bm.saved) v.emplace_back(t.name);
  return v;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x == s) return true;
  return false;
}

// The index of the first forward event of kind k for the tensor `name` (-1: none).
int event_at(const std::vector<ForwardEvent>& ev, ForwardEvent::Kind k, const std::string& name) {
  for (std::size_t i = 0; i < ev.size(); ++i)
    if (ev[i].kind == k && ev[i].name && name == ev[i].name) return static_cast<int>(i);
  return -1;
}
// Whether the forward frees `freed` after it makes `made` (both temporaries; each exists).
::testing::AssertionResult dies_after(const std::vector<ForwardEvent>& ev, const char* freed, const char* made) {
  const int f = event_at(ev, ForwardEvent::FreeTemp, freed), m = event_at(ev, ForwardEvent::Temp, made);
  if (f >= 0 && m >= 0 && f > m) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << freed << " freed at event " << f << ", " << made << " made at " << m;
}
}  // namespace

TEST(Implementation, TorchtitanByHand) {
  const BlockMemory bm = block(tiny_llama(), CheckpointMode::None, ModelImpl::TorchTitan);
  EXPECT_EQ(entries(bm), (Entries{
                             {"x", 64},                // block input: nn.RMSNorm -> _fused_rms_norm saves it
                             {"attn_norm.out", 64},    // saved by the fused wqkv linear
                             {"attn_norm.rstd", 16},   // fp32 [T, 1]
                             {"attn.v", 32},           // .contiguous() copy of the v split, saved by flex
                             {"attn.rope_cache", 64},  // cache[positions], saved by the complex mul
                             {"attn.q_rope", 64},      // type_as(view_as_real(q * cache)), saved by flex
                             {"attn.k_rope", 32},
                             {"attn.out", 64},         // flex output, also wo's input (same storage)
                             {"attn.lse", 32},
                             {"h", 64},                // residual, saved by the second _fused_rms_norm
                             {"mlp_norm.out", 64},     // w1 and w3 input
                             {"mlp_norm.rstd", 16},
                             {"mlp.gate", 128},        // silu input
                             {"mlp.act", 128},         // silu output, mul operand
                             {"mlp.up", 128},          // mul operand
                             {"mlp.prod", 128},        // w2 input
                         }));
  EXPECT_TRUE(bm.saved[0].is_input);
  // 64+64+16+32+64+64+32+64+32+64+64+16+4*128 = 1088
  EXPECT_EQ(bm.saved_bytes(), 1088);
  // Forward peak of temporaries: inside ComplexRoPE, q and k (64 + 32, held by the caller), their
  // fp32 copies (128 + 64) and complex products (128 + 64) are alive until apply_rotary_emb returns.
  EXPECT_EQ(bm.forward_extra, 64 + 32 + 128 + 64 + 128 + 64);
}

TEST(Implementation, HfByHand) {
  const BlockMemory bm = block(tiny_llama(), CheckpointMode::None, ModelImpl::HF);
  EXPECT_EQ(entries(bm), (Entries{
                             {"attn_norm.x_fp32", 128},  // hidden_states.to(float32): pow and mul save it
                             {"attn_norm.rstd", 16},     // rsqrt saves its result
                             {"attn_norm.normed", 64},   // .to(bf16), saved by weight * normed
                             {"attn_norm.out", 64},      // q/k/v_proj input
                             {"attn.v", 32},             // v_proj output (a view goes to SDPA)
                             {"attn.q_rope", 64},        // (q * cos) + (rotate_half(q) * sin)
                             {"attn.k_rope", 32},        // enable_gqa: k stays at g heads
                             {"attn.out", 64},
                             {"attn.lse", 32},
                             {"mlp_norm.x_fp32", 128},
                             {"mlp_norm.rstd", 16},
                             {"mlp_norm.normed", 64},
                             {"mlp_norm.out", 64},
                             {"mlp.gate", 128},
                             {"mlp.act", 128},
                             {"mlp.up", 128},
                             {"mlp.prod", 128},
                         }));
  // the bf16 block input and residual are not saved: LlamaRMSNorm keeps their fp32 copies.
  // (128+16+64+64)*2 + 32+64+32+64+32 + 4*128 = 544 + 224 + 512 = 1280
  EXPECT_EQ(bm.saved_bytes(), 1280);
  // Forward peak: in rotate_half for q: x 64 (held until the residual add), q 64, k 32 (held by the
  // caller), q * cos 64, cat(-x2, x1) 64, and its product with sin 64 (-x2 already freed).
  EXPECT_EQ(bm.forward_extra, 64 + 64 + 32 + 64 + 64 + 64);
}

// Python lifetimes in the eager forward (PyTorch 2.11's allocator history of l1b-fsdp2-ac-mb4-s4096-hf-offload-sync,
// reports/validation/torch-memory-2026-11-28): a submodule's argument lives until the submodule returns (the norm
// output through the attention's o_proj and the MLP's down projection), and LlamaRMSNorm.forward's locals
// (`variance`, the normalized fp32 `hidden_states`) until it returns. Seen where nothing saves them: a checkpointed
// block's forward. Inside a compiled block there are no frames: each buffer dies at its last use.
TEST(Implementation, HfArgumentsAndLocalsLiveUntilTheirFunctionReturns) {
  const BlockMemory eager = block(tiny_llama(), CheckpointMode::Full, ModelImpl::HF);
  const auto& ev = eager.forward_events;
  for (const auto& [freed, made] : {std::pair{"attn_norm.out", "attn.proj"}, {"mlp_norm.out", "mlp.down"},
                                    {"attn_norm.normed_fp32", "attn_norm.out"}, {"attn_norm.variance", "attn_norm.out"}})
    EXPECT_TRUE(dies_after(ev, freed, made));
  // (the fp32 input is rebound by the normalization: it dies once the normalized tensor exists)
  EXPECT_FALSE(dies_after(ev, "attn_norm.x_fp32", "attn_norm.normed"));
  EXPECT_GE(event_at(ev, ForwardEvent::FreeTemp, "attn_norm.x_fp32"), 0);
  // the norm output's last read is the v projection: without the frames it would die before the rotary embedding
  EXPECT_TRUE(dies_after(ev, "attn_norm.out", "attn.q_rope"));
  // the first GEMM's output marks where the thread's cuBLAS workspace is made
  for (const ForwardEvent& e : ev)
    if (e.gemm) {
      EXPECT_STREQ(e.name, "attn.q");
      break;
    }
}

TEST(Implementation, LitgptByHand) {
  const BlockMemory bm = block(tiny_llama(), CheckpointMode::None, ModelImpl::LitGPT);
  EXPECT_EQ(entries(bm), (Entries{
                             {"attn_norm.x_fp32", 128},     // x.float(): x * x saves it
                             {"attn_norm.rstd", 16},
                             {"attn_norm.normed_fp32", 128},  // x * rstd, fp32, saved by * weight.float()
                             {"attn_norm.weight_fp32", 32},   // weight.float(): [h] fp32 = 8*4, per block
                             {"attn_norm.out", 64},           // .to(bf16): the fused qkv input
                             {"attn.q_rope", 64},             // torch.cat((q_roped, q[..., n:])) copy
                             {"attn.k_rep", 64},              // k.repeat_interleave(a/g): a heads
                             {"attn.v_rep", 64},
                             {"attn.out", 64},
                             {"attn.lse", 32},
                             {"attn.y", 64},   // y.transpose(1, 2).reshape(): a copy (the query came out of the cat as
                                               // [b, heads, s, d]; flash's output takes its layout), proj's input
                             {"mlp_norm.x_fp32", 128},
                             {"mlp_norm.rstd", 16},
                             {"mlp_norm.normed_fp32", 128},
                             {"mlp_norm.weight_fp32", 32},
                             {"mlp_norm.out", 64},
                             {"mlp.gate", 128},  // litgpt computes fc_1 and fc_2 before silu
                             {"mlp.up", 128},
                             {"mlp.act", 128},
                             {"mlp.prod", 128},
                         }));
  // the expanded k/v copies keep nothing of qkv alive: (128+16+128+32+64)*2 + 4*64+32+64 + 4*128 = 1600
  EXPECT_EQ(bm.saved_bytes(), 1600);
  // Each norm's weight gets its gradient through weight.float(): the mul's gradient for it, (grad * normed) summed
  // over the tokens, is an [h] fp32 tensor (32 B), which ToCopyBackward0 casts into the weight's [h] bf16 gradient
  // (16 B) before it dies. The block's gradients are then its parameters' (the same as HF's recipe's). (Until
  // 2026-11-29 the mul passed no gradient to weight.float(): the norms got none.)
  int norm_grads = 0;
  const auto& ev = bm.backward_events;
  for (std::size_t i = 0; i < ev.size(); ++i)
    if (ev[i].kind == models::BackwardEvent::WeightGrad && ev[i].bytes == 16) {
      ++norm_grads;
      ASSERT_LT(i + 1, ev.size());
      EXPECT_EQ(ev[i + 1].kind, models::BackwardEvent::FreeGrad);   // the [h] fp32 gradient, at the same op
      EXPECT_EQ(ev[i + 1].bytes, 32);
      EXPECT_EQ(ev[i + 1].op, ev[i].op);
    }
  EXPECT_EQ(norm_grads, 2);
  EXPECT_EQ(bm.param_grads, block(tiny_llama(), CheckpointMode::None, ModelImpl::HF).param_grads);
}

// litgpt's frames (PyTorch 2.11's allocator history of l1b-fsdp2-lora5pct-litgpt, block 1's attention,
// reports/validation/torch-memory-2026-11-26): apply_rope's `rotated` lives until the function returns (after the
// sum), CausalSelfAttention.forward's `qkv` until o_proj has run, and y.transpose(1, 2).reshape() copies the
// attention output (the query came out of the rope's cat as [b, heads, s, d], which flash's output follows).
TEST(Implementation, LitgptLocalsAndTheAttentionOutputCopy) {
  const BlockMemory bm = block(tiny_llama(), CheckpointMode::Full, ModelImpl::LitGPT);
  const auto& ev = bm.forward_events;
  for (const auto& [freed, made] :
       {std::pair{"attn.q_rot", "attn.q_roped"}, {"attn.k_rot", "attn.k_roped"}, {"attn.qkv", "attn.proj"}})
    EXPECT_TRUE(dies_after(ev, freed, made));
  const int y = event_at(ev, ForwardEvent::Temp, "attn.y");
  ASSERT_GE(y, 0);
  EXPECT_EQ(ev[static_cast<std::size_t>(y)].bytes, 64);   // T 4 x 4 heads x d 2 x bf16
  EXPECT_GT(y, event_at(ev, ForwardEvent::Temp, "attn.out"));
  EXPECT_LT(y, event_at(ev, ForwardEvent::Temp, "attn.proj"));
  // HF's rotate_half(q) is a temporary of its expression: freed once multiplied by sin, before the sum
  const BlockMemory hf = block(tiny_llama(), CheckpointMode::Full, ModelImpl::HF);
  EXPECT_FALSE(dies_after(hf.forward_events, "attn.q_rot", "attn.q_rope"));
  EXPECT_GE(event_at(hf.forward_events, ForwardEvent::FreeTemp, "attn.q_rot"), 0);
  EXPECT_LT(event_at(hf.forward_events, ForwardEvent::Temp, "attn.y"), 0);
}

// litgpt's LoRAQKVLinear (litgpt/lora.py at 01e39f5) on tiny_llama (T 4, hidden 8, q 8 wide, k and v 4, the fused
// output 16; bf16) with rank-2 adapters on q and v, fully checkpointed (every tensor a temporary): the pretrained
// output first (4 x 16: 128 B), A's output 4 x 4 (32 B); under grouped-query attention one conv1d per enabled part,
// q 64 B and v 32 B, and their cat (96 B); zero_pad's zeros (128 B) and the transposed update's reshape copy (96 B),
// both freed once index_copy has made the padded update (128 B); the scaled update and the sum (128 B each). A's
// output and the cat (`after_A`, `after_B`) live until the sum. With as many k and v heads as q heads: one grouped
// conv1d. (The old code made B's output by one GEMM and padded it in one op, and freed both at their last use.)
TEST(Implementation, LitgptFusedQkvLoraByHand) {
  LoraShape l;
  l.rank = 2;
  l.targets = weight_bit(Weight::Q) | weight_bit(Weight::V);
  const auto lit = [&](const ModelSpec& m) {
    return block_memory(m, 1, 4, Dtype::BF16, CheckpointMode::Full,
                        ImplOptions{ModelImpl::LitGPT, false, Float8Recipe::None, l});
  };
  const BlockMemory bm = lit(tiny_llama());
  const auto& ev = bm.forward_events;
  const std::vector<std::pair<const char*, Bytes>> made{
      {"attn.qkv", 128},         {"attn.qkv.lora_a", 32},   {"attn.qkv.lora_b_q", 64},    {"attn.qkv.lora_b_v", 32},
      {"attn.qkv.lora_b", 96},   {"attn.qkv.lora_zeros", 128}, {"attn.qkv.lora_flat", 96}, {"attn.qkv.lora_pad", 128},
      {"attn.qkv.lora_scaled", 128}, {"attn.qkv.lora_sum", 128}};
  int last = -1;
  for (const auto& [name, bytes] : made) {
    const int i = event_at(ev, ForwardEvent::Temp, name);
    ASSERT_GT(i, last) << name;
    EXPECT_EQ(ev[static_cast<std::size_t>(i)].bytes, bytes) << name;
    last = i;
  }
  EXPECT_LT(event_at(ev, ForwardEvent::Temp, "attn.qkv.lora_b_k"), 0);
  for (const auto& [freed, after] :
       {std::pair{"attn.qkv.lora_b_q", "attn.qkv.lora_b"}, {"attn.qkv.lora_b_v", "attn.qkv.lora_b"},
        {"attn.qkv.lora_zeros", "attn.qkv.lora_pad"}, {"attn.qkv.lora_flat", "attn.qkv.lora_pad"},
        {"attn.qkv.lora_a", "attn.qkv.lora_sum"}, {"attn.qkv.lora_b", "attn.qkv.lora_sum"}})
    EXPECT_TRUE(dies_after(ev, freed, after));
  EXPECT_LT(event_at(ev, ForwardEvent::FreeTemp, "attn.qkv.lora_zeros"),
            event_at(ev, ForwardEvent::Temp, "attn.qkv.lora_scaled"));

  ModelSpec mha = tiny_llama();
  mha.n_kv_heads = 2;   // q, k and v 8 wide: B's output 4 x 16 (128 B) from one grouped conv1d
  const BlockMemory g = lit(mha);
  EXPECT_LT(event_at(g.forward_events, ForwardEvent::Temp, "attn.qkv.lora_b_q"), 0);
  const int b = event_at(g.forward_events, ForwardEvent::Temp, "attn.qkv.lora_b");
  ASSERT_GE(b, 0);
  EXPECT_EQ(g.forward_events[static_cast<std::size_t>(b)].bytes, 128);
}

TEST(Implementation, FusedLigerByHand) {
  const BlockMemory bm = block(tiny_llama(), CheckpointMode::None, ModelImpl::Fused);
  EXPECT_EQ(entries(bm), (Entries{
                             {"x", 64},               // LigerRMSNorm saves X
                             {"attn_norm.out", 64},
                             {"attn_norm.rstd", 16},  // fp32 (llama casting mode)
                             {"attn.q", 64},          // Liger RoPE rotates q_proj's output in place
                             {"attn.k", 32},
                             {"attn.v", 32},
                             {"attn.out", 64},
                             {"attn.lse", 32},
                             {"h", 64},
                             {"mlp_norm.out", 64},
                             {"mlp_norm.rstd", 16},
                             {"mlp.gate", 128},  // LigerSiLUMulFunction saves a, b only
                             {"mlp.up", 128},
                             {"mlp.prod", 128},  // down_proj's input
                         }));
  EXPECT_EQ(bm.saved_bytes(), 896);  // 64+64+16+64+32+32+64+32+64+64+16+3*128
  // Backward peak at down_proj: saved 896 + dy 64 + d(prod) 128 = 1088 (the SiLUMul backward then
  // writes d(gate), d(up) into the saved gate/up storage).
  EXPECT_EQ(bm.backward_extra, 64 + 128);
}

TEST(Implementation, HfGpt2KeepsTheWholeQkvAndGeluNewChain) {
  // T = 4, h = 8, f = 32: h-wide 64, fused qkv 3h: 192, f-wide 256; LayerNorm mean and rstd fp32: 16 each
  const BlockMemory bm = block(tiny_gpt2(), CheckpointMode::None, ModelImpl::HF);
  EXPECT_EQ(entries(bm), (Entries{
                             {"x", 64},  // native_layer_norm saves its input
                             {"attn_norm.out", 64},
                             {"attn_norm.mean", 16},
                             {"attn_norm.rstd", 16},
                             {"attn.qkv", 192},  // c_attn output: SDPA saves q, k, v views of it
                             {"attn.out", 64},
                             {"attn.lse", 32},
                             {"h", 64},
                             {"mlp_norm.out", 64},
                             {"mlp_norm.mean", 16},
                             {"mlp_norm.rstd", 16},
                             {"mlp.fc", 256},             // pow(x, 3) saves x
                             {"mlp.gelu_half", 256},      // 0.5 * x, saved by the final mul
                             {"mlp.gelu_tanh", 256},      // tanh saves its result
                             {"mlp.gelu_one_plus", 256},  // 1 + tanh(...), saved by the final mul
                             {"mlp.act", 256},            // c_proj's input
                         }));
  EXPECT_EQ(bm.saved_bytes(), 608 + 5 * 256);
  // The parameters' gradients, bf16: c_attn 8 x 24 + 24, c_proj 8 x 8 + 8, c_fc 8 x 32 + 32, mlp c_proj 32 x 8 + 8,
  // two LayerNorms 2 x (8 + 8): 872 elements, 1744 B. Trained per parameter with the biases frozen (FSDP2 under a
  // partial set: GradFlow::biases_train false) the 72 linear and 16 LayerNorm bias elements get none: 1568 B.
  EXPECT_EQ(bm.param_grads, 1744);
  models::GradFlow no_bias;
  no_bias.biases_train = false;
  EXPECT_EQ(block_memory(tiny_gpt2(), 1, 4, Dtype::BF16, CheckpointMode::None, ImplOptions{ModelImpl::HF}, no_bias).param_grads,
            1568);
}

namespace {
// Phi shaped (HF PhiDecoderLayer): one LayerNorm feeding attention and MLP in parallel, separate q, k, v and
// dense with biases, RoPE on half of each head (rotary_dim 2 of head_dim 4), fc1 -> gelu_new -> fc2; MHA.
ModelSpec tiny_phi() {
  ModelSpec m = tiny_gpt2();
  m.model_type = "phi";
  m.ffn_hidden = 16;
  m.positions = PositionKind::Rotary;
  m.conv1d_weights = false;
  m.parallel_residual = true;
  m.block_norms = 1;
  m.rotary_dim = 2;
  return m;
}
// GPT-NeoX shaped (HF GPTNeoXLayer, use_parallel_residual): two LayerNorms on x, one query_key_value linear,
// RoPE on half of each head, exact GELU.
ModelSpec tiny_neox() {
  ModelSpec m = tiny_phi();
  m.model_type = "gpt_neox";
  m.block_norms = 2;
  m.hidden_act = "gelu";
  return m;
}
}  // namespace

// T = 4, h = 8, a = g = 2, d = 4 (q, k, v: 64 each), f = 16 (f-wide: 128), rotary_dim 2: the rotated slices are
// half of q and k (32), and torch.cat((q_rot, q_pass)) makes q and k whole again (64), which SDPA saves.
TEST(Implementation, HfPhiParallelBlockByHand) {
  const BlockMemory bm = block(tiny_phi(), CheckpointMode::None, ModelImpl::HF);
  EXPECT_EQ(entries(bm), (Entries{
                             {"x", 64},               // native_layer_norm saves its input (the one norm)
                             {"attn_norm.out", 64},   // q/k/v_proj's input and fc1's: one tensor
                             {"attn_norm.mean", 16},
                             {"attn_norm.rstd", 16},
                             {"attn.v", 64},          // v_proj output, saved by SDPA
                             {"attn.q_rope", 64},     // cat((q_embed, q_pass))
                             {"attn.k_rope", 64},
                             {"attn.out", 64},
                             {"attn.lse", 32},
                             {"attn.y", 64},          // q from the cat is [b, heads, s, d]: sdpa_attention_forward's
                                                      // .transpose(1, 2).contiguous() copies the output (dense's input)
                             {"mlp.fc", 128},         // the gelu_new chain as in GPT-2 (pow saves x)
                             {"mlp.gelu_half", 128},
                             {"mlp.gelu_tanh", 128},
                             {"mlp.gelu_one_plus", 128},
                             {"mlp.act", 128},        // fc2's input
                         }));
  // no second norm and no h-wide residual between the branches: 64+64+16+16 + 5*64+32 + 5*128 = 1152
  EXPECT_EQ(bm.saved_bytes(), 1152);
}

TEST(Implementation, HfGptNeoxParallelBlockByHand) {
  const BlockMemory bm = block(tiny_neox(), CheckpointMode::None, ModelImpl::HF);
  EXPECT_EQ(entries(bm), (Entries{
                             {"x", 64},               // both LayerNorms save x: one storage
                             {"attn_norm.out", 64},
                             {"attn_norm.mean", 16},
                             {"attn_norm.rstd", 16},
                             {"attn.qkv", 192},       // query_key_value output: SDPA saves the v view of it
                             {"attn.q_rope", 64},
                             {"attn.k_rope", 64},
                             {"attn.out", 64},
                             {"attn.lse", 32},
                             {"attn.y", 64},          // the partial rotary's cat makes q [b, heads, s, d], so SDPA's
                                                      // output is too and .transpose(1, 2).contiguous() copies it
                             {"mlp_norm.out", 64},    // dense_h_to_4h's input
                             {"mlp_norm.mean", 16},
                             {"mlp_norm.rstd", 16},
                             {"mlp.fc", 128},         // exact GELU saves its input
                             {"mlp.act", 128},        // dense_4h_to_h's input
                         }));
  EXPECT_EQ(bm.saved_bytes(), 64 + 64 + 16 + 16 + 192 + 64 + 64 + 64 + 32 + 64 + 64 + 16 + 16 + 128 + 128);
}

// litgpt's Block with parallel_residual and shared_attention_norm (its phi-1_5 config): the fused qkv linear,
// apply_rope on q[..., :rope_n_elem] and torch.cat with the rest, GptNeoxMLP (fc -> F.gelu -> proj).
TEST(Implementation, LitgptSharedNormParallelBlockByHand) {
  const BlockMemory bm = block(tiny_phi(), CheckpointMode::None, ModelImpl::LitGPT);
  EXPECT_EQ(entries(bm), (Entries{
                             {"x", 64},
                             {"attn_norm.out", 64},
                             {"attn_norm.mean", 16},
                             {"attn_norm.rstd", 16},
                             {"attn.qkv", 192},       // the fused qkv output: SDPA's v is a view of it
                             {"attn.q_rope", 64},
                             {"attn.k_rope", 64},
                             {"attn.out", 64},
                             {"attn.lse", 32},
                             {"attn.y", 64},          // the reshape's copy of the [b, heads, s, d] output: proj's input
                             {"mlp.fc", 128},         // F.gelu(approximate="tanh"): one kernel saving its input
                             {"mlp.act", 128},
                         }));
  EXPECT_EQ(bm.saved_bytes(), 64 + 64 + 16 + 16 + 192 + 64 + 64 + 64 + 32 + 64 + 128 + 128);
}

// GPT-2's resid_pdrop (GPT2Attention.resid_dropout after c_proj, GPT2MLP.dropout after its c_proj):
// native_dropout saves a bool mask of its [T, h] input, 1 byte per element: T*h = 32 bytes each, in
// forward order after the branch output it masks. With p = 0 nothing changes.
TEST(Implementation, ResidualDropoutSavesOneByteMaskPerBranch) {
  ModelSpec m = tiny_gpt2();
  const BlockMemory plain = block(m, CheckpointMode::None, ModelImpl::HF);
  m.resid_dropout = 0.1;
  const BlockMemory dropped = block(m, CheckpointMode::None, ModelImpl::HF);
  EXPECT_EQ(dropped.saved_bytes(), plain.saved_bytes() + 2 * 32);
  Entries masks;
  for (const auto& [name, bytes] : entries(dropped))
    if (name.find("mask") != std::string::npos) masks.push_back({name, bytes});
  EXPECT_EQ(masks, (Entries{{"attn.resid_drop.mask", 32}, {"mlp.resid_drop.mask", 32}}));
  // Under full checkpointing the block keeps only its input: the masks are recomputed with the branch.
  EXPECT_EQ(block(m, CheckpointMode::Full, ModelImpl::HF).saved_bytes(),
            block(tiny_gpt2(), CheckpointMode::Full, ModelImpl::HF).saved_bytes());
}

TEST(Implementation, FullIsTheBlockInputOnly) {
  for (ModelImpl impl : {ModelImpl::TorchTitan, ModelImpl::HF, ModelImpl::LitGPT, ModelImpl::Fused}) {
    const BlockMemory bm = block(tiny_llama(), CheckpointMode::Full, impl);
    ASSERT_EQ(bm.saved.size(), 1u) << model_impl_name(impl);
    EXPECT_EQ(std::string(bm.saved[0].name), "x");
    EXPECT_EQ(bm.saved[0].bytes, 64);
    EXPECT_TRUE(bm.saved[0].is_input);
  }
}

TEST(Implementation, FullRecomputeByHandForTheFusedRecipe) {
  // Two moments reach 1088 B: the end of the recompute (x 64 + dy 64 + the 896 - 64 = 832 B it
  // re-creates + w2's output 64 + the recomputed block output 64) and, after it, the backward's peak
  // at down_proj (896 + dy 64 + d(prod) 128). Over the 64 B Full keeps: 1024.
  const BlockMemory bm = block(tiny_llama(), CheckpointMode::Full, ModelImpl::Fused);
  EXPECT_EQ(bm.backward_extra, 1088 - 64);
}

TEST(Implementation, SelectiveOpByHand) {
  // torchtitan (stock QKVLinear: wq, wk, wv): mm order wq(1, saved) wk(2) wv(3, saved) wo(4) w1(5, saved) w3(6)
  // w2(7, saved), torchtitan's _custom_policy counting every aten.mm of the block; flex attention saved.
  const BlockMemory tt = block(tiny_llama(), CheckpointMode::SelectiveOp, ModelImpl::TorchTitan);
  EXPECT_EQ(entries(tt), (Entries{{"x", 64}, {"attn.q", 64}, {"attn.v", 32}, {"attn.out", 64}, {"attn.lse", 32},
                                  {"mlp.gate", 128}, {"mlp.down", 64}}));
  // HF: q(1, saved) k(2) v(3, saved) o(4) gate(5, saved) up(6) down(7, saved).
  const BlockMemory hf = block(tiny_llama(), CheckpointMode::SelectiveOp, ModelImpl::HF);
  EXPECT_EQ(entries(hf), (Entries{{"x", 64}, {"attn.q", 64}, {"attn.v", 32}, {"attn.out", 64}, {"attn.lse", 32},
                                  {"mlp.gate", 128}, {"mlp.down", 64}}));
  // GPT-2's Conv1D runs aten.addmm: compute-intensive, saved always, never counted.
  const BlockMemory g2 = block(tiny_gpt2(), CheckpointMode::SelectiveOp, ModelImpl::HF);
  EXPECT_EQ(entries(g2), (Entries{{"x", 64}, {"attn.qkv", 192}, {"attn.out", 64}, {"attn.lse", 32},
                                  {"attn.proj", 64}, {"mlp.fc", 256}, {"mlp.down", 64}}));
}

TEST(Implementation, SelectiveOpAndFullAreSubsetsByName) {
  // Every SelectiveOp entry is the block input, an entry of the None list, or a matmul output the SAC
  // cache holds that plain autograd does not keep (what the recompute does not have to redo).
  const std::vector<std::string> sac_only = {"attn.qkv", "attn.q", "attn.proj", "mlp.down", "mlp.fc"};
  for (ModelImpl impl : {ModelImpl::TorchTitan, ModelImpl::HF, ModelImpl::LitGPT, ModelImpl::Fused}) {
    const auto none = names(block(tiny_llama(), CheckpointMode::None, impl));
    for (const auto& n : names(block(tiny_llama(), CheckpointMode::SelectiveOp, impl)))
      EXPECT_TRUE(n == "x" || contains(none, n) || contains(sac_only, n)) << model_impl_name(impl) << " " << n;
    for (const auto& n : names(block(tiny_llama(), CheckpointMode::Full, impl))) EXPECT_EQ(n, "x");
  }
}

TEST(Implementation, CompileSavesTheMinCutByHand) {
  // inductor recomputes the pointwise chains that only fusible backward ops read, from what cannot be
  // recomputed (the input, norm statistics, matmul and attention outputs); a tensor a library kernel's
  // backward reads (a linear's input for its weight gradient, SDPA's q, k, v) is banned from
  // recomputation (ban_recompute_materialized_backward) and saved. For torchtitan (T = 4, h 8, f 16):
  //   x 64, norm out 64, rstd 16, v 32, q_rope 64, k_rope 32 (SDPA's inputs), attention out 64 + lse 32,
  //   wo's output 64 (h = x + it is recomputed: a tie, the cut nearest the forward wins), the second norm's
  //   out 64 and rstd 16, gate 128 and up 128 (matmul outputs), prod 128 (w2's input) = 896; eager's 1088
  //   also keeps act = silu(gate) 128 (recomputed from gate) and the gathered RoPE cache 64 (recomputed
  //   from the model's buffer). Measured by PyTorch 2.11 on llama-1b (tests/fixtures/torch_memory/
  //   l1b-fsdp2-compile-w8-tt.json against l1b-fsdp2-mb2-tt.json): compiling keeps exactly one T x f bf16
  //   tensor per block less at the end of the forward (1,073,741,824 B over 16 blocks x 4096 tokens).
  const BlockMemory bm = block(tiny_llama(), CheckpointMode::None, ModelImpl::TorchTitan, /*compile=*/true);
  EXPECT_EQ(entries(bm), (Entries{{"x", 64}, {"attn_norm.out", 64}, {"attn_norm.rstd", 16}, {"attn.v", 32},
                                  {"attn.q_rope", 64}, {"attn.k_rope", 32}, {"attn.out", 64}, {"attn.lse", 32},
                                  {"attn.proj", 64}, {"mlp_norm.out", 64}, {"mlp_norm.rstd", 16}, {"mlp.gate", 128},
                                  {"mlp.up", 128}, {"mlp.prod", 128}}));
  EXPECT_EQ(bm.saved_bytes(), 896);  // 1088 eager
  // HF compiled reaches the same bytes: its fp32 norm copies are recomputed from x and the variance.
  EXPECT_EQ(block(tiny_llama(), CheckpointMode::None, ModelImpl::HF, true).saved_bytes(), 896);
  // Liger's kernels are opaque to the partitioner: compiling changes nothing but h <-> wo's output (a tie).
  EXPECT_EQ(block(tiny_llama(), CheckpointMode::None, ModelImpl::Fused, true).saved_bytes(), 896);
  // Checkpointing modes keep what they keep, compiled or not, except what the backward never reads: op-level SAC's
  // eager cache keeps every odd-numbered mm's output (448: x 64, wq's 64, wv's 32, attention out 64 + lse 32, w1's
  // 128 and w2's 64), the compiled partitioner leaves out w2's, which only the residual add reads (the AOT graph of
  // tests/fixtures/torch_memory/l1b-fsdp2-qlora-r16-qkv-sac-tt-compile.json: 8.70 GiB against eager's 8.95).
  EXPECT_EQ(block(tiny_llama(), CheckpointMode::SelectiveOp, ModelImpl::TorchTitan, false).saved_bytes(), 448);
  EXPECT_EQ(block(tiny_llama(), CheckpointMode::SelectiveOp, ModelImpl::TorchTitan, true).saved_bytes(), 384);
  EXPECT_EQ(block(tiny_llama(), CheckpointMode::Full, ModelImpl::TorchTitan, true).saved_bytes(), 64);
}

TEST(Implementation, Float8SavesTheHighPrecisionInputByHand) {
  // torchao's matmul_with_hp_or_float8_args saves input_hp (bf16), not its fp8 copy: same saved list.
  const auto bf16 = block(tiny_llama(), CheckpointMode::None, ModelImpl::TorchTitan);
  const auto f8 = block(tiny_llama(), CheckpointMode::None, ModelImpl::TorchTitan, false, Float8Recipe::Tensorwise);
  EXPECT_EQ(entries(f8), entries(bf16));
  // The casts are temporaries. The peak is at w2's weight cast (in f = 16, out h = 8):
  //   w2's input in fp8: T*f = 64 B, alive with its scale (4 B, fp32 scalar) until the mm;
  //   the weight's amax (2 B) and the weight in fp8: 8*16 = 128 B, its scale 4 B;
  //   the eager cast's working set: x.to(float32) and x * scale, 8 B per element: 8 * 128 = 1024 B.
  EXPECT_EQ(f8.forward_extra, 64 + 4 + 2 + 128 + 4 + 1024);
  // SelectiveOp: torchtitan's policy saves aten.max (the tensorwise amax, a 0-dim bf16 tensor): input
  // and weight amax for each of the 7 linears (wq, wk, wv, wo, w1, w3, w2) -> 14 * 2 B on top of the bf16 448
  // (SelectiveOpByHand).
  const auto sac = block(tiny_llama(), CheckpointMode::SelectiveOp, ModelImpl::TorchTitan, false, Float8Recipe::Tensorwise);
  EXPECT_EQ(sac.saved_bytes(), 448 + 14 * 2);
  EXPECT_TRUE(contains(names(sac), "attn.k.in_amax"));
  EXPECT_TRUE(contains(names(sac), "mlp.down.w_amax"));
  // rowwise takes torch.amax along a dim (aten.amax, not in the policy): nothing more is saved
  EXPECT_EQ(block(tiny_llama(), CheckpointMode::SelectiveOp, ModelImpl::TorchTitan, false, Float8Recipe::Rowwise).saved_bytes(),
            448);
  // GPT-2's Conv1D is not an nn.Linear: torchao does not convert it
  EXPECT_EQ(block(tiny_gpt2(), CheckpointMode::SelectiveOp, ModelImpl::HF, false, Float8Recipe::Tensorwise).saved_bytes(),
            block(tiny_gpt2(), CheckpointMode::SelectiveOp, ModelImpl::HF).saved_bytes());
}

TEST(Implementation, FinalNormByHand) {
  const ImplOptions tt{ModelImpl::TorchTitan};
  EXPECT_EQ(entries(final_norm_memory(tiny_llama(), 1, 4, Dtype::BF16, tt)),
            (Entries{{"x", 64}, {"final_norm.out", 64}, {"final_norm.rstd", 16}}));  // out = the head's input
  const ImplOptions hf{ModelImpl::HF};
  EXPECT_EQ(entries(final_norm_memory(tiny_llama(), 1, 4, Dtype::BF16, hf)),
            (Entries{{"final_norm.x_fp32", 128}, {"final_norm.rstd", 16}, {"final_norm.normed", 64}, {"final_norm.out", 64}}));
}

TEST(Implementation, MoeCoversEveryRoutedToken) {
  // Mixtral: k = 2 of E = 8 experts; at T = 4096 each expert sees 4096 * 2 / 8 = 1024 tokens (HF's
  // loop), torchtitan gathers all 8192 routed tokens for one grouped GEMM.
  const ModelSpec m = load_model("mixtral-8x7b");
  const BlockMemory hf = block_memory(m, 1, 4096, Dtype::BF16, CheckpointMode::None, ImplOptions{ModelImpl::HF});
  const BlockMemory tt = block_memory(m, 1, 4096, Dtype::BF16, CheckpointMode::None, ImplOptions{ModelImpl::TorchTitan});
  Bytes hf_gate = 0;
  for (const auto& t : hf.saved)
    if (std::string(t.name).ends_with(".gate")) hf_gate += t.bytes;
  EXPECT_EQ(hf_gate, 8 * 1024LL * 14336 * 2);  // 8 experts x 1024 tokens x f x bf16
  Bytes tt_gate = 0;
  for (const auto& t : tt.saved)
    if (std::string(t.name) == "moe.experts.gate") tt_gate += t.bytes;
  EXPECT_EQ(tt_gate, 8192LL * 14336 * 2);  // all routed tokens in one grouped GEMM
}

TEST(Implementation, LegacyAssumptionIsTorchtitanWithoutItsRopeGather) {
  // models/model_activations.cpp's single assumption (fused norms, q/k/v after RoPE at kv heads, SwiGLU
  // 4f) is torchtitan's block minus the per-block cache[positions] gather (T * d/2 * 8 B) that the
  // current ComplexRoPE saves; no recipe matches it exactly, so it stays a legacy function.
  const ModelSpec m = load_model("llama3-8b");
  const Bytes tt = block_memory(m, 1, 4096, Dtype::BF16, CheckpointMode::None, ImplOptions{ModelImpl::TorchTitan}).saved_bytes();
  EXPECT_EQ(tt - 4096LL * 64 * 8, block_saved_activation_bytes(m, 1, 4096, Dtype::BF16, CheckpointMode::None));
}

TEST(Implementation, Llama3_8bPerTokenByRecipe) {
  // per token (T = 4096): h 4096, a 32, g 8, d 128, f 14336, bf16
  const ModelSpec m = load_model("llama3-8b");
  auto per_token = [&](ModelImpl impl, CheckpointMode mode, bool compile = false) {
    return block_memory(m, 1, 4096, Dtype::BF16, mode, ImplOptions{impl, compile}).saved_bytes() / 4096;
  };
  // torchtitan: 4 h-wide (x, norm out, h, norm out) 32,768 + v 2,048 + cache 512 + q 8,192 + k 2,048
  //   + out 8,192 + lse 128 + 2 rstd 8 + 4f 114,688 = 168,584
  EXPECT_EQ(per_token(ModelImpl::TorchTitan, CheckpointMode::None), 168'584);
  // HF: per norm x_fp32 16,384 + rstd 4 + normed 8,192 + out 8,192 = 32,772 (x2) + v 2,048 + q 8,192 + k 2,048
  //   + out 8,192 + lse 128 + 114,688 = 200,840
  EXPECT_EQ(per_token(ModelImpl::HF, CheckpointMode::None), 200'840);
  // litgpt: per norm 16,384 + 4 + 16,384 + (weight fp32 16,384 B / 4096 tokens = 4) + 8,192 = 40,968 (x2)
  //   + q 8,192 + expanded k, v 2 x 8,192 + out 8,192 + lse 128 + the reshape's copy of out 8,192 + 114,688 = 237,712
  EXPECT_EQ(per_token(ModelImpl::LitGPT, CheckpointMode::None), 237'712);
  // fused: x, norm out, h, norm out 32,768 + 2 rstd 8 + q 8,192 + k, v 4,096 + out 8,192 + lse 128 + 3f 86,016 = 139,400
  EXPECT_EQ(per_token(ModelImpl::Fused, CheckpointMode::None), 139'400);
  // compiled torchtitan: eager less act (f 28,672, recomputed from gate) and the RoPE cache (512, recomputed
  //   from the buffer): x, norm out, q_rope, out, wo out, norm out 49,152 + k_rope, v 4,096 + lse 128
  //   + 2 rstd 8 + gate, up, prod 86,016 = 139,400
  EXPECT_EQ(per_token(ModelImpl::TorchTitan, CheckpointMode::None, true), 139'400);
  // SelectiveOp, torchtitan and HF alike (wq, wk, wv separate): x + q 8,192 + v 2,048 + attention 8,192 + 128
  //   + gate 28,672 + w2 out 8,192 = 63,616
  EXPECT_EQ(per_token(ModelImpl::TorchTitan, CheckpointMode::SelectiveOp), 63'616);
  EXPECT_EQ(per_token(ModelImpl::HF, CheckpointMode::SelectiveOp), 63'616);
  EXPECT_EQ(per_token(ModelImpl::LitGPT, CheckpointMode::Full), 8'192);
}

TEST(Implementation, LossUpcast) {
  const ModelSpec m = tiny_llama();
  EXPECT_TRUE(loss_upcasts_logits(m, ImplOptions{ModelImpl::TorchTitan}));
  EXPECT_TRUE(loss_upcasts_logits(m, ImplOptions{ModelImpl::HF}));
  EXPECT_TRUE(loss_upcasts_logits(m, ImplOptions{ModelImpl::Fused}));
  EXPECT_FALSE(loss_upcasts_logits(m, ImplOptions{ModelImpl::LitGPT}));
}

TEST(Implementation, BadInputIsAnInputError) {
  EXPECT_THROW(block_memory(tiny_llama(), 0, 4, Dtype::BF16, CheckpointMode::None, {}), InputError);
  EXPECT_THROW(block_memory(tiny_llama(), 1, -1, Dtype::BF16, CheckpointMode::None, {}), InputError);
  ModelSpec bad = tiny_llama();
  bad.n_kv_heads = 3;  // 2 heads cannot be grouped over 3
  EXPECT_THROW(block_memory(bad, 1, 4, Dtype::BF16, CheckpointMode::None, {}), InputError);
  EXPECT_THROW(parse_model_impl("megatron", "plan.implementation"), InputError);
  EXPECT_EQ(parse_model_impl("litgpt", "x"), ModelImpl::LitGPT);
}

TEST(Implementation, ModelInfoReportsTheRecipe) {
  ModelInfoRequest req;
  req.seq_len = 4096;
  req.implementation = ModelImpl::TorchTitan;
  const auto j = model_info_json(load_model("llama3-8b"), req);
  EXPECT_EQ(j.at("implementation"), "torchtitan");
  EXPECT_DOUBLE_EQ(j.at("saved_bytes_per_block_per_token").at("none").get<double>(), 168'584.0);
  EXPECT_DOUBLE_EQ(j.at("saved_bytes_per_block_per_token").at("full").get<double>(), 8'192.0);
  EXPECT_DOUBLE_EQ(j.at("final_norm_saved_bytes_per_token").get<double>(), 16'388.0);  // x, out, rstd
  EXPECT_NE(model_info_text(load_model("llama3-8b"), req).find("implementation torchtitan, saved per token per block: none 168584.0 B"),
            std::string::npos);
}

TEST(Implementation, ModelInfoCommandTakesTheOption) {
  auto run = [](const std::vector<std::string>& args) {
    std::ostringstream captured;
    std::streambuf* old = std::cout.rdbuf(captured.rdbuf());
    try {
      cli::cmd_model_info(args);
    } catch (...) {
      std::cout.rdbuf(old);
      throw;
    }
    std::cout.rdbuf(old);
    return captured.str();
  };
  EXPECT_NE(run({"--model", "llama3-8b", "--implementation", "litgpt"}).find("none 237712.0 B"), std::string::npos);
  try {
    run({"--model", "llama3-8b", "--implementation", "megatron"});
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--implementation");
  }
}

TEST(Implementation, NamesAreUniqueWithinABlock) {
  for (const char* model : {"llama3-8b", "gpt2", "gemma-2b", "mixtral-8x7b", "mpt-125m", "qwen2-7b"})
    for (ModelImpl impl : {ModelImpl::TorchTitan, ModelImpl::HF, ModelImpl::LitGPT, ModelImpl::Fused})
      for (CheckpointMode mode : {CheckpointMode::None, CheckpointMode::SelectiveOp})
        for (bool compile : {false, true}) {
          const BlockMemory bm = block_memory(load_model(model), 1, 128, Dtype::BF16, mode,
                                              ImplOptions{impl, compile, Float8Recipe::Tensorwise});
          std::vector<std::string> seen;
          for (const auto& t : bm.saved) {
            EXPECT_FALSE(contains(seen, t.name)) << model << " " << model_impl_name(impl) << " " << t.name;
            EXPECT_GT(t.bytes, 0) << model << " " << t.name;
            seen.emplace_back(t.name);
          }
          EXPECT_GT(bm.backward_extra, 0);
        }
}

TEST(Implementation, Fp32ActivationsNeedNoUpcastCopy) {
  // In fp32, hidden_states.to(float32) returns the tensor itself: HF's norm saves the block input.
  const BlockMemory bm = block_memory(tiny_llama(), 1, 4, Dtype::FP32, CheckpointMode::None, ImplOptions{ModelImpl::HF});
  EXPECT_EQ(std::string(bm.saved[0].name), "x");
  EXPECT_EQ(bm.saved[0].bytes, 4 * 8 * 4);
  const auto n = names(bm);
  EXPECT_FALSE(contains(n, "attn_norm.x_fp32"));
  EXPECT_FALSE(contains(n, "attn_norm.normed"));  // .to(fp32) of the fp32 normed tensor is itself
}

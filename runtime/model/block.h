// One Llama decoder block (LlamaDecoderLayer), forward and backward, fp32 on the CPU:
//   ln1 = rmsnorm(x) ; q,k,v = ln1 Wq,Wk,Wv (+b) ; rope(q,k) ; att = attention(q,k,v)
//   xmid = x + att Wo (+b) ; ln2 = rmsnorm(xmid) ; gate,up = ln2 Wgate,Wup (+b)
//   h = silu(gate) * up ; out = xmid + h Wdown (+b)
// Shapes: N = B*T tokens, C hidden, QD = NH*HD, KVD = NKV*HD, F MLP intermediate.
#pragma once
#include <vector>

#include "runtime/model/arena.h"
#include "runtime/model/dims.h"

namespace fsdpsim::runtime {

// Parameter (or gradient) tensors of one block, in the order of param_tensors.h. Biases may be null.
template <typename P>
struct BlockTensors {
  P wq = nullptr, bq = nullptr;       // [QD, C], [QD]
  P wk = nullptr, bk = nullptr;       // [KVD, C], [KVD]
  P wv = nullptr, bv = nullptr;       // [KVD, C], [KVD]
  P wo = nullptr, bo = nullptr;       // [C, QD], [C]
  P wgate = nullptr, bgate = nullptr; // [F, C], [F]
  P wup = nullptr, bup = nullptr;     // [F, C], [F]
  P wdown = nullptr, bdown = nullptr; // [C, F], [C]
  P ln1 = nullptr, ln2 = nullptr;     // [C], [C]
};
using BlockParams = BlockTensors<const float*>;
using BlockGrads = BlockTensors<float*>;

// Binds the tensors of one block from pointers listed in param_tensors.h order.
BlockParams bind_block_params(const Dims& d, const std::vector<const float*>& tensors);
BlockGrads bind_block_grads(const Dims& d, const std::vector<float*>& tensors);

// Everything the backward reads, as the forward leaves it (no activation checkpointing). These are
// exactly the tensors models/model_activations.cpp counts for a gated-MLP block: 4h + (2a+2g)d + 4f
// elements per token plus fp32 rstd x2 and the attention log-sum-exp (a per token).
struct BlockActs {
  float* x = nullptr;      // [N, C]   block input (for rmsnorm 1 backward)
  float* rstd1 = nullptr;  // [N]      1/rms of x
  float* ln1 = nullptr;    // [N, C]   rmsnorm 1 output (input of q/k/v projections)
  float* q = nullptr;      // [N, QD]  queries after rotary
  float* k = nullptr;      // [N, KVD] keys after rotary
  float* v = nullptr;      // [N, KVD] values
  float* att = nullptr;    // [N, QD]  attention output (input of o_proj)
  float* lse = nullptr;    // [B, NH, T] attention row log-sum-exp
  float* xmid = nullptr;   // [N, C]   residual after attention (for rmsnorm 2 backward)
  float* rstd2 = nullptr;  // [N]
  float* ln2 = nullptr;    // [N, C]   rmsnorm 2 output (input of gate/up projections)
  float* gate = nullptr;   // [N, F]
  float* act = nullptr;    // [N, F]   silu(gate) (input of the product, as eager PyTorch saves it)
  float* up = nullptr;     // [N, F]
  float* h = nullptr;      // [N, F]   act*up (input of down_proj)
};

// The layout of all BlockActs tensors in one region, in the field order above.
ArenaLayout block_acts_layout(const Dims& d);
BlockActs bind_block_acts(const Dims& d, void* base);   // base holds block_acts_layout(d).bytes()

// Gradient temporaries of one block backward (the runtime's working memory).
struct BlockScratch {
  float* dxmid = nullptr;  // [N, C]
  float* dh = nullptr;     // [N, F]
  float* dgate = nullptr;  // [N, F]
  float* dup = nullptr;    // [N, F]
  float* dln = nullptr;    // [N, C]   grad of ln2, then of ln1
  float* datt = nullptr;   // [N, QD]
  float* dq = nullptr;     // [N, QD]
  float* dk = nullptr;     // [N, KVD]
  float* dv = nullptr;     // [N, KVD]
};
ArenaLayout block_scratch_layout(const Dims& d);
BlockScratch bind_block_scratch(const Dims& d, void* base);

// Forward: reads x_in[N,C], fills every field of `a` (a.x receives a copy of x_in unless it is
// x_in itself), writes out[N,C].
// stop_early: a recompute under non-reentrant checkpointing's early stop (models/kernels_recompute.cpp):
// everything backward needs is re-created once the MLP's last linear's input exists, so that linear
// and the residual add after it are skipped (`out` is not written).
void block_forward(const Dims& d, const BlockParams& p, const float* x_in, BlockActs& a, float* out,
                   bool stop_early = false);

// Backward: from dout[N,C] and the forward's `a`, accumulates parameter grads into g (+=) and
// writes dx_in[N,C] (overwritten; may alias dout).
void block_backward(const Dims& d, const BlockParams& p, BlockGrads& g, const BlockActs& a, const float* dout,
                    float* dx_in, const BlockScratch& s);

}  // namespace fsdpsim::runtime

// Causal scaled-dot-product attention with grouped-query attention (GQA), computed the way
// flash/memory-efficient attention does: the forward saves only the output and the row
// log-sum-exp, never the T x T probabilities; the backward recomputes them.
// NH query heads share NKV key/value heads (head h reads kv head h / (NH/NKV)).
#pragma once

namespace fsdpsim::runtime {

// q[B,T,NH,HD], k[B,T,NKV,HD], v[B,T,NKV,HD] -> out[B,T,NH,HD], lse[B,NH,T] (log-sum-exp of the
// scaled scores of each query row, needed by the backward).
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int B, int T, int NH,
                       int NKV, int HD);

// dq[B,T,NH,HD], dk/dv[B,T,NKV,HD] are overwritten (not accumulated), from dout[B,T,NH,HD] and the
// forward's q, k, v, out, lse. Reductions run in a fixed order (deterministic).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, int B, int T, int NH, int NKV, int HD);

}  // namespace fsdpsim::runtime

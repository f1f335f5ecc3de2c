#include "runtime/model/block.h"

#include <cstring>

#include "runtime/layers/attention.h"
#include "runtime/layers/matmul.h"
#include "runtime/layers/rmsnorm.h"
#include "runtime/layers/rotary.h"
#include "runtime/layers/swiglu.h"
#include "runtime/model/param_tensors.h"

namespace fsdpsim::runtime {

namespace {
template <typename P, typename V>
BlockTensors<P> bind(const Dims& d, const std::vector<V>& t) {
  const BlockTensorIndex x = block_tensor_index(d);
  auto at = [&](int i) -> P { return i < 0 ? nullptr : t.at(i); };
  BlockTensors<P> b;
  b.wq = at(x.wq); b.bq = at(x.bq); b.wk = at(x.wk); b.bk = at(x.bk); b.wv = at(x.wv); b.bv = at(x.bv);
  b.wo = at(x.wo); b.bo = at(x.bo); b.wgate = at(x.wgate); b.bgate = at(x.bgate); b.wup = at(x.wup);
  b.bup = at(x.bup); b.wdown = at(x.wdown); b.bdown = at(x.bdown); b.ln1 = at(x.ln1); b.ln2 = at(x.ln2);
  return b;
}
}  // namespace

BlockParams bind_block_params(const Dims& d, const std::vector<const float*>& t) { return bind<const float*>(d, t); }
BlockGrads bind_block_grads(const Dims& d, const std::vector<float*>& t) { return bind<float*>(d, t); }

ArenaLayout block_acts_layout(const Dims& d) {
  const long N = d.tokens();
  ArenaLayout l;
  l.add("x", N * d.C);
  l.add("rstd1", N);
  l.add("ln1", N * d.C);
  l.add("q", N * d.q_dim());
  l.add("k", N * d.kv_dim());
  l.add("v", N * d.kv_dim());
  l.add("att", N * d.q_dim());
  l.add("lse", static_cast<long>(d.B) * d.NH * d.T);
  l.add("xmid", N * d.C);
  l.add("rstd2", N);
  l.add("ln2", N * d.C);
  l.add("gate", N * d.F);
  l.add("act", N * d.F);
  l.add("up", N * d.F);
  l.add("h", N * d.F);
  return l;
}

BlockActs bind_block_acts(const Dims& d, void* base) {
  const ArenaLayout l = block_acts_layout(d);
  BlockActs a;
  float** fields[] = {&a.x, &a.rstd1, &a.ln1, &a.q, &a.k, &a.v, &a.att, &a.lse, &a.xmid, &a.rstd2, &a.ln2,
                      &a.gate, &a.act, &a.up, &a.h};
  for (int i = 0; i < 15; ++i) *fields[i] = l.at(base, i);
  return a;
}

ArenaLayout block_scratch_layout(const Dims& d) {
  const long N = d.tokens();
  ArenaLayout l;
  l.add("dxmid", N * d.C);
  l.add("dh", N * d.F);
  l.add("dgate", N * d.F);
  l.add("dup", N * d.F);
  l.add("dln", N * d.C);
  l.add("datt", N * d.q_dim());
  l.add("dq", N * d.q_dim());
  l.add("dk", N * d.kv_dim());
  l.add("dv", N * d.kv_dim());
  return l;
}

BlockScratch bind_block_scratch(const Dims& d, void* base) {
  const ArenaLayout l = block_scratch_layout(d);
  BlockScratch s;
  float** fields[] = {&s.dxmid, &s.dh, &s.dgate, &s.dup, &s.dln, &s.datt, &s.dq, &s.dk, &s.dv};
  for (int i = 0; i < 9; ++i) *fields[i] = l.at(base, i);
  return s;
}

void block_forward(const Dims& d, const BlockParams& p, const float* x_in, BlockActs& a, float* out, bool stop_early) {
  const int N = static_cast<int>(d.tokens());
  const long NC = static_cast<long>(N) * d.C;
  if (a.x != x_in) std::memcpy(a.x, x_in, sizeof(float) * NC);
  rmsnorm_forward(a.ln1, a.rstd1, a.x, p.ln1, N, d.C);
  matmul_forward(a.q, a.ln1, p.wq, p.bq, N, d.C, d.q_dim());
  matmul_forward(a.k, a.ln1, p.wk, p.bk, N, d.C, d.kv_dim());
  matmul_forward(a.v, a.ln1, p.wv, p.bv, N, d.C, d.kv_dim());
  rotary_forward(a.q, d.B, d.T, d.NH, d.HD);
  rotary_forward(a.k, d.B, d.T, d.NKV, d.HD);
  attention_forward(a.att, a.lse, a.q, a.k, a.v, d.B, d.T, d.NH, d.NKV, d.HD);
  matmul_forward(a.xmid, a.att, p.wo, p.bo, N, d.q_dim(), d.C);
  for (long i = 0; i < NC; ++i) a.xmid[i] += a.x[i];
  rmsnorm_forward(a.ln2, a.rstd2, a.xmid, p.ln2, N, d.C);
  matmul_forward(a.gate, a.ln2, p.wgate, p.bgate, N, d.C, d.F);
  matmul_forward(a.up, a.ln2, p.wup, p.bup, N, d.C, d.F);
  swiglu_forward(a.act, a.h, a.gate, a.up, static_cast<long>(N) * d.F);
  if (stop_early) return;
  matmul_forward(out, a.h, p.wdown, p.bdown, N, d.F, d.C);
  for (long i = 0; i < NC; ++i) out[i] += a.xmid[i];
}

void block_backward(const Dims& d, const BlockParams& p, BlockGrads& g, const BlockActs& a, const float* dout,
                    float* dx_in, const BlockScratch& s) {
  const int N = static_cast<int>(d.tokens());
  const long NC = static_cast<long>(N) * d.C;
  // MLP branch: out = xmid + down(h).
  std::memcpy(s.dxmid, dout, sizeof(float) * NC);
  std::memset(s.dh, 0, sizeof(float) * N * static_cast<long>(d.F));
  matmul_backward(s.dh, g.wdown, g.bdown, dout, a.h, p.wdown, N, d.F, d.C);
  swiglu_backward(s.dgate, s.dup, s.dh, a.gate, a.act, a.up, static_cast<long>(N) * d.F);
  std::memset(s.dln, 0, sizeof(float) * NC);
  matmul_backward(s.dln, g.wgate, g.bgate, s.dgate, a.ln2, p.wgate, N, d.C, d.F);
  matmul_backward(s.dln, g.wup, g.bup, s.dup, a.ln2, p.wup, N, d.C, d.F);
  rmsnorm_backward(s.dxmid, g.ln2, s.dln, a.xmid, p.ln2, a.rstd2, N, d.C);
  // Attention branch: xmid = x + o_proj(att).
  std::memset(s.datt, 0, sizeof(float) * N * static_cast<long>(d.q_dim()));
  matmul_backward(s.datt, g.wo, g.bo, s.dxmid, a.att, p.wo, N, d.q_dim(), d.C);
  attention_backward(s.dq, s.dk, s.dv, s.datt, a.q, a.k, a.v, a.att, a.lse, d.B, d.T, d.NH, d.NKV, d.HD);
  rotary_backward(s.dq, d.B, d.T, d.NH, d.HD);
  rotary_backward(s.dk, d.B, d.T, d.NKV, d.HD);
  std::memset(s.dln, 0, sizeof(float) * NC);
  matmul_backward(s.dln, g.wq, g.bq, s.dq, a.ln1, p.wq, N, d.C, d.q_dim());
  matmul_backward(s.dln, g.wk, g.bk, s.dk, a.ln1, p.wk, N, d.C, d.kv_dim());
  matmul_backward(s.dln, g.wv, g.bv, s.dv, a.ln1, p.wv, N, d.C, d.kv_dim());
  // dx = dxmid (residual) + rmsnorm-1 backward. dx_in may alias dout: dout is no longer read.
  if (dx_in != s.dxmid) std::memcpy(dx_in, s.dxmid, sizeof(float) * NC);
  rmsnorm_backward(dx_in, g.ln1, s.dln, a.x, p.ln1, a.rstd1, N, d.C);
}

}  // namespace fsdpsim::runtime

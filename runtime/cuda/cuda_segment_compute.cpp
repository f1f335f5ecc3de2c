#include "runtime/cuda/cuda_segment_compute.h"

#include <cmath>
#include <map>
#include <stdexcept>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"
#include "runtime/layers/rotary.h"
#include "runtime/model/param_tensors.h"

namespace fsdpsim::runtime::cuda {

struct CudaSegmentCompute::Acts {
  bf16 *x = nullptr, *ln1 = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr, *xmid = nullptr;
  bf16 *ln2 = nullptr, *gate = nullptr, *act = nullptr, *up = nullptr, *h = nullptr;
  float *rstd1 = nullptr, *rstd2 = nullptr, *lse = nullptr;
};

namespace {
long x_bytes(const Dims& d) { return d.tokens() * d.C * 2; }
}  // namespace

Bytes cuda_block_acts_bytes(const Dims& d) {
  const long N = d.tokens();
  const long bf = 4 * N * d.C + 2 * N * d.q_dim() + 2 * N * d.kv_dim() + 4 * N * d.F;
  const long f32 = 2 * N + static_cast<long>(d.B) * d.NH * d.T;
  return bf * 2 + f32 * 4;
}

Bytes cuda_logits_bytes(const Dims& d) { return d.tokens() * d.V * (2 + 4); }

Bytes cuda_logits_lse_offset(const Dims& d) { return (d.tokens() * d.V * 2 + 3) / 4 * 4; }

// base = address of x; the other fields follow at their offsets (layout in the header).
CudaSegmentCompute::Acts CudaSegmentCompute::bind(char* act, char* recomp, int layer) const {
  const long N = d_.tokens();
  char* base = ckpt_[layer] ? recomp - x_bytes(d_) : act;
  Acts a;
  char* p = base;
  auto take_bf = [&](long n) { bf16* r = reinterpret_cast<bf16*>(p); p += n * 2; return r; };
  auto take_f = [&](long n) { float* r = reinterpret_cast<float*>(p); p += n * 4; return r; };
  a.x = take_bf(N * d_.C);
  a.rstd1 = take_f(N);
  a.rstd2 = take_f(N);
  a.lse = take_f(static_cast<long>(d_.B) * d_.NH * d_.T);
  a.ln1 = take_bf(N * d_.C);
  a.q = take_bf(N * d_.q_dim());
  a.k = take_bf(N * d_.kv_dim());
  a.v = take_bf(N * d_.kv_dim());
  a.att = take_bf(N * d_.q_dim());
  a.xmid = take_bf(N * d_.C);
  a.ln2 = take_bf(N * d_.C);
  a.gate = take_bf(N * d_.F);
  a.act = take_bf(N * d_.F);
  a.up = take_bf(N * d_.F);
  a.h = take_bf(N * d_.F);
  if (ckpt_[layer]) a.x = reinterpret_cast<bf16*>(act);
  return a;
}

template <class T>
T* CudaSegmentCompute::scratch(long n) {
  void* p = nullptr;
  const size_t bytes = static_cast<size_t>(std::max<long>(n, 1)) * sizeof(T);
  FSDPSIM_CUDA_CHECK(cudaMalloc(&p, bytes));
  owned_.push_back(p);
  untracked_ += static_cast<Bytes>(bytes);
  return static_cast<T*>(p);
}

CudaSegmentCompute::CudaSegmentCompute(const Dims& d, float dloss_scale, std::vector<bool> ckpt, Gemm& gemm)
    : d_(d), dloss_scale_(dloss_scale), ckpt_(std::move(ckpt)), gemm_(gemm), s_(gemm.stream()) {
  if (!attention_supports_head_dim(d.HD))
    throw std::invalid_argument("CUDA attention kernels are compiled for head_dim 16, 32, 64 and 128, not " +
                                std::to_string(d.HD));
  const long N = d.tokens(), NC = N * d.C;
  x_ = scratch<bf16>(NC);
  dx_ = scratch<bf16>(NC);
  bool any_ckpt = false;
  for (bool c : ckpt_) any_ckpt = any_ckpt || c;
  if (any_ckpt) transient_ = scratch<char>(block_acts_bytes());
  dxmid_ = scratch<bf16>(NC);
  dh_ = scratch<bf16>(N * d.F);
  dgate_ = scratch<bf16>(N * d.F);
  dup_ = scratch<bf16>(N * d.F);
  dln_ = scratch<bf16>(NC);
  datt_ = scratch<bf16>(N * d.q_dim());
  dq_ = scratch<bf16>(N * d.q_dim());
  dk_ = scratch<bf16>(N * d.kv_dim());
  dv_ = scratch<bf16>(N * d.kv_dim());
  attn_D_ = scratch<float>(static_cast<long>(d.B) * d.NH * d.T);
  head_x_ = scratch<bf16>(NC);
  head_ln_ = scratch<bf16>(NC);
  head_rstd_ = scratch<float>(N);
  // Rotary table as rotary.cpp computes it (double, then fp32), theta = kRopeTheta.
  std::vector<float> cs;
  cs.reserve(static_cast<size_t>(d.T) * d.HD);
  for (int t = 0; t < d.T; ++t)
    for (int i = 0; i < d.HD / 2; ++i) {
      const double a = t * std::pow(kRopeTheta, -2.0 * i / d.HD);
      cs.push_back(static_cast<float>(std::cos(a)));
      cs.push_back(static_cast<float>(std::sin(a)));
    }
  rope_ = scratch<float>(static_cast<long>(cs.size()));
  FSDPSIM_CUDA_CHECK(cudaMemcpy(rope_, cs.data(), cs.size() * sizeof(float), cudaMemcpyHostToDevice));
}

CudaSegmentCompute::~CudaSegmentCompute() {
  for (void* p : owned_) cudaFree(p);
}

void CudaSegmentCompute::set_batch(int mb, const std::vector<std::int32_t>& inputs,
                                   const std::vector<std::int32_t>& targets) {
  const long N = d_.tokens();
  if (static_cast<long>(inputs.size()) != N || static_cast<long>(targets.size()) != N)
    throw std::invalid_argument("CudaSegmentCompute::set_batch: not [B, T] tokens");
  while (static_cast<int>(batches_.size()) <= mb) {
    Batch b;
    b.inputs = scratch<std::int32_t>(N);
    b.targets = scratch<std::int32_t>(N);
    b.uniq = scratch<std::int32_t>(N);
    b.off = scratch<std::int32_t>(N + 1);
    b.pos = scratch<std::int32_t>(N);
    b.loss = scratch<float>(N);
    batches_.push_back(b);
  }
  Batch& b = batches_[mb];
  // The embedding backward's CSR: positions grouped by token, each group in increasing order.
  std::map<std::int32_t, std::vector<std::int32_t>> by;
  for (long n = 0; n < N; ++n) by[inputs[n]].push_back(static_cast<std::int32_t>(n));
  std::vector<std::int32_t> uniq, off{0}, pos;
  for (auto& [t, ps] : by) {
    uniq.push_back(t);
    pos.insert(pos.end(), ps.begin(), ps.end());
    off.push_back(static_cast<std::int32_t>(pos.size()));
  }
  b.n_uniq = static_cast<int>(uniq.size());
  auto up = [](std::int32_t* dst, const std::vector<std::int32_t>& v) {
    FSDPSIM_CUDA_CHECK(cudaMemcpy(dst, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  };
  up(b.inputs, inputs);
  up(b.targets, targets);
  up(b.uniq, uniq);
  up(b.off, off);
  up(b.pos, pos);
}

double CudaSegmentCompute::loss_sum(int mb) const {
  std::vector<float> l(d_.tokens());
  FSDPSIM_CUDA_CHECK(cudaMemcpy(l.data(), batches_.at(mb).loss, l.size() * 4, cudaMemcpyDeviceToHost));
  double s = 0;
  for (float v : l) s += v;   // token order, in double (as cross_entropy_forward)
  return s;
}

Bytes CudaSegmentCompute::act_bytes(int seg) const {
  if (seg == 0) return 0;
  if (seg == d_.L + 1) return cuda_logits_bytes(d_);
  return ckpt_[seg - 1] ? x_bytes(d_) : block_acts_bytes();
}

Bytes CudaSegmentCompute::recomp_bytes(int seg) const {
  if (seg == 0 || seg == d_.L + 1 || !ckpt_[seg - 1]) return 0;
  return block_acts_bytes() - x_bytes(d_);
}

namespace {
struct P {
  const bf16 *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo, *wgate, *bgate, *wup, *bup, *wdown, *bdown, *ln1, *ln2;
};
template <class V>
auto at(const V& t, int i) -> typename V::value_type { return i < 0 ? nullptr : t.at(i); }
}  // namespace

void CudaSegmentCompute::block_forward(const std::vector<bf16*>& t, const bf16* x_in, Acts& a, bf16* out, bool stop_early) {
  const BlockTensorIndex x = block_tensor_index(d_);
  const int N = static_cast<int>(d_.tokens());
  const long NC = static_cast<long>(N) * d_.C;
  if (a.x != x_in) FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(a.x, x_in, NC * 2, cudaMemcpyDeviceToDevice, s_));
  rmsnorm_forward(a.ln1, a.rstd1, a.x, at(t, x.ln1), N, d_.C, s_);
  gemm_.linear_forward(a.q, a.ln1, at(t, x.wq), at(t, x.bq), N, d_.C, d_.q_dim());
  gemm_.linear_forward(a.k, a.ln1, at(t, x.wk), at(t, x.bk), N, d_.C, d_.kv_dim());
  gemm_.linear_forward(a.v, a.ln1, at(t, x.wv), at(t, x.bv), N, d_.C, d_.kv_dim());
  rotary(a.q, rope_, d_.B, d_.T, d_.NH, d_.HD, false, s_);
  rotary(a.k, rope_, d_.B, d_.T, d_.NKV, d_.HD, false, s_);
  attention_forward(a.att, a.lse, a.q, a.k, a.v, d_.B, d_.T, d_.NH, d_.NKV, d_.HD, s_);
  gemm_.linear_forward(a.xmid, a.att, at(t, x.wo), at(t, x.bo), N, d_.q_dim(), d_.C);
  add_bf16(a.xmid, a.x, NC, s_);
  rmsnorm_forward(a.ln2, a.rstd2, a.xmid, at(t, x.ln2), N, d_.C, s_);
  gemm_.linear_forward(a.gate, a.ln2, at(t, x.wgate), at(t, x.bgate), N, d_.C, d_.F);
  gemm_.linear_forward(a.up, a.ln2, at(t, x.wup), at(t, x.bup), N, d_.C, d_.F);
  swiglu_forward(a.act, a.h, a.gate, a.up, static_cast<long>(N) * d_.F, s_);
  if (stop_early) return;
  gemm_.linear_forward(out, a.h, at(t, x.wdown), at(t, x.bdown), N, d_.F, d_.C);
  add_bf16(out, a.xmid, NC, s_);
}

// block.cpp's backward; dx (the residual-stream gradient) is read as dout and overwritten with dx_in.
void CudaSegmentCompute::block_backward(const std::vector<bf16*>& t, const std::vector<bf16*>& g, const Acts& a,
                                        bf16* dx) {
  const BlockTensorIndex x = block_tensor_index(d_);
  const int N = static_cast<int>(d_.tokens());
  const long NC = static_cast<long>(N) * d_.C, NF = static_cast<long>(N) * d_.F;
  FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(dxmid_, dx, NC * 2, cudaMemcpyDeviceToDevice, s_));
  FSDPSIM_CUDA_CHECK(cudaMemsetAsync(dh_, 0, NF * 2, s_));
  gemm_.linear_backward(dh_, at(g, x.wdown), at(g, x.bdown), dx, a.h, at(t, x.wdown), N, d_.F, d_.C);
  swiglu_backward(dgate_, dup_, dh_, a.gate, a.act, a.up, NF, s_);
  FSDPSIM_CUDA_CHECK(cudaMemsetAsync(dln_, 0, NC * 2, s_));
  gemm_.linear_backward(dln_, at(g, x.wgate), at(g, x.bgate), dgate_, a.ln2, at(t, x.wgate), N, d_.C, d_.F);
  gemm_.linear_backward(dln_, at(g, x.wup), at(g, x.bup), dup_, a.ln2, at(t, x.wup), N, d_.C, d_.F);
  rmsnorm_backward(dxmid_, at(g, x.ln2), dln_, a.xmid, at(t, x.ln2), a.rstd2, N, d_.C, s_);
  FSDPSIM_CUDA_CHECK(cudaMemsetAsync(datt_, 0, static_cast<long>(N) * d_.q_dim() * 2, s_));
  gemm_.linear_backward(datt_, at(g, x.wo), at(g, x.bo), dxmid_, a.att, at(t, x.wo), N, d_.q_dim(), d_.C);
  attention_backward(dq_, dk_, dv_, attn_D_, datt_, a.q, a.k, a.v, a.att, a.lse, d_.B, d_.T, d_.NH, d_.NKV, d_.HD, s_);
  rotary(dq_, rope_, d_.B, d_.T, d_.NH, d_.HD, true, s_);
  rotary(dk_, rope_, d_.B, d_.T, d_.NKV, d_.HD, true, s_);
  FSDPSIM_CUDA_CHECK(cudaMemsetAsync(dln_, 0, NC * 2, s_));
  gemm_.linear_backward(dln_, at(g, x.wq), at(g, x.bq), dq_, a.ln1, at(t, x.wq), N, d_.C, d_.q_dim());
  gemm_.linear_backward(dln_, at(g, x.wk), at(g, x.bk), dk_, a.ln1, at(t, x.wk), N, d_.C, d_.kv_dim());
  gemm_.linear_backward(dln_, at(g, x.wv), at(g, x.bv), dv_, a.ln1, at(t, x.wv), N, d_.C, d_.kv_dim());
  FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(dx, dxmid_, NC * 2, cudaMemcpyDeviceToDevice, s_));
  rmsnorm_backward(dx, at(g, x.ln1), dln_, a.x, at(t, x.ln1), a.rstd1, N, d_.C, s_);
}

void CudaSegmentCompute::forward(int seg, int mb, const std::vector<bf16*>& p, char* act) {
  const int N = static_cast<int>(d_.tokens());
  const long NC = d_.tokens() * d_.C;
  Batch& b = batches_.at(mb);
  if (seg == 0) {
    embedding_forward(x_, b.inputs, p.at(0), N, d_.C, s_);
    return;
  }
  if (seg == d_.L + 1) {   // final norm, LM head, fused cross-entropy
    bf16* logits = reinterpret_cast<bf16*>(act);
    float* lse = reinterpret_cast<float*>(act + cuda_logits_lse_offset(d_));
    FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(head_x_, x_, NC * 2, cudaMemcpyDeviceToDevice, s_));
    rmsnorm_forward(head_ln_, head_rstd_, head_x_, p.at(0), N, d_.C, s_);
    gemm_.linear_forward(logits, head_ln_, p.at(1), nullptr, N, d_.C, d_.V);
    cross_entropy_forward(lse, b.loss, logits, b.targets, N, d_.V, s_);
    return;
  }
  const int layer = seg - 1;
  Acts a;
  if (ckpt_[layer]) {   // torch.utils.checkpoint: intermediates are transient, only the input is kept
    a = bind(nullptr, transient_ + x_bytes(d_), layer);
    a.x = reinterpret_cast<bf16*>(transient_);
    FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(act, x_, NC * 2, cudaMemcpyDeviceToDevice, s_));
  } else {
    a = bind(act, nullptr, layer);
  }
  block_forward(p, x_, a, dx_);   // dx_ is free during the forward: the block output lands there
  FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(x_, dx_, NC * 2, cudaMemcpyDeviceToDevice, s_));
}

void CudaSegmentCompute::recompute(int seg, int mb, const std::vector<bf16*>& p, char* act, char* recomp) {
  const int layer = seg - 1;
  if (seg < 1 || seg > d_.L || !ckpt_[layer]) throw std::logic_error("recompute of a segment that is not checkpointed");
  Acts a = bind(act, recomp, layer);
  block_forward(p, a.x, a, dxmid_, early_stop_);   // the output is not needed; dxmid_ is free until this block's backward
}

void CudaSegmentCompute::backward(int seg, int mb, const std::vector<bf16*>& p, const std::vector<bf16*>& g,
                                  char* act, char* recomp) {
  const int N = static_cast<int>(d_.tokens());
  const long NC = d_.tokens() * d_.C;
  Batch& b = batches_.at(mb);
  if (seg == 0) {
    embedding_backward(g.at(0), dx_, b.uniq, b.off, b.pos, b.n_uniq, d_.C, s_);
    return;
  }
  if (seg == d_.L + 1) {
    bf16* logits = reinterpret_cast<bf16*>(act);
    const float* lse = reinterpret_cast<const float*>(act + cuda_logits_lse_offset(d_));
    cross_entropy_backward(logits, lse, b.targets, N, d_.V, dloss_scale_, s_);
    FSDPSIM_CUDA_CHECK(cudaMemsetAsync(dln_, 0, NC * 2, s_));
    gemm_.linear_backward(dln_, g.at(1), nullptr, logits, head_ln_, p.at(1), N, d_.C, d_.V);
    FSDPSIM_CUDA_CHECK(cudaMemsetAsync(dx_, 0, NC * 2, s_));
    rmsnorm_backward(dx_, g.at(0), dln_, head_x_, p.at(0), head_rstd_, N, d_.C, s_);
    return;
  }
  block_backward(p, g, bind(act, recomp, seg - 1), dx_);
}

}  // namespace fsdpsim::runtime::cuda

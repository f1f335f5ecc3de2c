// The CUDA kernels' math on the host, no GPU or driver needed: the __host__ __device__ functions of
// runtime/cuda/kernel_math.cuh driven over an emulated grid (threads, blocks, shared-memory tiles,
// exactly the loops of kernels.cu) and compared with runtime/layers, the fp32 reference.
//
// Inputs are drawn, then rounded to bf16, and the reference gets those same rounded values as fp32:
// the only differences left are the kernels' bf16 roundings of outputs and stored intermediates and
// fp32 summation order. bf16 keeps 8 significant bits: one rounding is a relative error of at most
// 2^-9. Errors are measured as max|kernel - ref| / max|ref| over the tensor, and the tolerance is
// 2^-9 per bf16 rounding on the path, times 2 for fp32 accumulation-order noise and cancellations:
//   one rounding (embedding, rmsnorm, swiglu's dup, attention forward, cross-entropy grads): 2^-8
//   two or three (rotary's in-place pair, swiglu's h and dgate, rmsnorm backward into a bf16 += ): 2^-7
// The tests below also check these tolerances are tight enough to catch real bugs (a wrong causal
// mask, a missing rstd factor), so they can fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "runtime/cuda/kernel_math.cuh"
#include "runtime/layers/attention.h"
#include "runtime/layers/cross_entropy.h"
#include "runtime/layers/embedding.h"
#include "runtime/layers/rmsnorm.h"
#include "runtime/layers/rotary.h"
#include "runtime/layers/swiglu.h"
#include "runtime/train/optimizer.h"
#include "bf16_test_data.h"

namespace fsdpsim::runtime::cuda {
namespace {

using test_data::Data;
using test_data::rand_data;
using test_data::rel_err;
using test_data::to_f;

constexpr double kOne = 1.0 / 256;    // 2^-8: one bf16 rounding, with margin
constexpr double kFew = 1.0 / 128;    // 2^-7: two or three roundings


TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f2bf(1.0f), 0x3f80);
  EXPECT_EQ(bf2f(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(f2bf(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(f2bf(1.0f + 3.0f / 256), 0x3f82);   // halfway between 1+2^-7 and 1+2^-6: up to even
  EXPECT_TRUE(std::isnan(bf2f(f2bf(NAN))));
  EXPECT_EQ(bf2f(f2bf(INFINITY)), INFINITY);
}

// ---- embedding ----
TEST(KernelMath, EmbeddingForwardBackwardMatchReference) {
  std::mt19937 g(1);
  const int N = 37, C = 24, V = 11;
  Data wte = rand_data(static_cast<long>(V) * C, g);
  std::vector<std::int32_t> tok(N);
  for (auto& t : tok) t = static_cast<std::int32_t>(g() % V);
  std::vector<bf16> out(static_cast<size_t>(N) * C);
  for (long i = 0; i < static_cast<long>(N) * C; ++i) math::embedding_fwd(out.data(), wte.b.data(), tok.data(), i, C);
  std::vector<float> ref(static_cast<size_t>(N) * C);
  embedding_forward(ref.data(), tok.data(), wte.f.data(), N, C);
  EXPECT_EQ(rel_err(to_f(out), ref), 0.0);   // a gather: exact

  // Backward: the host's CSR grouping, then one emulated block per unique token.
  Data dout = rand_data(static_cast<long>(N) * C, g);
  Data dw0 = rand_data(static_cast<long>(V) * C, g);   // "+=" onto an existing grad
  std::map<std::int32_t, std::vector<std::int32_t>> by;
  for (int n = 0; n < N; ++n) by[tok[n]].push_back(n);
  std::vector<std::int32_t> uniq, off{0}, pos;
  for (auto& [t, ps] : by) {
    uniq.push_back(t);
    pos.insert(pos.end(), ps.begin(), ps.end());
    off.push_back(static_cast<std::int32_t>(pos.size()));
  }
  std::vector<bf16> dw = dw0.b;
  for (int k = 0; k < static_cast<int>(uniq.size()); ++k)
    for (int c = 0; c < C; ++c) math::embedding_bwd(dw.data(), dout.b.data(), uniq.data(), off.data(), pos.data(), k, c, C);
  std::vector<float> dref = dw0.f;
  embedding_backward(dref.data(), dout.f.data(), tok.data(), N, C);
  EXPECT_LT(rel_err(to_f(dw), dref), kOne);
}

// ---- RMSNorm: one emulated block of nt threads per row ----
struct RmsOut {
  std::vector<float> out, rstd, dx, dw;
};
RmsOut rms_emulated(const Data& x, const Data& w, const Data& g, const Data& dx0, const Data& dw0, int N, int C,
                    bool drop_rstd_in_dx = false) {
  const int nt = 256;
  RmsOut r;
  std::vector<bf16> out(static_cast<size_t>(N) * C), dx = dx0.b, dw = dw0.b;
  std::vector<float> rstd(N);
  for (int n = 0; n < N; ++n) {
    const bf16* xr = x.b.data() + static_cast<long>(n) * C;
    float ss = 0;
    for (int t = 0; t < nt; ++t) ss += math::rms_sumsq_partial(xr, t, nt, C);
    rstd[n] = math::rms_rstd(ss, C, kRmsNormEps);
    for (int c = 0; c < C; ++c) out[static_cast<long>(n) * C + c] = math::rms_out(xr[c], w.b[c], rstd[n]);
    const bf16* gr = g.b.data() + static_cast<long>(n) * C;
    float dot = 0;
    for (int t = 0; t < nt; ++t) dot += math::rms_bwd_dot_partial(gr, w.b.data(), xr, t, nt, C);
    const float rr = drop_rstd_in_dx ? 1.0f : rstd[n];
    const float k = math::rms_bwd_k(dot, rr, C);
    for (int c = 0; c < C; ++c)
      add_to_bf16(dx[static_cast<long>(n) * C + c], math::rms_bwd_dx(gr[c], w.b[c], xr[c], rr, k));
  }
  for (int c = 0; c < C; ++c) add_to_bf16(dw[c], math::rms_bwd_dweight_col(g.b.data(), x.b.data(), rstd.data(), N, C, c));
  r.out = to_f(out);
  r.rstd = rstd;
  r.dx = to_f(dx);
  r.dw = to_f(dw);
  return r;
}

TEST(KernelMath, RmsNormForwardBackwardMatchReference) {
  std::mt19937 gen(2);
  const int N = 9, C = 300;   // C > 256: threads own several columns
  Data x = rand_data(static_cast<long>(N) * C, gen, -2, 2), w = rand_data(C, gen, 0.5, 1.5);
  Data g = rand_data(static_cast<long>(N) * C, gen), dx0 = rand_data(static_cast<long>(N) * C, gen),
       dw0 = rand_data(C, gen);
  RmsOut k = rms_emulated(x, w, g, dx0, dw0, N, C);
  std::vector<float> out(static_cast<size_t>(N) * C), rstd(N), dx = dx0.f, dw = dw0.f;
  rmsnorm_forward(out.data(), rstd.data(), x.f.data(), w.f.data(), N, C);
  rmsnorm_backward(dx.data(), dw.data(), g.f.data(), x.f.data(), w.f.data(), rstd.data(), N, C);
  EXPECT_LT(rel_err(k.rstd, rstd), 1e-5);   // fp32 throughout
  EXPECT_LT(rel_err(k.out, out), kOne);
  EXPECT_LT(rel_err(k.dx, dx), kFew);
  EXPECT_LT(rel_err(k.dw, dw), kFew);
  // A broken backward (rstd left out of the correction term) is far outside the tolerance.
  RmsOut bad = rms_emulated(x, w, g, dx0, dw0, N, C, true);
  EXPECT_GT(rel_err(bad.dx, dx), 10 * kFew);
}

// ---- rotary ----
std::vector<float> rope_table(int T, int HD) {   // what the runtime uploads: [T][HD/2][cos, sin]
  std::vector<float> cs;
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < HD / 2; ++i) {
      const double a = t * std::pow(kRopeTheta, -2.0 * i / HD);
      cs.push_back(static_cast<float>(std::cos(a)));
      cs.push_back(static_cast<float>(std::sin(a)));
    }
  return cs;
}

TEST(KernelMath, RotaryForwardBackwardMatchReference) {
  std::mt19937 g(3);
  const int B = 2, T = 13, H = 3, HD = 16, half = HD / 2;
  Data x = rand_data(static_cast<long>(B) * T * H * HD, g);
  const auto cs = rope_table(T, HD);
  for (int dir = 0; dir < 2; ++dir) {
    std::vector<bf16> k = x.b;
    for (long row = 0; row < static_cast<long>(B) * T * H; ++row) {
      const int t = static_cast<int>((row / H) % T);
      for (int i = 0; i < half; ++i)
        math::rope_pair(k.data() + row * HD, i, half, cs[(t * half + i) * 2], cs[(t * half + i) * 2 + 1],
                        dir == 0 ? 1.0f : -1.0f);
    }
    std::vector<float> ref = x.f;
    if (dir == 0) rotary_forward(ref.data(), B, T, H, HD);
    else rotary_backward(ref.data(), B, T, H, HD);
    EXPECT_LT(rel_err(to_f(k), ref), kOne) << "direction " << dir;
  }
}

// ---- attention: the kernels' tiling, emulated ----
constexpr int kRows = 64, kTile = 32, kKvRows = 32, kQTile = 16;   // as kernels.cu

template <int HD>
void load_rows(std::vector<float>& dst, const std::vector<bf16>& src, int b, int t0, int n, int h, int T, int H) {
  dst.assign(static_cast<size_t>(n) * HD, 0.0f);
  for (int j = 0; j < n; ++j)
    for (int d = 0; d < HD; ++d) dst[j * HD + d] = bf2f(src[((static_cast<long>(b) * T + t0 + j) * H + h) * HD + d]);
}

// mask_shift = 0: the kernel's causal tiles. mask_shift = 1 re-runs the forward with a mask that also
// lets each query see the next key (an off-by-one), for the test that shows the check catches it.
template <int HD>
void attn_fwd_emulated(std::vector<bf16>& out, std::vector<float>& lse, const Data& q, const Data& k, const Data& v,
                       int B, int T, int NH, int NKV, int mask_shift = 0) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  out.assign(static_cast<size_t>(B) * T * NH * HD, 0);
  lse.assign(static_cast<size_t>(B) * NH * T, 0);
  std::vector<float> Ks, Vs;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t0 = 0; t0 < T; t0 += kRows) {
        const int kvh = h / (NH / NKV);
        std::vector<math::AttnRow<HD>> st(kRows);
        for (auto& s : st) math::attn_row_init(s);
        const int kend = std::min(T, t0 + kRows + mask_shift);
        for (int k0 = 0; k0 < kend; k0 += kTile) {
          const int n = std::min(kTile, kend - k0);
          load_rows<HD>(Ks, k.b, b, k0, n, kvh, T, NKV);
          load_rows<HD>(Vs, v.b, b, k0, n, kvh, T, NKV);
          for (int r = 0; r < kRows && t0 + r < T; ++r) {
            const int t = t0 + r;
            float qr[HD];
            for (int d = 0; d < HD; ++d) qr[d] = q.f[((static_cast<long>(b) * T + t) * NH + h) * HD + d];
            math::attn_fwd_tile<HD, kTile>(qr, Ks.data(), Vs.data(), n, k0, std::min(T - 1, t + mask_shift), scale, st[r]);
          }
        }
        for (int r = 0; r < kRows && t0 + r < T; ++r) {
          const int t = t0 + r;
          math::attn_fwd_finish(st[r], out.data() + ((static_cast<long>(b) * T + t) * NH + h) * HD,
                                lse.data() + (static_cast<long>(b) * NH + h) * T + t);
        }
      }
}

template <int HD>
void attn_bwd_emulated(std::vector<bf16>& dq, std::vector<bf16>& dk, std::vector<bf16>& dv, const Data& dout,
                       const Data& q, const Data& k, const Data& v, const std::vector<bf16>& out,
                       const std::vector<float>& lse, int B, int T, int NH, int NKV) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const int group = NH / NKV;
  std::vector<float> D(static_cast<size_t>(B) * NH * T);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH; ++h) {
        const long row = (static_cast<long>(b) * T + t) * NH + h;
        float s = 0;
        for (int lane = 0; lane < 32; ++lane)
          s += math::attn_bwd_D_partial(dout.b.data() + row * HD, out.data() + row * HD, lane, 32, HD);
        D[(static_cast<long>(b) * NH + h) * T + t] = s;
      }
  dq.assign(q.b.size(), 0);
  dk.assign(k.b.size(), 0);
  dv.assign(v.b.size(), 0);
  std::vector<float> Qs, dOs, Ks, Vs;
  // dK/dV: blocks of kKvRows keys, Q/dO tiles of kQTile queries from the block's first key on.
  for (int b = 0; b < B; ++b)
    for (int kvh = 0; kvh < NKV; ++kvh)
      for (int u0 = 0; u0 < T; u0 += kKvRows) {
        const int nu = std::min(kKvRows, T - u0);
        std::vector<float> kr(static_cast<size_t>(nu) * HD), vr(kr.size()), dkr(kr.size(), 0.0f), dvr(kr.size(), 0.0f);
        load_rows<HD>(kr, k.b, b, u0, nu, kvh, T, NKV);
        load_rows<HD>(vr, v.b, b, u0, nu, kvh, T, NKV);
        for (int j = 0; j < group; ++j) {
          const int h = kvh * group + j;
          for (int q0 = u0; q0 < T; q0 += kQTile) {
            const int n = std::min(kQTile, T - q0);
            load_rows<HD>(Qs, q.b, b, q0, n, h, T, NH);
            load_rows<HD>(dOs, dout.b, b, q0, n, h, T, NH);
            const float* ls = lse.data() + (static_cast<long>(b) * NH + h) * T + q0;
            const float* Ds = D.data() + (static_cast<long>(b) * NH + h) * T + q0;
            for (int r = 0; r < nu; ++r)
              math::attn_bwd_kv_tile<HD>(kr.data() + r * HD, vr.data() + r * HD, u0 + r, Qs.data(), dOs.data(), ls, Ds,
                                         n, q0, scale, dkr.data() + r * HD, dvr.data() + r * HD);
          }
        }
        for (int r = 0; r < nu; ++r)
          for (int d = 0; d < HD; ++d) {
            dk[((static_cast<long>(b) * T + u0 + r) * NKV + kvh) * HD + d] = f2bf(dkr[r * HD + d]);
            dv[((static_cast<long>(b) * T + u0 + r) * NKV + kvh) * HD + d] = f2bf(dvr[r * HD + d]);
          }
      }
  // dQ: blocks of kRows queries, K/V tiles of kTile keys.
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t0 = 0; t0 < T; t0 += kRows) {
        const int kvh = h / group;
        const int nt = std::min(kRows, T - t0);
        std::vector<float> dqr(static_cast<size_t>(nt) * HD, 0.0f);
        const int kend = std::min(T, t0 + kRows);
        for (int k0 = 0; k0 < kend; k0 += kTile) {
          const int n = std::min(kTile, kend - k0);
          load_rows<HD>(Ks, k.b, b, k0, n, kvh, T, NKV);
          load_rows<HD>(Vs, v.b, b, k0, n, kvh, T, NKV);
          for (int r = 0; r < nt; ++r) {
            const int t = t0 + r;
            const long row = (static_cast<long>(b) * T + t) * NH + h;
            const long s = (static_cast<long>(b) * NH + h) * T + t;
            math::attn_bwd_q_tile<HD>(q.f.data() + row * HD, dout.f.data() + row * HD, lse[s], D[s], t, Ks.data(),
                                      Vs.data(), n, k0, scale, dqr.data() + r * HD);
          }
        }
        for (int r = 0; r < nt; ++r)
          for (int d = 0; d < HD; ++d) dq[((static_cast<long>(b) * T + t0 + r) * NH + h) * HD + d] = f2bf(dqr[r * HD + d]);
      }
}

template <int HD>
void check_attention(int B, int T, int NH, int NKV, unsigned seed) {
  std::mt19937 g(seed);
  const long nq = static_cast<long>(B) * T * NH * HD, nk = static_cast<long>(B) * T * NKV * HD;
  Data q = rand_data(nq, g, -2, 2), k = rand_data(nk, g, -2, 2), v = rand_data(nk, g), dout = rand_data(nq, g);
  std::vector<bf16> out;
  std::vector<float> lse;
  attn_fwd_emulated<HD>(out, lse, q, k, v, B, T, NH, NKV);
  std::vector<float> ref(nq), ref_lse(static_cast<size_t>(B) * NH * T);
  attention_forward(ref.data(), ref_lse.data(), q.f.data(), k.f.data(), v.f.data(), B, T, NH, NKV, HD);
  EXPECT_LT(rel_err(to_f(out), ref), kOne) << "HD " << HD << " T " << T;
  EXPECT_LT(rel_err(lse, ref_lse), 1e-5);
  // The reference backward reads the reference's out/lse; the kernels read their own (as they run).
  std::vector<bf16> dq, dk, dv;
  attn_bwd_emulated<HD>(dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV);
  std::vector<float> rdq(nq), rdk(nk), rdv(nk);
  attention_backward(rdq.data(), rdk.data(), rdv.data(), dout.f.data(), q.f.data(), k.f.data(), v.f.data(), ref.data(),
                     ref_lse.data(), B, T, NH, NKV, HD);
  // dS = P o (dP - D) uses D from the bf16 output: a second rounding on that path.
  EXPECT_LT(rel_err(to_f(dq), rdq), kFew) << "dq HD " << HD;
  EXPECT_LT(rel_err(to_f(dk), rdk), kFew) << "dk HD " << HD;
  EXPECT_LT(rel_err(to_f(dv), rdv), kOne) << "dv HD " << HD;
}

// T spans several query blocks and key tiles and is not a multiple of either; GQA groups of 2 and 4.
TEST(KernelMath, AttentionForwardBackwardMatchReferenceHd16) { check_attention<16>(2, 150, 4, 2, 4); }
TEST(KernelMath, AttentionForwardBackwardMatchReferenceHd32) { check_attention<32>(1, 97, 8, 2, 5); }
TEST(KernelMath, AttentionForwardBackwardMatchReferenceHd64) { check_attention<64>(1, 70, 2, 2, 6); }

TEST(KernelMath, AttentionWithAWrongCausalMaskFailsTheCheck) {
  std::mt19937 g(7);
  const int B = 1, T = 40, NH = 2, NKV = 1, HD = 16;
  const long nq = static_cast<long>(B) * T * NH * HD, nk = static_cast<long>(B) * T * NKV * HD;
  Data q = rand_data(nq, g, -2, 2), k = rand_data(nk, g, -2, 2), v = rand_data(nk, g);
  std::vector<bf16> out;
  std::vector<float> lse;
  attn_fwd_emulated<HD>(out, lse, q, k, v, B, T, NH, NKV, /*mask_shift=*/1);
  std::vector<float> ref(nq), ref_lse(static_cast<size_t>(B) * NH * T);
  attention_forward(ref.data(), ref_lse.data(), q.f.data(), k.f.data(), v.f.data(), B, T, NH, NKV, HD);
  EXPECT_GT(rel_err(to_f(out), ref), 4 * kOne);
}

// ---- SwiGLU ----
TEST(KernelMath, SwigluForwardBackwardMatchReference) {
  std::mt19937 g(8);
  const long N = 1000;
  Data gate = rand_data(N, g, -4, 4), up = rand_data(N, g, -2, 2), dh = rand_data(N, g);
  std::vector<bf16> act(N), h(N), dgate(N), dup(N);
  for (long i = 0; i < N; ++i) math::swiglu_fwd(act.data(), h.data(), gate.b.data(), up.b.data(), i);
  for (long i = 0; i < N; ++i) math::swiglu_bwd(dgate.data(), dup.data(), dh.b.data(), gate.b.data(), act.data(), up.b.data(), i);
  std::vector<float> ract(N), rh(N), rdgate(N), rdup(N);
  swiglu_forward(ract.data(), rh.data(), gate.f.data(), up.f.data(), N);
  swiglu_backward(rdgate.data(), rdup.data(), dh.f.data(), gate.f.data(), ract.data(), up.f.data(), N);
  EXPECT_LT(rel_err(to_f(act), ract), kOne);
  EXPECT_LT(rel_err(to_f(h), rh), kFew);
  EXPECT_LT(rel_err(to_f(dup), rdup), kFew);
  EXPECT_LT(rel_err(to_f(dgate), rdgate), kOne);
}

// ---- fused cross-entropy: per-row emulated block of 256 threads, tree merge as in ce_fwd_k ----
TEST(KernelMath, CrossEntropyForwardBackwardMatchReference) {
  std::mt19937 g(9);
  const int N = 6, V = 1000, nt = 256;
  Data logits = rand_data(static_cast<long>(N) * V, g, -8, 8);
  std::vector<std::int32_t> tgt(N);
  for (auto& t : tgt) t = static_cast<std::int32_t>(g() % V);
  std::vector<float> lse(N);
  double loss = 0;
  for (int n = 0; n < N; ++n) {
    std::vector<float> m(nt), s(nt);
    for (int t = 0; t < nt; ++t) math::lse_partial(logits.b.data() + static_cast<long>(n) * V, t, nt, V, m[t], s[t]);
    for (int w = nt / 2; w > 0; w /= 2)
      for (int t = 0; t < w; ++t) math::lse_merge(m[t], s[t], m[t + w], s[t + w]);
    lse[n] = m[0] + std::log(s[0]);
    loss += lse[n] - logits.f[static_cast<long>(n) * V + tgt[n]];
  }
  const float scale = 1.0f / N;
  std::vector<float> dl(static_cast<size_t>(N) * V);
  for (long i = 0; i < static_cast<long>(N) * V; ++i)
    dl[i] = bf2f(f2bf(math::ce_dlogit(logits.b[i], lse[i / V], static_cast<int>(i % V) == tgt[i / V], scale)));
  std::vector<float> logp(static_cast<size_t>(N) * V), rdl(logp.size());
  const double rloss = cross_entropy_forward(logp.data(), logits.f.data(), tgt.data(), N, V);
  cross_entropy_backward(rdl.data(), logp.data(), tgt.data(), N, V, scale);
  EXPECT_NEAR(loss, rloss, 1e-4 * std::fabs(rloss));   // fp32 throughout
  EXPECT_LT(rel_err(dl, rdl), kOne);
}

// ---- optimizer: the same fp32 operations as train/optimizer.cpp, so bitwise equal on the host ----
TEST(KernelMath, OptimizerStepsEqualTheReferenceBitwise) {
  std::mt19937 g(10);
  const long n = 500;
  Data p0 = rand_data(n, g), gr = rand_data(n, g);
  for (bool adam : {true, false}) {
    OptimizerConfig cfg;
    cfg.adamw = adam;
    std::vector<float> p = p0.f, st(static_cast<size_t>(n) * cfg.states(), 0.0f);
    std::vector<float> rp = p0.f, rst = st;
    for (int step = 1; step <= 3; ++step) {
      const double bc1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), step);
      const double bc2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), step);
      const float step_size = static_cast<float>(cfg.lr / bc1), bc2_sqrt = static_cast<float>(std::sqrt(bc2));
      for (long i = 0; i < n; ++i) {
        if (adam)
          math::adamw(p[i], gr.f[i], st[i], st[n + i], cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, step_size,
                      bc2_sqrt);
        else
          math::sgd_momentum(p[i], gr.f[i], st[i], cfg.lr, cfg.momentum, cfg.weight_decay, step == 1);
      }
      optimizer_step(cfg, rp.data(), gr.f.data(), rst.data(), n, step);
    }
    EXPECT_EQ(p, rp) << (adam ? "adamw" : "sgd");
    EXPECT_EQ(st, rst) << (adam ? "adamw" : "sgd");
  }
}

}  // namespace
}  // namespace fsdpsim::runtime::cuda

// Finite-difference gradient checks of the runtime's fp32 layers and of the whole transformer:
// the analytic backward must agree with central differences of the forward.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "runtime/layers/attention.h"
#include "runtime/layers/blas.h"
#include "runtime/layers/cross_entropy.h"
#include "runtime/layers/matmul.h"
#include "runtime/layers/rmsnorm.h"
#include "runtime/layers/rotary.h"
#include "runtime/layers/swiglu.h"
#include "runtime/train/reference_trainer.h"

using namespace fsdpsim::runtime;

namespace {

std::vector<float> randv(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

double dotd(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Checks that grad . dir equals (f(x + h dir) - f(x - h dir)) / 2h for a few random directions.
// f returns a double scalar of the float vector x. `five_point`: the fourth-order stencil
// (8 (f(h) - f(-h)) - (f(2h) - f(-2h))) / 12h instead, whose truncation error is small enough for an h
// at which an fp32 forward's rounding (it depends on the BLAS kernels the CPU gets) stays far below the
// tolerance.
void check_directional(std::vector<float>& x, const std::vector<float>& grad,
                       const std::function<double()>& f, double h, double rtol, const char* what,
                       double atol = 1e-3, bool five_point = false) {
  for (unsigned trial = 0; trial < 3; ++trial) {
    std::vector<float> dir = randv(x.size(), 100 + trial);
    const std::vector<float> x0 = x;
    const auto at = [&](double step) {
      for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] + static_cast<float>(step) * dir[i];
      return f();
    };
    const double fp = at(h), fm = at(-h);
    const double fd = five_point ? (8 * (fp - fm) - (at(2 * h) - at(-2 * h))) / (12 * h) : (fp - fm) / (2 * h);
    x = x0;
    const double an = dotd(grad, dir);
    EXPECT_NEAR(an, fd, std::max(atol, rtol * std::fabs(fd))) << what << " trial " << trial;
  }
}

class Layers : public ::testing::Test {
 protected:
  void SetUp() override { set_blas_threads(1); }
};

TEST_F(Layers, MatmulGradients) {
  const int N = 5, IC = 7, OC = 6;
  auto x = randv(N * IC, 1), w = randv(OC * IC, 2), b = randv(OC, 3), r = randv(N * OC, 4);
  auto f = [&] {
    std::vector<float> out(N * OC);
    matmul_forward(out.data(), x.data(), w.data(), b.data(), N, IC, OC);
    return dotd(out, r);
  };
  std::vector<float> dx(N * IC, 0), dw(OC * IC, 0), db(OC, 0);
  matmul_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, IC, OC);
  check_directional(x, dx, f, 1e-2, 1e-3, "dinp");
  check_directional(w, dw, f, 1e-2, 1e-3, "dweight");
  check_directional(b, db, f, 1e-2, 1e-3, "dbias");
  // Exact small case: [1,2] x [[3,4]]^T + 5 = 16.
  float xi[2] = {1, 2}, wi[2] = {3, 4}, bi[1] = {5}, o[1];
  matmul_forward(o, xi, wi, bi, 1, 2, 1);
  EXPECT_FLOAT_EQ(o[0], 16.0f);
}

TEST_F(Layers, RmsNormGradients) {
  const int N = 4, C = 9;
  auto x = randv(N * C, 5), w = randv(C, 6), r = randv(N * C, 7);
  auto f = [&] {
    std::vector<float> out(N * C);
    rmsnorm_forward(out.data(), nullptr, x.data(), w.data(), N, C);
    return dotd(out, r);
  };
  std::vector<float> dx(N * C, 0), dw(C, 0), rstd(N), out(N * C);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C);
  rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C);
  check_directional(x, dx, f, 1e-2, 2e-3, "dinp");
  check_directional(w, dw, f, 1e-2, 2e-3, "dweight");
  // Oracle: a row of all 2s normalizes to all 1s (up to eps) times the weight.
  float xs[3] = {2, 2, 2}, ws[3] = {1, 2, 3}, ys[3];
  rmsnorm_forward(ys, nullptr, xs, ws, 1, 3);
  EXPECT_NEAR(ys[1], 2.0f, 1e-5);
}

TEST_F(Layers, RotaryIsARotationAndBackwardIsItsTranspose) {
  const int B = 2, T = 5, H = 3, HD = 8;
  auto x = randv(B * T * H * HD, 8), r = randv(B * T * H * HD, 9);
  std::vector<float> y = x;
  rotary_forward(y.data(), B, T, H, HD);
  EXPECT_NEAR(dotd(y, y), dotd(x, x), 1e-4);              // norm preserved
  for (int i = 0; i < H * HD; ++i) EXPECT_EQ(y[i], x[i]);  // position 0: angle 0
  std::vector<float> g = r;
  rotary_backward(g.data(), B, T, H, HD);
  EXPECT_NEAR(dotd(y, r), dotd(x, g), 1e-4);               // <Rx, r> = <x, R^T r>
}

TEST_F(Layers, AttentionGradientsWithGqa) {
  const int B = 2, T = 6, NH = 4, NKV = 2, HD = 4;
  auto q = randv(B * T * NH * HD, 10), k = randv(B * T * NKV * HD, 11), v = randv(B * T * NKV * HD, 12);
  auto r = randv(B * T * NH * HD, 13);
  auto f = [&] {
    std::vector<float> out(B * T * NH * HD), lse(B * NH * T);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD);
    return dotd(out, r);
  };
  std::vector<float> out(B * T * NH * HD), lse(B * NH * T);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD);
  // Causality oracle: the first query attends only to the first key, so its output is v[0].
  for (int d = 0; d < HD; ++d) EXPECT_NEAR(out[d], v[d], 1e-6);
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                     B, T, NH, NKV, HD);
  check_directional(q, dq, f, 1e-2, 2e-3, "dq");
  check_directional(k, dk, f, 1e-2, 2e-3, "dk");
  check_directional(v, dv, f, 1e-2, 2e-3, "dv");
}

TEST_F(Layers, SwigluGradients) {
  const long N = 20;
  auto gate = randv(N, 14, 3.0f), up = randv(N, 15), r = randv(N, 16);
  auto f = [&] {
    std::vector<float> h(N);
    swiglu_forward(nullptr, h.data(), gate.data(), up.data(), N);
    return dotd(h, r);
  };
  std::vector<float> dg(N), du(N), act(N), h(N);
  swiglu_forward(act.data(), h.data(), gate.data(), up.data(), N);
  swiglu_backward(dg.data(), du.data(), r.data(), gate.data(), act.data(), up.data(), N);
  check_directional(gate, dg, f, 1e-2, 2e-3, "dgate");
  check_directional(up, du, f, 1e-2, 2e-3, "dup");
}

TEST_F(Layers, CrossEntropyValueAndGradient) {
  // Uniform logits: loss = ln V exactly, gradient = 1/V - onehot.
  const int V = 8;
  std::vector<float> logits(V, 0.5f), logp(V), d(V);
  std::int32_t tgt = 3;
  const double l = cross_entropy_forward(logp.data(), logits.data(), &tgt, 1, V);
  EXPECT_NEAR(l, std::log(8.0), 1e-6);
  cross_entropy_backward(d.data(), logp.data(), &tgt, 1, V, 1.0f);
  EXPECT_NEAR(d[3], 1.0f / 8 - 1, 1e-6);
  EXPECT_NEAR(d[0], 1.0f / 8, 1e-6);
  const int N = 3, V2 = 11;
  auto x = randv(N * V2, 17, 2.0f);
  std::vector<std::int32_t> t = {1, 10, 4};
  std::vector<float> lp(N * V2);
  auto f = [&] { return cross_entropy_forward(lp.data(), x.data(), t.data(), N, V2); };
  std::vector<float> dx(N * V2);
  f();
  cross_entropy_backward(dx.data(), lp.data(), t.data(), N, V2, 1.0f);
  check_directional(x, dx, f, 1e-2, 2e-3, "dlogits");
}

// The whole transformer (embedding, 2 blocks with biases and GQA, norm, head, loss): the
// reference trainer's gradient of every tensor against central differences of its loss.
void check_model(bool tied) {
  Dims d;
  d.B = 2; d.T = 5; d.C = 16; d.NH = 4; d.NKV = 2; d.HD = 4; d.F = 24; d.V = 11; d.L = 2;
  d.qkv_bias = true; d.out_bias = true; d.mlp_bias = true; d.tied = tied;
  ReferenceTrainer ref(d, 7, OptimizerConfig{});
  // Larger weights than the 0.02 init so every path carries a measurable gradient.
  for (auto& p : ref.mutable_params()) p *= 4.0f;
  TokenBatch batch = make_batch(3, {0, 1}, d.T, d.V);
  ref.forward_backward(batch, true);
  const std::vector<float> grads = ref.grads();
  const auto& ts = ref.tensors();
  for (size_t t = 0; t < ts.size(); ++t) {
    const std::int64_t off = ref.offset(static_cast<int>(t)), n = ts[t].numel();
    std::vector<float> g(grads.begin() + off, grads.begin() + off + n);
    std::vector<float> x(ref.params().begin() + off, ref.params().begin() + off + n);
    auto f = [&] {
      std::copy(x.begin(), x.end(), ref.mutable_params().begin() + off);
      return ref.loss(batch) * static_cast<double>(d.B * d.T);   // summed loss: larger signal
    };
    std::vector<float> gs = g;
    for (auto& v : gs) v *= static_cast<float>(d.B * d.T);
    // fp32 forward: the summed loss carries ~1e-6 of rounding, hence the absolute floor.
    check_directional(x, gs, f, 2e-3, 2e-2, ts[t].name.c_str(), 2e-3, /*five_point=*/true);
    std::copy(x.begin(), x.end(), ref.mutable_params().begin() + off);
  }
}

TEST_F(Layers, TransformerGradientsUntied) { check_model(false); }
TEST_F(Layers, TransformerGradientsTied) { check_model(true); }

}  // namespace

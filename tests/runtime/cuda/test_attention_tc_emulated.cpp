// The tensor-core attention kernels (runtime/cuda/attention_tc_kernels.cuh, the source nvcc builds)
// run on the CPU through cuda_emu.h, against runtime/layers' fp32 attention, no GPU needed. This
// checks what the emulator can: the tiling, the causal and tail masks (T not a multiple of the
// tiles, T = 1, T an exact multiple), GQA, the online softmax, the element map of the accumulators
// (the emulator's fragment layout is scrambled), the shared-memory plans (alignment, bounds, no read
// of an unwritten byte: shared memory starts as NaN) and every output element written (outputs start
// as NaN too). Tolerances as test_cuda_gpu.cpp's attention cases. What it cannot check: the
// hardware's fragment layout (the GPU test does), speed, and the GPU's weaker memory ordering.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda_emu.h"   // before the kernels: the CUDA names they use
#include "runtime/cuda/attention_tc_kernels.cuh"
#include "runtime/layers/attention.h"
#include "bf16_test_data.h"

namespace fsdpsim::runtime::cuda {
namespace {

using test_data::Data;
using test_data::rand_data;
using test_data::rel_err;
using test_data::to_f;

constexpr double kOne = 1.0 / 256, kFew = 1.0 / 128;   // as test_cuda_gpu.cpp
constexpr bf16 kNanBf16 = 0xFFFF;

struct EmuLaunch {
  template <class... KArgs, class... Args>
  void operator()(void (*kernel)(KArgs...), long blocks, int threads, std::size_t smem, Args... args) const {
    fsdpsim_emu::launch(kernel, blocks, threads, smem, args...);
  }
};


template <int HD>
void check(int B, int T, int NH, int NKV, unsigned seed) {
  std::mt19937 g(seed);
  const long nq = static_cast<long>(B) * T * NH * HD, nk = static_cast<long>(B) * T * NKV * HD;
  const long nl = static_cast<long>(B) * NH * T;
  Data q = rand_data(nq, g, -2, 2), k = rand_data(nk, g, -2, 2), v = rand_data(nk, g, -1, 1),
       dout = rand_data(nq, g, -1, 1);
  std::vector<bf16> out(nq, kNanBf16), dq(nq, kNanBf16), dk(nk, kNanBf16), dv(nk, kNanBf16);
  std::vector<float> lse(nl, NAN), D(nl, NAN);
  tc::forward_run<HD>(EmuLaunch{}, out.data(), lse.data(), q.b.data(), k.b.data(), v.b.data(), B, T, NH, NKV);
  tc::backward_run<HD>(EmuLaunch{}, dq.data(), dk.data(), dv.data(), D.data(), dout.b.data(), q.b.data(), k.b.data(),
                       v.b.data(), out.data(), lse.data(), B, T, NH, NKV);

  std::vector<float> ro(nq), rl(nl), rq(nq), rk(nk), rv(nk);
  runtime::attention_forward(ro.data(), rl.data(), q.f.data(), k.f.data(), v.f.data(), B, T, NH, NKV, HD);
  runtime::attention_backward(rq.data(), rk.data(), rv.data(), dout.f.data(), q.f.data(), k.f.data(), v.f.data(),
                              ro.data(), rl.data(), B, T, NH, NKV, HD);
  const std::string shape = "B " + std::to_string(B) + " T " + std::to_string(T) + " NH " + std::to_string(NH) +
                            " NKV " + std::to_string(NKV) + " HD " + std::to_string(HD);
  EXPECT_LT(rel_err(to_f(out), ro), kOne) << "out, " << shape;
  EXPECT_LT(rel_err(lse, rl), 1e-5) << "lse, " << shape;
  EXPECT_LT(rel_err(to_f(dq), rq), kFew) << "dq, " << shape;
  EXPECT_LT(rel_err(to_f(dk), rk), kFew) << "dk, " << shape;
  EXPECT_LT(rel_err(to_f(dv), rv), kOne) << "dv, " << shape;
}

// T crosses tiles and ends mid-tile; GQA groups of 1, 2 and 4; B = 2; T = 1; T a whole tile.
TEST(AttentionTcEmulated, Hd64MatchesReference) {
  check<64>(2, 70, 4, 2, 11);
  check<64>(1, 1, 2, 1, 12);
}
TEST(AttentionTcEmulated, Hd128MatchesReference) {
  check<128>(1, 100, 4, 1, 13);
  check<128>(1, 64, 2, 2, 14);
}

// The check can fail: a kernel reading the wrong key (here: the inputs it sees have the first key
// row of every kv head replaced) is far outside the tolerance.
TEST(AttentionTcEmulated, AWrongKeyFailsTheCheck) {
  const int B = 1, T = 70, NH = 2, NKV = 1, HD = 64;
  std::mt19937 g(15);
  const long nq = static_cast<long>(B) * T * NH * HD, nk = static_cast<long>(B) * T * NKV * HD;
  Data q = rand_data(nq, g, -2, 2), k = rand_data(nk, g, -2, 2), v = rand_data(nk, g, -1, 1);
  std::vector<bf16> vb = v.b;
  for (int d = 0; d < HD; ++d) vb[d] = f2bf(-bf2f(vb[d]));   // key 0's value row negated
  std::vector<bf16> out(nq, kNanBf16);
  std::vector<float> lse(static_cast<size_t>(B) * NH * T, NAN);
  tc::forward_run<HD>(EmuLaunch{}, out.data(), lse.data(), q.b.data(), k.b.data(), vb.data(), B, T, NH, NKV);
  std::vector<float> ro(nq), rl(lse.size());
  runtime::attention_forward(ro.data(), rl.data(), q.f.data(), k.f.data(), v.f.data(), B, T, NH, NKV, HD);
  EXPECT_GT(rel_err(to_f(out), ro), 4 * kOne);
}

}  // namespace
}  // namespace fsdpsim::runtime::cuda

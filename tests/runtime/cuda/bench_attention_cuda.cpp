// Times the CUDA runtime's attention (kernels.h attention_forward / attention_backward) with both
// kernel sets: FSDPSIM_CUDA_ATTENTION=simple (CUDA cores) and tc (tensor cores, attention_tc.h), on
// llama3-8b-like shapes. CUDA events around each call on one stream: 3 warm-ups, then the median of
// 10 timed calls. FLOPs as the simulator counts causal attention: forward 4 B T^2 NH HD / 2 (QK^T
// and PV, half the scores), backward 2.5 times that. Also prints how far the two paths' outputs are
// apart (max |tc - simple| / max |simple|), as a sanity check. Exits 0 with "no CUDA device" when
// there is none.
//   usage: bench_attention_cuda            (no arguments)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <vector>

#include "runtime/cuda/attention_tc.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernel_math.cuh"
#include "runtime/cuda/kernels.h"

namespace {

using fsdpsim::runtime::cuda::bf16;
using fsdpsim::runtime::cuda::bf2f;
using fsdpsim::runtime::cuda::f2bf;

struct Shape {
  int B, T, NH, NKV, HD;
};

template <class T>
struct Buf {
  T* p = nullptr;
  long n = 0;
  explicit Buf(long count) : n(count) { FSDPSIM_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(T))); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  std::vector<T> get() const {
    std::vector<T> h(n);
    FSDPSIM_CUDA_CHECK(cudaMemcpy(h.data(), p, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

void fill_random(Buf<bf16>& b, std::mt19937& g, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<bf16> h(b.n);
  for (auto& x : h) x = f2bf(u(g));
  FSDPSIM_CUDA_CHECK(cudaMemcpy(b.p, h.data(), h.size() * sizeof(bf16), cudaMemcpyHostToDevice));
}

// Median milliseconds of 10 calls of f after 3 warm-ups, each call timed alone with events on s.
template <class F>
double median_ms(F&& f, cudaStream_t s) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  FSDPSIM_CUDA_CHECK(cudaEventCreate(&a));
  FSDPSIM_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    FSDPSIM_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    FSDPSIM_CUDA_CHECK(cudaEventRecord(b, s));
    FSDPSIM_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    FSDPSIM_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  FSDPSIM_CUDA_CHECK(cudaEventDestroy(a));
  FSDPSIM_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return 0.5 * (ms[4] + ms[5]);
}

template <class T>
double rel_diff(const std::vector<T>& got, const std::vector<T>& ref) {
  auto f = [](T x) {
    if constexpr (sizeof(T) == 2) return static_cast<double>(bf2f(x));
    else return static_cast<double>(x);
  };
  double e = 0, m = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(f(got[i]))) return INFINITY;
    e = std::max(e, std::fabs(f(got[i]) - f(ref[i])));
    m = std::max(m, std::fabs(f(ref[i])));
  }
  return m > 0 ? e / m : e;
}

void bench(const Shape& sh, cudaStream_t s) {
  using namespace fsdpsim::runtime::cuda;
  const long nq = static_cast<long>(sh.B) * sh.T * sh.NH * sh.HD, nk = static_cast<long>(sh.B) * sh.T * sh.NKV * sh.HD;
  const long nl = static_cast<long>(sh.B) * sh.NH * sh.T;
  std::mt19937 g(1);
  Buf<bf16> q(nq), k(nk), v(nk), dout(nq), out(nq), dq(nq), dk(nk), dv(nk);
  Buf<float> lse(nl), D(nl);
  fill_random(q, g, -2, 2);
  fill_random(k, g, -2, 2);
  fill_random(v, g, -1, 1);
  fill_random(dout, g, -1, 1);
  const double fwd_flop = 4.0 * sh.B * static_cast<double>(sh.T) * sh.T * sh.NH * sh.HD / 2, bwd_flop = 2.5 * fwd_flop;
  auto fwd = [&] { attention_forward(out.p, lse.p, q.p, k.p, v.p, sh.B, sh.T, sh.NH, sh.NKV, sh.HD, s); };
  auto bwd = [&] {
    attention_backward(dq.p, dk.p, dv.p, D.p, dout.p, q.p, k.p, v.p, out.p, lse.p, sh.B, sh.T, sh.NH, sh.NKV, sh.HD, s);
  };
  std::vector<bf16> ref_out, ref_dq, ref_dk, ref_dv;
  double simple_ms[2] = {0, 0};
  for (const char* path : {"simple", "tc"}) {
    setenv("FSDPSIM_CUDA_ATTENTION", path, 1);
    const double f_ms = median_ms(fwd, s);   // the last call leaves out/lse for the backward
    const double b_ms = median_ms(bwd, s);
    FSDPSIM_CUDA_CHECK(cudaStreamSynchronize(s));
    std::printf("B=%d T=%d NH=%d NKV=%d HD=%d  %-6s  forward %9.3f ms %7.1f TFLOP/s   backward %9.3f ms %7.1f TFLOP/s",
                sh.B, sh.T, sh.NH, sh.NKV, sh.HD, path, f_ms, fwd_flop / f_ms * 1e-9, b_ms, bwd_flop / b_ms * 1e-9);
    if (path[0] == 's') {
      simple_ms[0] = f_ms;
      simple_ms[1] = b_ms;
      ref_out = out.get();
      ref_dq = dq.get();
      ref_dk = dk.get();
      ref_dv = dv.get();
      std::printf("\n");
    } else {
      std::printf("   speedup x%.1f / x%.1f; vs simple: out %.2e dq %.2e dk %.2e dv %.2e\n", simple_ms[0] / f_ms,
                  simple_ms[1] / b_ms, rel_diff(out.get(), ref_out), rel_diff(dq.get(), ref_dq),
                  rel_diff(dk.get(), ref_dk), rel_diff(dv.get(), ref_dv));
    }
    std::fflush(stdout);
  }
  unsetenv("FSDPSIM_CUDA_ATTENTION");
}

}  // namespace

int main() {
  const std::string why = fsdpsim::runtime::cuda::no_device_reason();
  if (!why.empty()) {
    std::printf("no CUDA device (%s): nothing to time\n", why.c_str());
    return 0;
  }
  try {
    cudaDeviceProp prop{};
    FSDPSIM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s (sm_%d%d), CUDA events, median of 10 after 3 warm-ups\n", prop.name, prop.major,
                prop.minor);
    cudaStream_t s;
    FSDPSIM_CUDA_CHECK(cudaStreamCreate(&s));
    for (const Shape& sh : {Shape{1, 2048, 32, 8, 128}, Shape{1, 4096, 32, 8, 128}, Shape{1, 2048, 32, 8, 64}})
      bench(sh, s);
    FSDPSIM_CUDA_CHECK(cudaStreamDestroy(s));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}

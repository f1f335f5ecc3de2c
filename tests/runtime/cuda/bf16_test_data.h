// Test data shared by the CUDA suites (test_kernel_math.cu, test_cuda_gpu.cpp,
// test_attention_tc_emulated.cpp): random inputs rounded to bf16 with their exact fp32 values (so a
// reference computed in fp32 sees the very inputs the kernel saw), and the error measure the
// tolerances are stated in. Include after the CUDA headers (it needs kernel_math.cuh's bf16 helpers;
// C++17: nvcc compiles test_kernel_math.cu with it).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include "runtime/cuda/kernel_math.cuh"

namespace fsdpsim::runtime::cuda::test_data {

struct Data {
  std::vector<bf16> b;     // bf16 bits (the kernel's input)
  std::vector<float> f;    // the same values as fp32 (the reference's input)
};

inline Data rand_data(long n, std::mt19937& g, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  Data d;
  d.b.reserve(static_cast<std::size_t>(n));
  d.f.reserve(static_cast<std::size_t>(n));
  for (long i = 0; i < n; ++i) {
    const bf16 h = f2bf(u(g));
    d.b.push_back(h);
    d.f.push_back(bf2f(h));
  }
  return d;
}

inline std::vector<float> to_f(const std::vector<bf16>& b) {
  std::vector<float> f;
  f.reserve(b.size());
  for (bf16 h : b) f.push_back(bf2f(h));
  return f;
}

// max|got - ref| / max|ref| (max|got - ref| when ref is all zero); infinite when got holds a NaN or
// an infinity, so an element a kernel never wrote (outputs start as NaN in the tests that check this)
// or a numerical blow-up fails any tolerance instead of being skipped by the max.
inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double e = 0, m = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    e = std::max(e, std::fabs(static_cast<double>(got[i]) - ref[i]));
    m = std::max(m, std::fabs(static_cast<double>(ref[i])));
  }
  return m > 0 ? e / m : e;
}

}  // namespace fsdpsim::runtime::cuda::test_data

// A small CUDA-on-CPU emulator: just what runtime/cuda/attention_tc_kernels.cuh uses, so that its
// kernels (the very source nvcc compiles) run on the host in a test without a GPU.
//  * A block is blockDim.x std::threads; __syncthreads is a std::barrier of the block, and the
//    warp-collective operations (__syncwarp, __shfl_xor_sync, wmma::mma_sync) a barrier of the
//    warp's 32 threads. A thread that returns drops out of both (as an exited CUDA thread does).
//    Blocks run one after another.
//  * Dynamic shared memory is one buffer per block, filled with 0xFF bytes first: NaN as fp32 and
//    as bf16, so a kernel that reads shared memory it never wrote poisons its result.
//  * wmma fragments hold 8 elements per lane, spread over the lanes in a scrambled order (a
//    different one per matrix kind, none the hardware's), so a kernel that assumes a layout fails;
//    the loads and stores check wmma's rules (32-byte aligned pointer, ldm a multiple of 16 bytes,
//    the whole 16x16 tile inside the block's shared memory) and abort with a message otherwise.
//    mma_sync multiplies bf16 exactly and accumulates in fp32 over k = 0..15.
// Memory ordering between threads is the host's (stronger than the GPU's), so the emulator finds a
// missing barrier only when the interleaving exposes it: a missing __syncthreads usually does, and
// store_matrix_sync delays a quarter of the lanes so that a missing __syncwarp after it does too.
#pragma once
#define FSDPSIM_CUDA_EMU 1

#include <math.h>

#include <barrier>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <thread>
#include <type_traits>
#include <vector>

struct __nv_bfloat16 {
  std::uint16_t bits;
};
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

namespace fsdpsim_emu {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

struct Warp {
  std::barrier<> bar{32};
  float a[256], b[256], c[256];   // mma_sync's operands, gathered from the lanes
  float shfl[32];
};

struct Block {
  explicit Block(int threads, std::size_t smem_bytes)
      : bar(threads),
        smem(static_cast<unsigned char*>(::operator new[](smem_bytes ? smem_bytes : 1, std::align_val_t{128}))),
        bytes(smem_bytes) {
    std::memset(smem, 0xFF, bytes);
    for (int w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<Warp>());
  }
  ~Block() { ::operator delete[](smem, std::align_val_t{128}); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  std::barrier<> bar;
  std::vector<std::unique_ptr<Warp>> warps;
  unsigned char* smem;   // the dynamic shared memory, 128-byte aligned as the CUDA kernels declare it
  std::size_t bytes;
};

inline thread_local Dim3 tl_thread_idx, tl_block_idx, tl_block_dim;
inline thread_local Block* tl_block = nullptr;

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s (block %u, thread %u)\n", what, tl_block_idx.x, tl_thread_idx.x);
  std::abort();
}
inline unsigned char* dynamic_smem() { return tl_block->smem; }
inline Warp& warp() { return *tl_block->warps[tl_thread_idx.x / 32]; }
inline int lane() { return static_cast<int>(tl_thread_idx.x % 32); }

// Runs kernel over a 1-D grid of `blocks` blocks of `threads` threads.
template <class... KArgs, class... Args>
void launch(void (*kernel)(KArgs...), long blocks, int threads, std::size_t smem_bytes, Args... args) {
  if (threads % 32 != 0) fail("launch: blockDim.x is not a whole number of warps");
  for (long bid = 0; bid < blocks; ++bid) {
    Block blk(threads, smem_bytes);
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        tl_thread_idx = Dim3{static_cast<unsigned>(t), 0, 0};
        tl_block_idx = Dim3{static_cast<unsigned>(bid), 0, 0};
        tl_block_dim = Dim3{static_cast<unsigned>(threads), 1, 1};
        tl_block = &blk;
        kernel(args...);
        blk.warps[t / 32]->bar.arrive_and_drop();
        blk.bar.arrive_and_drop();
      });
    for (auto& th : pool) th.join();
  }
}

}  // namespace fsdpsim_emu

#define threadIdx (::fsdpsim_emu::tl_thread_idx)
#define blockIdx (::fsdpsim_emu::tl_block_idx)
#define blockDim (::fsdpsim_emu::tl_block_dim)

inline void __syncthreads() { ::fsdpsim_emu::tl_block->bar.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::fsdpsim_emu::warp().bar.arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  auto& w = ::fsdpsim_emu::warp();
  const int l = ::fsdpsim_emu::lane();
  w.shfl[l] = v;
  w.bar.arrive_and_wait();
  const float r = w.shfl[l ^ lane_mask];
  w.bar.arrive_and_wait();
  return r;
}

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "cuda_emu: 16x16x16 fragments only");
  static constexpr int num_elements = 8;
  T x[num_elements];
};

namespace detail {
// Matrix position (16 r + c) of element e of lane l: an odd multiplier makes it a bijection of 0..255.
template <class Use>
int pos(int l, int e) {
  constexpr int mul = std::is_same_v<Use, matrix_a> ? 45 : std::is_same_v<Use, matrix_b> ? 29 : 77;
  constexpr int add = std::is_same_v<Use, matrix_a> ? 3 : std::is_same_v<Use, matrix_b> ? 101 : 13;
  return ((l * 8 + e) * mul + add) & 255;
}
inline float to_f(__nv_bfloat16 h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <class T>
void check(const T* p, unsigned ldm) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0) ::fsdpsim_emu::fail("wmma: pointer not 32-byte aligned");
  if ((ldm * sizeof(T)) % 16 != 0) ::fsdpsim_emu::fail("wmma: ldm not a multiple of 16 bytes");
  const auto* lo = reinterpret_cast<const unsigned char*>(p);
  const auto* hi = reinterpret_cast<const unsigned char*>(p + 15 * static_cast<std::size_t>(ldm) + 16);
  const unsigned char* s = ::fsdpsim_emu::dynamic_smem();
  if (lo < s || hi > s + ::fsdpsim_emu::tl_block->bytes) ::fsdpsim_emu::fail("wmma: tile outside the shared memory");
}
}  // namespace detail

// matrix_a: element (r, c) of A; matrix_b: element (k = r, n = c) of B. row_major: at p[r*ldm + c].
template <class Use, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout>& f, const __nv_bfloat16* p, unsigned ldm) {
  detail::check(p, ldm);
  for (int e = 0; e < 8; ++e) {
    const int i = detail::pos<Use>(::fsdpsim_emu::lane(), e), r = i / 16, c = i % 16;
    f.x[e] = std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[c * ldm + r];
  }
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t layout) {
  detail::check(p, ldm);
  for (int e = 0; e < 8; ++e) {
    const int i = detail::pos<accumulator>(::fsdpsim_emu::lane(), e), r = i / 16, c = i % 16;
    f.x[e] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  detail::check(p, ldm);
  // A quarter of the lanes store late: a read of the tile by another lane without a __syncwarp in
  // between then sees the old contents.
  if (::fsdpsim_emu::lane() % 4 == 3) std::this_thread::sleep_for(std::chrono::microseconds(200));
  for (int e = 0; e < 8; ++e) {
    const int i = detail::pos<accumulator>(::fsdpsim_emu::lane(), e), r = i / 16, c = i % 16;
    (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
  }
}
template <class Use, class T, class Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, T v) {
  for (auto& x : f.x) x = v;
}
template <class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  auto& w = ::fsdpsim_emu::warp();
  const int l = ::fsdpsim_emu::lane();
  for (int e = 0; e < 8; ++e) {
    w.a[detail::pos<matrix_a>(l, e)] = detail::to_f(a.x[e]);
    w.b[detail::pos<matrix_b>(l, e)] = detail::to_f(b.x[e]);
    w.c[detail::pos<accumulator>(l, e)] = c.x[e];
  }
  w.bar.arrive_and_wait();
  float res[8];
  for (int e = 0; e < 8; ++e) {
    const int i = detail::pos<accumulator>(l, e), r = i / 16, cc = i % 16;
    float s = w.c[i];
    for (int k = 0; k < 16; ++k) s += w.a[r * 16 + k] * w.b[k * 16 + cc];
    res[e] = s;
  }
  w.bar.arrive_and_wait();
  for (int e = 0; e < 8; ++e) d.x[e] = res[e];
}

}  // namespace nvcuda::wmma

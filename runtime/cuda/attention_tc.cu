// Launchers of the tensor-core attention kernels (attention_tc.h; kernels: attention_tc_kernels.cuh).
#include "runtime/cuda/attention_tc.h"

#include <climits>
#include <cstdlib>
#include <string>

#include "common/errors.h"
#include "runtime/cuda/attention_tc_kernels.cuh"
#include "runtime/cuda/cuda_check.h"

namespace fsdpsim::runtime::cuda {
namespace {

// tc::forward_run / backward_run's launcher: a 1-D grid on stream s, with the dynamic shared memory
// opted in (the plans use up to ~87 KiB: above the 48 KiB default, within sm_80's 163 KiB and sm_90's
// 227 KiB), every launch checked.
struct StreamLaunch {
  cudaStream_t s;
  const char* what;
  template <class... KArgs, class... Args>
  void operator()(void (*kernel)(KArgs...), long blocks, int threads, std::size_t smem, Args... args) const {
    if (blocks < 1 || blocks > INT_MAX)
      ::fsdpsim::check_failed(what, __FILE__, __LINE__, "grid of " + std::to_string(blocks) + " blocks (shape too large)");
    if (smem > 48 * 1024)
      FSDPSIM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<static_cast<unsigned>(blocks), threads, smem, s>>>(args...);
    FSDPSIM_LAUNCH_CHECK();
  }
};

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

void require(int HD, std::initializer_list<const void*> tensors, const char* what) {
  if (!attention_tc_supports_head_dim(HD))
    ::fsdpsim::check_failed(what, __FILE__, __LINE__, "head_dim " + std::to_string(HD) + " has no tensor-core kernel (64, 128)");
  for (const void* p : tensors)
    if (!aligned16(p)) ::fsdpsim::check_failed(what, __FILE__, __LINE__, "a tensor is not 16-byte aligned");
}

}  // namespace

bool attention_tc_supports_head_dim(int HD) { return HD == 64 || HD == 128; }

bool attention_tc_requested() {
  const char* e = std::getenv("FSDPSIM_CUDA_ATTENTION");
  if (!e || std::string(e).empty() || std::string(e) == "tc") return true;
  if (std::string(e) == "simple") return false;
  throw InputError("FSDPSIM_CUDA_ATTENTION", "\"" + std::string(e) + "\"",
                   "\"tc\" (tensor cores, the default) or \"simple\" (the CUDA-core kernels)");
}

bool attention_tc_selected(int HD, std::initializer_list<const void*> tensors) {
  if (!attention_tc_requested() || !attention_tc_supports_head_dim(HD)) return false;
  for (const void* p : tensors)
    if (!aligned16(p)) return false;
  return true;
}

void attention_forward_tc(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int NH,
                          int NKV, int HD, cudaStream_t s) {
  require(HD, {out, q, k, v}, "attention_forward_tc");
  if (static_cast<long>(B) * T * NH == 0) return;
  const StreamLaunch launch{s, "attention_forward_tc"};
  if (HD == 64) tc::forward_run<64>(launch, out, lse, q, k, v, B, T, NH, NKV);
  else tc::forward_run<128>(launch, out, lse, q, k, v, B, T, NH, NKV);
}

void attention_backward_tc(bf16* dq, bf16* dk, bf16* dv, float* D, const bf16* dout, const bf16* q, const bf16* k,
                           const bf16* v, const bf16* out, const float* lse, int B, int T, int NH, int NKV, int HD,
                           cudaStream_t s) {
  require(HD, {dq, dk, dv, dout, q, k, v, out}, "attention_backward_tc");
  if (static_cast<long>(B) * T * NH == 0) return;
  const StreamLaunch launch{s, "attention_backward_tc"};
  if (HD == 64) tc::backward_run<64>(launch, dq, dk, dv, D, dout, q, k, v, out, lse, B, T, NH, NKV);
  else tc::backward_run<128>(launch, dq, dk, dv, D, dout, q, k, v, out, lse, B, T, NH, NKV);
}

}  // namespace fsdpsim::runtime::cuda

#include "runtime/cuda/cuda_check.h"

#include <unistd.h>

#include <atomic>
#include <stdexcept>

namespace fsdpsim::runtime::cuda {

namespace {
std::atomic<int> g_rank{-1};
}

void set_error_rank(int rank) { g_rank = rank; }

std::string error_where() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '?';
  return std::string("host ") + host + ", rank " + std::to_string(g_rank.load());
}

void cuda_fail(const char* call, const char* file, int line, const std::string& what) {
  throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + " on " +
                           error_where() + ": " + what);
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  if (n == 0) return "0 CUDA devices";
  return "";
}

}  // namespace fsdpsim::runtime::cuda

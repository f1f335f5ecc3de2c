// One NCCL collective as the harness sees it (nccl-tests' struct testColl): element counts for a
// size S, an exactly checkable input, the check, and the in-place run. bf16 buffers, as FSDP's
// all-gather and reduce-scatter run in param_dtype / reduce_dtype bf16. Inputs are 0/1 so every
// sum over up to 256 ranks is exact in bf16. One file per collective (nccl_all_gather.cpp, ...).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "calibrate/cuda/cuda_check.h"
#include "calibrate/hardware_profile.h"

namespace fsdpsim::calibrate::cuda {

using Bf16Bits = std::uint16_t;   // host-side bf16: the top 16 bits of an fp32
inline Bf16Bits to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<Bf16Bits>(u >> 16);   // exact for the small integers used here
}
inline float from_bf16(Bf16Bits b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float input_value(int rank, std::size_t i) { return static_cast<float>((static_cast<std::size_t>(rank) + i) % 2); }
inline float summed_value(int n, std::size_t i) {
  int ones = 0;
  for (int r = 0; r < n; ++r) ones += static_cast<int>(input_value(r, i));
  return static_cast<float>(ones);
}

struct NcclCollective {
  const char* name;   // "ncclAllGather"
  CollectiveOp op;
  std::size_t (*count)(std::size_t total_elems, int n);
  std::size_t (*buffer_elems)(std::size_t count, int n);
  void (*init)(std::vector<Bf16Bits>& host, std::size_t count, int rank, int n);
  std::size_t (*check)(const std::vector<Bf16Bits>& host, std::size_t count, int rank, int n);
  void (*run)(void* buf, std::size_t count, int rank, ncclComm_t comm, cudaStream_t stream);
};

const NcclCollective& nccl_all_gather();
const NcclCollective& nccl_reduce_scatter();
const NcclCollective& nccl_all_reduce();

}  // namespace fsdpsim::calibrate::cuda

// One rank of the bundled FSDP runtime on the CUDA backend: the CUDA counterpart of
// runtime/cpu/rank_runner.h. It lowers the plan to the StepProgram the simulator executes, places
// its buffers with the caching-allocator model in one cudaMalloc'd region (cuda_device_memory.h),
// and executes it on CUDA streams (cuda_stream_executor.h) with real data and mixed precision as the
// plan says (fsdp-semantics.md M6/M9, F2.2, F2.9, F1.10-F1.12):
//  * sharded parameters, their gradients and the optimizer states in fp32 (master_weights_dtype);
//  * unsharded parameters, activations and unsharded gradients in bf16 (param_dtype): the all-gather
//    runs in bf16 after the program's cast;
//  * gradient reduction in reduce_dtype (fp32 or bf16), accumulated into the fp32 sharded grad;
//  * the optimizer (AdamW / SGD-momentum) on the fp32 shards.
// Each buffer's element type follows from its category and the op that fills it (classify_buffers);
// each OpKind gets its FSDP meaning in enqueue(), as rank_runner.cpp gives it on the CPU.
#pragma once
#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/wrap_graph.h"
#include "runtime/cpu/rank_runner.h"
#include "runtime/unit_layout.h"
#include "runtime/cuda/cuda_device_memory.h"
#include "runtime/cuda/cuda_segment_compute.h"
#include "runtime/cuda/cuda_stream_executor.h"
#include "runtime/cuda/gemm.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/device_communicator.h"

namespace fsdpsim::runtime::cuda {

// InputError if the CUDA runtime cannot execute this plan/model (bf16 compute, fp32 masters, ...).
void check_cuda_runtime_supports(const models::ModelSpec& m, const sim::Plan& plan);

class CudaRankRunner : public CudaOpRunner {
 public:
  // cfg.address_space caps the device region for the allocator's segments (it also stays below the
  // free device memory minus 512 MiB for cuBLAS and NCCL).
  CudaRankRunner(const RunConfig& cfg, DeviceCommunicator& comm);
  ~CudaRankRunner() override;

  StepOutcome step();
  // Emulated worlds only: after each collective's local stand-in, its stream waits per_op_ns[op id]
  // more (a GPU-side delay, spin.h), e.g. the profile's predicted duration of that collective, so that
  // communication overlaps compute as it would on the real fabric.
  void pad_collectives(std::vector<TimeNs> per_op_ns);
  const sim::StepProgram& program() const { return rp_.program; }
  std::vector<std::pair<std::string, std::vector<float>>> gather_params();
  std::vector<std::pair<std::string, std::vector<float>>> gather_grads();
  Bytes untracked_bytes() const { return compute_->untracked_bytes() + side_state_bytes_; }
  std::vector<std::string> notes() const { return notes_; }
  // What the driver says the device uses (cudaMemGetInfo: total - free), issue 19: at the runner's start
  // (CUDA context, NCCL communicators, cuBLAS handle), the placed allocator's fixed region, and the most
  // after setup and after each step, so that the bytes outside the region (context, cuBLAS workspaces,
  // NCCL buffers, untracked scratch) can be set beside the prediction's context bytes.
  nlohmann::json device_memory() const;

  void enqueue(const sim::Op& op, cudaStream_t stream) override;

 private:
  void classify_buffers();
  long numel(int buffer) const;
  char* ptr(int buffer) const { return mem_->ptr(buffer); }
  std::vector<bf16*> segment_params(int seg, const sim::Op& op);
  std::vector<bf16*> segment_grads(int seg, const sim::Op& op, cudaStream_t s);
  void run_compute(const sim::Op& op);
  void accumulate_grad(int unit, int src_buffer, cudaStream_t s);
  void pad_collective(const sim::Op& op, cudaStream_t s);
  std::vector<std::pair<std::string, std::vector<float>>> gather(const std::vector<int>& per_unit_buffer);

  RunConfig cfg_;
  DeviceCommunicator& comm_;
  RankProgram rp_;                                   // the program, layouts, segments and op roles
  std::unique_ptr<CudaStreamExecutor> exec_;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<CudaSegmentCompute> compute_;
  std::unique_ptr<CudaDeviceMemory> mem_;
  int steps_done_ = 0;
  std::vector<float*> state_ptr_;
  std::vector<void*> side_state_;
  Bytes side_state_bytes_ = 0;
  // FSDP1: the original parameters' gradients (views' grads) until the split-backward cat (a CopyOut)
  // builds the flat grad: the kernels accumulate them in a per-unit device scratch outside the allocator
  // (as the CPU runner does on the host); the cat moves it into the flat grad and zeroes it. The zeroing's
  // event makes the compute stream wait before the next backward writes the scratch again.
  std::vector<bf16*> grad_scratch_;
  cudaEvent_t scratch_zeroed_ = nullptr;
  bf16* grad_scratch(int unit);
  Bytes device_total_ = 0, used_at_start_ = 0, region_ = 0, used_peak_ = 0;
  void sample_device_use();
  std::vector<Elem> elem_;                           // per buffer
  std::vector<std::vector<int>> act_buf_, recomp_buf_;
  std::vector<std::string> notes_;
  std::vector<TimeNs> pad_ns_;                       // per op; empty: collectives not padded
};

}  // namespace fsdpsim::runtime::cuda

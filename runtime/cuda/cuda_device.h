// The CUDA backend's Device (runtime/device.h): the program's buffers placed by the caching-allocator
// model in one cudaMalloc'd region (cuda_device_memory.h), CUDA streams and events (cuda_stream_executor.h),
// bf16 kernels with fp32 accumulation and cuBLAS GEMMs (cuda_segment_compute.h, kernels.h), and typed
// collectives on a DeviceCommunicator (NCCL, or an emulated world on one GPU). Every call with a Stream
// enqueues on it and returns at once.
#pragma once
#include <cuda_runtime.h>

#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_device_memory.h"
#include "runtime/cuda/cuda_segment_compute.h"
#include "runtime/cuda/cuda_stream_executor.h"
#include "runtime/cuda/device_communicator.h"
#include "runtime/cuda/gemm.h"
#include "runtime/cuda/kernels.h"
#include "runtime/device.h"

namespace fsdpsim::runtime::cuda {

class CudaDevice : public Device {
 public:
  explicit CudaDevice(DeviceCommunicator& comm);   // samples the device's use at the start
  ~CudaDevice() override;

  std::string name() const override { return "CUDA"; }
  void check_supports(const models::ModelSpec& m, const sim::Plan& plan) const override;
  Elem compute_elem() const override { return Elem::BF16; }
  // The allocator's region: address_space at most, and below the free device memory less headroom.
  void prepare(const RankProgram& rp, float dloss_scale, Bytes address_space) override;
  std::vector<std::string> finish_setup() override;

  PlacedMemory& memory() override { return *mem_; }
  void* alloc_outside(Bytes bytes) override;
  std::string outside_state_note(int unit, Bytes have, Bytes need) const override;
  void* grad_scratch(int unit, Bytes bytes) override;
  void upload(void* dst, const void* host, Bytes bytes) override;
  void zero_now(void* dst, Bytes bytes) override;
  Bytes untracked_bytes() const override { return compute_->untracked_bytes() + outside_bytes_; }

  sim::SimResult execute_step(OpHandler& handler) override;
  Stream compute_stream() const override { return gemm_->stream(); }
  void compute_waits_for(Stream s) override;
  void synchronize() override;
  void after_step() override { sample_device_use(); }

  void set_batch(int micro_batch, std::vector<std::int32_t> inputs, std::vector<std::int32_t> targets) override;
  Bytes act_bytes(int seg) const override { return compute_->act_bytes(seg); }
  Bytes recomp_bytes(int seg) const override { return compute_->recomp_bytes(seg); }
  void forward(int seg, int mb, const std::vector<char*>& params, char* act) override;
  void recompute(int seg, int mb, const std::vector<char*>& params, char* act, char* recomp) override;
  void backward(int seg, int mb, const std::vector<char*>& params, const std::vector<char*>& grads, char* act,
                char* recomp) override;
  double loss_sum(int mb) override { return compute_->loss_sum(mb); }
  void copy(void* dst, Elem dst_type, const void* src, Elem src_type, std::int64_t n, Stream s) override;
  void copy_rows(void* dst, Bytes dpitch, const void* src, Bytes spitch, Bytes width, std::int64_t rows, Stream s) override;
  void zero(void* dst, Bytes bytes, Stream s) override;
  void accumulate(void* dst, Elem dst_type, const void* src, Elem src_type, std::int64_t n, bool assign, Stream s) override;
  void divide(void* x, Elem type, int factor, std::int64_t n, Stream s) override;
  void optimizer_step(const OptimizerConfig& cfg, int step, float* params, const float* grads, float* state,
                      std::int64_t n, Stream s) override;

  void all_gather(const void* in, void* out, std::int64_t count, Elem type, sim::CommGroup g, Stream s) override;
  void reduce_scatter(const void* in, void* out, std::int64_t count, Elem type, sim::CommGroup g, ReduceOp op,
                      Stream s) override;
  void all_reduce(void* inout, std::int64_t count, Elem type, sim::CommGroup g, ReduceOp op, Stream s) override;
  // Emulated worlds: after each collective's local stand-in its stream waits per_op_ns[op id] more.
  void after_collective(const sim::Op& op, Stream s) override;
  void gather_to_host(const float* shard, std::int64_t count, float* host) override;

  // As CudaRankRunner's.
  void pad_collectives(std::vector<TimeNs> per_op_ns, size_t program_ops);
  nlohmann::json device_memory() const;

 private:
  void sample_device_use();

  DeviceCommunicator& comm_;
  std::unique_ptr<CudaStreamExecutor> exec_;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<CudaSegmentCompute> compute_;
  std::unique_ptr<CudaDeviceMemory> mem_;
  std::vector<void*> outside_;                       // cudaMallocs outside the allocator (alloc_outside, grad_scratch)
  Bytes outside_bytes_ = 0;
  // FSDP1's views' grads until the split-backward cat: per unit, in outside_. The zeroing's event makes the
  // compute stream wait before the next backward writes the scratch again (compute_waits_for).
  std::vector<void*> grad_scratch_;
  cudaEvent_t scratch_zeroed_ = nullptr;
  Bytes device_total_ = 0, used_at_start_ = 0, region_ = 0, used_peak_ = 0;
  std::vector<TimeNs> pad_ns_;                       // per op; empty: collectives not padded
};

}  // namespace fsdpsim::runtime::cuda

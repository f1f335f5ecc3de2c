// The CPU backend's Device (runtime/device.h): the program's buffers in reserved host memory placed by
// the caching-allocator model (device_memory.h), the stream threads of stream_executor.h, fp32 kernels
// on OpenBLAS (segment_compute.h) and fp32 collectives through a Communicator (MPI, or one rank
// in-process). Every buffer is fp32; an op runs at once on the stream thread that calls it.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/cpu/device_memory.h"
#include "runtime/cpu/segment_compute.h"
#include "runtime/device.h"

namespace fsdpsim::runtime {

class CpuDevice : public Device {
 public:
  explicit CpuDevice(Communicator& comm) : comm_(comm) {}
  ~CpuDevice() override;

  std::string name() const override { return "CPU"; }
  void check_supports(const models::ModelSpec& m, const sim::Plan& plan) const override;
  Elem compute_elem() const override { return Elem::F32; }
  void prepare(const RankProgram& rp, float dloss_scale, Bytes address_space) override;
  std::vector<std::string> finish_setup() override;

  PlacedMemory& memory() override { return *mem_; }
  void* alloc_outside(Bytes bytes) override;
  std::string outside_state_note(int unit, Bytes have, Bytes need) const override;
  void* grad_scratch(int unit, Bytes bytes) override;
  void upload(void* dst, const void* host, Bytes bytes) override;
  void zero_now(void* dst, Bytes bytes) override;
  Bytes untracked_bytes() const override { return compute_->untracked_bytes(); }

  sim::SimResult execute_step(OpHandler& handler) override;
  Stream compute_stream() const override { return nullptr; }
  void compute_waits_for(Stream) override {}   // the program's waits order the stream threads
  void synchronize() override {}

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
  void gather_to_host(const float* shard, std::int64_t count, float* host) override;

 private:
  Communicator& comm_;
  const sim::StepProgram* program_ = nullptr;
  std::unique_ptr<SegmentCompute> compute_;
  std::unique_ptr<DeviceMemory> mem_;
  std::vector<std::vector<float>> outside_;         // alloc_outside's host arrays
  std::map<int, std::vector<float>> grad_scratch_;   // per unit
};

}  // namespace fsdpsim::runtime

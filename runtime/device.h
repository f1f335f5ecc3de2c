// What the rank runner (rank_runner.h) asks of a backend: a device with memory (the program's buffers
// placed by the caching-allocator model, and memory outside it), streams (the executor that issues the
// program's ops), kernels (the model's compute and the memory-bound ops FSDP needs) and a communicator
// (typed collectives on device buffers). The runner gives the ops their FSDP meaning once; a device only
// moves bytes. Implementations: cpu/cpu_device.h (host memory, stream threads, OpenBLAS, MPI) and
// cuda/cuda_device.h (one cudaMalloc'd region, CUDA streams, bf16 kernels and cuBLAS, NCCL).
//
// Pointers are device addresses (host addresses on the CPU). Calls that take a Stream enqueue on it (the
// CPU device runs them at once on the calling stream thread); the others complete before returning.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/units.h"
#include "models/model_spec.h"
#include "runtime/communicator.h"
#include "runtime/cpu/device_memory.h"
#include "runtime/elem.h"
#include "runtime/op_handler.h"
#include "runtime/rank_program.h"
#include "runtime/train/optimizer.h"
#include "program/plan.h"
#include "program/sim_result.h"
#include "program/step_program.h"

namespace fsdpsim::runtime {

class Device {
 public:
  virtual ~Device() = default;

  // ---- the backend ----
  virtual std::string name() const = 0;   // "CPU", "CUDA": messages say "<name> runtime", "<name> kernels"
  // InputError if this backend cannot execute the plan/model.
  virtual void check_supports(const models::ModelSpec& m, const sim::Plan& plan) const = 0;
  virtual Elem compute_elem() const = 0;  // of the kernels' parameters and gradients
  // Once the program is known: the kernels' state (dloss_scale = d(loss)/d(token loss) for this rank's
  // tokens) and the allocator's region (at most address_space bytes).
  virtual void prepare(const RankProgram& rp, float dloss_scale, Bytes address_space) = 0;
  // Once the runner has placed and initialized the persistent state: the notes for the measured result.
  virtual std::vector<std::string> finish_setup() = 0;

  // ---- memory ----
  virtual PlacedMemory& memory() = 0;
  // `bytes` outside the allocator (uninitialized), owned by the device; the note says where they live.
  virtual void* alloc_outside(Bytes bytes) = 0;
  virtual std::string outside_state_note(int unit, Bytes have, Bytes need) const = 0;
  // FSDP1's per-unit scratch for the views' grads (outside the allocator, zeroed on first use).
  virtual void* grad_scratch(int unit, Bytes bytes) = 0;
  virtual void upload(void* dst, const void* host, Bytes bytes) = 0;
  virtual void zero_now(void* dst, Bytes bytes) = 0;
  // Bytes of the device's memory outside the program's buffers (kernels' scratch, ...).
  virtual Bytes untracked_bytes() const = 0;

  // ---- streams ----
  // Runs one step of the program (memory().fill() adds the peaks).
  virtual sim::SimResult execute_step(OpHandler& handler) = 0;
  virtual Stream compute_stream() const = 0;
  // The compute stream's later work waits for what `s` has enqueued so far.
  virtual void compute_waits_for(Stream s) = 0;
  virtual void synchronize() = 0;
  virtual void after_step() {}

  // ---- kernels ----
  virtual void set_batch(int micro_batch, std::vector<std::int32_t> inputs, std::vector<std::int32_t> targets) = 0;
  virtual Bytes act_bytes(int seg) const = 0;      // what the kernels save per segment in the program's buffers
  virtual Bytes recomp_bytes(int seg) const = 0;
  // params/grads: the segment's tensors in param_tensors.h order, of compute_elem(); on the compute stream.
  virtual void forward(int seg, int mb, const std::vector<char*>& params, char* act) = 0;
  virtual void recompute(int seg, int mb, const std::vector<char*>& params, char* act, char* recomp) = 0;
  virtual void backward(int seg, int mb, const std::vector<char*>& params, const std::vector<char*>& grads, char* act,
                        char* recomp) = 0;
  virtual double loss_sum(int mb) = 0;             // summed token loss of a micro-batch (after the step)
  // dst = src converted to dst's type (n elements).
  virtual void copy(void* dst, Elem dst_type, const void* src, Elem src_type, std::int64_t n, Stream s) = 0;
  // `rows` rows of `width` bytes, from src (pitch spitch) to dst (pitch dpitch).
  virtual void copy_rows(void* dst, Bytes dpitch, const void* src, Bytes spitch, Bytes width, std::int64_t rows,
                         Stream s) = 0;
  virtual void zero(void* dst, Bytes bytes, Stream s) = 0;
  // dst += src (assign: dst = src), n elements; dst fp32, or both of one type.
  virtual void accumulate(void* dst, Elem dst_type, const void* src, Elem src_type, std::int64_t n, bool assign,
                          Stream s) = 0;
  virtual void divide(void* x, Elem type, int factor, std::int64_t n, Stream s) = 0;
  // One optimizer step (step = 1 for the first) on an fp32 shard; state: cfg.states() arrays of n.
  virtual void optimizer_step(const OptimizerConfig& cfg, int step, float* params, const float* grads, float* state,
                              std::int64_t n, Stream s) = 0;

  // ---- communicator (communicator.h's contract, typed, on device buffers) ----
  virtual void all_gather(const void* in, void* out, std::int64_t count, Elem type, sim::CommGroup g, Stream s) = 0;
  virtual void reduce_scatter(const void* in, void* out, std::int64_t count, Elem type, sim::CommGroup g, ReduceOp op,
                              Stream s) = 0;
  virtual void all_reduce(void* inout, std::int64_t count, Elem type, sim::CommGroup g, ReduceOp op, Stream s) = 0;
  virtual void after_collective(const sim::Op& op, Stream s) {}
  // Every member's fp32 shard[count] of the shard group into host[n * count], group-rank order.
  virtual void gather_to_host(const float* shard, std::int64_t count, float* host) = 0;
};

}  // namespace fsdpsim::runtime

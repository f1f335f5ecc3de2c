// Executes a StepProgram on CUDA streams with the semantics of program/step_program.h, the CUDA
// counterpart of runtime/cpu/stream_executor.h:
//  * the calling thread is the CPU: it issues ops in program order, blocks on `cpu_waits`
//    (cudaEventSynchronize), performs the op's allocs before enqueueing and its frees after;
//  * one CUDA stream per program stream; an op's `waits` are cudaStreamWaitEvent on the end events
//    of those ops; every op is bracketed by a start and an end event (the timing);
//  * collectives run on one NCCL stream per process group (PyTorch's ProcessGroupNCCL stream, the
//    "one NCCL queue per group" of F1.4): the group stream waits for the op's program stream (its
//    predecessor there and its waits), runs the collective, and the program stream waits for it, so
//    the program stream's order is kept and each group's collectives run in CPU issue order;
//  * a free with reuse_after_op (record_stream) returns the block to its pool only once that op's
//    end event has completed (cudaEventQuery, checked before every alloc).
// Times: CUDA-event times relative to an event recorded on the compute stream before the first op;
// the CPU's issue spans and blocked time come from the host clock started at that moment (the two
// clocks are aligned to within the launch latency). The result has the fields the CPU executor fills.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <vector>

#include "runtime/cuda/cuda_device_memory.h"
#include "runtime/op_handler.h"
#include "program/sim_result.h"
#include "program/step_program.h"

namespace fsdpsim::runtime::cuda {

class CudaStreamExecutor {
 public:
  explicit CudaStreamExecutor(const sim::StepProgram& program);
  ~CudaStreamExecutor();
  CudaStreamExecutor(const CudaStreamExecutor&) = delete;
  CudaStreamExecutor& operator=(const CudaStreamExecutor&) = delete;

  cudaStream_t stream(int program_stream) const { return streams_.at(program_stream); }
  // Runs one step and waits for the device; memory peaks: CudaDeviceMemory::fill.
  sim::SimResult execute_step(CudaDeviceMemory& memory, OpHandler& handler);

 private:
  const sim::StepProgram& p_;
  std::vector<cudaStream_t> streams_;
  std::array<cudaStream_t, 4> group_streams_{};   // per sim::CommGroup
  std::vector<cudaEvent_t> start_, end_;
  cudaEvent_t t0_ = nullptr;
};

}  // namespace fsdpsim::runtime::cuda

// What a backend's executor calls for each op of the program it issues: the rank runner's meaning of
// the op (rank_runner.h). The CPU executor (cpu/stream_executor.h) calls it on the op's stream thread,
// which runs it at once; the CUDA executor (cuda/cuda_stream_executor.h) on the CPU thread at issue,
// which enqueues it on the op's CUDA stream (or its group's NCCL stream for a collective).
#pragma once
#include "program/step_program.h"

namespace fsdpsim::runtime {

using Stream = void*;   // the stream an op runs on: a cudaStream_t on CUDA, null on the CPU

class OpHandler {
 public:
  virtual ~OpHandler() = default;
  // The op's buffers are allocated (at issue).
  virtual void run(const sim::Op& op, Stream s) = 0;
};

}  // namespace fsdpsim::runtime

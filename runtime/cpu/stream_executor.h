// Executes a StepProgram's schedule on real threads, with the semantics written at the top of
// program/step_program.h: the calling thread is the CPU (issues ops in order, blocks on cpu_waits,
// performs allocs before enqueueing and frees after), and each stream is a thread that runs its ops
// in order once their `waits` have completed. Collectives of one process group additionally run in
// CPU issue order, one at a time (one NCCL queue per group, F1.4), which keeps every rank's sequence
// of collectives identical. What an op does to data is the OpHandler's business (FSDP semantics,
// runtime/rank_runner.h); this file only orders, times and traces ops. The CUDA backend's executor
// (cuda/cuda_stream_executor.h) drives the same OpHandler from CUDA streams and events.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/cpu/device_memory.h"
#include "runtime/op_handler.h"
#include "program/sim_result.h"
#include "program/step_program.h"

namespace fsdpsim::runtime {

struct StepTiming {
  sim::SimResult result;   // step/compute/comm/exposed/cpu_blocked times, trace (memory: see DeviceMemory::fill)
};

// Runs one step. Throws the first exception an op raised (after every thread has stopped).
sim::SimResult execute_step(const sim::StepProgram& program, DeviceMemory& memory, OpHandler& handler);

// The measured step (both backends' executors): per-op spans from each op's issue, start and end times
// (ns since the step began) added to the CPU-side spans already in `trace`; the step, compute-stream busy,
// communication busy and exposed (the compute stream idle, waiting, while a collective ran) times.
sim::SimResult measured_step(const sim::StepProgram& p, const std::vector<TimeNs>& issue, const std::vector<TimeNs>& start,
                             const std::vector<TimeNs>& end, std::vector<sim::TraceSpan> trace, TimeNs cpu_blocked);

}  // namespace fsdpsim::runtime

#include "runtime/cuda/cuda_stream_executor.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "runtime/rank_program.h"
#include "runtime/cpu/stream_executor.h"
#include "runtime/cuda/cuda_check.h"

namespace fsdpsim::runtime::cuda {

namespace {

using Clock = std::chrono::steady_clock;

TimeNs elapsed_ns(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  FSDPSIM_CUDA_CHECK(cudaEventElapsedTime(&ms, from, to));
  return static_cast<TimeNs>(static_cast<double>(ms) * 1e6);
}

}  // namespace

CudaStreamExecutor::CudaStreamExecutor(const sim::StepProgram& program) : p_(program) {
  streams_.resize(p_.streams.size());
  for (auto& s : streams_) FSDPSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (auto& s : group_streams_) FSDPSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  start_.resize(p_.ops.size());
  end_.resize(p_.ops.size());
  for (auto& e : start_) FSDPSIM_CUDA_CHECK(cudaEventCreate(&e));
  for (auto& e : end_) FSDPSIM_CUDA_CHECK(cudaEventCreate(&e));
  FSDPSIM_CUDA_CHECK(cudaEventCreate(&t0_));
}

CudaStreamExecutor::~CudaStreamExecutor() {
  for (auto e : start_) cudaEventDestroy(e);
  for (auto e : end_) cudaEventDestroy(e);
  if (t0_) cudaEventDestroy(t0_);
  for (auto s : streams_) cudaStreamDestroy(s);
  for (auto s : group_streams_) cudaStreamDestroy(s);
}

sim::SimResult CudaStreamExecutor::execute_step(CudaDeviceMemory& mem, OpHandler& handler) {
  const int n = static_cast<int>(p_.ops.size());
  std::vector<char> issued(n, 0);
  std::vector<TimeNs> issue(n, 0);
  std::vector<sim::TraceSpan> trace;
  TimeNs cpu_blocked = 0;
  FSDPSIM_CUDA_CHECK(cudaDeviceSynchronize());   // the previous step (and set-up copies) are done
  FSDPSIM_CUDA_CHECK(cudaEventRecord(t0_, streams_[0]));
  const Clock::time_point h0 = Clock::now();
  auto now = [&] { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - h0).count(); };
  auto complete = [&](std::int64_t op) {
    if (op < 0 || op >= n || !issued[op]) return false;
    const cudaError_t e = cudaEventQuery(end_[op]);
    if (e == cudaErrorNotReady) return false;
    FSDPSIM_CUDA_CHECK(e);
    return true;
  };

  for (int i = 0; i < n; ++i) {
    const sim::Op& op = p_.ops[i];
    const TimeNs t_issue = now();
    if (!op.cpu_waits.empty()) {
      const TimeNs b0 = now();
      for (int w : op.cpu_waits) FSDPSIM_CUDA_CHECK(cudaEventSynchronize(end_.at(w)));
      const TimeNs b1 = now();
      if (b1 > b0) {
        cpu_blocked += b1 - b0;
        trace.push_back({"blocked before " + op.name, "cpu", "cpu_blocked", op.unit, b0, b1 - b0, 0});
      }
    }
    mem.process_events(complete);
    const std::size_t frees_after = sim::issue_memory(
        op, [&](int b) { mem.alloc(b, now()); }, [&](const sim::FreeSpec& f) { mem.free(f.buffer, -1, now()); });
    cudaStream_t ps = streams_.at(op.stream);
    for (int w : op.waits) FSDPSIM_CUDA_CHECK(cudaStreamWaitEvent(ps, end_.at(w), 0));
    cudaStream_t s = ps;
    if (is_collective(op.kind)) {
      // Hand over to the group's NCCL stream: it starts after the program stream reaches this op.
      s = group_streams_.at(static_cast<int>(op.group));
      FSDPSIM_CUDA_CHECK(cudaEventRecord(start_[i], ps));
      FSDPSIM_CUDA_CHECK(cudaStreamWaitEvent(s, start_[i], 0));
    }
    FSDPSIM_CUDA_CHECK(cudaEventRecord(start_[i], s));
    try {
      handler.run(op, s);   // enqueues on s
    } catch (const std::exception& e) {   // name the op: the message alone rarely says where
      throw std::runtime_error("op " + std::to_string(i) + " \"" + op.name + "\" (" + sim::op_kind_name(op.kind) +
                               ", unit " + std::to_string(op.unit) + ", micro-batch " + std::to_string(op.micro_batch) +
                               "): " + e.what());
    }
    FSDPSIM_CUDA_CHECK(cudaEventRecord(end_[i], s));
    if (s != ps) FSDPSIM_CUDA_CHECK(cudaStreamWaitEvent(ps, end_[i], 0));
    issued[i] = 1;
    issue[i] = now();
    for (std::size_t k = frees_after; k < op.frees.size(); ++k) {
      const sim::FreeSpec& f = op.frees[k];
      const bool reusable = f.reuse_after_op < 0 || complete(f.reuse_after_op);
      mem.free(f.buffer, reusable ? -1 : f.reuse_after_op, now());
    }
    trace.push_back({op.name, "cpu", "cpu_issue", op.unit, t_issue, now() - t_issue, 0});
  }
  FSDPSIM_CUDA_CHECK(cudaDeviceSynchronize());
  mem.process_events(complete);

  std::vector<TimeNs> st(n), en(n);
  for (int i = 0; i < n; ++i) {
    st[i] = elapsed_ns(t0_, start_[i]);
    en[i] = std::max(st[i], elapsed_ns(t0_, end_[i]));
  }
  return measured_step(p_, issue, st, en, std::move(trace), cpu_blocked);
}

}  // namespace fsdpsim::runtime::cuda

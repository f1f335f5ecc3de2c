#include "runtime/cpu/stream_executor.h"

#include "runtime/rank_program.h"
#include "program/sim_result.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

namespace fsdpsim::runtime {

namespace {

using Clock = std::chrono::steady_clock;

class Run {
 public:
  Run(const sim::StepProgram& p, DeviceMemory& mem, OpHandler& handler)
      : p_(p), mem_(mem), handler_(handler), n_(static_cast<int>(p.ops.size())), done_(n_, 0), queues_(p.streams.size()),
        start_(n_, 0), end_(n_, 0), issue_(n_, 0), seq_(n_, -1) {
    std::map<int, int> next;
    for (int i = 0; i < n_; ++i)
      if (is_collective(p.ops[i].kind)) {
        const int g = static_cast<int>(p.ops[i].group);
        seq_[i] = next[g]++;
      }
    group_done_.assign(4, 0);
  }

  sim::SimResult go() {
    t0_ = Clock::now();
    std::vector<std::thread> threads;
    for (size_t s = 0; s < p_.streams.size(); ++s) threads.emplace_back([this, s] { stream_loop(static_cast<int>(s)); });
    std::exception_ptr cpu_error;
    try {
      cpu_loop();
    } catch (...) {
      cpu_error = std::current_exception();
    }
    {
      std::unique_lock<std::mutex> lk(m_);
      if (cpu_error && !error_) error_ = cpu_error;
      if (!error_) cv_.wait(lk, [&] { return completed_ == n_ || error_; });
      stop_ = true;
      cv_.notify_all();
    }
    for (auto& t : threads) t.join();
    if (error_) std::rethrow_exception(error_);
    return result();
  }

 private:
  TimeNs now() const { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_).count(); }

  bool ready(int id) const {
    const sim::Op& op = p_.ops[id];
    for (int w : op.waits)
      if (!done_[w]) return false;
    if (seq_[id] >= 0 && group_done_[static_cast<int>(op.group)] != seq_[id]) return false;
    return true;
  }

  void cpu_loop() {
    for (int i = 0; i < n_; ++i) {
      const sim::Op& op = p_.ops[i];
      const TimeNs t_issue = now();
      {
        std::unique_lock<std::mutex> lk(m_);
        const TimeNs b0 = now();
        cv_.wait(lk, [&] {
          if (error_) return true;
          for (int w : op.cpu_waits)
            if (!done_[w]) return false;
          return true;
        });
        if (error_) return;
        const TimeNs b1 = now();
        if (!op.cpu_waits.empty() && b1 > b0) {
          cpu_blocked_ += b1 - b0;
          trace_.push_back({"blocked before " + op.name, "cpu", "cpu_blocked", op.unit, b0, b1 - b0, 0});
        }
        mem_.process_events([&](std::int64_t e) { return done_[static_cast<int>(e)] != 0; });
        const std::size_t frees_after = sim::issue_memory(
            op, [&](int b) { mem_.alloc(b, now()); }, [&](const sim::FreeSpec& f) { mem_.free(f.buffer, -1, now()); });
        issue_[i] = now();
        queues_[op.stream].push_back(i);
        for (std::size_t k = frees_after; k < op.frees.size(); ++k) {
          const sim::FreeSpec& f = op.frees[k];
          const bool reusable = f.reuse_after_op < 0 || done_[f.reuse_after_op];
          mem_.free(f.buffer, reusable ? -1 : f.reuse_after_op, now());
        }
        trace_.push_back({op.name, "cpu", "cpu_issue", op.unit, t_issue, now() - t_issue, 0});
      }
      cv_.notify_all();
    }
  }

  void stream_loop(int s) {
    for (;;) {
      int id = -1;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stop_ || (!queues_[s].empty() && ready(queues_[s].front())); });
        if (stop_) return;
        id = queues_[s].front();
        queues_[s].pop_front();
      }
      const TimeNs t_start = now();
      try {
        handler_.run(p_.ops[id], nullptr);
      } catch (...) {
        std::lock_guard<std::mutex> lk(m_);
        if (!error_) error_ = std::current_exception();
        stop_ = true;
        cv_.notify_all();
        return;
      }
      const TimeNs t_end = now();
      {
        std::lock_guard<std::mutex> lk(m_);
        start_[id] = t_start;
        end_[id] = t_end;
        done_[id] = 1;
        ++completed_;
        if (seq_[id] >= 0) ++group_done_[static_cast<int>(p_.ops[id].group)];
      }
      cv_.notify_all();
    }
  }

  sim::SimResult result() { return measured_step(p_, issue_, start_, end_, std::move(trace_), cpu_blocked_); }

  const sim::StepProgram& p_;
  DeviceMemory& mem_;
  OpHandler& handler_;
  int n_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<char> done_;
  std::vector<std::deque<int>> queues_;
  std::vector<TimeNs> start_, end_, issue_;
  std::vector<int> seq_, group_done_;
  int completed_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  Clock::time_point t0_;
  TimeNs cpu_blocked_ = 0;
  std::vector<sim::TraceSpan> trace_;
};

}  // namespace

sim::SimResult execute_step(const sim::StepProgram& program, DeviceMemory& memory, OpHandler& handler) {
  return Run(program, memory, handler).go();
}

namespace {
std::vector<std::pair<TimeNs, TimeNs>> merge(std::vector<std::pair<TimeNs, TimeNs>> iv) {
  std::sort(iv.begin(), iv.end());
  std::vector<std::pair<TimeNs, TimeNs>> out;
  for (auto& x : iv) {
    if (!out.empty() && x.first <= out.back().second) out.back().second = std::max(out.back().second, x.second);
    else out.push_back(x);
  }
  return out;
}
}  // namespace

sim::SimResult measured_step(const sim::StepProgram& p, const std::vector<TimeNs>& issue, const std::vector<TimeNs>& start,
                             const std::vector<TimeNs>& end, std::vector<sim::TraceSpan> trace, TimeNs cpu_blocked) {
  sim::SimResult r;
  TimeNs step = 0, compute = 0, prev_compute_end = 0;
  std::vector<std::pair<TimeNs, TimeNs>> comm, gaps;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const sim::Op& op = p.ops[i];
    step = std::max(step, end[i]);
    const Bytes bytes = is_collective(op.kind) ? op.comm_bytes : op.copy_bytes;
    trace.push_back({op.name, p.streams[op.stream].name, sim::op_kind_name(op.kind), op.unit, start[i], end[i] - start[i], bytes});
    if (is_collective(op.kind)) comm.push_back({start[i], end[i]});
    if (op.stream == 0) {
      compute += end[i] - start[i];
      const TimeNs ready = std::max(prev_compute_end, issue[i]);
      if (start[i] > ready) gaps.push_back({ready, start[i]});
      prev_compute_end = end[i];
    }
  }
  for (const auto& s : trace) step = std::max(step, s.start_ns + s.dur_ns);
  comm = merge(comm);
  r.step_time_ns = step;
  r.compute_ns = compute;
  for (auto& [a, b] : comm) r.comm_ns += b - a;
  r.exposed_comm_ns = sim::intersect_length(merge(gaps), comm);
  r.cpu_blocked_ns = cpu_blocked;
  std::stable_sort(trace.begin(), trace.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  r.trace = std::move(trace);
  return r;
}

}  // namespace fsdpsim::runtime

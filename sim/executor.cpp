// The discrete-event executor (sim/executor.h). It implements the execution semantics written at the
// top of sim/step_program.h on the event core of sim/event_queue.h:
//
//  * CPU: ops are issued in program order. Issuing op i first blocks until every op in cpu_waits has
//    completed (for CpuOptimizerStep also its `waits`: the CPU cannot step on grads not yet copied),
//    then costs cpu_ns[i] (CpuOptimizerStep: + its duration, it runs on the CPU). At the end of that
//    time the CPU performs the allocs, enqueues the op, performs the frees, and starts on op i+1.
//    The CPU sees every GPU completion at a time <= its own time (an issue event that coincides with
//    other events is re-queued behind them), so "completed by the current CPU time" is exact.
//  * GPU: an op starts when it is issued, its stream has finished the previous op, every op in
//    `waits` has completed, and — for a collective — it is the oldest unstarted collective of its
//    process group and no collective of that group is running (one NCCL queue per group, F1.4).
//  * Overlap slowdown: while at least one collective runs, SM kernels (compute and memory-bound
//    kernels, not host copies) progress at 1/overlap_slowdown of their speed (semantics N5). A running
//    kernel's remaining work (in "alone" nanoseconds, a double) is re-timed whenever the number of
//    running collectives goes 0 -> 1 or 1 -> 0; its completion time is now + llround(remaining ×
//    factor), by moving its pending completion event in place (EventQueue::reschedule: a fresh sequence
//    number, as a cancel + schedule would give, without a stale event left behind).
//  * Memory: sim/memory_tracker.h on the caching-allocator model.
//
// Speed (issue #3): the engine is reused per thread (its arrays, event list and memory tracker keep
// their capacity between runs), its hot per-op facts live in flat arrays built in two passes over the
// program (the same passes run validate_program's per-op checks), and a completion time is rounded
// with an inline llround. None of this changes an event, a time or a byte.
//
// Definitions of the outputs:
//  * step_time_ns: the latest completion of any op (GPU or CPU), from t = 0 when the CPU starts.
//  * compute_ns: busy time of stream 0 (the compute / default stream).
//  * comm_ns: length of the union of the intervals during which at least one collective runs.
//  * exposed_comm_ns: for each op X on the compute stream let ready(X) = max(end of the previous
//    compute-stream op, issue time of X); in [ready(X), start(X)) the compute stream is idle only
//    because X waits on another stream's op. exposed_comm_ns is the length of the union of those
//    idle intervals intersected with the collective-busy intervals (idle time during which some
//    collective is in flight — usually the one X waits on, directly or through a copy).
//  * cpu_blocked_ns: total time the CPU spends blocked on cpu_waits (rate limiter, syncs).
//  * comm_bytes_by_kind: bytes each rank sends, nccl-tests N1: AG/RS (n−1)/n·S, AR 2(n−1)/n·S.
#include "sim/executor.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "common/errors.h"
#include "sim/event_queue.h"
#include "sim/memory_tracker.h"
#include "sim/program_check.h"

namespace fsdpsim::sim {

namespace {

constexpr int kNumGroups = 4;   // CommGroup: Shard, Replicate, World, PostForward

bool is_collective(OpKind k) {
  return k == OpKind::AllGather || k == OpKind::ReduceScatter || k == OpKind::AllReduce;
}

// SM kernels share the GPU with NCCL's CTAs and HBM traffic (semantics N5); host copies run on the
// copy engines and collectives are the cause, so neither is slowed.
bool is_slowable(OpKind k) {
  switch (k) {
    case OpKind::Forward: case OpKind::Backward: case OpKind::Recompute:
    case OpKind::CopyIn: case OpKind::CopyOut: case OpKind::Cast: case OpKind::Pad: case OpKind::Divide:
    case OpKind::OptimizerStep:
      return true;
    default:
      return false;
  }
}

// std::llround for |x| < 2^63 (times in ns), inline: round half away from zero. x - trunc(x) is exact
// for every double, so the comparison with 0.5 decides exactly as llround does.
inline TimeNs round_ns(double x) {
  auto i = static_cast<std::int64_t>(x);   // truncation toward zero
  const double frac = x - static_cast<double>(i);
  if (frac >= 0.5) ++i;
  else if (frac <= -0.5) --i;
  return i;
}

// A flat list that only grows (its storage is kept across runs): append() is a few inline stores for
// the one- or two-element lists most ops have.
template <class T>
class FlatList {
 public:
  void clear() { n_ = 0; }
  int size() const { return static_cast<int>(n_); }
  const T& operator[](int i) const { return data_[static_cast<std::size_t>(i)]; }
  // Appends src; returns whether ok(x) held for every element (each is checked as it is copied).
  template <class Ok>
  bool append_checked(const std::vector<T>& src, Ok&& ok) {
    const std::size_t k = src.size();
    if (k == 0) return true;
    if (n_ + k > data_.size()) [[unlikely]] data_.resize(std::max(2 * data_.size(), n_ + k + 256));
    T* out = data_.data() + n_;
    n_ += k;
    bool all = true;
    for (std::size_t j = 0; j < k; ++j) {
      all &= ok(src[j]);
      out[j] = src[j];
    }
    return all;
  }

 private:
  std::vector<T> data_;
  std::size_t n_ = 0;
};

enum class EvType : std::uint8_t { OpComplete, IssueDone, CpuResume };
struct Ev {
  EvType type = EvType::OpComplete;
  int op = 0;
};

class Engine {
 public:
  SimResult run(const StepProgram& p, const OpCosts& c, const ExecOptions& o);

 private:
  // ---- setup ----
  void build_queues();
  // ---- CPU ----
  void cpu_begin(TimeNs now);
  void issue_done(int i, TimeNs now);
  // ---- GPU ----
  void wake_dependents(int h, TimeNs now) {
    for (int k = dep_begin_[h], e = dep_begin_[h + 1]; k < e; ++k) try_start(op_stream_[dep_list_[k]], now);
  }
  void try_start(int s, TimeNs now) {
    if (stream_busy_[s] >= 0 || stream_head_[s] == stream_begin_[s + 1]) return;
    const int h = stream_list_[stream_head_[s]];
    if (issue_t_[h] < 0) return;
    int k = wait_pos_[h];
    const int end = wait_begin_[h + 1];
    while (k < end && completed_[wait_list_[k]]) ++k;
    wait_pos_[h] = k;
    if (k < end) return;
    if (kind_flags_[h] & kCollective) {
      const int g = op_group_[h];
      if (group_busy_[g] || group_list_[group_head_[g]] != h) return;
    }
    start(h, now);
  }
  void start(int h, TimeNs now);
  void complete(int h, TimeNs now);
  void retime(TimeNs now, double new_factor);
  // ---- results ----
  void fill_results(SimResult& r);
  void add_span(const Op& op, const std::string& track, const char* kind, TimeNs start, TimeNs dur, Bytes bytes);

  const StepProgram* p_ = nullptr;
  const ExecOptions* o_ = nullptr;
  int n_ = 0;
  const TimeNs* gpu_ns_ = nullptr;
  const TimeNs* cpu_ns_ = nullptr;
  MemoryTracker mem_;
  EventQueue<Ev> q_;
  double slowdown_ = 1.0;
  bool use_slowdown_ = false;
  double factor_ = 1.0;             // current progress factor of SM kernels

  // per op (indexed by op id)
  std::vector<TimeNs> issue_t_, start_t_, end_t_, cpu_start_t_;
  std::vector<std::uint8_t> completed_, kind_flags_;
  // Hot per-op facts copied out of the (large) Op structs for cache locality: stream, NCCL queue,
  // and the GPU waits as one flat array (CSR); wait_pos_[h] is the first wait of h not yet seen
  // complete (an index into wait_list_).
  std::vector<int> wait_pos_, op_stream_, op_group_, wait_begin_;
  FlatList<int> wait_list_;
  std::vector<double> remaining_;
  std::vector<TimeNs> seg_start_;
  static constexpr std::uint8_t kCollective = 1, kSlowable = 2, kCpuOp = 4;

  // per stream: its GPU ops in order (CSR), the next one to start, the running one
  std::vector<int> stream_begin_, stream_list_, stream_head_, stream_busy_;
  std::vector<TimeNs> stream_prev_end_;
  // per NCCL queue (process group): its collectives in issue order
  std::vector<int> group_begin_, group_list_, group_head_;
  bool group_busy_[kNumGroups] = {false, false, false, false};

  // per op: the ops that wait on it (CSR), whose streams may start when it completes
  std::vector<int> dep_begin_, dep_list_;
  // per op, copied from the Op structs (CSR): CPU waits, allocs, frees
  std::vector<int> cpu_wait_begin_, alloc_begin_, free_begin_;
  FlatList<int> cpu_wait_list_, alloc_list_;
  FlatList<FreeSpec> free_list_;
  std::vector<int> fill_;   // scratch for the CSR fills

  std::vector<int> running_slowable_;
  int comm_active_ = 0;
  TimeNs comm_start_ = 0;
  std::vector<std::pair<TimeNs, TimeNs>> comm_intervals_, compute_gaps_;
  TimeNs compute_busy_ = 0;

  // CPU
  int cpu_op_ = 0;
  bool cpu_blocked_ = false;
  int cpu_blocked_on_ = -1;
  TimeNs cpu_blocked_since_ = 0;
  TimeNs cpu_blocked_total_ = 0;

  std::vector<TraceSpan> trace_;
};

// Two passes: (1) over the ops: validate_program's per-op checks (streams and buffers were checked
// before), flags, streams, groups, list sizes, and every list the run reads (GPU waits, CPU waits,
// allocs, frees) copied into flat arrays, so that the run itself never touches the (large) Op structs
// or their scattered vectors again; (2) over those arrays: the per-stream, per-group and dependents lists.
void Engine::build_queues() {
  const StepProgram& p = *p_;
  const int ns = static_cast<int>(p.streams.size());
  const int nb = static_cast<int>(p.buffers.size());
  stream_begin_.assign(ns + 1, 0);
  group_begin_.assign(kNumGroups + 1, 0);
  op_stream_.resize(n_);
  op_group_.resize(n_);
  wait_begin_.resize(n_ + 1);
  cpu_wait_begin_.resize(n_ + 1);
  alloc_begin_.resize(n_ + 1);
  free_begin_.resize(n_ + 1);
  wait_list_.clear();
  cpu_wait_list_.clear();
  alloc_list_.clear();
  free_list_.clear();
  dep_begin_.assign(n_ + 1, 0);
  kind_flags_.resize(n_);
  // One pass per op: validate_program's per-op checks (check_op's conditions as one yes/no, evaluated while
  // copying each list; on any failure detail::check_op throws the first error in its order) fused
  // with the copies and the dependents count.
  const auto below = [](int v, int n) { return static_cast<unsigned>(v) < static_cast<unsigned>(n); };
  const Buffer* bufs = p.buffers.data();
  int* dep_count = dep_begin_.data() + 1;
  for (int i = 0; i < n_; ++i) {
    const Op& op = p.ops[i];
    const bool collective = is_collective(op.kind);
    bool ok = op.id == i && below(op.stream, ns) &&
              static_cast<unsigned>(op.kind) <= static_cast<unsigned>(OpKind::CpuOptimizerStep) &&
              op.copy_bytes >= 0 && op.cpu_hooks >= 0 && op.kernel_launches >= 0;
    if (collective)
      ok &= static_cast<unsigned>(op.group) <= static_cast<unsigned>(CommGroup::PostForward) && op.group_size >= 1 &&
            op.comm_bytes >= 0;
    wait_begin_[i] = wait_list_.size();
    ok &= wait_list_.append_checked(op.waits, [&](int w) {
      if (!below(w, i)) return false;   // (checked first: dep_count is only indexed by valid ids)
      ++dep_count[w];
      return true;
    });
    cpu_wait_begin_[i] = cpu_wait_list_.size();
    ok &= cpu_wait_list_.append_checked(op.cpu_waits, [&](int w) { return below(w, i); });
    alloc_begin_[i] = alloc_list_.size();
    // (&&: no read past the buffers)
    ok &= alloc_list_.append_checked(op.allocs, [&](int b) { return below(b, nb) && !bufs[b].persistent; });
    free_begin_[i] = free_list_.size();
    ok &= free_list_.append_checked(op.frees, [&](const FreeSpec& f) {
      return below(f.buffer, nb) && f.reuse_after_op >= -1 && f.reuse_after_op <= i;
    });
    if (!ok) [[unlikely]] {
      detail::check_op(p, i, ns, nb);   // throws the InputError validate_program would
      throw std::logic_error("execute: the engine's checks and check_op disagree on op " + std::to_string(i));
    }
    std::uint8_t f = 0;
    if (op.kind == OpKind::CpuOptimizerStep) f |= kCpuOp;
    else ++stream_begin_[op.stream + 1];
    if (collective) {
      f |= kCollective;
      ++group_begin_[static_cast<int>(op.group) + 1];
    }
    if (is_slowable(op.kind)) f |= kSlowable;
    kind_flags_[i] = f;
    op_stream_[i] = op.stream;
    op_group_[i] = static_cast<int>(op.group);
  }
  wait_begin_[n_] = wait_list_.size();
  cpu_wait_begin_[n_] = cpu_wait_list_.size();
  alloc_begin_[n_] = alloc_list_.size();
  free_begin_[n_] = free_list_.size();
  for (int s = 0; s < ns; ++s) stream_begin_[s + 1] += stream_begin_[s];
  for (int g = 0; g < kNumGroups; ++g) group_begin_[g + 1] += group_begin_[g];
  for (int i = 0; i < n_; ++i) dep_begin_[i + 1] += dep_begin_[i];
  stream_list_.resize(stream_begin_[ns]);
  group_list_.resize(group_begin_[kNumGroups]);
  dep_list_.resize(dep_begin_[n_]);
  // Fill cursors: streams, then groups, then per-op dependents (one scratch array).
  fill_.resize(ns + kNumGroups + n_);
  int* fill_s = fill_.data();
  int* fill_g = fill_s + ns;
  int* fill_d = fill_g + kNumGroups;
  std::copy(stream_begin_.begin(), stream_begin_.end() - 1, fill_s);
  std::copy(group_begin_.begin(), group_begin_.end() - 1, fill_g);
  std::copy(dep_begin_.begin(), dep_begin_.end() - 1, fill_d);
  for (int i = 0; i < n_; ++i) {
    const std::uint8_t f = kind_flags_[i];
    if (!(f & kCpuOp)) stream_list_[fill_s[op_stream_[i]]++] = i;
    if (f & kCollective) group_list_[fill_g[op_group_[i]]++] = i;
    for (int k = wait_begin_[i], e = wait_begin_[i + 1]; k < e; ++k) dep_list_[fill_d[wait_list_[k]]++] = i;
  }
  stream_head_.assign(stream_begin_.begin(), stream_begin_.end() - 1);
  group_head_.assign(group_begin_.begin(), group_begin_.end() - 1);
  stream_busy_.assign(ns, -1);
  stream_prev_end_.assign(ns, 0);
  wait_pos_.assign(wait_begin_.begin(), wait_begin_.end() - 1);
}

SimResult Engine::run(const StepProgram& p, const OpCosts& c, const ExecOptions& o) {
  p_ = &p;
  o_ = &o;
  n_ = static_cast<int>(p.ops.size());
  build_queues();   // (checks every op first, as validate_program does)
  if (o.memory_capacity < 0)
    throw InputError("memory_capacity", std::to_string(o.memory_capacity), ">= 0 (0 = unlimited)");
  if (static_cast<int>(c.gpu_ns.size()) != n_ || static_cast<int>(c.cpu_ns.size()) != n_)
    throw std::invalid_argument("execute: OpCosts sized " + std::to_string(c.gpu_ns.size()) + " for " +
                                std::to_string(n_) + " ops");
  gpu_ns_ = c.gpu_ns.data();
  cpu_ns_ = c.cpu_ns.data();
  slowdown_ = c.overlap_slowdown;
  use_slowdown_ = slowdown_ != 1.0;
  factor_ = 1.0;
  for (bool& b : group_busy_) b = false;
  comm_active_ = 0;
  comm_start_ = 0;
  comm_intervals_.clear();
  compute_gaps_.clear();
  running_slowable_.clear();
  compute_busy_ = 0;
  cpu_op_ = 0;
  cpu_blocked_ = false;
  cpu_blocked_on_ = -1;
  cpu_blocked_since_ = 0;
  cpu_blocked_total_ = 0;
  trace_.clear();
  q_.clear();

  // Only issue_t_ (-1: not issued) and completed_ are read before an op writes them; the other per-op
  // arrays are written first (cpu_start at issue, start/remaining/seg_start at start, end at completion),
  // so they keep stale values.
  issue_t_.assign(n_, -1);
  completed_.assign(n_, 0);
  start_t_.resize(n_);
  end_t_.resize(n_);
  cpu_start_t_.resize(n_);
  if (use_slowdown_) {
    remaining_.resize(n_);
    seg_start_.resize(n_);
  }
  q_.reserve(64);
  if (o.record_trace) trace_.reserve(2 * static_cast<std::size_t>(n_));

  mem_.start(p, o.memory_capacity, o.record_memory_timeline);
  mem_.allocate_persistent();
  if (n_ > 0) cpu_begin(0);
  while (!q_.empty()) {
    auto e = q_.pop();
    const TimeNs now = e.time;
    const Ev& ev = e.payload;
    switch (ev.type) {
      case EvType::OpComplete:
        complete(ev.op, now);
        break;
      case EvType::IssueDone:
      case EvType::CpuResume:
        // The CPU acts after every GPU event at the same time (it sees completions at <= now).
        if (!q_.empty() && q_.next_time() == now) {
          q_.schedule(now, ev);
          break;
        }
        if (ev.type == EvType::IssueDone) issue_done(ev.op, now);
        cpu_begin(now);
        break;
    }
  }
  for (int i = 0; i < n_; ++i)
    if (!completed_[i]) throw std::logic_error("execute: op " + std::to_string(i) + " never completed");

  SimResult r;
  r.notes = p.notes;
  fill_results(r);
  return r;
}

// Runs the CPU from `now`: begins issuing op cpu_op_, or blocks on its first incomplete cpu_wait.
// When the issue would end strictly before the next pending event, nothing can happen on the GPU in
// between, so the issue is completed at once instead of through the event queue (same result, fewer
// events: the CPU usually runs ahead of the GPU).
void Engine::cpu_begin(TimeNs now) {
  while (cpu_op_ < n_) {
    const int i = cpu_op_;
    auto first_incomplete = [&](const FlatList<int>& list, const std::vector<int>& begin) {
      for (int k = begin[i], e = begin[i + 1]; k < e; ++k)
        if (!completed_[list[k]]) return list[k];
      return -1;
    };
    int w = first_incomplete(cpu_wait_list_, cpu_wait_begin_);
    if (w < 0 && (kind_flags_[i] & kCpuOp)) w = first_incomplete(wait_list_, wait_begin_);
    if (w >= 0) {
      if (!cpu_blocked_) {
        cpu_blocked_ = true;
        cpu_blocked_since_ = now;
      }
      cpu_blocked_on_ = w;
      return;
    }
    if (cpu_blocked_) {
      cpu_blocked_ = false;
      cpu_blocked_on_ = -1;
      cpu_blocked_total_ += now - cpu_blocked_since_;
      if (o_->record_trace && now > cpu_blocked_since_) {
        const Op& op = p_->ops[i];
        trace_.push_back(TraceSpan{"blocked before " + op.name, "cpu", "cpu_blocked", op.unit,
                                   cpu_blocked_since_, now - cpu_blocked_since_, 0});
      }
    }
    cpu_start_t_[i] = now;
    const TimeNs done = now + cpu_ns_[i] + ((kind_flags_[i] & kCpuOp) ? gpu_ns_[i] : 0);
    if (!q_.empty() && q_.next_time() <= done) {
      q_.schedule(done, Ev{EvType::IssueDone, i});
      return;
    }
    issue_done(i, done);
    now = done;
  }
}

void Engine::issue_done(int i, TimeNs now) {
  if (alloc_begin_[i] != alloc_begin_[i + 1]) {
    mem_.process_events([this](std::int64_t ev) { return completed_[ev] != 0; });
    for (int k = alloc_begin_[i], e = alloc_begin_[i + 1]; k < e; ++k) mem_.alloc(alloc_list_[k], i, now);
  }
  issue_t_[i] = now;
  if (kind_flags_[i] & kCpuOp) {
    // Ran on the CPU during [cpu_start + issue cost, now).
    start_t_[i] = cpu_start_t_[i] + cpu_ns_[i];
    end_t_[i] = now;
    completed_[i] = 1;
    mem_.op_completed(i);
    if (o_->record_trace) {
      const Op& op = p_->ops[i];
      add_span(op, "cpu", op_kind_name(op.kind), start_t_[i], now - start_t_[i], 0);
    }
    wake_dependents(i, now);
  } else {
    if (o_->record_trace && cpu_ns_[i] > 0)
      add_span(p_->ops[i], "cpu", "cpu_issue", cpu_start_t_[i], now - cpu_start_t_[i], 0);
    try_start(op_stream_[i], now);
  }
  for (int k = free_begin_[i], e = free_begin_[i + 1]; k < e; ++k) {
    const FreeSpec& f = free_list_[k];
    bool done = f.reuse_after_op >= 0 && completed_[f.reuse_after_op];
    mem_.free(f.buffer, f.reuse_after_op, done, i, now);
  }
  ++cpu_op_;
}

void Engine::start(int h, TimeNs now) {
  const int s = op_stream_[h];
  ++stream_head_[s];
  stream_busy_[s] = h;
  start_t_[h] = now;
  if (s == 0) {
    TimeNs ready = std::max(stream_prev_end_[0], issue_t_[h]);
    if (now > ready) compute_gaps_.emplace_back(ready, now);
  }
  const std::uint8_t f = kind_flags_[h];
  if (f & kCollective) {
    const int g = op_group_[h];
    ++group_head_[g];
    group_busy_[g] = true;
    if (comm_active_++ == 0) {
      comm_start_ = now;
      if (use_slowdown_) retime(now, slowdown_);
    }
  }
  TimeNs end;
  if (use_slowdown_ && (f & kSlowable)) {
    remaining_[h] = static_cast<double>(gpu_ns_[h]);
    seg_start_[h] = now;
    running_slowable_.push_back(h);
    end = now + round_ns(remaining_[h] * factor_);
  } else {
    end = now + gpu_ns_[h];
  }
  q_.schedule(end, Ev{EvType::OpComplete, h});
}

void Engine::retime(TimeNs now, double new_factor) {
  for (int r : running_slowable_) {
    double done = static_cast<double>(now - seg_start_[r]) / factor_;
    remaining_[r] = std::max(0.0, remaining_[r] - done);
    seg_start_[r] = now;
    TimeNs end = now + round_ns(remaining_[r] * new_factor);
    const bool moved = q_.reschedule(end, [r](const Ev& e) { return e.op == r && e.type == EvType::OpComplete; });
    if (!moved) [[unlikely]] throw std::logic_error("execute: running op " + std::to_string(r) + " has no completion event");
  }
  q_.refresh_min();
  factor_ = new_factor;
}

void Engine::complete(int h, TimeNs now) {
  const int s = op_stream_[h];
  completed_[h] = 1;
  mem_.op_completed(h);
  end_t_[h] = now;
  stream_busy_[s] = -1;
  stream_prev_end_[s] = now;
  if (s == 0) compute_busy_ += now - start_t_[h];
  const std::uint8_t f = kind_flags_[h];
  if (use_slowdown_ && (f & kSlowable)) {
    auto it = std::find(running_slowable_.begin(), running_slowable_.end(), h);
    running_slowable_.erase(it);
  }
  if (f & kCollective) {
    group_busy_[op_group_[h]] = false;
    if (--comm_active_ == 0) {
      comm_intervals_.emplace_back(comm_start_, now);
      if (use_slowdown_) retime(now, 1.0);
    }
  }
  if (o_->record_trace) {
    const Op& op = p_->ops[h];
    Bytes bytes = (f & kCollective) ? op.comm_bytes : op.copy_bytes;
    add_span(op, p_->streams[s].name, op_kind_name(op.kind), start_t_[h], now - start_t_[h], bytes);
  }
  if (cpu_blocked_ && cpu_blocked_on_ == h) q_.schedule(now, Ev{EvType::CpuResume, h});
  // What can start now: the next op of this stream, the ops waiting on this one, and the next
  // collective of this NCCL queue. (Being issued is handled in issue_done.)
  try_start(s, now);
  wake_dependents(h, now);
  if (f & kCollective) {
    const int g = op_group_[h];
    if (group_head_[g] < group_begin_[g + 1]) try_start(op_stream_[group_list_[group_head_[g]]], now);
  }
}

void Engine::add_span(const Op& op, const std::string& track, const char* kind, TimeNs start, TimeNs dur,
                      Bytes bytes) {
  trace_.push_back(TraceSpan{op.name, track, kind, op.unit, start, dur, bytes});
}

}  // namespace

TimeNs intersect_length(const std::vector<std::pair<TimeNs, TimeNs>>& a,
                        const std::vector<std::pair<TimeNs, TimeNs>>& b) {
  TimeNs total = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    TimeNs lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) total += hi - lo;
    if (a[i].second < b[j].second) ++i;
    else ++j;
  }
  return total;
}

namespace {

void Engine::fill_results(SimResult& r) {
  TimeNs step = 0;
  for (int i = 0; i < n_; ++i) step = std::max(step, end_t_[i]);
  r.step_time_ns = step;
  r.compute_ns = compute_busy_;
  TimeNs comm = 0;
  for (const auto& [a, b] : comm_intervals_) comm += b - a;
  r.comm_ns = comm;
  r.exposed_comm_ns = intersect_length(compute_gaps_, comm_intervals_);
  r.cpu_blocked_ns = cpu_blocked_total_;
  std::int64_t ag = 0, rs = 0, ar = 0;
  for (int i = 0; i < n_; ++i) {
    if (!(kind_flags_[i] & kCollective)) continue;
    const Op& op = p_->ops[i];
    const std::int64_t n = op.group_size;
    const std::int64_t sent = op.comm_bytes * (n - 1) / n;   // ring: (n−1)/n·S per rank (N1)
    if (op.kind == OpKind::AllGather) ag += sent;
    else if (op.kind == OpKind::ReduceScatter) rs += sent;
    else ar += 2 * op.comm_bytes * (n - 1) / n;
  }
  r.comm_bytes_by_kind["all_gather"] = ag;
  r.comm_bytes_by_kind["reduce_scatter"] = rs;
  r.comm_bytes_by_kind["all_reduce"] = ar;
  mem_.fill(r, o_->max_timeline_samples);
  if (o_->record_trace) {
    std::stable_sort(trace_.begin(), trace_.end(),
                     [](const TraceSpan& a, const TraceSpan& b) { return a.start_ns < b.start_ns; });
    r.trace = std::move(trace_);
    trace_ = {};
  }
}

}  // namespace

namespace {
// compute_op_costs into `c` (its vectors' storage reused).
void fill_op_costs(const StepProgram& program, const CostModel& cost, OpCosts& c) {
  const std::size_t n = program.ops.size();
  c.gpu_ns.resize(n);
  c.cpu_ns.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Op& op = program.ops[i];
    c.gpu_ns[i] = cost.op_time(op);
    c.cpu_ns[i] = cost.cpu_issue_time(op);
    if (c.gpu_ns[i] < 0)
      throw InputError("cost_model.op_time(ops[" + std::to_string(i) + "])", std::to_string(c.gpu_ns[i]), ">= 0 ns");
    if (c.cpu_ns[i] < 0)
      throw InputError("cost_model.cpu_issue_time(ops[" + std::to_string(i) + "])", std::to_string(c.cpu_ns[i]),
                       ">= 0 ns");
  }
  c.overlap_slowdown = cost.overlap_slowdown();
  if (!std::isfinite(c.overlap_slowdown) || c.overlap_slowdown < 1.0 || c.overlap_slowdown > 100.0)
    throw InputError("cost_model.overlap_slowdown", std::to_string(c.overlap_slowdown), "a factor in [1, 100]");
}
}  // namespace

OpCosts compute_op_costs(const StepProgram& program, const CostModel& cost) {
  OpCosts c;
  fill_op_costs(program, cost, c);
  return c;
}

SimResult execute(const StepProgram& program, const OpCosts& costs, const ExecOptions& opts) {
  detail::check_streams_and_buffers(program);   // validate_program's per-op checks run in the engine's first pass
  // One engine per thread, reused (see the note at the top); a nested call gets its own.
  thread_local Engine engine;
  thread_local bool in_use = false;
  if (in_use) {
    Engine local;
    return local.run(program, costs, opts);
  }
  in_use = true;
  struct Release {
    bool& flag;
    ~Release() { flag = false; }
  } release{in_use};
  return engine.run(program, costs, opts);
}

SimResult execute(const StepProgram& program, const CostModel& cost, const ExecOptions& opts) {
  // The costs live only for this call: one per-thread OpCosts keeps its storage (a nested call, which
  // nothing makes today, gets its own).
  thread_local OpCosts costs;
  thread_local bool in_use = false;
  if (in_use) return execute(program, compute_op_costs(program, cost), opts);
  in_use = true;
  struct Release {
    bool& flag;
    ~Release() { flag = false; }
  } release{in_use};
  fill_op_costs(program, cost, costs);
  return execute(program, costs, opts);
}

}  // namespace fsdpsim::sim

// The reference engine (sim/reference_engine.h). Each rule below is one sentence of the semantics at the
// top of program/step_program.h and sim/executor.cpp, written as directly as it reads:
//  * events are ordered by (time, sequence); a rescheduled event takes a fresh sequence number; the CPU's
//    events (an issue ending, a resume) run after every other event of the same time (it sees every GPU
//    completion at a time <= its own);
//  * the CPU issues ops in program order: it blocks until the op's cpu_waits (a CPU op: its waits too)
//    have completed and, for a GPU op, until its stream's launch queue has room; the issue costs cpu_ns
//    (a CPU op also runs its gpu_ns on the CPU); at its end the op is enqueued (a CPU op is done);
//  * a GPU op starts when it is issued, its stream's previous op has completed, its waits have completed
//    and, for a collective, it is its process group's oldest unfinished collective; it runs gpu_ns, SM
//    kernels slowed by overlap_slowdown while a collective runs (re-timed when the number of running
//    collectives goes 0 -> 1 or 1 -> 0);
//  * memory, replayed afterwards for a first and a steady step in program order at each op's issue time:
//    pending record_stream blocks whose op completed by then return to their pools, then the op's allocs
//    with its frees inside the op among them, then its other frees (a record_stream free whose op has not
//    completed by the issue stays pending).
#include "sim/reference_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "common/errors.h"
#include "memory/caching_allocator.h"
#include "program/program_check.h"
#include "sim/compiled_program.h"

namespace fsdpsim::sim {
namespace {

enum class Ev { Complete, IssueDone, CpuResume };
enum class State { NotIssued, Issued, Running, Done };

// round half away from zero, as std::llround
TimeNs round_ns(double x) { return static_cast<TimeNs>(std::llround(x)); }

class Reference {
 public:
  Reference(const StepProgram& p, const OpCosts& c) : p_(p), c_(c), n_(static_cast<int>(p.ops.size())) {}

  SimResult run(const ExecOptions& o) {
    const int ns = static_cast<int>(p_.streams.size());
    state_.assign(n_, State::NotIssued);
    issue_.assign(n_, 0);
    start_.assign(n_, 0);
    cpu_start_.assign(n_, 0);
    complete_.assign(n_, std::numeric_limits<TimeNs>::max());
    remaining_.assign(n_, 0.0);
    seg_start_.assign(n_, 0);
    queued_.assign(ns, 0);
    streams_.assign(ns, {});
    head_.assign(ns, 0);
    depth_ = c_.launch_queue_depth > 0 ? c_.launch_queue_depth : std::numeric_limits<std::int64_t>::max() / 4;
    dependents_.assign(n_, {});
    for (int i = 0; i < n_; ++i) {
      const Op& op = p_.ops[i];
      if (op.kind != OpKind::CpuOptimizerStep)
        for (int w : op.waits) dependents_[w].push_back(i);
      if (op.kind != OpKind::CpuOptimizerStep) streams_[op.stream].push_back(i);
      if (is_collective(op.kind)) groups_[static_cast<int>(op.group)].push_back(i);
    }
    if (n_ > 0) cpu(0);
    while (!events_.empty()) {
      const auto [t, seq, type, op] = *events_.begin();
      events_.erase(events_.begin());
      if (type == Ev::Complete) {
        complete(op, t);
        continue;
      }
      if (!events_.empty() && std::get<0>(*events_.begin()) == t) {   // the CPU acts after the GPU's events
        schedule(t, type, op);
        continue;
      }
      if (type == Ev::IssueDone) issue_done(op, t);
      cpu(t);
    }
    for (int i = 0; i < n_; ++i)
      if (state_[i] != State::Done) throw std::logic_error("reference engine: op " + std::to_string(i) + " never completed");

    SimResult r;
    r.step_time_ns = step_end_;
    r.compute_ns = compute_busy_;
    for (const auto& [a, b] : comm_intervals_) r.comm_ns += b - a;
    const TimeNs idle_from = std::max(compute_prev_end_, n_ > 0 ? issue_[n_ - 1] : 0);
    if (step_end_ > idle_from) gaps_.emplace_back(idle_from, step_end_);
    r.exposed_comm_ns = intersect_length(gaps_, comm_intervals_);
    r.cpu_blocked_ns = blocked_total_;
    r.cpu_issue_ns = cpu_issue_total(c_);
    memory(o, r);
    return r;
  }

 private:
  using Event = std::tuple<TimeNs, std::uint64_t, Ev, int>;

  void schedule(TimeNs t, Ev type, int op) { events_.insert(Event{t, seq_++, type, op}); }
  bool done(int op) const { return state_[op] == State::Done; }
  const Op& op(int i) const { return p_.ops[i]; }
  int head(int s) const {
    const auto& v = streams_[s];
    return head_[s] < v.size() ? v[head_[s]] : -1;
  }
  int group_head(int g) const { return ghead_[g] < groups_[g].size() ? groups_[g][ghead_[g]] : -1; }

  // ---- the CPU ----
  void cpu(TimeNs now) {
    while (cpu_op_ < n_) {
      const int i = cpu_op_;
      const Op& o = op(i);
      const bool cpu_op = o.kind == OpKind::CpuOptimizerStep;
      int w = -1;
      for (int x : o.cpu_waits)
        if (w < 0 && !done(x)) w = x;
      if (cpu_op)
        for (int x : o.waits)
          if (w < 0 && !done(x)) w = x;
      if (w < 0 && !cpu_op) w = queue_wait(i);
      if (w >= 0) {
        if (!blocked_) {
          blocked_ = true;
          blocked_since_ = now;
        }
        blocked_on_ = w;
        return;
      }
      if (blocked_) {
        blocked_ = false;
        blocked_on_ = -1;
        blocked_total_ += now - blocked_since_;
        const int h0 = head(0);
        if (cpu_op && (h0 < 0 || state_[h0] == State::NotIssued)) {
          const TimeNs ready = std::max(compute_prev_end_, blocked_since_);
          if (now > ready) gaps_.emplace_back(ready, now);
        }
      }
      cpu_start_[i] = now;
      const TimeNs end = now + c_.cpu_ns[i] + (cpu_op ? c_.gpu_ns[i] : 0);
      if (!events_.empty() && std::get<0>(*events_.begin()) <= end) {
        schedule(end, Ev::IssueDone, i);
        return;
      }
      issue_done(i, end);
      now = end;
    }
  }
  // The op whose completion makes room for op i in its stream's launch queue (-1: room now).
  int queue_wait(int i) const {
    const int s = op(i).stream;
    std::int64_t queued = queued_[s];
    const int launches = op(i).kernel_launches;
    if (queued + launches <= depth_ || queued == 0) return -1;
    const auto& v = streams_[s];
    for (std::size_t k = head_[s]; k < v.size(); ++k) {
      queued -= op(v[k]).kernel_launches;
      if (queued + launches <= depth_ || queued == 0) return v[k];
    }
    throw std::logic_error("reference engine: a launch queue that never drains");
  }
  void issue_done(int i, TimeNs now) {
    issue_[i] = now;
    if (op(i).kind == OpKind::CpuOptimizerStep) {
      start_[i] = cpu_start_[i] + c_.cpu_ns[i];
      state_[i] = State::Done;
      complete_[i] = now;
      step_end_ = std::max(step_end_, now);
      wake_dependents(i, now);
    } else {
      state_[i] = State::Issued;
      queued_[op(i).stream] += op(i).kernel_launches;
      try_start(op(i).stream, now);
    }
    ++cpu_op_;
  }

  // ---- the GPU ----
  void try_start(int s, TimeNs now) {
    const int h = head(s);
    if (h < 0 || state_[h] != State::Issued) return;
    for (int w : op(h).waits)
      if (!done(w)) return;
    if (is_collective(op(h).kind) && group_head(static_cast<int>(op(h).group)) != h) return;
    start(h, now);
  }
  void wake_dependents(int h, TimeNs now) {   // the GPU ops waiting on h, in program order
    for (int i : dependents_[h]) try_start(op(i).stream, now);
  }
  void start(int h, TimeNs now) {
    const Op& o = op(h);
    state_[h] = State::Running;
    start_[h] = now;
    if (o.stream == 0) {
      const TimeNs ready = std::max(compute_prev_end_, issue_[h]);
      if (now > ready) gaps_.emplace_back(ready, now);
    }
    if (is_collective(o.kind) && comm_active_++ == 0) {
      comm_start_ = now;
      if (c_.overlap_slowdown != 1.0) retime(now, c_.overlap_slowdown);
    }
    TimeNs end = now + c_.gpu_ns[h];
    if (c_.overlap_slowdown != 1.0 && is_slowable(o.kind)) {
      remaining_[h] = static_cast<double>(c_.gpu_ns[h]);
      seg_start_[h] = now;
      slowed_.push_back(h);
      end = now + round_ns(remaining_[h] * factor_);
    }
    schedule(end, Ev::Complete, h);
  }
  void retime(TimeNs now, double factor) {
    for (int r : slowed_) {
      const double ran = static_cast<double>(now - seg_start_[r]) / factor_;
      remaining_[r] = std::max(0.0, remaining_[r] - ran);
      seg_start_[r] = now;
      auto it = std::find_if(events_.begin(), events_.end(),
                             [r](const Event& e) { return std::get<2>(e) == Ev::Complete && std::get<3>(e) == r; });
      if (it == events_.end()) throw std::logic_error("reference engine: a running op without its completion");
      events_.erase(it);
      schedule(now + round_ns(remaining_[r] * factor), Ev::Complete, r);
    }
    factor_ = factor;
  }
  void complete(int h, TimeNs now) {
    const Op& o = op(h);
    const int s = o.stream;
    state_[h] = State::Done;
    complete_[h] = now;
    step_end_ = std::max(step_end_, now);
    ++head_[s];
    queued_[s] -= o.kernel_launches;
    if (s == 0) {
      compute_prev_end_ = now;
      compute_busy_ += now - start_[h];
    }
    if (c_.overlap_slowdown != 1.0 && is_slowable(o.kind)) slowed_.erase(std::find(slowed_.begin(), slowed_.end(), h));
    if (is_collective(o.kind)) {
      ++ghead_[static_cast<int>(o.group)];
      if (--comm_active_ == 0) {
        comm_intervals_.emplace_back(comm_start_, now);
        if (c_.overlap_slowdown != 1.0) retime(now, 1.0);
      }
    }
    if (blocked_ && blocked_on_ == h) schedule(now, Ev::CpuResume, h);
    try_start(s, now);
    wake_dependents(h, now);
    if (is_collective(o.kind)) {
      const int next = group_head(static_cast<int>(o.group));
      if (next >= 0) try_start(op(next).stream, now);
    }
  }

  // ---- memory: a first and a steady step, at the ops' issue times ----
  void memory(const ExecOptions& o, SimResult& r) {
    AllocatorConfig config{o.memory_capacity};
    if (o.max_split_size > 0) config.max_split_size = o.max_split_size;
    config.expandable_segments = o.expandable_segments;
    CachingAllocator a(config);
    const std::size_t nb = p_.buffers.size();
    std::vector<int> block(nb, kNotLive);
    Bytes peak_alloc = -1, peak_res = -1;
    int alloc_op = -1, res_op = -1;
    auto note = [&](int i) {
      if (a.stats().allocated > peak_alloc) peak_alloc = a.stats().allocated, alloc_op = i;
      if (a.stats().peak_reserved > peak_res) peak_res = a.stats().peak_reserved, res_op = i;
    };
    allocate_before_first_step(p_, a, block);
    note(-1);
    for (int step = 1; step <= 2; ++step) {
      if (step == 2) {
        r.first_step_peak_allocated = a.stats().peak_allocated;
        r.first_step_peak_reserved = a.stats().peak_reserved;
        r.first_step_peak_allocated_at.op = alloc_op;
        r.first_step_peak_reserved_at.op = res_op;
        a.reset_peaks();
        peak_alloc = a.stats().allocated;
        peak_res = a.stats().reserved;
        alloc_op = res_op = -1;
      }
      // A record_stream block waits on op j of this step (event n + j) or of the first (event j: done).
      const std::int64_t base = step == 1 ? 0 : n_;
      for (int i = 0; i < n_; ++i) {
        const Op& x = op(i);
        const TimeNs t = issue_[i];
        const auto completed = [&](int j) {
          return j < i ? complete_[j] <= t : x.kind == OpKind::CpuOptimizerStep;
        };
        if (!x.allocs.empty())
          a.process_events([&](std::int64_t e) { return e < base || completed(static_cast<int>(e - base)); });
        const auto alloc = [&](int b) {
          const Buffer& buf = p_.buffers[b];
          if (block[b] != kNotLive) {
            if (step == 2 && buf.first_step_lazy) return;
            throw InputError("program.ops[" + std::to_string(i) + "].allocs", std::to_string(b), "a buffer that is not allocated");
          }
          block[b] = a.alloc(buf.bytes, buf.pool_stream);
          note(i);
        };
        const auto free = [&](const FreeSpec& f) {
          if (block[f.buffer] == kNotLive)
            throw InputError("program.ops[" + std::to_string(i) + "].frees", std::to_string(f.buffer), "a live buffer");
          const int j = f.reuse_after_op;
          if (j < 0 || completed(j)) a.free_live(block[f.buffer]);
          else a.free_after(block[f.buffer], base + j);
          block[f.buffer] = kNotLive;
        };
        for (std::size_t k = issue_memory(x, alloc, free); k < x.frees.size(); ++k) free(x.frees[k]);
      }
    }
    r.peak_allocated = a.stats().peak_allocated;
    r.peak_reserved = a.stats().peak_reserved;
    r.peak_allocated_at.op = alloc_op;
    r.peak_reserved_at.op = res_op;
    r.alloc_retries = a.stats().num_alloc_retries;
  }

  static constexpr int kNotLive = -2;   // (-1: a live 0-byte buffer, the allocator's null block)
  const StepProgram& p_;
  const OpCosts& c_;
  const int n_;
  std::set<Event> events_;
  std::uint64_t seq_ = 0;
  std::vector<State> state_;
  std::vector<TimeNs> issue_, start_, cpu_start_, complete_;
  std::vector<double> remaining_;
  std::vector<TimeNs> seg_start_;
  std::vector<int> slowed_;   // running slowable ops, in start order
  double factor_ = 1.0;
  std::vector<std::vector<int>> dependents_;   // per op: the GPU ops that wait on it, in program order
  std::vector<std::vector<int>> streams_;   // per stream: its GPU ops in program order
  std::vector<std::size_t> head_;           // per stream: the index of its first unfinished op
  std::vector<int> groups_[4];                // per process group: its collectives
  std::size_t ghead_[4] = {0, 0, 0, 0};
  std::vector<std::int64_t> queued_;
  std::int64_t depth_ = 0;
  int comm_active_ = 0;
  TimeNs comm_start_ = 0, compute_prev_end_ = 0, compute_busy_ = 0, step_end_ = 0;
  std::vector<std::pair<TimeNs, TimeNs>> comm_intervals_, gaps_;
  int cpu_op_ = 0;
  bool blocked_ = false;
  int blocked_on_ = -1;
  TimeNs blocked_since_ = 0, blocked_total_ = 0;
};

}  // namespace

// Before the first step (StepProgram::init_flatten_world): the persistent buffers, FSDP1's FlatParameters flattened
// whole then sharded while their original parameters are held (the root's last; offloaded ones then moved to the
// CPU), the after_construction buffers, the cache emptied (FSDP1's construction), then the lazy init's requests.
void allocate_before_first_step(const StepProgram& p, CachingAllocator& a, std::vector<int>& block) {
  const std::size_t nb = p.buffers.size();
  block.resize(nb, -1);
  const bool construct = p.init_flatten_world >= 1;
  const auto constructed = [&](const Buffer& buf) { return construct && buf.category == MemCategory::ShardedParams; };
  for (std::size_t b = 0; b < nb; ++b) {
    const Buffer& buf = p.buffers[b];
    if (buf.persistent && !buf.first_step_lazy && !buf.after_construction && !constructed(buf))
      block[b] = a.alloc(buf.bytes, buf.pool_stream);
  }
  // The after_construction buffers in buffer order, with StepProgram::loop_setup's temporaries around them.
  bool temporaries = false;
  const auto loop_inputs = [&] {
    std::size_t next = 0;
    const auto make_next = [&] {
      while (next < nb && !p.buffers[next].after_construction) ++next;
      if (next < nb) block[next] = a.alloc(p.buffers[next].bytes, p.buffers[next].pool_stream);
      ++next;
    };
    if (p.loop_setup.empty()) {
      while (next < nb) make_next();
      return;
    }
    std::vector<int> made;
    for (const LoopSetupCall& c : p.loop_setup) {
      if (c.kind == LoopSetupCall::Buffer) {
        make_next();
      } else if (c.kind == LoopSetupCall::Temporary) {
        temporaries = true;
        made.push_back(a.alloc(c.bytes, c.pool_stream));
      } else {
        a.free(made.at(static_cast<std::size_t>(c.temporary)));
      }
    }
  };
  if (construct) {
    // (b: a buffer's index, or nb for an offloaded FlatParameter, whose shard is moved to the CPU once made)
    const auto flatten_then_shard = [&](std::size_t b, Bytes bytes, int pool, int originals_index) {
      std::vector<int> originals;
      if (originals_index >= 0)
        for (Bytes o : p.init_originals.at(static_cast<std::size_t>(originals_index))) originals.push_back(a.alloc(o, pool));
      const int whole = p.init_flatten_world > 1 ? a.alloc(bytes * p.init_flatten_world, pool) : -1;
      const int shard = a.alloc(bytes, pool);
      a.free(whole);   // (-1: none)
      if (b < nb) block[b] = shard;
      else a.free(shard);
      for (int o : originals) a.free(o);
    };
    const auto buffer = [&](std::size_t b) {
      const Buffer& buf = p.buffers[b];
      flatten_then_shard(b, buf.bytes, buf.pool_stream, buf.init_originals);
    };
    const auto last = static_cast<std::size_t>(p.init_flatten_last);   // (-1: past every buffer)
    for (std::size_t b = 0; b < nb; ++b) {
      const Buffer& buf = p.buffers[b];
      if (buf.persistent && !buf.first_step_lazy && constructed(buf) && b != last) buffer(b);
    }
    if (last < nb && constructed(p.buffers[last])) buffer(last);
    for (const InitOffloaded& o : p.init_offloaded) flatten_then_shard(nb, o.bytes, o.pool_stream, o.originals);
    loop_inputs();
    a.empty_cache();
    a.reset_peaks();
  } else {
    loop_inputs();
    if (temporaries) {
      a.empty_cache();
      a.reset_peaks();
    }
  }
  for (const InitRequest& q : p.init_scratch) a.free(a.alloc(q.bytes, q.pool_stream));
}

SimResult reference_execute(const StepProgram& program, const OpCosts& costs, const ExecOptions& opts) {
  validate_program(program);
  if (costs.gpu_ns.size() != program.ops.size() || costs.cpu_ns.size() != program.ops.size())
    throw std::invalid_argument("reference_execute: costs sized unlike the program's ops");
  return Reference(program, costs).run(opts);
}

}  // namespace fsdpsim::sim

// The discrete-event executor (sim/executor.h). It implements the execution semantics written at the
// top of program/step_program.h on the event core of sim/event_queue.h:
//
//  * CPU: ops are issued in program order. Issuing op i first blocks until every op in cpu_waits has
//    completed (for CpuOptimizerStep also its `waits`: the CPU cannot step on grads not yet copied),
//    then costs cpu_ns[i] (CpuOptimizerStep: + its duration, it runs on the CPU). At the end of that
//    time the CPU performs the allocs, enqueues the op, performs the frees, and starts on op i+1.
//    The CPU sees every GPU completion at a time <= its own time (an issue event that coincides with
//    other events is re-queued behind them), so "completed by the current CPU time" is exact.
//  * Launch queue: a stream's launch queue holds `launch_queue_depth` kernels (OpCosts; the hardware
//    profile's overheads.launch_queue_depth, default 1024, an assumption: calibrate/launch_queue.h). An
//    op puts its OpRec::launches kernels on its stream's queue when it is enqueued and takes them off
//    when it completes. If issuing op i on stream s would take s past the depth, the CPU first blocks
//    (as on a cpu_wait, counted in cpu_blocked_ns) until enough of the oldest incomplete ops of s have
//    completed; an op with more kernels than the depth waits for an empty queue. Approximations (op
//    granularity): a real launch blocks kernel by kernel, part-way through an op's launches, when one
//    kernel of the stream completes; here the CPU waits before the op's issue begins, for whole ops, and
//    an op's kernels stay queued until its last one completes. Event records and stream waits take no
//    place in the queue. Without this bound the CPU of a program with nothing else to stop it (FSDP1
//    without the rate limiter) ran arbitrarily far ahead of the GPU, and every record_stream'ed block
//    stayed pending (issue 19).
//  * GPU: an op starts when it is issued, its stream has finished the previous op, every op in
//    `waits` has completed, and — for a collective — it is the oldest unstarted collective of its
//    process group and no collective of that group is running (one NCCL queue per group, F1.4).
//  * Overlap slowdown: while at least one collective runs, SM kernels (compute and memory-bound
//    kernels, not host copies) progress at 1/overlap_slowdown of their speed (semantics N5). A running
//    kernel's remaining work (in "alone" nanoseconds, a double) is re-timed whenever the number of
//    running collectives goes 0 -> 1 or 1 -> 0; its completion time is now + llround(remaining ×
//    factor), by moving its pending completion event in place (EventQueue::reschedule: a fresh sequence
//    number, as a cancel + schedule would give, without a stale event left behind).
//  * Memory: sim/memory_tracker.h on the caching-allocator model, for a first and a steady-state step
//    (note "first and steady step" there). The steady step's memory events follow the first step's
//    times shifted by the step time: where memory depends on them (record_stream frees, a timeline)
//    the run records every op's completion time (ops the fast-forward skips complete after every issue:
//    they keep "never", which no issue time reaches) and replays the steady step after the run.
//
// Speed (issue #3): the engine is reused per Workspace (its arrays, event list and memory tracker keep
// their capacity between runs); its hot per-op facts live in one record per op (OpRec) and one flat
// array of lists, built in ONE pass over the program that also runs validate_program's per-op checks
// (the per-stream, per-group and dependents lists are in op order, so they are linked lists appended
// at their tails during that pass); a stream's and an NCCL queue's head stays their head while it
// runs, so "can the head start" is one test of its state; a completion time is rounded with an inline
// llround. None of this changes an event, a time, a sequence number or a byte: the same try_start
// calls happen in the same order as with per-stream busy flags and CSR lists.
//
// Fast-forward (ExecOptions::fast_forward; issue #3). A transformer's blocks repeat, so once the CPU
// has issued every op (after that, allocations, frees, issue times and the CPU are never touched
// again) the run is a pure timing problem over repeated blocks (and, with memory apart, before that
// too: "The CPU still issuing" below). After each event during which an op
// started on the compute stream the engine snapshots its state relative to that moment: every stream's
// and NCCL queue's head and its state, running ops' start times, the pending completions in (time,
// sequence) order, the running SM kernels with their remaining work, the collectives in flight, the
// slowdown factor, the end of the last compute op. When a snapshot b repeats an earlier one a shifted
// by p op ids (every head moved by exactly p, or did not move and is not running) and D = b.t − a.t
// ns, the evolution from b is the evolution from a shifted, for as long as the ops it reads are the
// shifts of those read between a and b (same stream, kind, queue and duration; waits, next op of the
// stream and queue, and woken streams shifted or equivalent) and every head that did not move stays
// blocked. The engine checks that for each further period j, takes the largest number m that passes,
// and jumps: the ops in between are marked done; heads, running ops and pending completions move by
// m·p ids and m·D ns; compute busy time grows by m times one period's, the collective-busy and
// compute-gap intervals of the period are repeated, shifted. Times are integer ns and every quantity
// the engine computes from them is relative (now + duration, remaining work as alone-ns), so a shifted
// state evolves to exactly the shifted result: the fast-forward changes no figure (tests/sim/
// test_fast_forward.cpp compares whole results with it on and off). Runs with a trace simulate every
// op (the trace has a span per op).
//
// The CPU still issuing. With the launch queue bounded, the CPU of a long program is usually still
// issuing, a queue's length ahead of the GPU, until near the end of the step. When memory is replayed
// apart ("memory apart": no allocation or free waits on the GPU) and there is no trace, issuing an op
// only sets its issue time and state and fills its launch queue, so the snapshots also hold the CPU:
// its op (moved by p too), its block (on the op p further, for as long, and whether on a full queue),
// an issue in progress and the launch queues' contents (and, as always, the issue time of a waiting
// compute-stream head, which start() reads). The checks add what the CPU read between a and b: the ops it
// issued, from a's CPU op to b's (same kind, stream — a moving one —, issue cost, launches, CPU waits
// shifted or equivalent), and, if it waits for room at b, the queue's ops up to the one it waits for;
// the ops' launches are compared where the GPU's are (the queue walks read those). The jump marks the
// skipped periods' ops issued, each a period after the op p before it, and moves the CPU's op, block and
// blocked time. With a memory timeline the fast-forward waits until the CPU is done (every sample is
// recorded).
//
// Memory with the issues. Where memory is replayed with the issues (record_stream frees: FSDP1) the
// CPU's allocations depend on the GPU's progress, and the memory is part of the compared state: the
// snapshot also holds the allocator's blocks with the buffer in each and the event each pending block
// waits on (MemoryTracker::Shape, sim/memory_shift.cpp), the checks add the issued ops' allocations and
// frees (the same buffer facts, each freed buffer the one p ops after, each record_stream free's op
// behaving alike: ff_same_memory), and the jump renames the period's buffers and pending events m·p ops
// on (MemoryTracker::shift_periods); it is recorded, and the steady step's replay (replay_timed) skips
// the same periods where its memory and times repeat there too. Such periods are whole micro-batches:
// inside one, a block's activations make the memory grow, so a run of blocks never repeats it.
// Long periods. A micro-batch has more compute-stream boundaries than the ring of recent snapshots
// holds, so the run of whole micro-batches (the longest run of the stretched program whose periods
// span many boundaries) gets one snapshot per period as the compute stream enters it, compared with the
// period's before (ff_long); with memory apart this skips whole micro-batches of the timing as well.
//
// Definitions of the outputs:
//  * step_time_ns: the latest completion of any op (GPU or CPU), from t = 0 when the CPU starts.
//  * compute_ns: busy time of stream 0 (the compute / default stream).
//  * comm_ns: length of the union of the intervals during which at least one collective runs.
//  * exposed_comm_ns: the time the step waits on other streams, intersected with the collective-busy
//    intervals (idle time during which some collective is in flight — usually the one waited on,
//    directly or through a copy). The step waits (1) for each op X on the compute stream in
//    [ready(X), start(X)), ready(X) = max(end of the previous compute-stream op, issue time of X): the
//    compute stream is idle only because X waits on another stream's op; (2) for a CPU op X (the
//    offloaded optimizer step) that the CPU blocked on, in [max(end of the last compute-stream op, the
//    time the CPU reached X), start(X)) when the compute stream has nothing issued meanwhile: with CPU
//    offload the tail reduction and grad D2H are waited on here (F1.13, F2.11), as the GPU optimizer
//    step waits on them without offload; (3) from the later of the compute stream's and the CPU's last
//    op to the step's end, if other work runs past both.
//  * cpu_blocked_ns: total time the CPU spends blocked on cpu_waits (rate limiter, syncs) and on a full
//    launch queue.
//  * comm_bytes_by_kind: bytes each rank sends, nccl-tests N1: AG/RS (n−1)/n·S, AR 2(n−1)/n·S.
#include "sim/executor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "common/errors.h"
#include "sim/event_queue.h"
#include "sim/memory_tracker.h"
#include "sim/peak_location.h"
#include "program/program_check.h"

namespace fsdpsim::sim {

namespace {

constexpr int kNumGroups = 4;   // CommGroup: Shard, Replicate, World, PostForward

// std::llround for |x| < 2^63 (times in ns), inline: round half away from zero. x - trunc(x) is exact
// for every double, so the comparison with 0.5 decides exactly as llround does.
inline TimeNs round_ns(double x) {
  auto i = static_cast<std::int64_t>(x);   // truncation toward zero
  const double frac = x - static_cast<double>(i);
  if (frac >= 0.5) ++i;
  else if (frac <= -0.5) --i;
  return i;
}

enum class EvType : std::uint8_t { OpComplete, IssueDone, CpuResume };
struct Ev {
  EvType type = EvType::OpComplete;
  int op = 0;
};

// One link of a dependents list (Engine::dep_): the next link (-1: the end), and the stream of the op
// that waits (the one try_start looks at when the awaited op completes).
struct DepLink {
  int next = -1;
  int stream = 0;
};

class Engine {
 public:
  // Runs `cp` (its records' run state is overwritten) with op durations gpu_ns / cpu_ns (see OpCosts).
  // `source`, the StepProgram cp was compiled from, names ops and buffers in traces and error messages;
  // a run with a trace needs it.
  SimResult run(CompiledProgram& cp, const TimeNs* gpu_ns, const TimeNs* cpu_ns, double overlap_slowdown,
                int launch_queue_depth, const ExecOptions& o, const StepProgram* source);

 private:
  // ---- setup ----
  void link();
  // ---- CPU ----
  void cpu_begin(TimeNs now);
  [[gnu::always_inline]] inline void issue_done(int i, TimeNs now);   // (inline: once per op)
  int queue_wait(int i) const;
  // ---- GPU ----
  void wake_dependents(int h, TimeNs now) {
    for (int k = dep_[h].next; k >= 0; k = dep_[k].next) try_start(dep_[k].stream, now);
  }
  // Starts the head of stream s if it can start now. The head stays the stream's head while it runs
  // (complete() moves on to the next op), so "the stream is busy" and "the head is not issued yet"
  // are one test: the head's state is not Issued. The stream's end is the sentinel rec_[n_], which is
  // never issued. Likewise the head of an NCCL queue is its running collective, or else the oldest
  // unstarted one, so "the queue is free and this is its oldest unstarted collective" is one test too.
  void try_start(int s, TimeNs now) {
    const int h = stream_head_[s];
    OpRec& r = rec_[h];
    if (r.state != kIssued) return;
    int k = r.wait_pos;
    const int end = r.cpu_waits;
    const int* lists = lists_;
    while (k < end && rec_[lists[k]].state == kDone) ++k;
    r.wait_pos = k;
    if (k < end) return;
    if ((r.flags & kCollective) && group_head_[r.group] != h) return;
    start(h, now);
  }
  void start(int h, TimeNs now);
  [[gnu::always_inline]] inline void complete(int h, TimeNs now);   // (inline: once per op, in the run loop)
  void retime(TimeNs now, double new_factor);
  bool is_done(int op) const { return rec_[op].state == kDone; }
  // ---- fast-forward over repeated blocks (see "Fast-forward" at the top) ----
  struct FfEvent {
    TimeNs dt;            // time - snapshot time
    std::uint64_t seq;
    int op;
    EvType type;
  };
  struct FfSnap {
    TimeNs t = 0;
    TimeNs compute_busy = 0, compute_prev_end = 0, comm_start = 0;   // the last two relative to t
    int comm_active = 0;
    TimeNs head0_ns = 0;                  // duration of the compute op that just started (a cheap first test)
    double factor = 1.0;
    std::size_t n_comm = 0, n_gaps = 0;   // sizes of comm_intervals_ / compute_gaps_
    int group_head[kNumGroups] = {};
    std::vector<int> heads;               // per stream
    std::vector<OpState> head_state;      // per stream: its head's state
    std::vector<TimeNs> head_start;       // per stream: start - t of a running head, else 0
    std::vector<FfEvent> events;          // pending events in (time, seq) order
    std::vector<int> slow;                // running_slowable_, in order
    std::vector<double> slow_rem;         // their remaining_
    std::vector<TimeNs> slow_seg;         // their seg_start_ - t
    // The issue time - t of the compute stream's head when it is issued and waits (0 otherwise): start()
    // reads it. (Any later op of the stream was issued before its predecessor ends: its issue time is
    // never read.)
    TimeNs head0_issue = 0;
    // The CPU (see "The CPU still issuing" at the top): cpu_op_ (n_: done), its block, the launch queues.
    int cpu_op = 0;
    int blocked_on = -1;                  // cpu_blocked_on_ (-1: not blocked)
    bool blocked_queue = false;
    TimeNs blocked_since = 0;             // - t
    TimeNs blocked_total = 0;
    TimeNs cpu_start = 0;                 // an issue in progress (IssueDone pending): its start - t
    std::vector<std::int64_t> queued;
    // Memory replayed with the issues while the CPU issues ("Memory with the issues" at the top).
    bool has_mem = false;
    MemoryTracker::Shape mem;
  };
  struct FfLite {
    TimeNs t;
    int head0;
    TimeNs head0_ns, prev_end;   // the compute op's duration; end of the previous one - t
    int comm_active, events, slow;
    int cpu_lead;                // cpu_op_ - the compute head (-1: the CPU is done)
    std::int64_t queued0;        // the compute stream's launch queue (0: the CPU is done)
  };
  static constexpr int kFfSnaps = 5;
  void ff_boundary(TimeNs now);
  bool ff_take(FfSnap& s, TimeNs now);
  bool ff_same_shape(const FfSnap& a, const FfSnap& b, int p);
  int ff_max_jump(const FfSnap& a, const FfSnap& b, int p);
  bool ff_equivalent(int i, int i2, int d, bool last, const FfSnap& a, bool strict = false) const;
  bool ff_same_wait(int w, int w2, int d, const FfSnap& a, bool strict) const;
  bool ff_cpu_equivalent(int x, int x2, int d, const FfSnap& a, bool strict) const;
  bool ff_cpu_periods(const FfSnap& a, const FfSnap& b, int d, bool strict) const;
  bool ff_same_memory(int x, int x2, int d, const FfSnap& a, bool strict) const;
  bool ff_try(const FfSnap& a, const FfSnap& b);
  int ff_run_jump(const FfSnap& a, const FfSnap& b, int p, int m);
  void ff_jump(const FfSnap& a, const FfSnap& b, int p, int m);
  int list_start(int i) const { return i == 0 ? 0 : rec_[i - 1].end; }
  bool done_at(int x, const FfSnap& a) const {   // x had completed at snapshot a
    return (rec_[x].flags & kCpuOp) ? x < a.cpu_op : x < a.heads[rec_[x].stream];
  }
  // ---- results ----
  void fill_results(SimResult& r);
  void add_span(const Op& op, const std::string& track, const char* kind, TimeNs start, TimeNs dur, Bytes bytes);

  const StepProgram* p_ = nullptr;
  const ExecOptions* o_ = nullptr;
  bool trace_on_ = false;
  int n_ = 0;
  const TimeNs* gpu_ns_ = nullptr;
  const TimeNs* cpu_ns_ = nullptr;
  MemoryTracker mem_;
  // Memory is replayed with the CPU's issues (else in a pass of its own before the run: see run()).
  bool mem_inline_ = true;
  bool mem_ff_ = false;             // mem_inline_ without a timeline, fast-forward on: jumps move the memory
  const CompiledProgram* cp_ = nullptr;
  std::vector<MemoryTracker::PeriodJump> mem_jumps_;   // those jumps, for the steady step
  std::vector<TimeNs> complete_t_;  // (mem_inline_) each op's completion time, for the steady step
  bool fast_issue_ = false;         // !mem_inline_ && !trace_on_ (cpu_begin's tight loop)
  EventQueue<Ev> q_;
  double slowdown_ = 1.0;
  bool use_slowdown_ = false;
  double factor_ = 1.0;             // current progress factor of SM kernels

  // per op (indexed by op id; rec_[n_] is the end-of-list sentinel): the run's CompiledProgram
  OpRec* rec_ = nullptr;
  const int* lists_ = nullptr;      // every op's lists (see OpRec)
  int num_lists_ = 0;
  // Dependents, as linked lists in op order: dep_[i].next (i < n_) is the first link of op i's list;
  // the link of the wait stored at lists_[k] is dep_[n_ + k] (it names the waiting op's stream).
  std::vector<DepLink> dep_;
  std::vector<int> dep_tail_;       // scratch: the last link of each op's dependents list
  std::vector<TimeNs> issue_t_, start_t_, cpu_start_t_;
  std::vector<double> remaining_;
  std::vector<TimeNs> seg_start_;
  TimeNs step_end_ = 0;             // latest completion so far
  int n_done_ = 0;

  // per stream: its head (the running op, else the next to start; n_ when none is left)
  std::vector<int> stream_head_;
  std::vector<int*> stream_link_;   // scratch for link(): the link the stream's next op goes to
  TimeNs compute_prev_end_ = 0;     // end of the last op of the compute stream (0)
  // per NCCL queue (process group): its head (the running collective, else the oldest unstarted one)
  int group_head_[kNumGroups] = {0, 0, 0, 0};
  std::int64_t comm_sent_[3] = {0, 0, 0};   // all_gather, reduce_scatter, all_reduce (N1)
  // Launch queues (see "Launch queue" at the top): per stream, the kernels of its enqueued, incomplete
  // ops. Read only while the CPU issues (the fast-forward, which runs after that, leaves it stale).
  std::vector<std::int64_t> queued_;
  std::int64_t queue_depth_ = 0;    // kernels a queue holds (unbounded: more than any program has)

  std::vector<int> running_slowable_;
  int comm_active_ = 0;
  TimeNs comm_start_ = 0;
  std::vector<std::pair<TimeNs, TimeNs>> comm_intervals_, compute_gaps_;
  TimeNs compute_busy_ = 0;

  // CPU
  int cpu_op_ = 0;
  bool cpu_blocked_ = false;
  bool cpu_blocked_queue_ = false;  // (for the trace) the CPU waits for room in a launch queue
  int cpu_blocked_on_ = -1;
  TimeNs cpu_blocked_since_ = 0;
  TimeNs cpu_blocked_total_ = 0;

  std::vector<TraceSpan> trace_;

  // fast-forward
  const std::vector<PeriodicRun>* runs_ = nullptr;   // the program's runs of identical periods
  bool ff_on_ = false;
  bool started0_ = false;           // an op started on the compute stream during the current event
  FfSnap ff_[kFfSnaps];             // ring of the latest boundary snapshots
  int ff_count_ = 0, ff_next_ = 0;
  FfLite ff_lite_[kFfSnaps] = {};   // ring of the latest boundaries' scalars (all of them)
  // Long periods (memory with the issues): whole micro-batches, whose compute-stream boundaries are too
  // many for the ring; one snapshot per period of the run, as the compute stream enters it.
  const PeriodicRun* long_run_ = nullptr;
  int long_next_ = 0;               // the first op of the next period to snapshot
  int long_count_ = 0;              // snapshots in long_ (0..2; the newest at long_[1])
  FfSnap long_[2];
  bool ff_long(TimeNs now);
  int ff_lite_count_ = 0, ff_lite_next_ = 0;
  std::vector<std::uint8_t> ff_moving_;   // per stream (scratch of a match)
  ExecStats stats_;
};

// Before a run: every op's run state reset, and the per-stream, per-group and dependents lists
// linked. All three are in op order, which is the order in which this pass appends to them, so each is
// a linked list built by appending at its tail: no counting pass, no prefix sums, no second pass. The
// run never touches the (large) Op structs or their scattered vectors.
void Engine::link() {
  const int n = n_;
  const int ns = static_cast<int>(stream_head_.size());
  OpRec* rec = rec_;
  rec[n] = OpRec{};   // the sentinel: never issued
  dep_.resize(static_cast<std::size_t>(n) + static_cast<std::size_t>(num_lists_));
  dep_tail_.resize(n);
  DepLink* dep = dep_.data();
  int* dep_tail = dep_tail_.data();
  const int* lists = lists_;
  // Tails of the stream and group lists: the address of the link to set when the next op comes.
  stream_link_.resize(ns);
  int** stream_link = stream_link_.data();
  for (int s = 0; s < ns; ++s) stream_link[s] = &stream_head_[s];
  int* group_link[kNumGroups];
  for (int g = 0; g < kNumGroups; ++g) group_link[g] = &group_head_[g];
  int pos = 0;
  for (int i = 0; i < n; ++i) {
    OpRec& r = rec[i];
    const int s = r.stream;
    dep[i].next = -1;
    dep_tail[i] = i;
    r.wait_pos = pos;
    for (const int e = r.cpu_waits; pos < e; ++pos) {
      const int w = lists[pos];
      const int link = n + pos;
      dep[link] = DepLink{-1, s};
      dep[dep_tail[w]].next = link;
      dep_tail[w] = link;
    }
    pos = r.end;
    r.state = kNotIssued;
    const std::uint8_t f = r.flags;
    if (!(f & kCpuOp)) {
      *stream_link[s] = i;
      stream_link[s] = &r.next_in_stream;
    }
    if (f & kCollective) {
      const int g = r.group;
      *group_link[g] = i;
      group_link[g] = &r.next_in_group;
    }
  }
  for (int s = 0; s < ns; ++s) *stream_link[s] = n;
  for (int g = 0; g < kNumGroups; ++g) *group_link[g] = n;
}

SimResult Engine::run(CompiledProgram& cp, const TimeNs* gpu_ns, const TimeNs* cpu_ns, double overlap_slowdown,
                      int launch_queue_depth, const ExecOptions& o, const StepProgram* source) {
  p_ = source;
  o_ = &o;
  trace_on_ = o.record_trace;
  if (trace_on_ && !source) throw std::invalid_argument("execute: a trace needs the program's StepProgram");
  if (o.memory_capacity < 0)
    throw InputError("memory_capacity", std::to_string(o.memory_capacity), ">= 0 (0 = unlimited)");
  n_ = cp.num_ops();
  rec_ = cp.ops.data();
  lists_ = cp.lists.data();
  num_lists_ = static_cast<int>(cp.lists.size());
  stream_head_.resize(cp.num_streams);
  link();
  queued_.assign(static_cast<std::size_t>(cp.num_streams), 0);
  queue_depth_ = launch_queue_depth > 0 ? launch_queue_depth : std::numeric_limits<std::int64_t>::max() / 4;
  for (int k = 0; k < 3; ++k) comm_sent_[k] = cp.comm_sent[k];
  runs_ = &cp.runs;
  gpu_ns_ = gpu_ns;
  cpu_ns_ = cpu_ns;
  slowdown_ = overlap_slowdown;
  use_slowdown_ = slowdown_ != 1.0;
  factor_ = 1.0;
  comm_active_ = 0;
  comm_start_ = 0;
  comm_intervals_.clear();
  compute_gaps_.clear();
  running_slowable_.clear();
  compute_busy_ = 0;
  compute_prev_end_ = 0;
  step_end_ = 0;
  n_done_ = 0;
  cpu_op_ = 0;
  cpu_blocked_ = false;
  cpu_blocked_queue_ = false;
  cpu_blocked_on_ = -1;
  cpu_blocked_since_ = 0;
  cpu_blocked_total_ = 0;
  trace_.clear();
  q_.clear();
  ff_on_ = o.fast_forward && !trace_on_;
  started0_ = false;
  ff_count_ = ff_next_ = 0;
  ff_lite_count_ = ff_lite_next_ = 0;
  long_run_ = nullptr;
  long_count_ = 0;
  stats_ = ExecStats{};

  // The op states were reset by link(); the per-op times are written before they are read
  // (issue and cpu_start at issue, start/remaining/seg_start at start), so they keep stale values.
  issue_t_.resize(n_);
  start_t_.resize(n_);
  cpu_start_t_.resize(n_);
  if (use_slowdown_) {
    remaining_.resize(n_);
    seg_start_.resize(n_);
  }
  q_.reserve(64);
  if (trace_on_) trace_.reserve(2 * static_cast<std::size_t>(n_));

  if (o.max_split_size < 0)
    throw InputError("max_split_size", std::to_string(o.max_split_size), ">= 0 bytes (0 = no limit)");
  AllocatorConfig alloc_config{o.memory_capacity};
  if (o.max_split_size > 0) alloc_config.max_split_size = o.max_split_size;
  alloc_config.expandable_segments = o.expandable_segments;
  mem_.start(cp, alloc_config, o.record_memory_timeline, source);
  mem_.allocate_persistent();
  // Memory is a function of the CPU's issue order alone unless a free's block waits on GPU progress
  // (record_stream) or the timeline needs issue times: then it is replayed first, in a pass of its own
  // (which can skip repeated periods), and the run is timing only. The same calls in the same order
  // either way, so every memory figure is the same.
  mem_inline_ = o.record_memory_timeline || cp.record_stream_frees;
  fast_issue_ = !mem_inline_ && !trace_on_;
  mem_ff_ = mem_inline_ && !o.record_memory_timeline && ff_on_;
  cp_ = &cp;
  mem_jumps_.clear();
  if (mem_ff_ || (ff_on_ && fast_issue_)) {
    // The longest run whose periods hold more compute-stream boundaries than the ring keeps.
    for (const PeriodicRun& r : cp.runs)
      if (r.period >= 8 * kFfSnaps && r.count >= 4 && (!long_run_ || r.period > long_run_->period)) long_run_ = &r;
    if (long_run_) long_next_ = long_run_->begin;
  }
  if (!mem_inline_) {
    const bool fold = o.fast_forward && !trace_on_;
    mem_.replay(cp, fold);
    stats_.memory_jumps = mem_.fold_stats().jumps;
    stats_.memory_periods_skipped = mem_.fold_stats().periods_skipped;
    mem_.begin_steady_step();   // the steady step, replayed on the allocator the first step left
    mem_.replay(cp, fold);
    stats_.memory_jumps += mem_.fold_stats().jumps;
    stats_.memory_periods_skipped += mem_.fold_stats().periods_skipped;
  } else {
    complete_t_.assign(static_cast<std::size_t>(n_), std::numeric_limits<TimeNs>::max());
  }
  if (n_ > 0) cpu_begin(0);
  while (!q_.empty()) {
    auto e = q_.pop();
    const TimeNs now = e.time;
    const Ev& ev = e.payload;
    switch (ev.type) {
      case EvType::OpComplete:
        complete(ev.op, now);
        if (started0_) {
          started0_ = false;
          if (ff_on_ && (cpu_op_ == n_ || fast_issue_ || mem_ff_)) ff_boundary(now);
        }
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
  if (n_done_ != n_) [[unlikely]] {
    for (int i = 0; i < n_; ++i)
      if (!is_done(i)) throw std::logic_error("execute: op " + std::to_string(i) + " never completed");
  }
  if (mem_inline_) {
    mem_.begin_steady_step();
    mem_.replay_timed(cp, issue_t_.data(), complete_t_.data(), step_end_, mem_jumps_);
    stats_.steady_periods_shifted = mem_.steady_periods_shifted();
  }

  if (o.stats) *o.stats = stats_;
  SimResult r;
  r.notes = source ? source->notes : cp.notes;
  fill_results(r);
  return r;
}

// Runs the CPU from `now`: begins issuing op cpu_op_, or blocks on its first incomplete cpu_wait.
// When the issue would end strictly before the next pending event, nothing can happen on the GPU in
// between, so the issue is completed at once instead of through the event queue (same result, fewer
// events: the CPU usually runs ahead of the GPU).
void Engine::cpu_begin(TimeNs now) {
  while (cpu_op_ < n_) {
    if (fast_issue_ && !cpu_blocked_) {   // (a blocked CPU resumes through the general path, which ends the block)
      // With memory replayed apart and no trace, issuing an op that waits on nothing on the CPU, is a
      // GPU op, is not its stream's head (so try_start would find nothing new: no event happens in
      // between) and fits in its stream's launch queue only records its issue time, state and queued
      // kernels: a tight loop while the issues end before the next event, exactly what the general path
      // below does for them one by one.
      const TimeNs limit = q_.empty() ? std::numeric_limits<TimeNs>::max() : q_.next_time();
      int i = cpu_op_;
      for (; i < n_; ++i) {
        OpRec& r = rec_[i];
        if (r.cpu_waits != r.allocs || (r.flags & kCpuOp) || stream_head_[r.stream] == i) break;
        std::int64_t& queued = queued_[r.stream];
        if (queued + r.launches > queue_depth_) break;
        const TimeNs done = now + cpu_ns_[i];
        if (done >= limit) break;
        issue_t_[i] = done;
        r.state = kIssued;
        queued += r.launches;
        now = done;
      }
      cpu_op_ = i;
      if (i == n_) return;
    }
    const int i = cpu_op_;
    const OpRec& r = rec_[i];
    const int* lists = lists_;
    auto first_incomplete = [&](int k, int e) {
      for (; k < e; ++k)
        if (!is_done(lists[k])) return lists[k];
      return -1;
    };
    int w = first_incomplete(r.cpu_waits, r.allocs);
    if (w < 0 && (r.flags & kCpuOp)) w = first_incomplete(r.wait_pos, r.cpu_waits);   // (never advanced)
    // (both conditions only become true as ops complete, so the order of the two tests changes nothing)
    const bool queue_full = w < 0 && !(r.flags & kCpuOp) && (w = queue_wait(i)) >= 0;
    if (w >= 0) {
      if (!cpu_blocked_) {
        cpu_blocked_ = true;
        cpu_blocked_since_ = now;
      }
      cpu_blocked_on_ = w;
      cpu_blocked_queue_ = queue_full;
      return;
    }
    if (cpu_blocked_) {
      cpu_blocked_ = false;
      cpu_blocked_on_ = -1;
      cpu_blocked_total_ += now - cpu_blocked_since_;
      // A CPU op (the offloaded optimizer step) waited on other streams while the compute stream had
      // nothing issued: the step waited there, as on a compute-stream op (exposed_comm_ns, above).
      if ((r.flags & kCpuOp) && rec_[stream_head_[0]].state == kNotIssued) {
        const TimeNs ready = std::max(compute_prev_end_, cpu_blocked_since_);
        if (now > ready) compute_gaps_.emplace_back(ready, now);
      }
      if (trace_on_ && now > cpu_blocked_since_) {
        const Op& op = p_->ops[i];
        trace_.push_back(TraceSpan{(cpu_blocked_queue_ ? "launch queue full before " : "blocked before ") + op.name,
                                   "cpu", "cpu_blocked", op.unit, cpu_blocked_since_, now - cpu_blocked_since_, 0});
      }
    }
    cpu_start_t_[i] = now;
    const TimeNs done = now + cpu_ns_[i] + ((r.flags & kCpuOp) ? gpu_ns_[i] : 0);
    if (!q_.empty() && q_.next_time() <= done) {
      q_.schedule(done, Ev{EvType::IssueDone, i});
      return;
    }
    issue_done(i, done);
    now = done;
  }
}

// The op whose completion makes room for GPU op i in its stream's launch queue, or -1 if there is room
// now (or the queue is empty: an op with more kernels than the depth waits only for an empty queue). The
// stream's incomplete ops are the enqueued ones from its head up to i, and they complete in order, so
// that is the first op at which the kernels queued up to it, taken off, leave room.
int Engine::queue_wait(int i) const {
  const OpRec& r = rec_[i];
  std::int64_t queued = queued_[r.stream];
  if (queued + r.launches <= queue_depth_ || queued == 0) return -1;
  for (int h = stream_head_[r.stream];; h = rec_[h].next_in_stream) {
    queued -= rec_[h].launches;
    if (queued + r.launches <= queue_depth_ || queued == 0) return h;
  }
}

void Engine::issue_done(int i, TimeNs now) {
  OpRec& r = rec_[i];
  int frees_after = r.frees;   // (the frees made after enqueueing start there)
  if (mem_inline_ && r.allocs != r.frees) {
    mem_.process_events([this](std::int64_t ev) { return is_done(static_cast<int>(ev)); });
    frees_after = issue_memory(
        lists_, r, [&](int b) { mem_.alloc(b, i, now); }, [&](int b) { mem_.free(b, -1, false, i, now); });
  }
  issue_t_[i] = now;
  if (r.flags & kCpuOp) {
    // Ran on the CPU during [cpu_start + issue cost, now).
    start_t_[i] = cpu_start_t_[i] + cpu_ns_[i];
    r.state = kDone;
    ++n_done_;
    if (mem_inline_) complete_t_[i] = now;
    if (now > step_end_) step_end_ = now;
    mem_.op_completed(i);
    if (trace_on_) {
      const Op& op = p_->ops[i];
      add_span(op, "cpu", op_kind_name(op.kind), start_t_[i], now - start_t_[i], 0);
    }
    wake_dependents(i, now);
  } else {
    r.state = kIssued;
    queued_[r.stream] += r.launches;
    if (trace_on_ && cpu_ns_[i] > 0)
      add_span(p_->ops[i], "cpu", "cpu_issue", cpu_start_t_[i], now - cpu_start_t_[i], 0);
    try_start(r.stream, now);
  }
  if (mem_inline_) {
    for (int k = frees_after, e = r.end; k < e; k += 2) {
      const int buffer = lists_[k], reuse_after_op = lists_[k + 1];
      const bool reusable = reuse_after_op >= 0 && is_done(reuse_after_op);
      mem_.free(buffer, reuse_after_op, reusable, i, now);
    }
  }
  ++cpu_op_;
}

void Engine::start(int h, TimeNs now) {
  OpRec& r = rec_[h];
  const int s = r.stream;
  r.state = kRunning;
  start_t_[h] = now;
  if (s == 0) {
    started0_ = true;
    TimeNs ready = std::max(compute_prev_end_, issue_t_[h]);
    if (now > ready) compute_gaps_.emplace_back(ready, now);
  }
  const std::uint8_t f = r.flags;
  if (f & kCollective) {
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
  OpRec& r = rec_[h];
  const int s = r.stream;
  r.state = kDone;
  ++n_done_;
  if (now > step_end_) step_end_ = now;
  mem_.op_completed(h);
  if (mem_inline_) complete_t_[h] = now;
  stream_head_[s] = r.next_in_stream;
  queued_[s] -= r.launches;
  if (s == 0) {
    compute_prev_end_ = now;
    compute_busy_ += now - start_t_[h];
  }
  const std::uint8_t f = r.flags;
  if (use_slowdown_ && (f & kSlowable)) {
    auto it = std::find(running_slowable_.begin(), running_slowable_.end(), h);
    running_slowable_.erase(it);
  }
  if (f & kCollective) {
    group_head_[r.group] = r.next_in_group;
    if (--comm_active_ == 0) {
      comm_intervals_.emplace_back(comm_start_, now);
      if (use_slowdown_) retime(now, 1.0);
    }
  }
  if (trace_on_) {
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
    const int next = r.next_in_group;
    if (next != n_) try_start(rec_[next].stream, now);
  }
}

// ---- Fast-forward (see the note at the top) ----

// Called after an event during which an op started on the compute stream, once the CPU has issued
// every op. Snapshots the engine's state and compares it with the recent snapshots, newest first; on
// the first that the new one repeats, shifted, skips as many periods as the checks allow.
void Engine::ff_boundary(TimeNs now) {
  // First a few scalars (FfLite): a full snapshot is taken only at a boundary whose scalars repeat an
  // earlier boundary's, so candidates that never repeat pay a few stores (a jump then comes one period
  // later than with full snapshots everywhere).
  if (stream_head_[0] >= n_) return;   // the compute stream is done (a start seen during a CPU event)
  const bool cpu_done = cpu_op_ == n_;
  if (long_run_ && !cpu_done && stream_head_[0] >= long_next_ && ff_long(now)) return;
  // With memory moved by the jumps, only whole micro-batches (above): inside one, the activations make
  // the memory grow block after block, so no block period repeats it.
  if (mem_ff_ && !cpu_done) return;
  const FfLite l{now, stream_head_[0], gpu_ns_[stream_head_[0]], compute_prev_end_ - now, comm_active_,
                 static_cast<int>(q_.size()), static_cast<int>(running_slowable_.size()),
                 cpu_done ? -1 : cpu_op_ - stream_head_[0], cpu_done ? 0 : queued_[0]};
  bool repeats = false;
  for (int k = 0; k < ff_lite_count_ && !repeats; ++k) {
    const FfLite& a = ff_lite_[k];
    repeats = l.head0 > a.head0 && l.t > a.t && l.head0_ns == a.head0_ns && l.prev_end == a.prev_end &&
              l.comm_active == a.comm_active && l.events == a.events && l.slow == a.slow &&
              l.cpu_lead == a.cpu_lead && l.queued0 == a.queued0;
  }
  ff_lite_[ff_lite_next_] = l;
  ff_lite_next_ = (ff_lite_next_ + 1) % kFfSnaps;
  if (ff_lite_count_ < kFfSnaps) ++ff_lite_count_;
  if (!repeats) return;

  const int cur = ff_next_;
  FfSnap& b = ff_[cur];
  if (!ff_take(b, now)) return;
  ff_next_ = (cur + 1) % kFfSnaps;
  for (int k = 1; k <= ff_count_; ++k)
    if (ff_try(ff_[(cur - k + kFfSnaps) % kFfSnaps], b)) return;
  if (ff_count_ < kFfSnaps - 1) ++ff_count_;
}

// Jumps if snapshot b repeats a, shifted by the compute stream's ops between them (and the memory with
// it, where the snapshots hold it), by as many periods as the checks allow; returns whether it did.
bool Engine::ff_try(const FfSnap& a, const FfSnap& b) {
  const int p = b.heads[0] - a.heads[0];
  // (the cheap tests first: most candidates differ in one of these)
  if (p <= 0 || b.t <= a.t || a.head0_ns != b.head0_ns || a.compute_prev_end != b.compute_prev_end ||
      a.comm_active != b.comm_active || a.events.size() != b.events.size() || a.slow.size() != b.slow.size() ||
      !ff_same_shape(a, b, p))
    return false;
  if (b.has_mem && !(a.has_mem && mem_.shape_repeats(a.mem, b.mem, p))) return false;
  int m = ff_max_jump(a, b, p);
  if (b.has_mem)
    while (m > 0 && !mem_.can_shift(a.mem, b.mem, p, m)) --m;
  if (m <= 0) return false;
  ff_jump(a, b, p, m);
  ff_count_ = ff_next_ = 0;   // every boundary seen so far describes the past
  ff_lite_count_ = ff_lite_next_ = 0;
  return true;
}

// A snapshot as the compute stream enters a period of long_run_, compared with the one a period before;
// returns whether it jumped.
bool Engine::ff_long(TimeNs now) {
  const PeriodicRun& run = *long_run_;
  const int h = stream_head_[0], end = run.begin + run.period * run.count;
  if (h >= end) {
    long_run_ = nullptr;
    return false;
  }
  if (h < run.begin) {
    long_next_ = run.begin;
    return false;
  }
  long_next_ = h + run.period - (h - run.begin) % run.period;   // (the next period's first op)
  if (long_count_ == 2) std::swap(long_[0], long_[1]);
  FfSnap& b = long_[long_count_ == 2 ? 1 : long_count_];
  if (!ff_take(b, now)) {
    long_count_ = 0;
    return false;
  }
  if (long_count_ < 2) ++long_count_;
  if (long_count_ < 2) return false;
  // (a block-period jump of the ring in between moves the timing only, as the run would: the two
  // snapshots still compare)
  if (b.heads[0] - long_[0].heads[0] != run.period || !ff_try(long_[0], b)) return false;
  long_count_ = 0;
  long_next_ = stream_head_[0] + run.period - (stream_head_[0] - run.begin) % run.period;
  return true;
}

bool Engine::ff_take(FfSnap& s, TimeNs now) {
  const int ns = static_cast<int>(stream_head_.size());
  s.t = now;
  s.compute_busy = compute_busy_;
  s.compute_prev_end = compute_prev_end_ - now;
  s.comm_active = comm_active_;
  s.comm_start = comm_active_ > 0 ? comm_start_ - now : 0;
  s.factor = factor_;
  s.head0_ns = gpu_ns_[stream_head_[0]];
  s.head0_issue = rec_[stream_head_[0]].state == kIssued ? issue_t_[stream_head_[0]] - now : 0;
  s.n_comm = comm_intervals_.size();
  s.n_gaps = compute_gaps_.size();
  for (int g = 0; g < kNumGroups; ++g) s.group_head[g] = group_head_[g];
  s.heads.assign(stream_head_.begin(), stream_head_.end());
  s.head_state.resize(ns);
  s.head_start.resize(ns);
  for (int k = 0; k < ns; ++k) {
    const int h = stream_head_[k];
    s.head_state[k] = rec_[h].state;
    s.head_start[k] = rec_[h].state == kRunning ? start_t_[h] - now : 0;
  }
  bool only_completions = true;
  s.events.clear();
  s.cpu_start = 0;
  q_.for_each([&](const EventQueue<Ev>::Event& e) {
    if (e.payload.type != EvType::OpComplete) only_completions = false;
    if (e.payload.type == EvType::IssueDone) s.cpu_start = cpu_start_t_[e.payload.op] - now;
    s.events.push_back(FfEvent{e.time - now, e.seq, e.payload.op, e.payload.type});
  });
  // The CPU: nothing more once it is done; else its state (see "The CPU still issuing" at the top).
  s.cpu_op = cpu_op_;
  s.blocked_on = cpu_blocked_ ? cpu_blocked_on_ : -1;
  s.blocked_queue = cpu_blocked_ && cpu_blocked_queue_;
  s.blocked_since = cpu_blocked_ ? cpu_blocked_since_ - now : 0;
  s.blocked_total = cpu_blocked_total_;
  s.has_mem = false;
  if (cpu_op_ == n_) {
    if (!only_completions) return false;
    s.queued.clear();
  } else {
    s.queued.assign(queued_.begin(), queued_.end());
    if (mem_ff_) {
      mem_.begin_shapes(*cp_);
      mem_.capture_shape(s.mem);
      s.has_mem = true;
    }
  }
  std::sort(s.events.begin(), s.events.end(),
            [](const FfEvent& x, const FfEvent& y) { return x.dt != y.dt ? x.dt < y.dt : x.seq < y.seq; });
  s.slow.assign(running_slowable_.begin(), running_slowable_.end());
  s.slow_rem.resize(s.slow.size());
  s.slow_seg.resize(s.slow.size());
  for (std::size_t k = 0; k < s.slow.size(); ++k) {
    s.slow_rem[k] = remaining_[s.slow[k]];
    s.slow_seg[k] = seg_start_[s.slow[k]] - now;
  }
  return true;
}

// b repeats a shifted by p op ids (and b.t - a.t ns): every stream's and NCCL queue's head either moved
// by exactly p ("moving") or did not move and is not running ("still"); heads in the same states,
// running ops started the same time before, the same pending completions in the same (time, sequence)
// order, the same running SM kernels with the same remaining work, collectives in flight, slowdown
// factor and end of the last compute op. Fills ff_moving_.
bool Engine::ff_same_shape(const FfSnap& a, const FfSnap& b, int p) {
  const int ns = static_cast<int>(b.heads.size());
  ff_moving_.assign(ns, 0);
  for (int s = 0; s < ns; ++s) {
    const int d = b.heads[s] - a.heads[s];
    if (a.head_state[s] != b.head_state[s] || a.head_start[s] != b.head_start[s]) return false;
    if (d == p) {
      if (b.heads[s] >= n_) return false;
      ff_moving_[s] = 1;
    } else if (d != 0 || b.head_state[s] == kRunning) {
      return false;
    }
  }
  for (int g = 0; g < kNumGroups; ++g) {
    const int h = b.group_head[g], d = h - a.group_head[g];
    if (d == p) {
      if (h >= n_) return false;
    } else if (d != 0 || (h < n_ && rec_[h].state == kRunning)) {
      return false;
    }
  }
  if (a.comm_active != b.comm_active || a.factor != b.factor || a.compute_prev_end != b.compute_prev_end ||
      a.comm_start != b.comm_start || a.head0_issue != b.head0_issue)
    return false;
  if (a.events.size() != b.events.size() || a.slow.size() != b.slow.size()) return false;
  for (std::size_t k = 0; k < a.events.size(); ++k)
    if (a.events[k].dt != b.events[k].dt || b.events[k].op != a.events[k].op + p || a.events[k].type != b.events[k].type)
      return false;
  if ((a.cpu_op == n_) != (b.cpu_op == n_)) return false;
  if (b.cpu_op < n_) {
    // The CPU moved by p too, blocked on the op p on or not blocked, in the same way for as long; the same
    // launch queues.
    if (b.cpu_op - a.cpu_op != p || (a.blocked_on < 0) != (b.blocked_on < 0) ||
        (b.blocked_on >= 0 && b.blocked_on != a.blocked_on + p) || a.blocked_queue != b.blocked_queue ||
        a.blocked_since != b.blocked_since || a.cpu_start != b.cpu_start || a.queued != b.queued)
      return false;
  }
  for (std::size_t k = 0; k < a.slow.size(); ++k)
    if (b.slow[k] != a.slow[k] + p || a.slow_rem[k] != b.slow_rem[k] || a.slow_seg[k] != b.slow_seg[k]) return false;
  return true;
}

// The evolution from a to b read, of the ops of each moving stream, those from its head at a to its
// head at b (the last only up to its start: its completion comes in the next period), and of the still
// streams only their heads. From b it repeats, shifted, for as many periods j as (1) op i + j·p looks
// like op i to the engine for every such i (ff_equivalent) and (2) every still head stays blocked:
// what it waits for lies beyond where the moving heads get. Returns that number of periods.
int Engine::ff_max_jump(const FfSnap& a, const FfSnap& b, int p) {
  const int ns = static_cast<int>(b.heads.size());
  int m = n_ / p + 1;
  const auto cap = [&](long long room) { m = room < 0 ? 0 : static_cast<int>(std::min<long long>(m, room / p)); };
  const auto group_moves = [&](int g) { return b.group_head[g] - a.group_head[g] == p; };
  for (int s = 0; s < ns && m > 0; ++s) {
    const int x = b.heads[s];
    if (ff_moving_[s] || x >= n_) continue;
    const OpRec& r = rec_[x];
    // (not issued yet: the CPU's checks below keep it so, every op the CPU issues being on a moving stream)
    if (r.state == kNotIssued && b.cpu_op < n_) continue;
    if (r.state != kIssued) return 0;
    int w = -1;
    for (int k = list_start(x); k < r.cpu_waits; ++k) {
      if (!is_done(lists_[k])) {
        w = lists_[k];
        break;
      }
    }
    if (w >= 0) {
      // Blocked until w completes: w must stay at or past its stream's head (a still stream never gets there).
      const OpRec& rw = rec_[w];
      if (!(rw.flags & kCpuOp) && ff_moving_[rw.stream]) cap(static_cast<long long>(w) - b.heads[rw.stream]);
      else if (rw.flags & kCpuOp) cap(static_cast<long long>(w) - b.cpu_op);   // the CPU must not reach w
    } else if ((r.flags & kCollective) && group_moves(r.group)) {
      cap(static_cast<long long>(x) - 1 - b.group_head[r.group]);   // the queue must not reach x
    } else {
      return 0;
    }
  }
  for (int g = 0; g < kNumGroups && m > 0; ++g) {
    const int y = b.group_head[g];
    if (group_moves(g) || y >= n_) continue;
    const int sy = rec_[y].stream;
    if (ff_moving_[sy]) cap(static_cast<long long>(y) - 1 - b.heads[sy]);   // its stream must not reach y
  }
  if (m > 0) {
    const int mr = ff_run_jump(a, b, p, m);
    if (mr > 0) return mr;
    if (mr < 0) return 0;   // a boundary or two later the run's checks apply (cheaper than these)
  }
  int j = 1;
  for (; j <= m; ++j) {
    const int d = j * p;
    if (b.cpu_op < n_ && !ff_cpu_periods(a, b, d, false)) return j - 1;
    for (int s = 0; s < ns; ++s) {
      if (!ff_moving_[s]) continue;
      for (int i = a.heads[s];; i = rec_[i].next_in_stream) {
        const bool last = i == b.heads[s];
        if (i + d >= n_ || !ff_equivalent(i, i + d, d, last, a)) return j - 1;
        if (last) break;
      }
    }
  }
  return m;
}

// The checks of ff_max_jump for all m periods at once, inside a run of identical periods
// (CompiledProgram::runs, p a multiple of its period): consecutive periods of a run repeat each other
// record for record (each wait names the op one period on, or the same op), so if the ops of the
// period a -> b and their neighbours (next op of their stream and queue, the ops that wait on them)
// stay inside the run m periods on, op i + j*p looks to the engine as op i + p does, one period
// further, for every j <= m, provided op i + p looks as op i does in a way that does not depend on j:
// each wait that moves with the period on a moving stream, each fixed wait done at a or on a still
// stream (ff_equivalent's other case, two distinct ops both done at a, could fail further on). Returns
// m, or 0 when that does not apply (the caller then checks period by period).
int Engine::ff_run_jump(const FfSnap& a, const FfSnap& b, int p, int m) {
  const int ns = static_cast<int>(b.heads.size());
  const PeriodicRun* run = nullptr;
  int lo = n_, hi = -1;
  for (int s = 0; s < ns; ++s) {
    if (!ff_moving_[s]) continue;
    lo = std::min(lo, a.heads[s]);
    hi = std::max(hi, b.heads[s]);
  }
  if (hi < 0) return 0;
  const bool cpu = b.cpu_op < n_;
  if (cpu) {   // (the CPU's ops, and those its queue waits read, lie between a's CPU op and b's)
    lo = std::min(lo, a.cpu_op);
    hi = std::max(hi, b.cpu_op);
  }
  for (const PeriodicRun& r : *runs_) {
    if (hi < r.begin || hi >= r.begin + r.period * r.count || p % r.period != 0) continue;
    if (lo >= r.begin) {
      run = &r;
      break;
    }
    // The period a -> b starts just before the run (a stream's head lags behind): one or two boundaries
    // later it lies inside, where m periods are checked at the price of one.
    if (lo >= r.begin - 2 * p && r.count * r.period > 8 * p) return -1;
  }
  if (!run) return 0;
  const int run_end = run->begin + run->period * run->count;
  // The reach of an op's neighbours within one period of the run (later periods repeat it).
  int reach = 0;
  for (int x = run->begin; x < run->begin + run->period; ++x) {
    const OpRec& r = rec_[x];
    if (r.next_in_stream < n_) reach = std::max(reach, r.next_in_stream - x);
    if ((r.flags & kCollective) && r.next_in_group < n_) reach = std::max(reach, r.next_in_group - x);
    for (int k = list_start(x), e = cpu ? r.allocs : r.cpu_waits; k < e; ++k)
      reach = std::max(reach, x - lists_[k]);   // waiters' distance (and the CPU's)
  }
  m = std::min<long long>(m, (static_cast<long long>(run_end) - 1 - reach - hi) / p);
  if (m < 1) return 0;
  if (cpu && !ff_cpu_periods(a, b, p, /*strict=*/true)) return 0;
  for (int s = 0; s < ns; ++s) {
    if (!ff_moving_[s]) continue;
    for (int i = a.heads[s];; i = rec_[i].next_in_stream) {
      const bool last = i == b.heads[s];
      if (!ff_equivalent(i, i + p, p, last, a, /*strict=*/true)) return 0;
      if (last) break;
    }
  }
  return m;
}

// Op i2 = i + d behaves as op i does, shifted: same stream, kind flags, NCCL queue and duration; each
// GPU wait either the shifted wait on the same moving stream, or two ops done at snapshot a, or two ops
// of still streams in the same state; unless `last`, the next op of its stream and queue shifted too and
// the same streams woken, in the same order, when it completes. (The CPU is done: cpu_ns, cpu_waits,
// allocs and frees are never read again, nor is the issue time, which is before every start from here.)
bool Engine::ff_equivalent(int i, int i2, int d, bool last, const FfSnap& a, bool strict) const {
  const OpRec& x = rec_[i];
  const OpRec& y = rec_[i2];
  if (y.stream != x.stream || y.flags != x.flags || gpu_ns_[i2] != gpu_ns_[i] || y.launches != x.launches) return false;
  if ((x.flags & kCollective) && y.group != x.group) return false;
  const int sx = list_start(i), sy = list_start(i2);
  const int nw = x.cpu_waits - sx;
  if (y.cpu_waits - sy != nw) return false;
  const int* lists = lists_;
  for (int k = 0; k < nw; ++k)
    if (!ff_same_wait(lists[sx + k], lists[sy + k], d, a, strict)) return false;
  if (last) return true;
  if (y.next_in_stream != x.next_in_stream + d) return false;
  if (x.flags & kCollective) {
    const int nx = x.next_in_group, ny = y.next_in_group;
    if (nx == n_ ? ny != n_ : (ny != nx + d || rec_[ny].stream != rec_[nx].stream)) return false;
  }
  int k = dep_[i].next, k2 = dep_[i2].next;
  for (; k >= 0 && k2 >= 0; k = dep_[k].next, k2 = dep_[k2].next)
    if (dep_[k].stream != dep_[k2].stream) return false;
  return k < 0 && k2 < 0;
}

// A wait on w of an op and on w2 of the op d ids on behave alike: w2 is w shifted on a moving stream, or
// both were done at snapshot a, or both lie on still streams in the same state. `strict` (ff_run_jump):
// only a fixed wait may be done, or still.
bool Engine::ff_same_wait(int w, int w2, int d, const FfSnap& a, bool strict) const {
  const OpRec& rw = rec_[w];
  const OpRec& rw2 = rec_[w2];
  const bool cpu = rw.flags & kCpuOp, cpu2 = rw2.flags & kCpuOp;
  if (w2 == w + d && !cpu && !cpu2 && rw2.stream == rw.stream && ff_moving_[rw.stream]) return true;
  if (strict && w2 != w) return false;
  if (done_at(w, a) && done_at(w2, a)) return true;
  return !cpu && !cpu2 && !ff_moving_[rw.stream] && !ff_moving_[rw2.stream] && is_done(w) == is_done(w2);
}

// Op x2 = x + d looks to the issuing CPU as op x does: the same kind, stream (a moving one: the CPU issues
// nothing to a still stream), issue cost, launches and (a CPU op) duration and dependents' streams; its
// CPU waits (a CPU op's GPU waits too) alike (ff_same_wait).
bool Engine::ff_cpu_equivalent(int x, int x2, int d, const FfSnap& a, bool strict) const {
  const OpRec& r = rec_[x];
  const OpRec& r2 = rec_[x2];
  if (r2.flags != r.flags || r2.stream != r.stream || r2.launches != r.launches || cpu_ns_[x2] != cpu_ns_[x]) return false;
  const bool cpu_op = r.flags & kCpuOp;
  if (cpu_op ? gpu_ns_[x2] != gpu_ns_[x] : !ff_moving_[r.stream]) return false;
  const int lo = cpu_op ? list_start(x) : r.cpu_waits, lo2 = cpu_op ? list_start(x2) : r2.cpu_waits;
  const int nw = r.allocs - lo;
  if (r2.allocs - lo2 != nw || r.cpu_waits - list_start(x) != r2.cpu_waits - list_start(x2)) return false;
  for (int k = 0; k < nw; ++k)
    if (!ff_same_wait(lists_[lo + k], lists_[lo2 + k], d, a, strict)) return false;
  if (cpu_op) {   // (its completion, at the end of its issue, wakes its dependents' streams)
    int k = dep_[x].next, k2 = dep_[x2].next;
    for (; k >= 0 && k2 >= 0; k = dep_[k].next, k2 = dep_[k2].next)
      if (dep_[k].stream != dep_[k2].stream) return false;
    if (k >= 0 || k2 >= 0) return false;
  }
  return !mem_ff_ || ff_same_memory(x, x2, d, a, strict);
}

// Op x2 = x + d allocates and frees as op x does, one period on (memory with the issues): buffers of the
// same facts in the same order, each freed buffer the one playing the role of x's d ops later, the
// same frees inside the op, and each record_stream free waiting on an op that behaves alike
// (ff_same_wait: whether it has completed at the free decides whether the block is reusable at once).
bool Engine::ff_same_memory(int x, int x2, int d, const FfSnap& a, bool strict) const {
  const OpRec& r = rec_[x];
  const OpRec& r2 = rec_[x2];
  if (r2.frees - r2.allocs != r.frees - r.allocs || r2.end - r2.frees != r.end - r.frees) return false;
  const CompiledBuffer* bufs = cp_->buffers.data();
  for (int k = r.allocs, k2 = r2.allocs; k < r.frees; ++k, ++k2)
    if (!(bufs[lists_[k2]] == bufs[lists_[k]])) return false;
  for (int k = r.frees, k2 = r2.frees; k < r.end; k += 2, k2 += 2) {
    if (!mem_.shifted_buffer(lists_[k], lists_[k2], d)) return false;
    const int u = lists_[k + 1], u2 = lists_[k2 + 1];
    if (is_free_inside_op(u) || u < 0 || is_free_inside_op(u2) || u2 < 0) {
      if (u2 != u) return false;
    } else if (!ff_same_wait(u, u2, d, a, strict)) {
      return false;
    }
  }
  return true;
}

// What the CPU read between snapshots a and b repeats d ids on: the ops it issued, from a's CPU op to b's
// (the last one it began, or is blocked before), and, when it waits for room in a launch queue at b, the
// queue's ops from the stream's head to the one it waits for (their launches and stream order: the ops
// queue_wait walks). The walks before b read ops between the stream's heads at a and b, which
// ff_equivalent checks (launches included).
bool Engine::ff_cpu_periods(const FfSnap& a, const FfSnap& b, int d, bool strict) const {
  for (int x = a.cpu_op; x <= b.cpu_op; ++x)
    if (x + d >= n_ || !ff_cpu_equivalent(x, x + d, d, a, strict)) return false;
  if (b.blocked_queue) {
    const int s = rec_[b.blocked_on].stream;
    for (int i = b.heads[s];; i = rec_[i].next_in_stream) {
      const int i2 = i + d;
      if (i2 >= n_ || rec_[i2].stream != s || rec_[i2].launches != rec_[i].launches ||
          rec_[i2].next_in_stream != rec_[i].next_in_stream + d)
        return false;
      if (i == b.blocked_on) break;
    }
  }
  return true;
}

// Moves the engine from state b to b shifted by m periods: the ops the moving streams complete in
// between are marked done, the heads, running ops and pending completions move by m·p ids and
// m·(b.t − a.t) ns, and the accumulated figures grow by m times what one period added.
void Engine::ff_jump(const FfSnap& a, const FfSnap& b, int p, int m) {
  const int dp = m * p;
  const TimeNs period = b.t - a.t, dt = m * period;
  const int ns = static_cast<int>(b.heads.size());
  int skipped = 0;
  if (b.cpu_op < n_) {
    // The CPU's issues of the skipped periods (before the streams' ops they reach are marked done): each
    // op issued a period after the op p ids before it; a CPU op done as it is issued. The launch queues
    // hold what they held at b.
    for (int x = b.cpu_op, e = b.cpu_op + dp; x < e; ++x) {
      issue_t_[x] = issue_t_[x - p] + period;
      if (rec_[x].flags & kCpuOp) {
        rec_[x].state = kDone;
        if (mem_inline_) complete_t_[x] = complete_t_[x - p] + period;
        ++skipped;
      } else {
        rec_[x].state = kIssued;
      }
    }
    if (b.has_mem) {
      if (!mem_.shift_periods(a.mem, b.mem, p, m, /*waited=*/true))
        throw std::logic_error("fast-forward: the memory cannot be moved by the periods checked");
      mem_jumps_.push_back(MemoryTracker::PeriodJump{a.cpu_op, b.cpu_op, p, m});
      ++stats_.memory_shift_jumps;
    }
    cpu_op_ += dp;
    ++stats_.jumps_while_issuing;
    if (cpu_blocked_) {
      cpu_blocked_on_ += dp;
      cpu_blocked_since_ += dt;
    }
    cpu_blocked_total_ += m * (b.blocked_total - a.blocked_total);
    q_.for_each([&](const EventQueue<Ev>::Event& e) {   // (an issue in progress: its start, shifted)
      if (e.payload.type == EvType::IssueDone) cpu_start_t_[e.payload.op + dp] = cpu_start_t_[e.payload.op] + dt;
    });
  }
  for (int s = 0; s < ns; ++s) {
    if (!ff_moving_[s]) continue;
    const int h = b.heads[s], target = h + dp;
    for (int i = h; i != target; i = rec_[i].next_in_stream) {
      rec_[i].state = kDone;
      if (mem_inline_) complete_t_[i] = complete_t_[i - p] + period;   // (for the steady step's replay)
      ++skipped;
    }
    if (b.head_state[s] == kRunning) {
      rec_[target].state = kRunning;
      start_t_[target] = start_t_[h] + dt;
    }
    stream_head_[s] = target;
  }
  for (int g = 0; g < kNumGroups; ++g)
    if (b.group_head[g] - a.group_head[g] == p) group_head_[g] += dp;
  for (int& r : running_slowable_) {
    const int r2 = r + dp;
    remaining_[r2] = remaining_[r];
    seg_start_[r2] = seg_start_[r] + dt;
    r = r2;
  }
  q_.shift(dt, [dp](Ev& e) { e.op += dp; });
  compute_busy_ += m * (b.compute_busy - a.compute_busy);
  const auto repeat = [&](std::vector<std::pair<TimeNs, TimeNs>>& v, std::size_t lo, std::size_t hi) {
    v.reserve(v.size() + static_cast<std::size_t>(m) * (hi - lo));
    for (int j = 1; j <= m; ++j)
      for (std::size_t k = lo; k < hi; ++k) v.emplace_back(v[k].first + j * period, v[k].second + j * period);
  };
  repeat(comm_intervals_, a.n_comm, b.n_comm);
  repeat(compute_gaps_, a.n_gaps, b.n_gaps);
  step_end_ += dt;   // (the latest completion so far was in the period a -> b)
  compute_prev_end_ += dt;
  if (comm_active_ > 0) comm_start_ += dt;
  n_done_ += skipped;
  ++stats_.jumps;
  stats_.ops_fast_forwarded += skipped;
}

void Engine::add_span(const Op& op, const std::string& track, const char* kind, TimeNs start, TimeNs dur,
                      Bytes bytes) {
  trace_.push_back(TraceSpan{op.name, track, kind, op.unit, start, dur, bytes});
}

}  // namespace

namespace {

void Engine::fill_results(SimResult& r) {
  r.step_time_ns = step_end_;
  r.compute_ns = compute_busy_;
  TimeNs comm = 0;
  for (const auto& [a, b] : comm_intervals_) comm += b - a;
  r.comm_ns = comm;
  // Work that runs past the compute stream's and the CPU's last op still ends the step: it waited there.
  const TimeNs idle_from = std::max(compute_prev_end_, n_ > 0 ? issue_t_[n_ - 1] : 0);
  if (step_end_ > idle_from) compute_gaps_.emplace_back(idle_from, step_end_);
  r.exposed_comm_ns = intersect_length(compute_gaps_, comm_intervals_);
  r.cpu_blocked_ns = cpu_blocked_total_;
  r.comm_bytes_by_kind["all_gather"] = comm_sent_[0];   // (summed when the program was compiled)
  r.comm_bytes_by_kind["reduce_scatter"] = comm_sent_[1];
  r.comm_bytes_by_kind["all_reduce"] = comm_sent_[2];
  mem_.fill(r, o_->max_timeline_samples);
  if (o_->record_memory_timeline) r.steady_step_start_ns = step_end_;
  if (p_) {
    describe_peaks(*p_, {&r.peak_allocated_at, &r.peak_reserved_at, &r.first_step_peak_allocated_at,
                         &r.first_step_peak_reserved_at});
  }
  if (trace_on_) {
    std::stable_sort(trace_.begin(), trace_.end(),
                     [](const TraceSpan& a, const TraceSpan& b) { return a.start_ns < b.start_ns; });
    r.trace = std::move(trace_);
    trace_ = {};
  }
}

}  // namespace

// compute_op_costs into `c` (its vectors' storage reused).
void fill_op_costs(const StepProgram& program, const CostModel& cost, OpCosts& c) {
  const std::size_t n = program.ops.size();
  c.gpu_ns.resize(n);
  c.cpu_ns.resize(n);
  // (local pointers: the virtual calls could change c as far as g++ knows, so it would reload them)
  TimeNs* gpu_ns = c.gpu_ns.data();
  TimeNs* cpu_ns = c.cpu_ns.data();
  const Op* ops = program.ops.data();
  for (std::size_t i = 0; i < n; ++i) {
    const TimeNs g = cost.op_time(ops[i]);
    const TimeNs cpu = cost.cpu_issue_time(ops[i]);
    gpu_ns[i] = g;
    cpu_ns[i] = cpu;
    if ((g | cpu) < 0) [[unlikely]] {   // (either negative)
      if (g < 0) throw InputError("cost_model.op_time(ops[" + std::to_string(i) + "])", std::to_string(g), ">= 0 ns");
      throw InputError("cost_model.cpu_issue_time(ops[" + std::to_string(i) + "])", std::to_string(cpu), ">= 0 ns");
    }
  }
  c.overlap_slowdown = cost.overlap_slowdown();
  if (!std::isfinite(c.overlap_slowdown) || c.overlap_slowdown < 1.0 || c.overlap_slowdown > 100.0)
    throw InputError("cost_model.overlap_slowdown", std::to_string(c.overlap_slowdown), "a factor in [1, 100]");
  c.launch_queue_depth = cost.launch_queue_depth();
  if (c.launch_queue_depth < 0)
    throw InputError("cost_model.launch_queue_depth", std::to_string(c.launch_queue_depth), ">= 0 kernels (0 = unbounded)");
}

OpCosts compute_op_costs(const StepProgram& program, const CostModel& cost) {
  OpCosts c;
  fill_op_costs(program, cost, c);
  return c;
}

// One pass over the ops: validate_program's per-op checks (streams and buffers were checked before;
// check_op's conditions as one yes/no, evaluated while copying each list; on any failure
// detail::check_op throws the first error in its order), fused with the records and every list the
// run reads (GPU waits, CPU waits, allocs, frees) copied into one flat array (one capacity check per op).
void compile_program(const StepProgram& p, CompiledProgram& cp) {
  detail::check_streams_and_buffers(p);
  const int ns = static_cast<int>(p.streams.size());
  const int nb = static_cast<int>(p.buffers.size());
  const int n = static_cast<int>(p.ops.size());
  const auto below = [](int v, int lim) { return static_cast<unsigned>(v) < static_cast<unsigned>(lim); };
  const Buffer* bufs = p.buffers.data();
  const Op* ops = p.ops.data();
  cp.num_streams = ns;
  cp.ops.resize(static_cast<std::size_t>(n) + 1);
  OpRec* rec = cp.ops.data();
  rec[n] = OpRec{};
  std::vector<int>& lists = cp.lists;
  if (lists.size() < 4096) lists.resize(4096);
  std::int64_t sent[3] = {0, 0, 0};
  int record_stream = -1;   // the largest reuse_after_op (-1: no record_stream free)
  int pos = 0;   // next free slot of lists
  for (int i = 0; i < n; ++i) {
    const Op& op = ops[i];
    const unsigned kind = static_cast<unsigned>(op.kind);
    const std::uint8_t f = kKindFlags[kind < kNumOpKinds ? kind : kNumOpKinds];
    const int s = op.stream;
    // (& rather than &&: one branch for all; an OR of numbers is negative iff one of them is)
    bool ok = (op.id == i) & below(s, ns) & !(f & kBadKind) &
              ((op.copy_bytes | op.cpu_hooks | op.kernel_launches) >= 0);
    if (f & kCollective)
      ok &= (static_cast<unsigned>(op.group) <= static_cast<unsigned>(CommGroup::PostForward)) &
            (op.group_size >= 1) & (op.comm_bytes >= 0);
    const std::size_t need = op.waits.size() + op.cpu_waits.size() + op.allocs.size() + 2 * op.frees.size();
    if (pos + need > lists.size()) [[unlikely]]
      lists.resize(std::max(2 * lists.size(), pos + need + 256));
    int* out = lists.data();
    OpRec& r = rec[i];
    r.wait_pos = pos;
    for (int w : op.waits) {
      ok &= below(w, i);
      out[pos++] = w;
    }
    r.cpu_waits = pos;
    for (int w : op.cpu_waits) {
      ok &= below(w, i);
      out[pos++] = w;
    }
    r.allocs = pos;
    for (int b : op.allocs) {
      ok &= below(b, nb) && (!bufs[b].persistent || bufs[b].first_step_lazy);   // (&&: no read past the buffers)
      out[pos++] = b;
    }
    r.frees = pos;
    int prev_reuse = free_inside_op(1);
    for (const FreeSpec& fr : op.frees) {
      ok &= below(fr.buffer, nb) &&
            valid_free_reuse(fr.reuse_after_op, prev_reuse, i, static_cast<int>(op.allocs.size()));
      prev_reuse = fr.reuse_after_op;
      out[pos] = fr.buffer;
      out[pos + 1] = fr.reuse_after_op;
      record_stream = std::max(record_stream, fr.reuse_after_op);
      pos += 2;
    }
    r.end = pos;
    if (!ok) [[unlikely]] {
      detail::check_op(p, i, ns, nb);   // throws the InputError validate_program would
      throw std::logic_error("execute: the compile checks and check_op disagree on op " + std::to_string(i));
    }
    r.stream = s;
    r.flags = f;
    r.launches = f & kCpuOp ? 0 : op.kernel_launches;
    r.group = static_cast<std::uint8_t>(f & kCollective ? static_cast<int>(op.group) : 0);
    if (f & kCollective) {
      // Bytes each rank sends (N1): ring all-gather / reduce-scatter (n−1)/n·S, all-reduce 2(n−1)/n·S.
      const std::int64_t gs = op.group_size;
      if (op.kind == OpKind::AllGather) sent[0] += op.comm_bytes * (gs - 1) / gs;
      else if (op.kind == OpKind::ReduceScatter) sent[1] += op.comm_bytes * (gs - 1) / gs;
      else sent[2] += 2 * op.comm_bytes * (gs - 1) / gs;
    }
  }
  lists.resize(static_cast<std::size_t>(pos));   // (shrinking keeps the capacity)
  for (int k = 0; k < 3; ++k) cp.comm_sent[k] = sent[k];
  cp.buffers.resize(static_cast<std::size_t>(nb));
  CompiledBuffer* cb = cp.buffers.data();
  for (int b = 0; b < nb; ++b) cb[b] = compiled_buffer(bufs[b]);
  cp.notes.clear();
  cp.init_scratch = p.init_scratch;
  cp.init_flatten_world = p.init_flatten_world;
  cp.init_flatten_last = p.init_flatten_last;
  cp.init_originals = p.init_originals;
  cp.init_offloaded = p.init_offloaded;
  cp.loop_setup = p.loop_setup;
  cp.runs.clear();
  cp.record_stream_frees = record_stream >= 0;
}

namespace {
void check_costs(const CompiledProgram& cp, const OpCosts& costs) {
  const int n = cp.num_ops();
  if (static_cast<int>(costs.gpu_ns.size()) != n || static_cast<int>(costs.cpu_ns.size()) != n)
    throw std::invalid_argument("execute: OpCosts sized " + std::to_string(costs.gpu_ns.size()) + " for " +
                                std::to_string(n) + " ops");
  if (costs.launch_queue_depth < 0)
    throw InputError("launch_queue_depth", std::to_string(costs.launch_queue_depth), ">= 0 kernels (0 = unbounded)");
}

// One engine per workspace, reused (see the note at the top).
SimResult run_engine(CompiledProgram& cp, const OpCosts& costs, const ExecOptions& opts, const StepProgram* source) {
  check_costs(cp, costs);
  SimResult r = with_storage<Engine>(opts.workspace, [&](Engine& engine) {
    return engine.run(cp, costs.gpu_ns.data(), costs.cpu_ns.data(), costs.overlap_slowdown, costs.launch_queue_depth,
                      opts, source);
  });
  r.cpu_issue_ns = cpu_issue_total(costs);
  return r;
}
}  // namespace

SimResult execute_compiled(CompiledProgram& cp, const OpCosts& costs, const ExecOptions& opts) {
  return run_engine(cp, costs, opts, nullptr);
}

SimResult execute(const StepProgram& program, const OpCosts& costs, const ExecOptions& opts) {
  // The compiled form lives only for this call.
  return with_storage<CompiledProgram>(opts.workspace, [&](CompiledProgram& cp) {
    compile_program(program, cp);   // (checks every op, as validate_program does)
    return run_engine(cp, costs, opts, &program);
  });
}

SimResult execute(const StepProgram& program, const CostModel& cost, const ExecOptions& opts) {
  // The costs live only for this call.
  return with_storage<OpCosts>(opts.workspace, [&](OpCosts& costs) {
    fill_op_costs(program, cost, costs);
    return execute(program, costs, opts);
  });
}

}  // namespace fsdpsim::sim

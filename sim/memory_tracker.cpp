#include "sim/memory_tracker.h"

#include <algorithm>
#include <limits>
#include <string>

#include "common/errors.h"

namespace fsdpsim::sim {

namespace {
constexpr TimeNs kNever = std::numeric_limits<TimeNs>::max();

std::string op_field(int op, const char* what) {
  return "program.ops[" + std::to_string(op) + "]." + what;
}
}  // namespace

void MemoryTracker::start(const StepProgram& program, const AllocatorConfig& config, bool record_timeline) {
  own_bufs_.resize(program.buffers.size());
  for (std::size_t b = 0; b < program.buffers.size(); ++b) own_bufs_[b] = compiled_buffer(program.buffers[b]);
  bufs_ = own_bufs_.data();
  names_ = &program;
  init_scratch_ = &program.init_scratch;
  init_flatten_world_ = program.init_flatten_world;
  init_flatten_last_ = program.init_flatten_last;
  init_originals_ = &program.init_originals;
  init_offloaded_ = &program.init_offloaded;
  loop_setup_ = &program.loop_setup;
  start_run(static_cast<int>(program.buffers.size()), static_cast<int>(program.ops.size()), config, record_timeline);
}

void MemoryTracker::start(const CompiledProgram& program, const AllocatorConfig& config, bool record_timeline,
                          const StepProgram* names) {
  bufs_ = program.buffers.data();
  names_ = names;
  init_scratch_ = &program.init_scratch;
  init_flatten_world_ = program.init_flatten_world;
  init_flatten_last_ = program.init_flatten_last;
  init_originals_ = &program.init_originals;
  init_offloaded_ = &program.init_offloaded;
  loop_setup_ = &program.loop_setup;
  start_run(static_cast<int>(program.buffers.size()), program.num_ops(), config, record_timeline);
}

void MemoryTracker::start_run(int num_buffers, int num_ops, const AllocatorConfig& config, bool record_timeline) {
  if (fold_scratch_) forget_fold_precompute(*fold_scratch_);
  num_bufs_ = num_buffers;
  allocator_.reset(config);
  record_timeline_ = record_timeline;
  // block_of_.assign(n, kNotLive), written so that g++ -O2 stores 8 entries per step (two 16-byte
  // stores; a plain fill of an int value is one store per entry: ~8 K instructions per 70B run).
  const std::size_t n = static_cast<std::size_t>(num_buffers);
  block_of_.resize(n);
  int* const map = block_of_.data();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t j = 0; j < 8; ++j) map[i + j] = kNotLive;
  for (; i < n; ++i) map[i] = kNotLive;
  waited_on_.assign(static_cast<std::size_t>(num_ops), 0);
  shapes_.on = false;
  shapes_.program = nullptr;
  ready_ = false;
  live_ = {};
  live_at_peak_ = {};
  reserved_at_peak_ = 0;
  peak_allocated_ = -1;
  reserved_peak_seen_ = -1;
  allocated_peak_op_ = reserved_peak_op_ = -1;
  steady_ = false;
  first_peak_allocated_ = first_peak_reserved_ = 0;
  first_allocated_peak_op_ = first_reserved_peak_op_ = -1;
  timeline_.clear();
  if (record_timeline_) timeline_.reserve(static_cast<std::size_t>(num_ops) + 16);
}

void MemoryTracker::record_sample(TimeNs now) {
  const AllocatorStats& s = allocator_.stats();
  if (!timeline_.empty() && timeline_.back().t_ns == now) {
    timeline_.back().allocated = s.allocated;
    timeline_.back().reserved = s.reserved;
  } else {
    timeline_.push_back(MemorySample{now, s.allocated, s.reserved});
  }
}

template <class Visit>
void MemoryTracker::for_each_init_call(Visit&& visit) const {
  const bool construct = init_flatten_world_ >= 1;
  const auto constructed = [&](const CompiledBuffer& b) { return construct && b.category == MemCategory::ShardedParams; };
  for (int id = 0; id < num_bufs_; ++id) {
    const CompiledBuffer& b = bufs_[id];
    if (b.persistent && !b.first_step_lazy && !b.after_construction && !constructed(b) &&
        !visit(InitCall::Buffer, id, b.bytes, b.pool_stream))
      return;
  }
  // The after_construction buffers, in buffer order, with the temporaries of StepProgram::loop_setup around them.
  bool temporaries = false;
  const auto loop_inputs = [&] {
    int id = 0;
    const auto next_buffer = [&] {
      while (id < num_bufs_ && !bufs_[id].after_construction) ++id;
      return id < num_bufs_ ? id++ : -1;
    };
    if (!loop_setup_ || loop_setup_->empty()) {
      for (int b = next_buffer(); b >= 0; b = next_buffer())
        if (!visit(InitCall::Buffer, b, bufs_[b].bytes, bufs_[b].pool_stream)) return false;
      return true;
    }
    for (const LoopSetupCall& c : *loop_setup_) {
      bool go = true;
      if (c.kind == LoopSetupCall::Buffer) {
        const int b = next_buffer();
        go = b >= 0 && visit(InitCall::Buffer, b, bufs_[b].bytes, bufs_[b].pool_stream);
      } else if (c.kind == LoopSetupCall::Temporary) {
        temporaries = true;
        go = visit(InitCall::Temporary, -1, c.bytes, c.pool_stream);
      } else {
        go = visit(InitCall::FreeTemporary, -1, c.temporary, 0);   // (bytes: which temporary)
      }
      if (!go) return false;
    }
    return true;
  };
  if (construct) {
    // One FlatParameter: its originals, the flattened whole (NO_SHARD, a world of 1: the shard itself), the shard
    // (a buffer, or an offloaded one: InitCall::Offloaded), the originals freed.
    const auto flatten_then_shard = [&](int id, Bytes bytes, int pool, int originals_index) {
      static const std::vector<Bytes> kNone;
      const std::vector<Bytes>& originals = originals_index >= 0 ? (*init_originals_)[originals_index] : kNone;
      for (Bytes o : originals)
        if (!visit(InitCall::Original, -1, o, pool)) return false;
      if ((init_flatten_world_ > 1 && !visit(InitCall::Scratch, -1, bytes * init_flatten_world_, pool)) ||
          !visit(id >= 0 ? InitCall::Buffer : InitCall::Offloaded, id, bytes, pool))
        return false;
      for (std::size_t k = 0; k < originals.size(); ++k)
        if (!visit(InitCall::FreeOriginal, -1, static_cast<Bytes>(k), pool)) return false;
      return true;
    };
    const auto buffer = [&](int id) {
      const CompiledBuffer& b = bufs_[id];
      return flatten_then_shard(id, b.bytes, b.pool_stream, b.init_originals);
    };
    for (int id = 0; id < num_bufs_; ++id) {
      const CompiledBuffer& b = bufs_[id];
      if (b.persistent && !b.first_step_lazy && constructed(b) && id != init_flatten_last_ && !buffer(id)) return;
    }
    if (init_flatten_last_ >= 0 && init_flatten_last_ < num_bufs_ && constructed(bufs_[init_flatten_last_]) &&
        !buffer(init_flatten_last_))
      return;
    for (const InitOffloaded& o : *init_offloaded_)
      if (!flatten_then_shard(-1, o.bytes, o.pool_stream, o.originals)) return;
    if (!loop_inputs() || !visit(InitCall::EmptyCache, -1, 0, 0)) return;
  } else if (!loop_inputs() || (temporaries && !visit(InitCall::EmptyCache, -1, 0, 0))) {
    return;
  }
  if (init_scratch_)
    for (const InitRequest& q : *init_scratch_)
      if (!visit(InitCall::Lazy, -1, q.bytes, q.pool_stream)) return;
}

void MemoryTracker::allocate_persistent() {
  bool any = false;
  // The saved state is the one right after start() plus the persistent allocations: only while nothing
  // has been allocated since start() (the executor's order) does it depend on nothing else.
  const bool from_start = allocator_.stats().num_allocs == 0;
  if (from_start && after_persistent_.valid() && after_persistent_.config() == allocator_.config()) {
    // The same calls again? One walk compares them and fills block_of_ and live_ as the allocations
    // would (a persistent buffer gets the block the same request got last time, see below).
    const PersistentAlloc* it = persistent_.data();
    const PersistentAlloc* const end = it + persistent_.size();
    bool same = true;
    for_each_init_call([&](InitCall call, int id, Bytes bytes, int pool) {
      if (it == end || it->call != call || it->bytes != bytes || it->pool_stream != pool ||
          (call == InitCall::Buffer && it->block == -1)) {
        same = false;
        return false;
      }
      if (call == InitCall::Buffer) {
        block_of_[id] = it->block;
        live_[static_cast<int>(bufs_[id].category)] += bytes;
      }
      ++it;
      return true;
    });
    if (same && it == end) {
      // Exact: start() reset the allocator to the empty state of this config (the same state for every
      // run, up to storage), and from one state a sequence of calls is deterministic (block ids,
      // addresses, splits, statistics, retries, OOMs), so the same (config, calls) leave the state
      // saved last time, and each request gets the block it got then. restore() reproduces that state
      // (see CachingAllocator::restore). live_ and block_of_ were filled from this program's buffers.
      allocator_.restore(after_persistent_);
      if (!persistent_.empty()) after_change(-1, 0);
      if (record_timeline_ && timeline_.empty()) timeline_.push_back(MemorySample{0, 0, 0});
      return;
    }
    live_ = {};   // the block_of_ entries written so far are rewritten below
  }
  if (from_start) {
    after_persistent_.invalidate();   // persistent_ is rebuilt (an exception may leave it half done)
    persistent_.clear();
  }
  construction_peak_ = AllocatorStats{};   // (kept with the saved state: the same calls reach the same peak)
  int scratch = -1;   // a FlatParameter flattened whole, freed once its shard exists
  std::vector<int>& temporaries = init_temporaries_;   // the loop setup's (StepProgram::loop_setup)
  temporaries.clear();
  init_original_blocks_.clear();
  bool originals_done = false;   // (the next Original begins another unit's)
  for_each_init_call([&](InitCall call, int id, Bytes bytes, int pool) {
    int block = -1;
    switch (call) {
      case InitCall::Buffer:
        block = allocator_.alloc(bytes, pool);
        block_of_[id] = block;
        live_[static_cast<int>(bufs_[id].category)] += bytes;
        if (scratch != -1) allocator_.free(scratch);
        scratch = -1;
        break;
      case InitCall::Scratch: scratch = allocator_.alloc(bytes, pool); break;
      case InitCall::Offloaded: {   // (made after the flattened whole, which is then freed; moved to the CPU)
        const int shard = allocator_.alloc(bytes, pool);
        if (scratch != -1) allocator_.free(scratch);
        scratch = -1;
        allocator_.free(shard);
        break;
      }
      case InitCall::Temporary: temporaries.push_back(allocator_.alloc(bytes, pool)); break;
      case InitCall::FreeTemporary: allocator_.free(temporaries[static_cast<std::size_t>(bytes)]); break;
      case InitCall::Original:
        if (originals_done) {
          init_original_blocks_.clear();
          originals_done = false;
        }
        init_original_blocks_.push_back(allocator_.alloc(bytes, pool));
        break;
      case InitCall::FreeOriginal:
        allocator_.free(init_original_blocks_[static_cast<std::size_t>(bytes)]);
        originals_done = true;
        break;
      case InitCall::EmptyCache:
        if (init_flatten_world_ >= 1) construction_peak_ = allocator_.stats();
        allocator_.empty_cache();
        allocator_.reset_peaks();
        break;
      // (FSDP1's lazy init: its requests leave their segments reserved; the allocator's peak counts them)
      case InitCall::Lazy: allocator_.free(allocator_.alloc(bytes, pool)); break;
    }
    if (from_start) persistent_.push_back(PersistentAlloc{bytes, pool, block, call});
    any = true;
    return true;
  });
  if (from_start) allocator_.save(after_persistent_);
  // One after_change for all of them, the same as one per buffer: allocated only grows here but for the
  // construction's scratch (freed at once: allocated ends at the buffers' sum) and the lazy init's requests, and
  // the allocator's own peaks count what they held; at t = 0 every sample overwrites the previous one.
  if (any) after_change(-1, 0);
  if (record_timeline_ && timeline_.empty()) timeline_.push_back(MemorySample{0, 0, 0});
}

void MemoryTracker::begin_steady_step() {
  const AllocatorStats& s = allocator_.stats();
  first_peak_allocated_ = s.peak_allocated;
  first_peak_reserved_ = s.peak_reserved;
  first_allocated_peak_op_ = allocated_peak_op_;
  first_reserved_peak_op_ = reserved_peak_op_;
  steady_ = true;
  allocator_.reset_peaks();
  peak_allocated_ = s.allocated;
  live_at_peak_ = live_;
  reserved_at_peak_ = s.reserved;
  reserved_peak_seen_ = s.reserved;
  allocated_peak_op_ = reserved_peak_op_ = -1;   // (at the step's start until an allocation passes it)
}

namespace {
// replay_timed: whether op i's free of a block whose record_stream op is j (-1: none) makes it reusable at
// once: j has completed by i's issue (op i itself only if it runs on the CPU, as the engine's issue does).
bool reusable_at_issue(const OpRec* ops, const TimeNs* issue_ns, const TimeNs* complete_ns, int i, int j) {
  return j < 0 || (j < i ? complete_ns[j] <= issue_ns[i] : (ops[i].flags & kCpuOp) != 0);
}
}  // namespace

void MemoryTracker::replay_timed(const CompiledProgram& program, const TimeNs* issue_ns, const TimeNs* complete_ns,
                                 TimeNs step_start_ns, const std::vector<PeriodJump>& jumps) {
  const OpRec* ops = program.ops.data();
  const int* lists = program.lists.data();
  const int n = program.num_ops();
  // Pending blocks wait on events: op j of the first step is event j (complete now), op j of this one
  // event n + j. `next_release`: the earliest completion a pending block of this step waits on (the
  // scan of the pending list only runs once an issue has reached it).
  TimeNs next_release = allocator_.has_pending() ? 0 : kNever;
  steady_shifted_ = 0;
  if (!jumps.empty()) begin_shapes(program);
  std::size_t nj = 0;   // the next of the first step's jumps
  std::size_t a_for = jumps.size();   // the jump whose first moment steady_a_ holds
  for (int i = 0; i < n; ++i) {
    // The first step's jumps: the memory at the same two ops, then, if it repeats and so do the times,
    // the same periods skipped (memory_shift.cpp).
    while (nj < jumps.size() && i > jumps[nj].b) ++nj;
    if (nj < jumps.size()) {
      const PeriodJump& J = jumps[nj];
      if (i == J.a) {
        capture_shape(steady_a_);
        a_for = nj;
      } else if (i == J.b && a_for == nj) {
        ++nj;
        capture_shape(steady_b_);
        if (shape_repeats(steady_a_, steady_b_, J.p)) {
          int m = steady_timing_periods(program, issue_ns, complete_ns, i, J.p, J.m);
          while (m > 0 && !can_shift(steady_a_, steady_b_, J.p, m)) --m;
          if (m > 0 && shift_periods(steady_a_, steady_b_, J.p, m, /*waited=*/false)) {
            steady_shifted_ += m;
            i += m * J.p;
            next_release = allocator_.has_pending() ? 0 : kNever;
            if (i >= n) break;
          }
        }
      }
    }
    const OpRec& r = ops[i];
    const TimeNs issue = issue_ns[i], now = step_start_ns + issue;
    if (r.allocs != r.frees) {
      if (issue >= next_release) {
        TimeNs later = kNever;
        allocator_.process_events([&](std::int64_t e) {
          if (e < n) return true;
          const TimeNs c = complete_ns[e - n];
          if (c <= issue) return true;
          later = std::min(later, c);
          return false;
        });
        next_release = later;
      }
    }
    auto free = [&](int buffer, int j) {
      const int block = block_of_[buffer];
      if (block == kNotLive) [[unlikely]]
        throw_not_live(buffer, i);
      const bool reusable = reusable_at_issue(ops, issue_ns, complete_ns, i, j);
      if (reusable) {
        allocator_.free_live(block);
      } else {
        allocator_.free_after(block, n + j);
        next_release = std::min(next_release, complete_ns[j]);
      }
      block_of_[buffer] = kNotLive;
      live_[static_cast<int>(bufs_[buffer].category)] -= bufs_[buffer].bytes;
      if (record_timeline_) record_sample(now);
    };
    const int after = issue_memory(lists, r, [&](int b) { alloc(b, i, now); }, [&](int b) { free(b, -1); });
    for (int k = after; k < r.end; k += 2) free(lists[k], lists[k + 1]);
  }
}

// The largest m' <= m such that ops [x, x + m'·p) of the steady step see the times as the ops p before
// them do: issued one period D later, each free reusable at once exactly when its counterpart was (else
// waiting on an op that completes D after the counterpart's), and each event a block waits on at x
// completing D after the one its counterpart waited on, period after period.
int MemoryTracker::steady_timing_periods(const CompiledProgram& program, const TimeNs* issue_ns,
                                         const TimeNs* complete_ns, int x, int p, int m) const {
  const OpRec* ops = program.ops.data();
  const int* lists = program.lists.data();
  const int n = program.num_ops();
  if (x < p) return 0;
  const TimeNs D = issue_ns[x] - issue_ns[x - p];
  m = std::min(m, (n - x) / p);
  // The events blocks wait on at x: this step's ops (a first-step event is complete: not a period's).
  for (int k = 0, np = allocator_.num_pending(); k < np; ++k) {
    const std::int64_t ev = allocator_.pending_at(k).second;
    if (ev < n) return 0;
    const int op = static_cast<int>(ev - n);
    for (int j = 1; j <= m; ++j) {
      const int o2 = op + j * p;
      if (o2 >= n || complete_ns[o2] - complete_ns[o2 - p] != D) {
        m = j - 1;
        break;
      }
    }
  }
  auto reusable = [&](int i, int j) { return reusable_at_issue(ops, issue_ns, complete_ns, i, j); };
  for (int i = x, e = x + m * p; i < e; ++i) {
    const OpRec& r = ops[i];
    const OpRec& r0 = ops[i - p];
    if (issue_ns[i] - issue_ns[i - p] != D || r.end - r.frees != r0.end - r0.frees) return (i - x) / p;
    for (int k = r.frees, k0 = r0.frees; k < r.end; k += 2, k0 += 2) {
      const int j = lists[k + 1], j0 = lists[k0 + 1];
      if (is_free_inside_op(j) || is_free_inside_op(j0)) {
        if (j != j0) return (i - x) / p;
        continue;
      }
      const bool now = reusable(i, j);
      if (now != reusable(i - p, j0) || (!now && complete_ns[j] - complete_ns[j0] != D)) return (i - x) / p;
    }
  }
  return m;
}

std::string MemoryTracker::canonical_state() const {
  std::string out = allocator_.canonical_state();
  for (int b = 0; b < num_bufs_; ++b) {
    const int blk = block_of_[b];
    if (blk == kNotLive) continue;
    out += "buf " + std::to_string(b) + " ";
    out += blk < 0 ? "null" : std::to_string(allocator_.block_address(blk)) + "+" + std::to_string(allocator_.block_size(blk));
    out += "\n";
  }
  for (int c = 0; c < kNumMemCategories; ++c) out += std::to_string(live_[c]) + " " + std::to_string(live_at_peak_[c]) + " ";
  out += std::to_string(reserved_at_peak_) + " " + std::to_string(peak_allocated_) + " at " +
         std::to_string(allocated_peak_op_) + ", reserved peak at " + std::to_string(reserved_peak_op_);
  return out;
}

std::string MemoryTracker::buffer_label(int buffer) const {
  if (names_ && buffer < static_cast<int>(names_->buffers.size()) && !names_->buffers[buffer].name.empty())
    return "buffer \"" + names_->buffers[buffer].name + "\"";
  return "buffer " + std::to_string(buffer);
}

void MemoryTracker::throw_already_live(int buffer, int op) const {
  throw InputError(op_field(op, "allocs"), std::to_string(buffer),
                   "a buffer that is not allocated (" + buffer_label(buffer) + " is already live" +
                       (steady_ ? ": the first step did not free it, and only persistent buffers outlive a step)" : ")"));
}

void MemoryTracker::throw_not_live(int buffer, int op) const {
  throw InputError(op_field(op, "frees"), std::to_string(buffer),
                   "a live buffer (" + buffer_label(buffer) + " is not allocated)");
}

void MemoryTracker::fill(SimResult& r, int max_samples) {
  const AllocatorStats& s = allocator_.stats();
  r.peak_allocated = s.peak_allocated;
  r.peak_reserved = s.peak_reserved;
  r.first_step_peak_allocated = steady_ ? first_peak_allocated_ : s.peak_allocated;
  r.first_step_peak_reserved = steady_ ? first_peak_reserved_ : s.peak_reserved;
  r.construction_peak_allocated = construction_peak_.peak_allocated;
  r.construction_peak_reserved = construction_peak_.peak_reserved;
  r.peak_allocated_at = PeakLocation{};
  r.peak_reserved_at = PeakLocation{};
  r.peak_allocated_at.op = allocated_peak_op_;
  r.peak_reserved_at.op = reserved_peak_op_;
  r.first_step_peak_allocated_at = PeakLocation{};
  r.first_step_peak_reserved_at = PeakLocation{};
  r.first_step_peak_allocated_at.op = steady_ ? first_allocated_peak_op_ : allocated_peak_op_;
  r.first_step_peak_reserved_at.op = steady_ ? first_reserved_peak_op_ : reserved_peak_op_;
  r.alloc_retries = s.num_alloc_retries;
  r.breakdown_at_peak.clear();
  Bytes requested = 0;
  for (int c = 0; c < kNumMemCategories; ++c) {
    auto cat = static_cast<MemCategory>(c);
    if (cat == MemCategory::AllocatorSlack || cat == MemCategory::CudaContext) continue;
    r.breakdown_at_peak[mem_category_name(cat)] = live_at_peak_[c];
    requested += live_at_peak_[c];
  }
  // Rounding to 512 B, unsplit remainders, cached free blocks of every stream's pool and blocks
  // waiting on record_stream events: what is reserved but not requested at the allocated peak.
  r.breakdown_at_peak[mem_category_name(MemCategory::AllocatorSlack)] = std::max<Bytes>(0, reserved_at_peak_ - requested);
  if (s.num_ooms > 0)
    r.notes.push_back("caching allocator: " + std::to_string(s.num_ooms) +
                      " allocation(s) exceeded the GPU memory even after releasing the cache "
                      "(a real run raises torch.OutOfMemoryError)" + (steady_ ? " in the first and steady step" : ""));
  if (s.num_alloc_retries > 0)
    r.notes.push_back("caching allocator: " + std::to_string(s.num_alloc_retries) +
                      " cudaMalloc retr" + (s.num_alloc_retries == 1 ? "y" : "ies") +
                      (steady_ ? " in the first and steady step" : "") +
                      " (cache released at capacity; each costs a device synchronize in a real run)");
  if (record_timeline_) r.memory_timeline = decimate_timeline(timeline_, max_samples);
}

std::vector<MemorySample> decimate_timeline(const std::vector<MemorySample>& in, int max_samples) {
  if (max_samples <= 0 || static_cast<int>(in.size()) <= max_samples) return in;
  // Each bucket contributes up to two samples (max allocated, max reserved) in time order.
  const std::size_t buckets = static_cast<std::size_t>(std::max(1, (max_samples - 1) / 2));
  std::vector<MemorySample> out;
  out.reserve(2 * buckets + 2);
  const std::size_t n = in.size();
  for (std::size_t b = 0; b < buckets; ++b) {
    std::size_t lo = b * n / buckets, hi = (b + 1) * n / buckets;
    if (lo >= hi) continue;
    std::size_t ia = lo, ir = lo;
    for (std::size_t i = lo; i < hi; ++i) {
      if (in[i].allocated > in[ia].allocated) ia = i;
      if (in[i].reserved > in[ir].reserved) ir = i;
    }
    std::size_t first = std::min(ia, ir), second = std::max(ia, ir);
    out.push_back(in[first]);
    if (second != first) out.push_back(in[second]);
  }
  if (out.back().t_ns != in.back().t_ns) out.push_back(in.back());
  return out;
}

}  // namespace fsdpsim::sim

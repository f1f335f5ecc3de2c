// MemoryTracker::replay (sim/memory_tracker.h): the memory of a program whose frees never wait on GPU
// work, replayed in program order, with repeated periods skipped where that is proven exact.
//
// What is skipped: runs of whole micro-batches (CompiledProgram::runs with periods of at least kShapePeriod
// ops, many of them: gradient accumulation). At consecutive period boundaries the replay captures the
// allocator's whole state (MemoryTracker::Shape: every block of every segment, the buffer in each, named by
// its role one period on); where the state at x is the state at x - p moved one period on and the period's
// calls repeat (same_lists), every later period repeats it too, and the remaining periods are applied at once
// (MemoryTracker::shift_periods, sim/memory_shift.cpp, which gives the argument). Everything else is replayed
// call by call.
//
// (Until 2026-11-28 a second, recorded fold also tried runs of blocks within a micro-batch, classifying the
// segments each period touched as cyclic, growth, consumed or pile. Since per-tensor memory (issue 19) it
// skipped periods of no plan of the benchmarks' searches (0 of 1,710 runs of the 70B search, 0 of 836 of the
// default 8B search) while recording cost 2-5% of their time, and it was removed.)
//
// The tests (tests/sim/test_memory_fold.cpp) compare every result, and the allocator's whole state, with the
// replay without skipping.
#include <stdexcept>
#include <string>

#include "sim/memory_tracker.h"

namespace fsdpsim::sim {

class MemoryFold {
 public:
  MemoryFold(MemoryTracker& t, const CompiledProgram& p, bool fold, bool verify)
      : t_(t), a_(t.allocator_), p_(p), ops_(p.ops.data()), lists_(p.lists.data()), n_(p.num_ops()), fold_(fold),
        verify_(verify), st_(&t.fold_scratch()), block_of_(t.block_of_.data()), bufs_(t.bufs_) {}
  void run();

 private:
  friend struct FoldScratch;
  FoldScratch& storage() const;
  static constexpr int kNotLive = MemoryTracker::kNotLive;
  static constexpr int kShapePeriod = 40;   // ops: a run of periods this long holds whole micro-batches

  // ---- replay primitives ----
  void alloc(int buffer, int op);
  void free(int buffer, int op);
  void replay_ops(int lo, int hi) {
    for (int i = lo; i < hi; ++i) {
      const OpRec& r = ops_[i];
      const int after = issue_memory(lists_, r, [&](int b) { alloc(b, i); }, [&](int b) { free(b, i); });
      for (int k = after; k < r.end; k += 2) free(lists_[k], i);
    }
  }
  // Runs of whole micro-batches: the memory compared at period boundaries (MemoryTracker::Shape); returns
  // the op up to which the run is done, and sets `skipped`.
  int shape_run(const PeriodicRun& run, bool& skipped);
  bool same_lists(int x, int p) const;

  MemoryTracker& t_;
  CachingAllocator& a_;
  const CompiledProgram& p_;
  const OpRec* ops_;
  const int* lists_;
  const int n_;
  const bool fold_, verify_;
  FoldScratch* const st_;               // storage() (the tracker's, created at construction)
  int* const block_of_;                 // t_.block_of_ (sized by start(), never resized during a replay)
  const CompiledBuffer* const bufs_;    // t_.bufs_
};

// Storage kept by the tracker between replays (a replay allocates nothing once it has grown).
struct FoldScratch {
  std::vector<std::uint8_t> folded;                          // per run of the program: the first step skipped periods
  MemoryTracker::Shape shape_a, shape_b;                     // (shape_run's)
};

// (MemoryTracker::start_run: a new run, whose program may lie where the last one did)
void forget_fold_precompute(FoldScratch& s) { s.folded.clear(); }

// The replay's per-call path (inline into replay_ops).
inline void MemoryFold::alloc(int buffer, int op) {
  if (block_of_[buffer] != kNotLive) [[unlikely]] {
    if (t_.steady_ && bufs_[buffer].first_step_lazy) return;   // (MemoryTracker::alloc)
    t_.throw_already_live(buffer, op);
  }
  const CompiledBuffer& b = bufs_[buffer];
  const int block = a_.alloc(b.bytes, b.pool_stream);
  block_of_[buffer] = block;
  t_.live_[static_cast<int>(b.category)] += b.bytes;
  if (block >= 0) {
    t_.note_block(block, buffer);
  }
  t_.note_peaks(op);
}
inline void MemoryFold::free(int buffer, int op) {
  const int block = block_of_[buffer];
  if (block == kNotLive) [[unlikely]]
    t_.throw_not_live(buffer, op);
  a_.free_live(block);
  block_of_[buffer] = kNotLive;
  const CompiledBuffer& b = bufs_[buffer];
  t_.live_[static_cast<int>(b.category)] -= b.bytes;
}

FoldScratch& MemoryTracker::fold_scratch() {
  if (!fold_scratch_) fold_scratch_.reset(new FoldScratch);
  return *fold_scratch_;
}
void MemoryTracker::FoldScratchDeleter::operator()(FoldScratch* s) const { delete s; }

FoldScratch& MemoryFold::storage() const { return *st_; }

void MemoryTracker::replay(const CompiledProgram& program, bool fold, bool verify) {
  fold_stats_ = FoldStats{};
  MemoryFold f(*this, program, fold, verify);
  f.run();
}

void MemoryFold::run() {
  // Expandable segments keep a pool's blocks in one segment that every period touches and that grows
  // with the activations: no layout repeats, so they are replayed call by call.
  if (!fold_ || p_.runs.empty() || a_.config().expandable_segments) {
    replay_ops(0, n_);
    return;
  }
  FoldScratch& st = storage();
  // The persistent buffers' blocks (allocated before the replay) are named too: a segment a period
  // touches may hold one (a persistent buffer's cached remainder reused).
  const CompiledBuffer* const bufs = p_.buffers.data();
  const int nb = static_cast<int>(p_.buffers.size());
  for (int b = 0; b < nb; ++b) {
    if (!bufs[b].persistent) continue;
    const int blk = block_of_[b];
    if (blk < 0) continue;
    t_.note_block(blk, b);
  }
  // The steady step tries only the runs the first step folded: comparing a run's states costs more than
  // replaying it, and one whose first step never repeated does not repeat in the steady step either. (A cost
  // rule: either way every call is exact.)
  const bool steady = t_.steady_ && st.folded.size() == p_.runs.size();
  if (!steady) st.folded.assign(p_.runs.size(), 0);
  int x = 0;
  for (std::size_t k = 0; k < p_.runs.size(); ++k) {
    const PeriodicRun& run = p_.runs[k];
    // (nested in a run done, or not whole micro-batches: replayed call by call with what follows)
    if (run.begin < x || run.period < kShapePeriod || run.count < 8) continue;
    if (steady && !st.folded[k]) continue;
    replay_ops(x, run.begin);
    x = run.begin + run.period * run.count;
    bool folded = false;
    const int y = shape_run(run, folded);
    if (y < x) replay_ops(y, x);
    if (!steady) st.folded[k] = folded ? 1 : 0;
  }
  replay_ops(x, n_);
}

// Ops [x, x + p) allocate and free as ops [x - p, x) did, one period on: buffers of the same facts, each
// freed buffer the one playing its role p ops later, the same frees inside the op (the run's guarantee,
// CompiledProgram::runs, carries it to every later period: roles named by shift stay shifts).
bool MemoryFold::same_lists(int x, int p) const {
  for (int i = x - p; i < x; ++i) {
    const OpRec& r = ops_[i];
    const OpRec& r2 = ops_[i + p];
    if (r2.frees - r2.allocs != r.frees - r.allocs || r2.end - r2.frees != r.end - r.frees) return false;
    for (int k = r.allocs, k2 = r2.allocs; k < r.frees; ++k, ++k2)
      if (!(bufs_[lists_[k2]] == bufs_[lists_[k]])) return false;
    for (int k = r.frees, k2 = r2.frees; k < r.end; k += 2, k2 += 2)
      if (!t_.shifted_buffer(lists_[k], lists_[k2], p) || lists_[k2 + 1] != lists_[k + 1]) return false;
  }
  return true;
}

// The memory at consecutive period boundaries of a run of whole micro-batches: where the state at x is
// the state at x - p one period on (MemoryTracker::shape_repeats; no free waits on GPU work here, so
// the calls alone decide it) and the period's calls repeat, every later period repeats it too
// (sim/memory_shift.cpp's argument, without the times), and the remaining periods are applied at once
// (MemoryTracker::shift_periods). Unlike fold_run it records nothing per call, and it compares whole
// allocator states, so a period that releases the cache and cudaMallocs again (a plan past its memory)
// still repeats; a run whose state grows period by period is left to fold_run.
int MemoryFold::shape_run(const PeriodicRun& run, bool& skipped) {
  FoldScratch& st = storage();
  const int p = run.period, end = run.begin + p * run.count;
  skipped = false;
  t_.begin_shapes(p_);
  MemoryTracker::Shape* a = &st.shape_a;
  MemoryTracker::Shape* b = &st.shape_b;
  int x = run.begin;
  bool have = false;
  for (int tries = 0; tries < 5 && x + p <= end; ++tries) {
    t_.capture_shape(*b);
    if (have && t_.shape_repeats(*a, *b, p) && same_lists(x, p)) {
      int m = (end - x) / p;
      while (m > 0 && !t_.can_shift(*a, *b, p, m)) --m;
      if (m > 0) {
        t_.shift_periods(*a, *b, p, m, /*waited=*/false);
        ++t_.fold_stats_.jumps;
        t_.fold_stats_.periods_skipped += m;
        skipped = true;
        if (verify_) {
          // The state a call-by-call replay reaches at the same op, to the last block and address.
          MemoryTracker ref;
          ref.start(p_, a_.config(), false);
          ref.allocate_persistent();
          MemoryFold f(ref, p_, false, false);
          if (t_.steady_) {
            f.replay_ops(0, n_);
            ref.begin_steady_step();
          }
          f.replay_ops(0, x + m * p);
          if (ref.canonical_state() != t_.canonical_state())
            throw std::logic_error("memory fold: moving " + std::to_string(m) + " periods of " + std::to_string(p) +
                                   " ops at op " + std::to_string(x) + " left another state than replaying them");
        }
        return x + m * p;
      }
    }
    std::swap(a, b);
    have = true;
    replay_ops(x, x + p);
    x += p;
  }
  return x;
}

}  // namespace fsdpsim::sim

// MemoryTracker::replay (sim/memory_tracker.h): the memory of a program whose frees never wait on GPU
// work, replayed in program order, with repeated periods skipped where that is proven exact.
//
// Why skipping is exact. Inside a run of identical periods (CompiledProgram::runs: each op repeats the
// op one period before, its buffers' roles shifted), the replay watches what each "memory period"
// (q = 1 or 2 consecutive periods: FSDP's double-buffered all-gather outputs alternate between two
// layouts) does to the allocator, segment by segment. Every segment a memory period touches is one of:
//   cyclic    touched in the previous memory period too; it must end every memory period in the same
//             layout (block sizes, free/allocated, and for an allocated block the role of its buffer:
//             "freed at event k of the op so many ops after this boundary", or, for a buffer freed only
//             after the run, that very buffer);
//   growth    created in it (cudaMalloc), ending with blocks that outlive the run and free blocks too
//             small for any request of their pool in a period ("dead": best fit never takes them);
//   consumed  first touched by the free of a buffer allocated before (the activations a backward frees),
//             ending all free and dead;
//   pile      first touched by an allocation that took a whole free segment (the forward of a later
//             micro-batch reusing the cached activation segments), ending with its block and a dead rest.
// If two consecutive memory periods A and B match — the same cyclic segments in the same final
// layouts, growth/consumed/pile segments of the same shapes in the same order, the same statistics
// deltas — then the next memory period, which performs the same calls one period on, meets the same
// state where it looks: the cyclic segments as B left them (congruent to A's), no new candidate for
// best fit (growth, consumed and pile leftovers are dead; pile items are consumed lowest address first
// and no other free block has their size), untouched segments untouched; so it makes the same choices
// and leaves the same state, one period on, by induction over the skipped periods. The skip checks
// beforehand, for each skipped memory period, what it depends on that lies outside the matched
// periods: the blocks the consumed frees will free have B's consumed layout, enough pile segments are
// cached, the growth buffers and the cyclic segments' buffers at the end exist and are not live, every
// cudaMalloc stays under the capacity (no cache release, which would break the pattern). It then applies
// the skipped periods' net effect: the consumed frees and pile allocations as the real calls
// (free_live, alloc_from), growth segments appended at the addresses cudaMalloc would give, the cyclic
// segments' buffers renamed, statistics advanced by m deltas, and the allocated peak moved where the
// last skipped period's maximum lies (allocated grows by the same delta every period). The tests
// (tests/sim/test_memory_fold.cpp) compare every result, and the allocator's whole state, with the
// replay without skipping.
#include <algorithm>
#include <stdexcept>
#include <climits>
#include <span>
#include <string>
#include <vector>

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
  static constexpr int kNever = INT_MAX;
  enum Kind : std::uint8_t { kCyclic, kGrowth, kConsumed, kPile };

  // A block of a segment's layout, with its buffer's role.
  struct Entry {
    Bytes size = 0, requested = 0;
    std::uint8_t role = 0;   // 0 free, 1 freed at op boundary + a (frees index b), 2 buffer a itself,
                             // 3 allocated at op period_start + a (allocs index b)
    int a = 0, b = 0;
    bool operator==(const Entry&) const = default;
  };
  struct Touch {
    int seg = -1;
    Kind kind = kCyclic;
    int event = 0, index = 0;          // consumed/pile: the op (relative to the period start) and list index
    Bytes seg_base = 0, seg_size = 0;
    int pool = 0;
    std::vector<Entry> before, after;
  };
  struct Rec {                         // one memory period
    int start = 0, end = 0;            // ops
    int segs_at_start = 0;
    bool foldable = true;
    std::vector<Touch> touch_store;    // the first n_touches, in first-touch order (storage reused)
    int n_touches = 0;
    std::span<Touch> touches() { return {touch_store.data(), static_cast<std::size_t>(n_touches)}; }
    std::span<const Touch> touches() const { return {touch_store.data(), static_cast<std::size_t>(n_touches)}; }
    Touch& add_touch() {
      if (n_touches == static_cast<int>(touch_store.size())) touch_store.emplace_back();
      Touch& t = touch_store[static_cast<std::size_t>(n_touches++)];
      t.before.clear();
      t.after.clear();
      t.event = t.index = 0;
      return t;
    }
    AllocatorStats stats;              // at the end
    std::array<Bytes, kNumMemCategories> live{};
    Bytes next_addr = 0;
    bool has_max = false;
    Bytes max_alloc = 0, res_at_max = 0;
    int max_alloc_op = -1, max_res_op = -1;   // where max_alloc / max_res were first reached
    std::array<Bytes, kNumMemCategories> live_at_max{};
    bool has_malloc = false;
    Bytes max_res = 0;                 // the largest reserved right after a cudaMalloc
  };

  // ---- replay primitives ----
  void alloc(int buffer, int op);
  void after_alloc(int buffer, int op, int block, Bytes reserved);   // the record's note (recording only)
  void free(int buffer, int op);
  void replay_ops(int lo, int hi) {
    for (int i = lo; i < hi; ++i) {
      const OpRec& r = ops_[i];
      const int after = issue_memory(lists_, r, [&](int b) { alloc(b, i); }, [&](int b) { free(b, i); });
      for (int k = after; k < r.end; k += 2) free(lists_[k], i);
    }
  }
  void precompute();
  int free_index(int op, int buffer) const;
  int alloc_index(int op, int buffer) const;
  bool fold_run(const PeriodicRun& run);   // whether it skipped periods
  // Runs of whole micro-batches: the memory compared at period boundaries (MemoryTracker::Shape); returns
  // the op up to which the run is done, and sets `skipped`.
  int shape_run(const PeriodicRun& run, bool& skipped);
  bool same_lists(int x, int p) const;
  // ---- recording ----
  void begin_record(Rec& r, int start, int end);
  void end_record(Rec& r);
  void touch(int seg, int buffer, int op, bool is_alloc, int block);
  void capture(int seg, int boundary, std::vector<Entry>& out);
  // seg's blocks in address order as entries; role(e, buffer) describes each allocated block's buffer.
  template <class Role>
  void capture_with(int seg, std::vector<Entry>& out, Role role);
  // The record that last touched segment slot seg (one that none did: -100; slots are created while
  // not recording too, so the stamps may not cover every slot).
  int stamp_of(int seg) const;
  void capture_growth(int seg, int period_start, std::vector<Entry>& out);
  bool dead(int pool, Bytes size) const {
    for (const auto& [p, s] : min_req_)
      if (p == pool) return size < s;
    return true;
  }
  // ---- matching and skipping ----
  bool match(const Rec& a0, const Rec& a, const Rec& b) const;
  int skip(const Rec& a, const Rec& b, int q, int room);

  MemoryTracker& t_;
  CachingAllocator& a_;
  const CompiledProgram& p_;
  const OpRec* ops_;
  const int* lists_;
  const int n_;
  const bool fold_, verify_;
  int run_begin_ = 0, run_end_ = 0, period_ = 0;
  int life_ = 0;                        // the longest a buffer of a period lives within the run, in periods
  bool hopeless_ = false;               // the run shows a pattern no memory period matches
  Rec* rec_ = nullptr;                  // the memory period being recorded (null: not recording)
  int stamp_now_ = 0;
  std::vector<std::pair<int, Bytes>> min_req_;   // per pool: the smallest rounded request of a period
  std::vector<CachingAllocator::BlockInfo> tmp_;
  FoldScratch* const st_;               // storage() (the tracker's, created at construction)
  int* const block_of_;                 // t_.block_of_ (sized by start(), never resized during a replay)
  const CompiledBuffer* const bufs_;    // t_.bufs_
};

// Storage kept by the tracker between replays (a replay allocates nothing once it has grown).
struct FoldScratch {
  std::vector<int> free_op, alloc_op;                        // per buffer: the op freeing / allocating it
  std::vector<int> seg_stamp;                                // segment slot -> the record that last touched it
  std::vector<int> seg_touch;                                // segment slot -> its touch in that record
  std::vector<int> pile_blocks;
  std::vector<std::uint8_t> folded;                          // per run of the program: the first step skipped periods
  MemoryTracker::Shape shape_a, shape_b;                     // (shape_run's)
  MemoryFold::Rec recs[3];                                   // fold_run's consecutive memory periods
  // The program free_op / alloc_op were computed for in this run (MemoryTracker::start forgets it): the
  // steady step replays the program the first step did, so it reuses them.
  const CompiledProgram* precomputed_for = nullptr;
};

// (MemoryTracker::start_run: a new run, whose program may lie where the last one did)
void forget_fold_precompute(FoldScratch& s) {
  s.precomputed_for = nullptr;
  s.folded.clear();
}

// The replay's per-call path (inline into replay_ops). What only recording needs is out of line
// (after_alloc), behind one test.
inline void MemoryFold::alloc(int buffer, int op) {
  if (block_of_[buffer] != kNotLive) [[unlikely]] {
    if (t_.steady_ && bufs_[buffer].first_step_lazy) return;   // (MemoryTracker::alloc)
    t_.throw_already_live(buffer, op);
  }
  const CompiledBuffer& b = bufs_[buffer];
  const Bytes reserved = a_.stats().reserved;
  const int block = a_.alloc(b.bytes, b.pool_stream);
  block_of_[buffer] = block;
  t_.live_[static_cast<int>(b.category)] += b.bytes;
  if (block >= 0) {
    t_.note_block(block, buffer);
  }
  t_.note_peaks(op);
  if (rec_ != nullptr) [[unlikely]]
    after_alloc(buffer, op, block, reserved);
}
inline void MemoryFold::free(int buffer, int op) {
  const int block = block_of_[buffer];
  if (block == kNotLive) [[unlikely]]
    t_.throw_not_live(buffer, op);
  if (rec_ != nullptr && block >= 0) [[unlikely]]
    touch(a_.block_segment(block), buffer, op, false, block);
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

void MemoryFold::after_alloc(int buffer, int op, int block, Bytes reserved) {
  const AllocatorStats& s = a_.stats();
  Rec& r = *rec_;
  if (!r.has_max || s.allocated > r.max_alloc) {
    r.has_max = true;
    r.max_alloc = s.allocated;
    r.live_at_max = t_.live_;
    r.res_at_max = s.reserved;
    r.max_alloc_op = op;
  }
  if (s.reserved != reserved) {
    r.has_malloc = true;
    if (s.reserved > r.max_res) {
      r.max_res = s.reserved;
      r.max_res_op = op;
    }
  }
  if (block >= 0) touch(a_.block_segment(block), buffer, op, true, block);
}

// Where every buffer is allocated and freed (op, list index): roles are named by them.
void MemoryFold::precompute() {
  FoldScratch& st = storage();
  const int nb = static_cast<int>(p_.buffers.size());
  st.free_op.assign(nb, kNever);
  st.alloc_op.assign(nb, -1);
  int* free_op = st.free_op.data();
  int* alloc_op = st.alloc_op.data();
  for (int i = 0; i < n_; ++i) {
    const OpRec& r = ops_[i];
    for (int k = r.allocs; k < r.frees; ++k) alloc_op[lists_[k]] = i;
    for (int k = r.frees; k < r.end; k += 2) free_op[lists_[k]] = i;
  }
}

// The position of `buffer` in op's free list (pairs) / alloc list.
int MemoryFold::free_index(int op, int buffer) const {
  const OpRec& r = ops_[op];
  for (int k = r.frees; k < r.end; k += 2)
    if (lists_[k] == buffer) return (k - r.frees) / 2;
  return -1;
}
int MemoryFold::alloc_index(int op, int buffer) const {
  const OpRec& r = ops_[op];
  for (int k = r.allocs; k < r.frees; ++k)
    if (lists_[k] == buffer) return k - r.allocs;
  return -1;
}

void MemoryFold::run() {
  // Expandable segments keep a pool's blocks in one segment that every period touches and that grows
  // with the activations: no layout repeats, so they are replayed call by call.
  if (!fold_ || p_.runs.empty() || a_.config().expandable_segments) {
    replay_ops(0, n_);
    return;
  }
  FoldScratch& st = storage();
  // (The first step's replay computes them; the steady step's, of the same program in the same run, reuses them.)
  if (!t_.steady_ || st.precomputed_for != &p_) {
    precompute();
    st.precomputed_for = &p_;
  }
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
  st.seg_stamp.assign(static_cast<std::size_t>(a_.num_segment_slots()) + 64, -100);
  st.seg_touch.assign(st.seg_stamp.size(), 0);
  // The steady step tries only the runs the first step folded: recording a run costs more than replaying
  // it, and one whose first step never repeated (a run of blocks whose activations pile up) does not
  // repeat in the steady step either. (A cost rule: either way every call is exact.)
  const bool steady = t_.steady_ && st.folded.size() == p_.runs.size();
  if (!steady) st.folded.assign(p_.runs.size(), 0);
  int x = 0;
  for (std::size_t k = 0; k < p_.runs.size(); ++k) {
    const PeriodicRun& run = p_.runs[k];
    if (run.begin < x || run.period < 1 || run.count < 4) continue;   // (nested in a run done, or too short)
    replay_ops(x, run.begin);
    x = run.begin + run.period * run.count;
    if (steady && !st.folded[k]) {
      replay_ops(run.begin, x);
      continue;
    }
    bool folded = false;
    if (run.period >= kShapePeriod && run.count >= 8) {
      // Whole micro-batches: compared at their boundaries first (no recording); what that does not
      // match goes to the recorded fold.
      const int y = shape_run(run, folded);
      if (!folded && y < x) folded = fold_run(PeriodicRun{y, run.period, (x - y) / run.period});
      else if (y < x) replay_ops(y, x);
    } else {
      folded = fold_run(run);
    }
    if (!steady) st.folded[k] = folded ? 1 : 0;
  }
  replay_ops(x, n_);
}

void MemoryFold::begin_record(Rec& r, int start, int end) {
  r.start = start;
  r.end = end;
  r.segs_at_start = a_.num_segment_slots();
  r.foldable = true;
  r.n_touches = 0;
  r.has_max = r.has_malloc = false;
  r.max_res = 0;
  ++stamp_now_;
  rec_ = &r;
}

void MemoryFold::touch(int seg, int buffer, int op, bool is_alloc, int block) {
  FoldScratch& st = storage();
  if (static_cast<std::size_t>(seg) >= st.seg_stamp.size()) {
    st.seg_stamp.resize(2 * seg + 64, -100);
    st.seg_touch.resize(st.seg_stamp.size(), 0);
  }
  int& stamp = st.seg_stamp[static_cast<std::size_t>(seg)];
  Rec& r = *rec_;
  if (stamp == stamp_now_) {
    // Touched before in this memory period: a consumed or pile segment is one event's (the skip
    // replays that event alone), so a second event there is not a pattern the skip reproduces.
    const Kind k = r.touch_store[static_cast<std::size_t>(st.seg_touch[static_cast<std::size_t>(seg)])].kind;
    if (k == kConsumed || k == kPile) r.foldable = false;
    return;
  }
  st.seg_touch[static_cast<std::size_t>(seg)] = r.n_touches;
  Touch& t = r.add_touch();
  t.seg = seg;
  t.seg_base = a_.segment_base(seg);
  t.seg_size = a_.segment_size(seg);
  t.pool = a_.segment_pool(seg);
  if (seg >= r.segs_at_start) {
    t.kind = kGrowth;
  } else if (stamp == stamp_now_ - 1) {
    t.kind = kCyclic;
  } else if (!is_alloc) {
    // The first free in a segment the previous memory period left alone: its layout before the free.
    t.kind = kConsumed;
    t.event = op - r.start;
    t.index = free_index(op, buffer);
    capture(seg, r.start, t.before);
  } else {
    // An allocation from a segment the previous memory period left alone: it must have been a whole
    // free segment (the block at its front, the rest free after it).
    t.kind = kPile;
    t.event = op - r.start;
    t.index = alloc_index(op, buffer);
    tmp_.clear();
    a_.segment_blocks(seg, tmp_);
    const bool whole = tmp_.size() <= 2 && tmp_[0].block == block && (tmp_.size() == 1 || tmp_[1].free);
    if (!whole) r.foldable = false;
    // Best fit took this segment over every other free block of its size: if one of them lies in a
    // segment the pattern reuses (touched in this memory period or the previous), a later period could
    // take that one instead (pile segments are taken in address order); the skip cannot tell.
    a_.free_blocks_of_size(t.pool, t.seg_size, st.pile_blocks);
    for (int other : st.pile_blocks) {
      const int s2 = a_.block_segment(other);
      if (stamp_of(s2) >= stamp_now_ - 1)
        r.foldable = false;
    }
  }
  stamp = stamp_now_;
}

int MemoryFold::stamp_of(int seg) const {
  const FoldScratch& st = storage();
  return static_cast<std::size_t>(seg) < st.seg_stamp.size() ? st.seg_stamp[static_cast<std::size_t>(seg)] : -100;
}

template <class Role>
void MemoryFold::capture_with(int seg, std::vector<Entry>& out, Role role) {
  out.clear();
  tmp_.clear();
  a_.segment_blocks(seg, tmp_);
  for (const auto& bi : tmp_) {
    Entry e;
    e.size = bi.size;
    e.requested = bi.requested;
    if (!bi.free) role(e, t_.buffer_of_block_[static_cast<std::size_t>(bi.block)]);
    out.push_back(e);
  }
}

// seg's blocks in address order; an allocated block's buffer by its role relative to op `boundary`.
void MemoryFold::capture(int seg, int boundary, std::vector<Entry>& out) {
  const FoldScratch& st = storage();
  capture_with(seg, out, [&](Entry& e, int buf) {
    if (st.free_op[buf] < run_end_) {
      e.role = 1;
      e.a = st.free_op[buf] - boundary;
      e.b = free_index(st.free_op[buf], buf);
    } else {
      e.role = 2;
      e.a = buf;
    }
  });
}

// A growth segment's blocks: an allocated block's buffer by where it was allocated (relative to the
// period's first op); it must outlive the run (checked when skipping).
void MemoryFold::capture_growth(int seg, int period_start, std::vector<Entry>& out) {
  const FoldScratch& st = storage();
  capture_with(seg, out, [&](Entry& e, int buf) {
    e.role = 3;
    // (a buffer allocated before this period, persistent ones included, is not this period's growth)
    if (st.alloc_op[buf] < period_start || st.free_op[buf] < run_end_) {
      rec_->foldable = false;
    } else {
      e.a = st.alloc_op[buf] - period_start;
      e.b = alloc_index(st.alloc_op[buf], buf);
    }
  });
}

void MemoryFold::end_record(Rec& r) {
  // Every buffer of the run still live here and freed later in the run must sit in a segment this
  // memory period touched (a cyclic one, whose buffers the skip renames): a buffer resting in an
  // untouched segment (buffers rotating among more segments than the memory period spans) would be
  // left behind by a skip. Such buffers were allocated at most `life_` periods ago.
  {
    const FoldScratch& st = storage();
    for (int i = std::max(run_begin_, r.end - (life_ + 1) * period_); i < r.end && r.foldable; ++i) {
      const OpRec& op = ops_[i];
      for (int k = op.allocs; k < op.frees; ++k) {
        const int buf = lists_[k];
        const int blk = t_.block_of_[buf];
        if (blk < 0 || st.free_op[buf] >= run_end_) continue;
        if (stamp_of(a_.block_segment(blk)) != stamp_now_) {
          r.foldable = false;
          break;
        }
      }
    }
  }
  for (Touch& t : r.touches()) {
    if (!a_.segment_live(t.seg)) {
      r.foldable = false;   // released (a cudaMalloc retry): not a pattern to repeat
      continue;
    }
    // (growth and pile segments keep their new buffers beyond the run: named by where they were allocated;
    // a record already unfoldable is never matched, so its segments need no capture)
    if (t.kind == kGrowth || t.kind == kPile) {
      if (!r.foldable) {
        t.after.clear();
        continue;
      }
      capture_growth(t.seg, r.start, t.after);
    } else {
      capture(t.seg, r.end, t.after);
      // A buffer of this period that outlives the run, in a segment reused every period (accumulated
      // no_sync gradients carved from cached segments): not a shape the skip knows; no memory period
      // length will match, so the run is replayed call by call from here.
      // (A buffer allocated after the run, e.g. the optimizer's state the first step created, sits
      // there from before the period: the steady step meets it.)
      if (t.kind == kCyclic)
        for (const Entry& e : t.after)
          if (e.role == 2 && storage().alloc_op[e.a] >= r.start && storage().alloc_op[e.a] < r.end) hopeless_ = true;
    }
  }
  r.stats = a_.stats();
  r.live = t_.live_;
  r.next_addr = a_.next_address();
  rec_ = nullptr;
}

// b repeats a, which repeated a0 (consecutive memory periods of one length).
bool MemoryFold::match(const Rec& a0, const Rec& a, const Rec& b) const {
  if (!a.foldable || !b.foldable || a.n_touches != b.n_touches) return false;
  const Bytes dnext = b.next_addr - a.next_addr;
  for (int k = 0; k < a.n_touches; ++k) {
    const Touch& x = a.touch_store[static_cast<std::size_t>(k)];
    const Touch& y = b.touch_store[static_cast<std::size_t>(k)];
    if (x.kind != y.kind || x.pool != y.pool || x.seg_size != y.seg_size || x.event != y.event || x.index != y.index ||
        !(x.after == y.after) || !(x.before == y.before))
      return false;
    switch (x.kind) {
      case kCyclic:
        if (x.seg != y.seg) return false;
        break;
      case kGrowth:
        if (y.seg_base - x.seg_base != dnext) return false;
        for (const Entry& e : y.after)
          if (e.role == 0 && !dead(y.pool, e.size)) return false;
        break;
      case kConsumed:
      case kPile:
        if (x.kind == kPile && y.seg_base <= x.seg_base) return false;   // (piles are taken in address order)
        for (const Entry& e : y.after)
          if (e.role == 0 && !dead(y.pool, e.size)) return false;
        break;
    }
  }
  // The same statistics deltas twice (allocated etc. move by the same amount every memory period).
  const AllocatorStats &s0 = a0.stats, &s1 = a.stats, &s2 = b.stats;
  auto same = [](Bytes v0, Bytes v1, Bytes v2) { return v2 - v1 == v1 - v0; };
  if (!same(s0.allocated, s1.allocated, s2.allocated) || !same(s0.requested, s1.requested, s2.requested) ||
      !same(s0.reserved, s1.reserved, s2.reserved) || !same(s0.num_allocs, s1.num_allocs, s2.num_allocs) ||
      !same(s0.num_device_alloc, s1.num_device_alloc, s2.num_device_alloc) || s1.num_device_free != s2.num_device_free ||
      s1.num_alloc_retries != s2.num_alloc_retries || s1.num_ooms != s2.num_ooms || s2.pending != 0 ||
      !same(a0.next_addr, a.next_addr, b.next_addr))
    return false;
  for (int c = 0; c < kNumMemCategories; ++c)
    if (!same(a0.live[c], a.live[c], b.live[c])) return false;
  if (a.has_max != b.has_max || a.has_malloc != b.has_malloc) return false;
  if (b.has_max && (b.max_alloc - a.max_alloc != s2.allocated - s1.allocated || b.res_at_max - a.res_at_max != s2.reserved - s1.reserved))
    return false;
  if (b.has_malloc && b.max_res - a.max_res != s2.reserved - s1.reserved) return false;
  return true;
}

// Skips up to `room` memory periods of q periods after b (which repeated a); returns how many it skipped.
int MemoryFold::skip(const Rec& a, const Rec& b, int q, int room) {
  FoldScratch& st = storage();
  const int span = q * period_;             // ops per memory period
  const int x = b.end;                      // the boundary after b
  const AllocatorStats& sb = b.stats;
  const Bytes d_alloc = sb.allocated - a.stats.allocated, d_res = sb.reserved - a.stats.reserved;
  int m = room;
  // Every cudaMalloc stays within the capacity (reserved + its size, at most b's max_res + i*d_res).
  const Bytes cap = a_.config().capacity;
  if (cap > 0 && b.has_malloc) {
    if (b.max_res > cap) return 0;
    if (d_res > 0) m = std::min<long long>(m, (cap - b.max_res) / d_res);
  }
  // The cyclic segments' buffers at the end must name ops inside the run.
  for (const Touch& t : b.touches())
    if (t.kind == kCyclic)
      for (const Entry& e : t.after)
        if (e.role == 1) m = std::min<long long>(m, (run_end_ - 1 - x - e.a) / span);
  // Pile segments: enough cached whole segments of the size, and no other free block of that size.
  int piles = 0;
  Bytes pile_size = 0;
  int pile_pool = -1;
  for (const Touch& t : b.touches()) {
    if (t.kind != kPile) continue;
    if (piles > 0 && (t.seg_size != pile_size || t.pool != pile_pool)) return 0;   // (one kind of pile)
    pile_size = t.seg_size;
    pile_pool = t.pool;
    ++piles;
  }
  if (piles > 0) {
    // The cached whole segments of that size no matched period touched, in address order (a touched
    // segment of that size is part of the pattern, taken by it at its own moment).
    a_.free_blocks_of_size(pile_pool, pile_size, st.pile_blocks);
    std::size_t keep = 0;
    for (int blk : st.pile_blocks) {
      if (!a_.block_is_whole_segment(blk)) return 0;
      if (stamp_of(a_.block_segment(blk)) >= stamp_now_ - 1) continue;
      st.pile_blocks[keep++] = blk;
    }
    st.pile_blocks.resize(keep);
    m = std::min<int>(m, static_cast<int>(st.pile_blocks.size()) / piles);
  }
  // Per skipped memory period: the consumed frees' blocks have b's layout; growth buffers outlive the run.
  std::vector<Entry> lay;
  int ok = 0;
  for (int i = 1; i <= m; ++i) {
    const int base = x + (i - 1) * span;
    bool good = true;
    for (const Touch& t : b.touches()) {
      if (t.kind == kConsumed) {
        const int op = base + t.event;
        const int buf = lists_[ops_[op].frees + 2 * t.index];
        const int blk = t_.block_of_[buf];
        if (blk < 0) { good = false; break; }
        const int seg = a_.block_segment(blk);
        if (stamp_of(seg) >= stamp_now_ - 1) { good = false; break; }   // (b touched it)
        // (another pool's segment of the same layout would, once free, be a candidate there)
        if (a_.segment_pool(seg) != t.pool || a_.segment_size(seg) != t.seg_size) { good = false; break; }
        capture(seg, base, lay);
        if (!(lay == t.before)) { good = false; break; }
      } else if (t.kind == kGrowth) {
        for (const Entry& e : t.after) {
          if (e.role != 3) continue;
          const int op = base + e.a;
          const int buf = lists_[ops_[op].allocs + e.b];
          if (st.free_op[buf] < run_end_ || t_.block_of_[buf] != kNotLive) { good = false; break; }
        }
        if (!good) break;
      } else if (t.kind == kPile) {
        if (t_.block_of_[lists_[ops_[base + t.event].allocs + t.index]] != kNotLive) { good = false; break; }
      }
    }
    if (!good) break;
    ok = i;
  }
  m = ok;
  if (m < 1) return 0;
  const int x_end = x + m * span;
  // The cyclic segments' buffers at the end are not live now (else they would sit in two blocks).
  for (const Touch& t : b.touches())
    if (t.kind == kCyclic)
      for (const Entry& e : t.after)
        if (e.role == 1 && t_.block_of_[lists_[ops_[x_end + e.a].frees + 2 * e.b]] != kNotLive) return 0;

  // ---- apply: the skipped periods' consumed frees, pile allocations and growth segments, in order ----
  int pile_next = 0;
  std::vector<std::pair<Bytes, Bytes>> blocks;
  std::vector<int> ids;
  for (int i = 1; i <= m; ++i) {
    const int base = x + (i - 1) * span;
    for (const Touch& t : b.touches()) {
      if (t.kind == kConsumed) {
        const int buf = lists_[ops_[base + t.event].frees + 2 * t.index];
        a_.free_live(t_.block_of_[buf]);
        t_.block_of_[buf] = kNotLive;
      } else if (t.kind == kPile) {
        const int buf = lists_[ops_[base + t.event].allocs + t.index];
        const int blk = a_.alloc_from(st.pile_blocks[static_cast<std::size_t>(pile_next++)], t_.bufs_[buf].bytes);
        t_.block_of_[buf] = blk;
        t_.note_block(blk, buf);
      } else if (t.kind == kGrowth) {
        blocks.clear();
        for (const Entry& e : t.after) blocks.emplace_back(e.size, e.role == 3 ? e.requested : 0);
        a_.append_segment(t.pool, t.seg_size, blocks, ids);
        for (std::size_t k = 0; k < t.after.size(); ++k) {
          const Entry& e = t.after[k];
          if (e.role != 3) continue;
          const int buf = lists_[ops_[base + e.a].allocs + e.b];
          t_.block_of_[buf] = ids[k];
          t_.note_block(ids[k], buf);
        }
      }
    }
  }
  // The cyclic segments: the same layouts, each buffer renamed to the one in its role m periods on.
  for (const Touch& t : b.touches()) {
    if (t.kind != kCyclic) continue;
    tmp_.clear();
    a_.segment_blocks(t.seg, tmp_);
    for (std::size_t k = 0; k < tmp_.size(); ++k) {
      const Entry& e = t.after[k];
      if (e.role != 1) continue;
      const int blk = tmp_[k].block;
      const int old_buf = t_.buffer_of_block_[static_cast<std::size_t>(blk)];
      const int new_buf = lists_[ops_[x_end + e.a].frees + 2 * e.b];
      t_.block_of_[old_buf] = kNotLive;
      t_.block_of_[new_buf] = blk;
      t_.note_block(blk, new_buf);
    }
  }
  // Statistics: m deltas on; the peaks where the last skipped period's maxima lie.
  AllocatorStats s = sb;
  const AllocatorStats& sa = a.stats;
  s.allocated += m * d_alloc;
  s.requested += m * (sb.requested - sa.requested);
  s.reserved += m * d_res;
  s.num_allocs += m * (sb.num_allocs - sa.num_allocs);
  s.num_device_alloc += m * (sb.num_device_alloc - sa.num_device_alloc);
  if (b.has_max && d_alloc > 0) {
    const Bytes peak = b.max_alloc + m * d_alloc;
    s.peak_allocated = std::max(s.peak_allocated, peak);
    if (peak > t_.peak_allocated_) {
      t_.peak_allocated_ = peak;
      for (int c = 0; c < kNumMemCategories; ++c) t_.live_at_peak_[c] = b.live_at_max[c] + m * (b.live[c] - a.live[c]);
      t_.reserved_at_peak_ = b.res_at_max + m * d_res;
      t_.allocated_peak_op_ = b.max_alloc_op + m * span;   // (the same op, m memory periods on)
    }
  }
  if (b.has_malloc && d_res > 0) {
    const Bytes peak = b.max_res + m * d_res;
    s.peak_reserved = std::max(s.peak_reserved, peak);
    if (peak > t_.reserved_peak_seen_) {
      t_.reserved_peak_seen_ = peak;
      t_.reserved_peak_op_ = b.max_res_op + m * span;
    }
  }
  a_.set_stats(s);
  for (int c = 0; c < kNumMemCategories; ++c) t_.live_[c] = b.live[c] + m * (b.live[c] - a.live[c]);
  ++t_.fold_stats_.jumps;
  t_.fold_stats_.periods_skipped += m * q;
  if (verify_) {
    // The state a call-by-call replay reaches at the same op must be the same, to the last block.
    // (The reference tracker has its own storage: this replay's block -> buffer map is left alone.)
    MemoryTracker ref;
    ref.start(p_, a_.config(), false);
    ref.allocate_persistent();
    MemoryFold f(ref, p_, false, false);
    if (t_.steady_) {   // (the first step, then this one up to the same op)
      f.replay_ops(0, n_);
      ref.begin_steady_step();
    }
    f.replay_ops(0, x_end);
    if (ref.canonical_state() != t_.canonical_state())
      throw std::logic_error("memory fold: skipping " + std::to_string(m) + " memory periods of " + std::to_string(q) +
                             " at op " + std::to_string(x) + " (run " + std::to_string(run_begin_) + ".." +
                             std::to_string(run_end_) + ") left another state than replaying them");
  }
  return m;
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

bool MemoryFold::fold_run(const PeriodicRun& run) {
  period_ = run.period;
  run_begin_ = run.begin;
  run_end_ = run.begin + run.period * run.count;
  const FoldScratch& st = storage();
  life_ = 0;
  for (int i = run.begin; i < run.begin + run.period; ++i)
    for (int k = ops_[i].allocs; k < ops_[i].frees; ++k) {
      const int f = st.free_op[lists_[k]];
      if (f < run_end_) life_ = std::max(life_, (f - i) / run.period + 1);
    }
  // Dead sizes: a free block smaller than every request of its pool in a period is never taken.
  min_req_.clear();
  for (int i = run.begin; i < run.begin + run.period; ++i) {
    const OpRec& r = ops_[i];
    for (int k = r.allocs; k < r.frees; ++k) {
      const CompiledBuffer& b = t_.bufs_[lists_[k]];
      if (b.bytes <= 0) continue;
      const int pool = CachingAllocator::request_pool(b.bytes, b.pool_stream);
      const Bytes size = CachingAllocator::round_size(b.bytes);
      auto it = std::find_if(min_req_.begin(), min_req_.end(), [&](const auto& e) { return e.first == pool; });
      if (it == min_req_.end()) min_req_.emplace_back(pool, size);
      else it->second = std::min(it->second, size);
    }
  }
  // Memory periods of q = 1 period first; then 2 (double-buffered layouts), and as many periods as a
  // buffer lives (buffers rotating among that many segments), each given a few memory periods to match.
  // Recording costs more than replaying, so a run too short to repay it, or one that shows a pattern no
  // q matches, is replayed call by call. (A run of whole micro-batches, of long periods that usually
  // match at q = 1, repays it from 8 periods on: measured on the default plan's search, -6%.)
  Rec* recs = storage().recs;
  int x = run.begin;
  hopeless_ = false;
  if (run.count < (run.period >= 40 ? 8 : 16)) {
    replay_ops(x, run_end_);
    return false;
  }
  int qs[4] = {1, 2, life_, life_ + 1};
  for (int qi = 0; qi < 4; ++qi) {
    const int q = qs[qi];
    if (q < 1 || q > 8 || (qi > 0 && q <= *std::max_element(qs, qs + qi))) continue;
    const int span = q * run.period;
    int have = 0;   // consecutive records in recs (oldest first, at most 3)
    for (int tries = 0; x + span <= run_end_ && tries < (q == 1 ? 4 : 3) && !hopeless_; ++tries) {
      if (have == 3) std::rotate(recs, recs + 1, recs + 3);   // (the oldest's storage is reused)
      Rec& r = recs[have < 3 ? have : 2];
      begin_record(r, x, x + span);
      replay_ops(x, x + span);
      end_record(r);
      x += span;
      if (have < 3) ++have;
      if (have == 3 && match(recs[0], recs[1], recs[2])) {
        const int room = (run_end_ - x) / span;
        const int m = room > 0 ? skip(recs[1], recs[2], q, room) : 0;
        if (m > 0) {
          x += m * span;
          replay_ops(x, run_end_);   // the rest of the run, call by call
          return true;
        }
      }
    }
  }
  replay_ops(x, run_end_);
  return false;
}

}  // namespace fsdpsim::sim

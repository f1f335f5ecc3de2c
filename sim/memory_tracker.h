// The executor's view of device memory: a StepProgram's buffers on top of the caching-allocator
// model. It maps buffer ids to allocator blocks, keeps the requested bytes per MemCategory, the
// breakdown at the allocated peak (with allocator_slack = reserved − requested at that moment) and the
// memory timeline. Errors in the program's alloc/free sequence are InputError naming the op.
// One tracker can serve many runs (start() resets it, keeping its storage): a Simulator keeps one (in
// its engine), so a run allocates nothing once the storage has grown to the program's size.
//
// Two steps (note "first and steady step"): a run replays the program's first step, then, after
// begin_steady_step(), the same program again as a steady-state step on the same allocator: the
// persistent buffers and every first_step_lazy buffer the first step created are live from its start,
// the allocator keeps the segments the first step cached (PyTorch's caching allocator keeps them from
// one iteration to the next), and each step's peaks are its own (torch.cuda.reset_peak_memory_stats at
// the step's start: a peak starts at what is allocated / reserved then). A first_step_lazy buffer's
// alloc is skipped in the steady step (it is live); any other buffer still live from the first step is
// an error (only persistent buffers outlive a step).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memory/caching_allocator.h"
#include "sim/compiled_program.h"
#include "program/sim_result.h"
#include "program/step_program.h"

namespace fsdpsim::sim {

struct FoldScratch;   // the memory fold's storage, kept between replays (sim/memory_fold.cpp)
// Drops what the fold precomputed for the run's program (sim/memory_fold.cpp; a new run may bring another).
void forget_fold_precompute(FoldScratch& s);

class MemoryTracker {
 public:
  MemoryTracker() = default;
  MemoryTracker(const StepProgram& program, Bytes capacity, bool record_timeline) {
    start(program, capacity, record_timeline);
  }
  // Begins a run of `program` (nothing allocated; the tracker keeps a copy of its buffers' facts).
  void start(const StepProgram& program, const AllocatorConfig& config, bool record_timeline);
  // Begins a run of a compiled program (the tracker keeps a reference to it); `names`, when given, is
  // the StepProgram it was compiled from (buffer names in error messages).
  void start(const CompiledProgram& program, const AllocatorConfig& config, bool record_timeline,
             const StepProgram* names = nullptr);
  // (the default allocator options with `capacity`)
  void start(const StepProgram& program, Bytes capacity, bool record_timeline) {
    start(program, AllocatorConfig{capacity}, record_timeline);
  }
  void start(const CompiledProgram& program, Bytes capacity, bool record_timeline, const StepProgram* names = nullptr) {
    start(program, AllocatorConfig{capacity}, record_timeline, names);
  }

  // Allocates every persistent buffer but the first_step_lazy ones at time 0. Called right after start(), when the program's
  // persistent buffers ask for the same (bytes, pool_stream) sequence under the same allocator config
  // as in the run that last allocated them so here, the allocator state that run saved right after
  // them is restored instead of allocating them again (a planner's candidates mostly share it).
  void allocate_persistent();
  // FSDP1's construction (StepProgram::init_flatten_world >= 1): the allocator's peak allocated and reserved bytes
  // from the start to the end of the construction (before its empty_cache and peak reset), as allocate_persistent()
  // left them; both 0 where no construction is modelled.
  Bytes construction_peak_allocated() const { return construction_peak_.peak_allocated; }
  Bytes construction_peak_reserved() const { return construction_peak_.peak_reserved; }
  // Blocks whose record_stream op has completed go back to their pools (process_events). The scan of
  // the pending list only runs when an op some pending block waits on has completed since the last one
  // (op_completed): otherwise it would release nothing. FSDP1 plans can keep hundreds of blocks pending.
  template <class IsComplete>
  void process_events(IsComplete&& is_complete) {
    if (ready_) {
      ready_ = false;
      allocator_.process_events(is_complete);
    }
  }
  // The executor reports every op's completion.
  void op_completed(int op) {
    if (waited_on_[op]) ready_ = true;
  }
  void alloc(int buffer, int op, TimeNs now) {
    if (block_of_[buffer] != kNotLive) [[unlikely]] {
      if (steady_ && bufs_[buffer].first_step_lazy) return;   // created by the first step
      throw_already_live(buffer, op);
    }
    const CompiledBuffer& b = bufs_[buffer];
    const int block = allocator_.alloc(b.bytes, b.pool_stream);
    block_of_[buffer] = block;
    if (shapes_.on && block >= 0) [[unlikely]]
      note_block(block, buffer);
    live_[static_cast<int>(b.category)] += b.bytes;
    after_change(op, now);
  }
  // reuse_after_op < 0 or already complete: the block is reusable at once; else when that op completes.
  void free(int buffer, int reuse_after_op, bool reuse_op_complete, int op, TimeNs now) {
    if (block_of_[buffer] == kNotLive) [[unlikely]]
      throw_not_live(buffer, op);
    const CompiledBuffer& b = bufs_[buffer];
    if (reuse_after_op < 0 || reuse_op_complete) {
      allocator_.free_live(block_of_[buffer]);   // live: block_of_ says so (-1: a 0-byte buffer)
    } else {
      allocator_.free_after(block_of_[buffer], reuse_after_op);
      waited_on_[reuse_after_op] = 1;
    }
    block_of_[buffer] = kNotLive;
    live_[static_cast<int>(b.category)] -= b.bytes;
    // No peak check: a free lowers allocated, which every earlier alloc has already compared with the
    // peak (peak_allocated_ >= allocated at all times), so it can never set a new peak.
    if (record_timeline_) record_sample(now);
  }

  // Performs every op's allocations and then its frees, op after op, in program order: the memory of a
  // program whose frees never wait on GPU work (no reuse_after_op), without a timeline (no times).
  // Call after allocate_persistent(). Where the program has runs of identical periods
  // (CompiledProgram::runs), repeated periods whose effect on the allocator is proven periodic are not
  // replayed call by call but applied at once (sim/memory_fold.cpp; `fold` false: every call).
  // With `verify` (tests), every skip is checked against replaying the skipped calls one by one: a
  // different allocator state throws std::logic_error.
  void replay(const CompiledProgram& program, bool fold = true, bool verify = false);
  struct FoldStats {
    int jumps = 0;              // times periods were skipped
    int periods_skipped = 0;    // periods (of their runs) not replayed call by call
  };
  const FoldStats& fold_stats() const { return fold_stats_; }

  // Ends the first step and begins the steady-state step (see the note at the top): the first step's
  // peaks are kept for fill(), this step's start at the current allocated and reserved bytes.
  void begin_steady_step();
  bool steady() const { return steady_; }
  // The steady step of a run whose memory followed the engine's times (a free's block reusable once
  // its record_stream op has completed, a timeline): replays `program` in order with each op issued at
  // issue_ns[i] + step_start_ns, its record_stream ops complete at complete_ns[j] + step_start_ns, and
  // every op of the first step complete (the steady step starts when the first step's last op ends).
  // An op's frees see an op j < i complete iff complete_ns[j] <= issue_ns[i], op i itself only if it
  // runs on the CPU (as the engine's issue does); its allocations see ops j < i alike.
  // `jumps`: the periods the first step's fast-forward moved the memory by (memory_shift.cpp); where the
  // steady step's memory and times repeat there too, it skips them likewise.
  struct PeriodJump {
    int a = 0, b = 0;   // the CPU's op at the two moments compared (b = a + p)
    int p = 0, m = 0;   // ops per period, periods skipped after b
  };
  void replay_timed(const CompiledProgram& program, const TimeNs* issue_ns, const TimeNs* complete_ns,
                    TimeNs step_start_ns, const std::vector<PeriodJump>& jumps = {});
  int steady_periods_shifted() const { return steady_shifted_; }
  // ---- repeated periods of a run whose memory follows the issues (sim/memory_shift.cpp) ----
  // The executor's fast-forward skips periods while the CPU still issues (and allocates): it compares
  // the memory at two moments p ops apart and, where the second is the first one period on, moves it
  // by whole periods instead of replaying them; replay_timed does the same in the steady step.
  // The memory at one moment, as those comparisons see it.
  struct Shape {
    AllocatorStats stats;
    std::array<Bytes, kNumMemCategories> live{};
    std::vector<CachingAllocator::BlockState> blocks;   // every block of every live segment
    std::vector<CachingAllocator::SegmentState> segments;   // the live segments, in address order
    Bytes next_address = 0;                             // where the next segment would go
    std::vector<std::int64_t> tags;                     // per block: its buffer (allocated), else -1
    struct Pending {
      int segment;
      Bytes offset;
      std::int64_t event;
    };
    std::vector<Pending> pending;                       // in the allocator's order
  };
  // Starts the bookkeeping the comparisons need for `program` (the run's): which block holds which
  // buffer (buffer_of_block_, from now on noted by alloc() too), where each buffer is allocated. Cheap
  // to call again.
  void begin_shapes(const CompiledProgram& program);
  void capture_shape(Shape& s) const;
  // Buffer x2 plays buffer x's role d ops later: allocated d ops after x, at the same place of the
  // op's alloc list, with the same facts (persistent buffers have no such role).
  bool shifted_buffer(int x, int x2, int d) const {
    const ShapeIndex& ix = shapes_;
    return x2 >= 0 && x2 < num_bufs_ && ix.alloc_op[x] >= 0 && ix.alloc_op[x2] == ix.alloc_op[x] + d &&
           ix.alloc_idx[x2] == ix.alloc_idx[x] && bufs_[x2] == bufs_[x];
  }
  // The buffer playing x's role d ops later (-1: none).
  int shift_buffer(int x, int d) const;
  // b, captured p ops after a, is a's memory one period on: live segments of the same sizes in the same
  // order cut into the same blocks, each where it was or one period's worth of addresses on (a period
  // that releases the cache and cudaMallocs again leaves its segments at new addresses), each
  // allocated block holding the same buffer or the one playing its role p ops later, each pending
  // block waiting on the event p ops after a's, the same allocated, requested, reserved and pending
  // bytes and live bytes per category (the counts of calls, retries and OOMs may grow; peaks may have
  // been reached in between: a repeated period reaches no higher).
  bool shape_repeats(const Shape& a, const Shape& b, int p) const;
  // Moves the memory from b (which repeated a) to b shifted by m periods of p ops, as replaying them
  // would leave it: each block holding a buffer of the period holds the one m periods on, each pending
  // block waits on the event m·p ops on, the counts of calls, retries and OOMs grow by m deltas, and the
  // segments cudaMalloc'ed again every period lie m periods' worth of addresses on. `waited` (the
  // engine's inline replay): the new events are marked waited on. Returns false, changing nothing,
  // where a buffer m periods on does not exist.
  bool shift_periods(const Shape& a, const Shape& b, int p, int m, bool waited);
  // Whether shift_periods(a, b, p, m, ...) finds every buffer it renames.
  bool can_shift(const Shape& a, const Shape& b, int p, int m) const;

  // The allocator's canonical_state() plus, for each live buffer, its block's address and size (tests).
  std::string canonical_state() const;

  // Fills peak_allocated, peak_reserved, breakdown_at_peak (without cuda_context) and the ops of both
  // peaks (PeakLocation::op; the caller describes them) of the current step, first_step_peak_* of the
  // first (the same when no steady step ran), alloc_retries (both steps), memory_timeline (decimated to
  // max_samples if > 0) and notes about OOM in the allocator.
  void fill(SimResult& r, int max_samples);
  const AllocatorStats& stats() const { return allocator_.stats(); }

 private:
  static constexpr int kNotLive = -2;   // -1 is a live 0-byte buffer (the allocator's null block)
  // After an allocation by `op` (-1: before the step's first op): the step's peaks and where they are.
  void note_peaks(int op) {
    const AllocatorStats& s = allocator_.stats();
    if (s.allocated > peak_allocated_) {
      peak_allocated_ = s.allocated;
      live_at_peak_ = live_;
      reserved_at_peak_ = s.reserved;
      allocated_peak_op_ = op;
    }
    if (s.peak_reserved > reserved_peak_seen_) {   // (the allocator's peak: a retry may pass it inside the call)
      reserved_peak_seen_ = s.peak_reserved;
      reserved_peak_op_ = op;
    }
  }
  void after_change(int op, TimeNs now) {
    note_peaks(op);
    if (record_timeline_) record_sample(now);
  }
  void record_sample(TimeNs now);
  [[noreturn]] void throw_already_live(int buffer, int op) const;
  [[noreturn]] void throw_not_live(int buffer, int op) const;

  friend class MemoryFold;
  FoldScratch& fold_scratch();   // created on first use
  struct FoldScratchDeleter {
    void operator()(FoldScratch* s) const;
  };
  std::unique_ptr<FoldScratch, FoldScratchDeleter> fold_scratch_;
  void start_run(int num_buffers, int num_ops, const AllocatorConfig& config, bool record_timeline);
  std::string buffer_label(int buffer) const;

  const CompiledBuffer* bufs_ = nullptr;   // the run's buffers (num_bufs_ of them)
  int num_bufs_ = 0;
  const StepProgram* names_ = nullptr;     // optional: buffer names for error messages
  std::vector<CompiledBuffer> own_bufs_;   // start(StepProgram): its buffers' facts
  const std::vector<InitRequest>* init_scratch_ = nullptr;   // the run's (StepProgram::init_scratch)
  int init_flatten_world_ = 0, init_flatten_last_ = -1;       // the run's (StepProgram::init_flatten_world)
  const std::vector<std::vector<Bytes>>* init_originals_ = nullptr;   // the run's (StepProgram::init_originals)
  const std::vector<InitOffloaded>* init_offloaded_ = nullptr;       // the run's (StepProgram::init_offloaded)
  // What allocate_persistent does, call by call (see StepProgram::init_flatten_world): a persistent buffer (the
  // after_construction ones after FSDP1's construction, before its empty_cache), a construction scratch (freed after
  // the next buffer), empty_cache, an init_scratch request (allocated and freed); an original parameter of a unit
  // under construction (Buffer::init_originals), and its free (passed as its number since the unit's first); a
  // shard offloaded to the CPU (StepProgram::init_offloaded: made, the scratch freed, itself freed).
  // The loop setup's temporaries (StepProgram::loop_setup): made, and freed by their number (passed as bytes).
  enum class InitCall : std::uint8_t {
    Buffer, Scratch, EmptyCache, Lazy, Temporary, FreeTemporary, Original, FreeOriginal, Offloaded
  };
  const std::vector<LoopSetupCall>* loop_setup_ = nullptr;   // the run's (StepProgram::loop_setup)
  std::vector<int> init_temporaries_, init_original_blocks_;  // (allocate_persistent's scratch)
  // Calls visit(call, buffer id or -1, bytes, pool stream) in order while it returns true.
  template <class Visit>
  void for_each_init_call(Visit&& visit) const;
  CachingAllocator allocator_;
  bool record_timeline_ = false;
  std::vector<int> block_of_;                                 // buffer id -> allocator block, kNotLive if not live
  std::vector<std::uint8_t> waited_on_;                       // op id -> some record_stream free waits on it
  bool ready_ = false;                                        // such an op completed since the last release
  std::array<Bytes, kNumMemCategories> live_{};               // requested bytes per category
  std::array<Bytes, kNumMemCategories> live_at_peak_{};
  Bytes reserved_at_peak_ = 0;
  Bytes peak_allocated_ = -1;
  Bytes reserved_peak_seen_ = -1;
  int allocated_peak_op_ = -1, reserved_peak_op_ = -1;
  bool steady_ = false;
  // The first step's figures (begin_steady_step).
  Bytes first_peak_allocated_ = 0, first_peak_reserved_ = 0;
  int first_allocated_peak_op_ = -1, first_reserved_peak_op_ = -1;
  std::vector<MemorySample> timeline_;
  FoldStats fold_stats_;
  // The last persistent allocation done here (allocate_persistent): the requests in program order with
  // the block each got, and the allocator state right after them (valid() iff persistent_ is complete).
  struct PersistentAlloc {
    Bytes bytes;
    int pool_stream;
    int block;   // the buffer's block (InitCall::Buffer), else -1
    InitCall call;
  };
  std::vector<PersistentAlloc> persistent_;
  AllocatorStats construction_peak_;   // (construction_peak_allocated/reserved(); kept with after_persistent_)
  CachingAllocator::Snapshot after_persistent_;
  // Shapes (begin_shapes): off until a run asks for them.
  struct ShapeIndex {
    bool on = false;
    const CompiledProgram* program = nullptr;
    std::vector<int> alloc_op, alloc_idx;   // per buffer: the op allocating it and its place there (-1: persistent)
    std::vector<std::pair<int, int>> moves; // (shift_periods' scratch)
    std::vector<std::pair<int, Bytes>> relocations;
    mutable std::vector<int> entry_of_block;   // (capture_shape's scratch)
  };
  ShapeIndex shapes_;
  int steady_shifted_ = 0;          // periods replay_timed skipped
  Shape steady_a_, steady_b_;       // (replay_timed's scratch)
  // replay_timed's check that ops [x, x + m·p) see their times as the ops p before them do.
  int steady_timing_periods(const CompiledProgram& program, const TimeNs* issue_ns, const TimeNs* complete_ns,
                            int x, int p, int m) const;
  // Allocator block -> the buffer in it (valid while the block is allocated and noted): kept by the
  // memory fold's replay for every allocation, and by alloc() while shapes are on.
  std::vector<int> buffer_of_block_;
  void note_block(int block, int buffer) {
    if (static_cast<std::size_t>(block) >= buffer_of_block_.size()) [[unlikely]]
      buffer_of_block_.resize(2 * static_cast<std::size_t>(block) + 64, -1);
    buffer_of_block_[static_cast<std::size_t>(block)] = buffer;
  }
};

// Keeps at most max_samples samples: the series is cut into buckets and each keeps its sample with
// the highest allocated bytes (and the one with the highest reserved bytes), so peaks survive.
std::vector<MemorySample> decimate_timeline(const std::vector<MemorySample>& in, int max_samples);

}  // namespace fsdpsim::sim

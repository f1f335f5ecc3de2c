// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp; semantics M10, M14;
// options from PYTORCH_CUDA_ALLOC_CONF: max_split_size_mb, expandable_segments). It tracks which bytes
// are allocated (live blocks), which are reserved (cudaMalloc'ed segments, or an expandable segment's
// mapped pages) and where fragmentation comes from, without any device memory. It knows nothing of the
// executor: the simulator drives it with a StepProgram's buffers, the CPU runtime can drive it with its
// real allocations.
//
// The rules it follows (constants below cite the same source):
//  * request sizes are rounded up to a multiple of 512 B (round_size);
//  * requests <= 1 MiB are "small": served from the small pool, whose segments are 2 MiB; larger
//    requests use the large pool: requests < 10 MiB get a 20 MiB segment, others the request rounded
//    up to 2 MiB (get_allocation_size);
//  * one pool per (stream, small/large): a block freed on one stream's pool is never reused by another
//    stream (the cause of cross-stream fragmentation, PT PR#129721);
//  * best fit: the smallest free block of the stream's pool that is >= the request, ties by address
//    (BlockComparatorSize: stream, size, ptr);
//  * a found block is split when the remainder is >= 512 B (small pool, or any pool with expandable
//    segments) or > 1 MiB (large pool), the allocation taking the front part (should_split); otherwise
//    the whole block is handed out and counted as allocated (what torch.cuda.memory_allocated reports);
//  * a freed block merges with free neighbours of its segment (try_merge_blocks);
//  * record_stream: a block freed with an outstanding stream use stops counting as allocated at once
//    but returns to its pool only when that use's event has completed (process_events, run at the
//    start of every allocation);
//  * max_split_size (off by default): blocks >= it are never split and a request below it never takes
//    one; a request >= it may take a cached block at most max_non_split_rounding (20 MiB) larger
//    (get_free_block). When a cudaMalloc fails it first frees just enough cached blocks >= max_split_size
//    of the request's pool (release_available_cached_blocks: the smallest one >= max(request,
//    max_split_size), else the largest ones down) and tries again;
//  * cudaMalloc beyond `capacity` fails: then every cached segment with no live block is released
//    (release_cached_blocks, cudaFree) and the allocation retried once (num_alloc_retries); if it
//    still does not fit the model records an OOM and allocates anyway so the caller can report by how
//    much it overflows;
//  * expandable_segments (caching_allocator_expandable.cpp, Note [Expandable Segments]): instead of a
//    cudaMalloc per segment, each pool has one segment, a virtual address range that grows by mapping
//    pages at the lowest address with room (the end, unless a cache release left holes): 2 MiB pages for
//    the small pool, 20 MiB for the large one. A request no free block fits extends the free block at
//    the mapped end (or maps fresh pages); reserved counts mapped pages; a free never unmaps; a cache
//    release (OOM retry, empty_cache) unmaps every whole page inside a free block.
// Not modelled: garbage_collection_threshold, roundup_power2_divisions, CUDA graph pools, and the CPU
// synchronize that release_cached_blocks performs on outstanding events (blocks still waiting on an
// event stay cached). With expandable segments the model reserves 2^22 pages of address space per pool
// (PyTorch: 1.125 x the GPU's memory; they differ only for a segment spanning more than that), and an
// OOM retry skips release_available_cached_blocks (PyTorch's release_block asserts on an expandable
// block there).
#pragma once
#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/units.h"

namespace fsdpsim::sim {

// c10/cuda/CUDACachingAllocator.cpp constants.
inline constexpr Bytes kAllocMinBlockSize = 512;             // kMinBlockSize: all sizes rounded to 512 B
inline constexpr Bytes kAllocSmallSize = 1 * kMiB;           // kSmallSize: largest "small" request
inline constexpr Bytes kAllocSmallBuffer = 2 * kMiB;         // kSmallBuffer: small-pool segment size
inline constexpr Bytes kAllocLargeBuffer = 20 * kMiB;        // kLargeBuffer: segment for 1–10 MiB requests
inline constexpr Bytes kAllocMinLargeAlloc = 10 * kMiB;      // kMinLargeAlloc
inline constexpr Bytes kAllocRoundLarge = 2 * kMiB;          // kRoundLarge: large segments rounded to 2 MiB
inline constexpr Bytes kAllocNoMaxSplit = std::numeric_limits<Bytes>::max();  // max_split_size default
// Expandable segments (find_expandable_block): pages of kSmallBuffer for the small pool and of
// kLargeBuffer for the large one; the address space reserved per segment, in pages (see above).
inline constexpr Bytes kExpandablePageSmall = kAllocSmallBuffer;
inline constexpr Bytes kExpandablePageLarge = kAllocLargeBuffer;
inline constexpr Bytes kExpandableVirtualPages = Bytes{1} << 22;

struct AllocatorConfig {
  Bytes capacity = 0;                               // bytes cudaMalloc may hand out; 0 = unlimited
  Bytes max_split_size = kAllocNoMaxSplit;          // PYTORCH_CUDA_ALLOC_CONF max_split_size_mb
  Bytes max_non_split_rounding = kAllocLargeBuffer; // max_non_split_rounding_mb (default 20 MiB)
  bool expandable_segments = false;                 // PYTORCH_CUDA_ALLOC_CONF expandable_segments:True
  bool operator==(const AllocatorConfig&) const = default;
};

struct AllocatorStats {
  Bytes allocated = 0;        // sum of live blocks' sizes (torch.cuda.memory_allocated)
  Bytes requested = 0;        // sum of live requests as asked (before rounding)
  Bytes reserved = 0;         // sum of segments / mapped pages (torch.cuda.memory_reserved)
  Bytes pending = 0;          // freed blocks waiting on a record_stream event (not allocated, not reusable)
  Bytes peak_allocated = 0;
  Bytes peak_reserved = 0;
  std::int64_t num_allocs = 0;
  std::int64_t num_device_alloc = 0;   // cudaMalloc calls (expandable segments: page mappings, map_block)
  std::int64_t num_device_free = 0;    // cudaFree calls (expandable segments: unmappings, unmap_block)
  std::int64_t num_alloc_retries = 0;  // allocations that had to release the cache and retry
  std::int64_t num_ooms = 0;           // allocations that did not fit even after the retry
};

class CachingAllocator {
 public:
  explicit CachingAllocator(AllocatorConfig config = {});
  // Back to the state of CachingAllocator(config), keeping the storage (the simulator reuses one
  // allocator per Simulator): no block, segment, pending free or statistic survives.
  void reset(AllocatorConfig config);

  // Allocates `bytes` for `stream`'s pool; returns a block id (>= 0), or -1 for a 0-byte request
  // (PyTorch returns a null pointer without touching the pools). Throws std::invalid_argument for
  // bytes < 0 or stream < 0.
  int alloc(Bytes bytes, int stream);
  // Frees a live block now: it merges with free neighbours and returns to its pool. -1 is a no-op.
  void free(int block) {
    if (block == -1) return;
    check_live(block, "free");
    free_live(block);
  }
  // free() without the liveness check, for a caller that only ever passes -1 or a block it holds
  // (MemoryTracker: its buffer -> block map already tells a live buffer from a freed one).
  void free_live(int block);
  // Frees a live block whose memory is still in use by GPU work (record_stream): not allocated from
  // now on, reusable only after process_events() sees `event` complete.
  void free_after(int block, std::int64_t event);
  // Returns to their pools the blocks whose event `is_complete(event)` says has completed; returns how
  // many. alloc() does not call it (the caller decides what "now" is): call it before alloc().
  template <class IsComplete>
  int process_events(IsComplete&& is_complete) {
    int released = 0;
    std::size_t keep = 0;
    for (std::size_t i = 0; i < pending_.size(); ++i) {
      if (is_complete(pending_[i].event)) {
        release_pending(pending_[i].block);
        ++released;
      } else {
        pending_[keep++] = pending_[i];
      }
    }
    pending_.resize(keep);
    return released;
  }
  bool has_pending() const { return !pending_.empty(); }
  // torch.cuda.empty_cache(): releases every segment none of whose blocks is live or pending.
  Bytes empty_cache();
  // torch.cuda.reset_peak_memory_stats(): the peaks restart at the current allocated / reserved bytes.
  void reset_peaks() {
    stats_.peak_allocated = stats_.allocated;
    stats_.peak_reserved = stats_.reserved;
  }

  // The allocator's whole observable state at one moment, for a caller that replays the same calls
  // again and again (MemoryTracker: every run allocates the same persistent buffers first; from a new
  // or reset allocator, the state after a sequence of calls depends only on the config and that
  // sequence). restore() makes this allocator, whatever it did before, indistinguishable from the one
  // save() saw: every later block id, address, split, merge, statistic, retry and OOM the same. A
  // Snapshot keeps its storage between saves.
  class Snapshot;
  void save(Snapshot& s) const;
  void restore(const Snapshot& s);

  const AllocatorConfig& config() const { return config_; }
  const AllocatorStats& stats() const { return stats_; }
  // ---- segments and their blocks (sim_segments, the memory shift's checks) ----
  // One block of a segment, in address order.
  struct BlockInfo {
    int block;
    Bytes size, requested;
    bool free;               // (else allocated: a tracker replaying without record_stream has no pending block)
  };
  int num_segment_slots() const { return static_cast<int>(segments_.size()); }
  bool segment_live(int seg) const { return segments_[seg].live; }
  Bytes segment_size(int seg) const { return segments_[seg].size; }
  int segment_pool(int seg) const { return segments_[seg].stream * 2 + (segments_[seg].small ? 1 : 0); }
  bool segment_expandable(int seg) const { return segments_[seg].expandable; }
  // Appends segment seg's blocks, in address order, to `out`.
  void segment_blocks(int seg, std::vector<BlockInfo>& out) const;
  Bytes next_address() const { return next_addr_; }
  // Overwrites the statistics (after calls that stand for many alloc/free calls: the memory shift).
  void set_stats(const AllocatorStats& s) { stats_ = s; }
  // ---- for the executor's fast-forward with memory replayed with the issues (sim/memory_shift.cpp) ----
  // A block as a comparison of two moments sees it: its live segment's rank (the segments in address
  // order, which is the order they were created in), its offset there, state 0 free, 1 allocated, 2
  // waiting on a record_stream event, 3 anything else (an expandable segment's unmapped range).
  // Best fit, splits and merges depend on addresses only through that order, so two moments with the
  // same blocks at the same offsets of segments of the same sizes in the same order evolve alike.
  struct BlockState {
    int block;
    int segment;             // rank among the live segments
    Bytes offset, size, requested;
    std::uint8_t state;
  };
  struct SegmentState {
    int slot;
    Bytes base, size;
  };
  // Every block of every live segment, segment after segment in address order, each segment's in address
  // order; `segments` gets the live segments in that order.
  void all_blocks(std::vector<BlockState>& out, std::vector<SegmentState>& segments) const;
  // Moves live segments to other addresses, keeping their blocks, states and every statistic (a caller
  // that stands for calls which would have cudaMalloc'ed them elsewhere: (slot, bytes to add)), and the
  // next segment's address by next_delta. The caller keeps the segments in address order.
  void relocate(const std::vector<std::pair<int, Bytes>>& moves, Bytes next_delta);
  // The blocks waiting on a record_stream event, in the order process_events visits them: (block, event).
  int num_pending() const { return static_cast<int>(pending_.size()); }
  std::pair<int, std::int64_t> pending_at(int k) const { return {pending_[k].block, pending_[k].event}; }
  // Every pending block now waits on the event d later (the same wait, d ops on).
  void shift_pending_events(std::int64_t d) {
    for (Pending& x : pending_) x.event += d;
  }

  // The allocator's observable state as text, independent of block ids and storage (tests compare two
  // allocators that must be indistinguishable): live segments by address with their blocks (address,
  // size, requested, state), each pool's cached blocks in best-fit order, the statistics.
  std::string canonical_state() const;

  // Block facts (for tests and traces): rounded size, segment-relative address, stream, pool.
  Bytes block_size(int block) const { return blocks_[block].size; }
  Bytes block_address(int block) const { return blocks_[block].addr; }
  int block_segment(int block) const { return blocks_[block].segment; }
  bool block_is_small(int block) const { return (blocks_[block].pool & 1) != 0; }
  int num_segments() const;               // live segments
  // Free (cached, reusable) bytes in one stream's pools.
  Bytes cached_free_bytes(int stream) const;

  static Bytes round_size(Bytes bytes);
  static Bytes allocation_size(Bytes rounded);

 private:
  // Unmapped: an expandable segment's address range without pages (never in a pool, never merged with
  // a mapped block: try_merge_blocks compares `mapped`).
  enum class State : std::uint8_t { Free, Allocated, Pending, Dead, Unmapped };
  // 64 bytes (alignas): a slot index scales with one shift, and blocks_.size() (check_live) needs no
  // division by the size.
  struct alignas(64) Block {
    Bytes addr = 0;          // virtual address (segments are laid out one after the other)
    Bytes size = 0;
    Bytes requested = 0;
    int segment = -1;
    int prev = -1, next = -1;   // neighbours within the segment
    int pool = 0;            // index into pools_: stream * 2 + small (the hot paths need no bounds check)
    int cls = 0;             // while in a pool: its size class index, if the pool's classes have not moved since
    State state = State::Free;
  };
  // A pool is ordered by (size, addr) like PyTorch's BlockComparatorSize, stored as size classes:
  // an FSDP step frees many blocks of few sizes at a time (llama3-70b: ~150 free blocks, 8 to 16 sizes;
  // with per-tensor allocation it cycles through ~500 sizes over the step), so a sorted vector of all
  // blocks spent most of the executor's time shifting entries. Each class keeps its
  // blocks by DESCENDING address: best fit takes the lowest address from the back in O(1), and the
  // usual frees (backward releases blocks in reverse allocation order) append at the back. The class
  // sizes sit in their own contiguous array (`sizes`, ascending), so finding a class is a short
  // binary search over a few cache lines; `list(i)` holds the blocks of size `sizes[i]`.
  struct FreeEntry {
    Bytes addr;
    int block;
  };
  struct Pool {
    // Bit i of the words is set iff list(i) is not empty (bits at and above sizes.size() are 0): best
    // fit skips empty classes a word at a time (count-trailing-zeros).
    std::vector<std::uint64_t> nonempty;
    int whole = 0;   // free blocks of this pool that span a whole segment (what release_cached_blocks frees)
    std::vector<Bytes> sizes;                    // distinct, ascending; a class may be empty (see compact)
    // Class i's blocks, addr descending, are lists[slot[i]]: a new class appends its list and inserts its
    // 4-byte slot, so adding one moves no list (with per-parameter tensors a planner search creates
    // thousands of classes; shifting a vector of vectors was a fifth of its time).
    std::vector<std::uint32_t> slot;             // parallel to sizes
    std::vector<std::vector<FreeEntry>> lists;   // in creation order
    std::vector<std::vector<FreeEntry>> spare;   // emptied lists dropped by compact, their storage kept
    std::vector<FreeEntry>& list(std::size_t i) { return lists[slot[i]]; }
    const std::vector<FreeEntry>& list(std::size_t i) const { return lists[slot[i]]; }
    // A small direct-mapped memo of class_at_least(size) for the sizes a step keeps asking about
    // (`exact`: that class has exactly this size). add_class and compact drop every hint (the only times
    // class indices move; with classes kept, both are rare), so a stored hint is always current.
    struct Hint {
      Bytes size = -1;
      std::uint32_t index = 0;
      std::uint32_t exact = 0;
    };
    std::array<Hint, 256> hints{};
    int expandable = -1;   // its live expandable segment (-1: none)
    // That segment's unmapped blocks but its last (holes a cache release left), by address: what
    // find_expandable_block looks through (walking every block instead was a quarter of a search whose plans
    // run over capacity and release their cache at every allocation).
    std::vector<std::pair<Bytes, int>> holes;
  };
  struct Segment {
    Bytes base = 0, size = 0;
    int stream = 0;
    bool small = false;
    bool live = false;
    bool expandable = false;
    int first = -1;          // its first block (lowest address)
    int last = -1;           // expandable: its last block (always unmapped: the rest of the address range)
    int unmapped = 0;        // expandable: its unmapped blocks (1: only `last`, no hole)
  };
  struct Pending {
    int block;
    std::int64_t event;
  };

  // The pool of (stream, small), created on first use; pools_ never shrinks, so a block's `pool`
  // index stays valid.
  int pool_index(int stream, bool small) {
    const std::size_t idx = static_cast<std::size_t>(stream) * 2 + (small ? 1 : 0);
    if (idx >= num_pools_) [[unlikely]] {
      pools_.resize(idx + 1);
      num_pools_ = pools_.size();
    }
    return static_cast<int>(idx);
  }
  static std::size_t hint_slot(Bytes size) {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(size) * 0x9e3779b97f4a7c15ULL) >> 56);
  }
  // Removes the empty classes of a pool (when it has many: sizes come and go with splits).
  static void compact(Pool& p);
  // The first non-empty class at or after i (sizes.size() if none).
  static std::size_t next_nonempty(const Pool& p, std::size_t i) {
    const std::size_t nw = p.nonempty.size();
    std::size_t w = i >> 6;
    if (w >= nw) return p.sizes.size();
    std::uint64_t m = p.nonempty[w] & (~std::uint64_t{0} << (i & 63));
    while (m == 0) {
      if (++w == nw) return p.sizes.size();
      m = p.nonempty[w];
    }
    return (w << 6) + static_cast<std::size_t>(std::countr_zero(m));
  }
  static void mark_nonempty(Pool& p, std::size_t i) { p.nonempty[i >> 6] |= std::uint64_t{1} << (i & 63); }
  static void mark_empty(Pool& p, std::size_t i) { p.nonempty[i >> 6] &= ~(std::uint64_t{1} << (i & 63)); }
  static void clear_pool(Pool& p);
  void hole_insert(int b);   // (expandable segments: Pool::holes)
  void hole_erase(int b);
  void rebuild_holes(Pool& p);
  static void recompute_nonempty(Pool& p);
  static Pool::Hint lower_class(Pool& p, Bytes size);   // class_at_least, stored as the size's hint
  static std::size_t class_at_least(const std::vector<Bytes>& sizes, Bytes s);   // first class >= s
  // The hot paths (defined in the .cpp, inlined into alloc/free): best-fit take, insert, erase.
  int find_free_block(Pool& p, Bytes size);
  int take_from_class(Pool& p, std::size_t i, Bytes size);
  template <bool try_cls, bool maybe_whole>
  void pool_insert(Pool& p, int block);
  void pool_erase_neighbour(Pool& p, int block);
  void add_class(Pool& p, std::size_t at, Bytes size);
  int add_block(const Block& init);
  bool try_cuda_malloc(Bytes size);
  int create_segment(int pool, Bytes size);   // cudaMalloc (with the retry) + its block
  int add_segment(int pool, Bytes size);      // the Segment record at the next address
  int place(int b, Bytes bytes, Bytes size, int pi, bool small);   // alloc()'s split and statistics
  bool release_available_cached_blocks(int pool, Bytes size);
  void release_cached_blocks();
  void release_whole_segment(int block);      // (out of its pool already)
  void pool_erase(Pool& p, int block);         // any free block out of its pool
  // ---- expandable segments (caching_allocator_expandable.cpp) ----
  int take_expandable(Bytes size, int pi);   // alloc()'s block with expandable segments (before place)
  int find_free_block_expandable(Pool& p, Bytes size);
  int try_allocate_expandable_block(int pi, Bytes size, bool force);
  int find_expandable_block(int pi, Bytes size);
  void insert_split_off(int block);            // pool_insert of a free block that has neighbours
  bool map_block(int block, Bytes size, bool force);
  void unmap_block(int block);
  void release_expandable_cached_blocks();
  Bytes page_size(int pool) const { return (pool & 1) ? kExpandablePageSmall : kExpandablePageLarge; }
  void free_block(int block);
  void merge_and_insert(int block);
  void release_pending(int block);
  [[noreturn]] void throw_bad_alloc(Bytes bytes, int stream) const;
  [[noreturn]] void throw_not_live(int block, const char* what) const;
  void check_live(int block, const char* what) const {
    // One unsigned compare covers block < 0 and block >= size.
    if (static_cast<std::size_t>(static_cast<unsigned>(block)) >= blocks_.size() ||
        blocks_[block].state != State::Allocated) [[unlikely]]
      throw_not_live(block, what);
  }

  AllocatorConfig config_;
  bool split_limits_ = false;                    // config_.max_split_size is set (not kAllocNoMaxSplit)
  bool expandable_ = false;                      // config_.expandable_segments
  std::vector<Block> blocks_;
  std::vector<int> dead_blocks_;                 // recycled Block slots
  std::vector<Segment> segments_;
  std::vector<Pool> pools_;                      // [stream * 2 + small], ordered by (size, addr)
  std::size_t num_pools_ = 0;                    // pools_.size() (without the division by sizeof(Pool))
  std::vector<Pending> pending_;
  Bytes next_addr_ = 0;
  int cached_whole_segments_ = 0;                // free blocks in pools that span a whole segment
  AllocatorStats stats_;
  std::vector<int> release_scratch_;             // (storage of release_expandable_cached_blocks)
};

// A recycled or new Block slot holding `init`. (Here: caching_allocator_expandable.cpp uses it too.)
[[gnu::always_inline]] inline int CachingAllocator::add_block(const Block& init) {
  if (!dead_blocks_.empty()) {
    const int b = dead_blocks_.back();
    dead_blocks_.pop_back();
    blocks_[b] = init;
    return b;
  }
  blocks_.push_back(init);
  return static_cast<int>(blocks_.size()) - 1;
}

// The Segment record of a new segment of `size` bytes at the next address.
[[gnu::always_inline]] inline int CachingAllocator::add_segment(int pool, Bytes size) {
  Segment s;
  s.base = next_addr_;
  s.size = size;
  s.stream = pool >> 1;
  s.small = (pool & 1) != 0;
  s.live = true;
  next_addr_ += size;
  segments_.push_back(s);
  return static_cast<int>(segments_.size()) - 1;
}

// What save() keeps: every member of the allocator but the pools' inner layout. A pool is saved as its
// free blocks only (the non-empty classes in order, each with its blocks in the pool's order): the empty
// classes, the class indices and the hints are storage, not state (see CachingAllocator::restore), and
// restore() puts the blocks into the classes the restoring allocator already has, so no vector of
// vectors is copied and no class storage is freed and allocated again by the next run.
class CachingAllocator::Snapshot {
 public:
  bool valid() const { return valid_; }
  const AllocatorConfig& config() const { return config_; }
  void invalidate() { valid_ = false; }

 private:
  friend class CachingAllocator;
  struct FreeClass {
    int pool;
    int whole;               // free blocks of this class that span a whole segment
    Bytes size;
    std::uint32_t begin, end;   // its entries in `entries`
  };
  bool valid_ = false;
  AllocatorConfig config_;
  std::vector<Block> blocks_;
  std::vector<int> dead_blocks_;
  std::vector<Segment> segments_;
  std::vector<Pending> pending_;
  std::vector<FreeClass> classes_;
  std::vector<FreeEntry> entries_;   // per class: addr descending, as in the pool
  std::size_t num_pools_ = 0;
  Bytes next_addr_ = 0;
  int cached_whole_segments_ = 0;
  AllocatorStats stats_;
};

}  // namespace fsdpsim::sim

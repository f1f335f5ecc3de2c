// The caching-allocator model; the rules and their source are listed in caching_allocator.h.
// Pools are vectors of size classes (see Pool in the header): few distinct sizes with many blocks
// each in an FSDP step; no tree, so the simulator's hot path has no node allocations.
#include "memory/caching_allocator.h"

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <string>

namespace fsdpsim::sim {

CachingAllocator::CachingAllocator(AllocatorConfig config) : config_(config) {
  if (config_.capacity < 0) throw std::invalid_argument("CachingAllocator: capacity < 0");
  if (config_.max_split_size <= 0) throw std::invalid_argument("CachingAllocator: max_split_size <= 0");
  split_limits_ = config_.max_split_size != kAllocNoMaxSplit;
  expandable_ = config_.expandable_segments;
  blocks_.reserve(256);
  segments_.reserve(64);
}

void CachingAllocator::reset(AllocatorConfig config) {
  if (config.capacity < 0) throw std::invalid_argument("CachingAllocator: capacity < 0");
  if (config.max_split_size <= 0) throw std::invalid_argument("CachingAllocator: max_split_size <= 0");
  config_ = config;
  split_limits_ = config_.max_split_size != kAllocNoMaxSplit;
  expandable_ = config_.expandable_segments;
  blocks_.clear();
  dead_blocks_.clear();
  segments_.clear();
  // The size classes stay (empty), and with them the hints: an empty class is invisible to every
  // lookup, and keeping it saves re-creating the same classes (and their vectors) in the next run.
  for (Pool& p : pools_) clear_pool(p);
  pending_.clear();
  next_addr_ = 0;
  cached_whole_segments_ = 0;
  stats_ = AllocatorStats{};
}

void CachingAllocator::save(Snapshot& s) const {
  s.config_ = config_;
  s.blocks_ = blocks_;
  s.dead_blocks_ = dead_blocks_;
  s.segments_ = segments_;
  s.pending_ = pending_;
  s.classes_.clear();
  s.entries_.clear();
  for (std::size_t pi = 0; pi < pools_.size(); ++pi) {
    const Pool& p = pools_[pi];
    for (std::size_t i = 0; i < p.sizes.size(); ++i) {
      const auto& v = p.list(i);
      if (v.empty()) continue;
      Snapshot::FreeClass c{static_cast<int>(pi), 0, p.sizes[i], static_cast<std::uint32_t>(s.entries_.size()), 0};
      for (const FreeEntry& e : v) {
        const Block& blk = blocks_[e.block];
        if (blk.prev < 0 && blk.next < 0) ++c.whole;
        s.entries_.push_back(e);
      }
      c.end = static_cast<std::uint32_t>(s.entries_.size());
      s.classes_.push_back(c);
    }
  }
  s.num_pools_ = num_pools_;
  s.next_addr_ = next_addr_;
  s.cached_whole_segments_ = cached_whole_segments_;
  s.stats_ = stats_;
  s.valid_ = true;
}

// Why the restored allocator is the saved one: config_, blocks_, dead_blocks_ (the order slots are
// recycled in), segments_, pending_, next_addr_, the whole-segment counts and stats_ are copied as they
// were, and every pool gets exactly the free blocks it had, each class's in the same (address-descending)
// order. What differs is storage only, as between two runs after reset(): which empty classes a pool
// keeps (lookups skip them: take_from_class goes on to the first non-empty class, release_cached_blocks
// visits non-empty classes only), the class indices (Block::cls of a live block may name another class
// or none: pool_insert and pool_erase_neighbour check that sizes[cls] is the block's size before using
// it, and sizes are distinct within a pool, so such a class IS the block's class), and the hints (only
// lower_class stores one, add_class drops them all when indices move, so they stay current). A pool the
// snapshot does not have stays empty: an empty pool is never visited and holds no bytes.
void CachingAllocator::restore(const Snapshot& s) {
  config_ = s.config_;
  split_limits_ = config_.max_split_size != kAllocNoMaxSplit;
  expandable_ = config_.expandable_segments;
  blocks_ = s.blocks_;   // assignment into the existing storage (trivially copyable: one memmove)
  dead_blocks_ = s.dead_blocks_;
  segments_ = s.segments_;
  pending_ = s.pending_;
  for (Pool& p : pools_) clear_pool(p);
  if (num_pools_ < s.num_pools_) {
    pools_.resize(s.num_pools_);
    num_pools_ = pools_.size();
  }
  for (const Snapshot::FreeClass& c : s.classes_) {
    Pool& p = pools_[static_cast<std::size_t>(c.pool)];
    Pool::Hint h = lower_class(p, c.size);
    if (!h.exact) {
      add_class(p, h.index, c.size);
      h = lower_class(p, c.size);
    }
    const std::size_t i = h.index;
    auto& v = p.list(i);
    v.assign(s.entries_.begin() + c.begin, s.entries_.begin() + c.end);
    for (const FreeEntry& e : v) blocks_[e.block].cls = static_cast<int>(i);
    mark_nonempty(p, i);
    p.whole += c.whole;
  }
  // Each pool's expandable segment is the live expandable segment of that pool (at most one).
  for (int seg = 0; seg < static_cast<int>(segments_.size()); ++seg)
    if (segments_[seg].live && segments_[seg].expandable) {
      Pool& p = pools_[static_cast<std::size_t>(segment_pool(seg))];
      p.expandable = seg;
      rebuild_holes(p);
    }
  next_addr_ = s.next_addr_;
  cached_whole_segments_ = s.cached_whole_segments_;
  stats_ = s.stats_;
}

// Empties a pool, keeping its classes (see reset): `nonempty` names the lists to clear.
void CachingAllocator::clear_pool(Pool& p) {
  for (std::size_t w = 0; w < p.nonempty.size(); ++w) {
    for (std::uint64_t m = p.nonempty[w]; m != 0; m &= m - 1)
      p.list((w << 6) + static_cast<std::size_t>(std::countr_zero(m))).clear();
    p.nonempty[w] = 0;
  }
  p.whole = 0;
  p.expandable = -1;
  p.holes.clear();
}

Bytes CachingAllocator::round_size(Bytes bytes) {
  if (bytes < kAllocMinBlockSize) return kAllocMinBlockSize;
  return kAllocMinBlockSize * ((bytes + kAllocMinBlockSize - 1) / kAllocMinBlockSize);
}

Bytes CachingAllocator::allocation_size(Bytes rounded) {
  if (rounded <= kAllocSmallSize) return kAllocSmallBuffer;
  if (rounded < kAllocMinLargeAlloc) return kAllocLargeBuffer;
  return kAllocRoundLarge * ((rounded + kAllocRoundLarge - 1) / kAllocRoundLarge);
}

// Index of the first class with size >= s (sizes.size() if none).
// Branch-free binary search (a pool has a few dozen classes at most; the comparisons are hard to predict).
std::size_t CachingAllocator::class_at_least(const std::vector<Bytes>& sizes, Bytes s) {
  const Bytes* base = sizes.data();
  std::size_t n = sizes.size();
  if (n == 0) return 0;
  while (n > 1) {
    const std::size_t half = n / 2;
    base = base[half - 1] < s ? base + half : base;
    n -= half;
  }
  return static_cast<std::size_t>(base - sizes.data()) + (*base < s ? 1 : 0);
}

// The slow half of a hint lookup (a miss): the binary search, remembered when a later hit may use it
// without further checks (see Pool::Hint).
CachingAllocator::Pool::Hint CachingAllocator::lower_class(Pool& p, Bytes size) {
  const std::size_t n = p.sizes.size();
  const std::size_t i = class_at_least(p.sizes, size);
  const Pool::Hint h{size, static_cast<std::uint32_t>(i), i < n && p.sizes[i] == size ? 1u : 0u};
  p.hints[hint_slot(size)] = h;
  return h;
}

namespace {
// Position of addr in a class's blocks (addr descending): the first entry with entry.addr <= addr.
template <class Vec>
auto addr_position(Vec& v, Bytes addr) {
  return std::lower_bound(v.begin(), v.end(), addr, [](const auto& e, Bytes a) { return e.addr > a; });
}
}  // namespace

// An emptied class stays in its pool, so a size that is freed and reused again and again (every FSDP
// unit's buffers, and with per-tensor allocation the split remainders of the activation segments: a
// llama3-70b step cycles through ~500 sizes in its compute stream's large pool while holding 8 to 16 at
// a time) costs no vector insert/erase; lookups skip empty classes. Compaction bounds them: with a bound
// below the sizes a step cycles through, every compaction drops classes the step re-creates.
constexpr std::size_t kCompactClasses = 2048;

void CachingAllocator::compact(Pool& p) {
  // The non-empty classes keep their order; their lists move to the front of the storage, the others'
  // storage goes to `spare`.
  std::size_t keep = 0;
  for (std::size_t i = 0; i < p.sizes.size(); ++i) {
    if (p.list(i).empty()) continue;
    p.sizes[keep] = p.sizes[i];
    p.slot[keep] = p.slot[i];
    ++keep;
  }
  p.sizes.resize(keep);
  p.slot.resize(keep);
  std::vector<std::uint32_t> at(p.lists.size(), UINT32_MAX);
  for (std::size_t k = 0; k < keep; ++k) at[p.slot[k]] = 0;
  std::uint32_t n = 0;
  for (std::size_t j = 0; j < p.lists.size(); ++j) {
    if (at[j] == UINT32_MAX) continue;
    if (n != j) p.lists[n].swap(p.lists[j]);
    at[j] = n++;
  }
  for (std::size_t k = 0; k < keep; ++k) p.slot[k] = at[p.slot[k]];
  for (std::size_t j = n; j < p.lists.size(); ++j)
    if (p.lists[j].capacity() > 0) p.spare.push_back(std::move(p.lists[j]));
  p.lists.resize(n);
  recompute_nonempty(p);
  p.hints.fill(Pool::Hint{});   // class indices moved
}

void CachingAllocator::recompute_nonempty(Pool& p) {
  p.nonempty.assign((p.sizes.size() + 63) / 64, 0);
  for (std::size_t i = 0; i < p.sizes.size(); ++i)
    if (!p.list(i).empty()) mark_nonempty(p, i);
}

void CachingAllocator::add_class(Pool& p, std::size_t at, Bytes size) {
  if (p.sizes.size() >= kCompactClasses) {
    compact(p);
    at = class_at_least(p.sizes, size);
  }
  p.sizes.insert(p.sizes.begin() + static_cast<std::ptrdiff_t>(at), size);
  if (!p.spare.empty()) {
    p.lists.push_back(std::move(p.spare.back()));
    p.spare.pop_back();
  } else {
    p.lists.emplace_back();
  }
  p.slot.insert(p.slot.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::uint32_t>(p.lists.size() - 1));
  // The classes from `at` on moved up one index, and so do their bits; the new class is empty.
  if (p.nonempty.size() * 64 < p.sizes.size()) p.nonempty.push_back(0);
  const std::size_t w0 = at >> 6;
  for (std::size_t w = p.nonempty.size() - 1; w > w0; --w) p.nonempty[w] = (p.nonempty[w] << 1) | (p.nonempty[w - 1] >> 63);
  const std::uint64_t low = p.nonempty[w0] & ((std::uint64_t{1} << (at & 63)) - 1);
  p.nonempty[w0] = low | ((p.nonempty[w0] & ~low) << 1);
  p.hints.fill(Pool::Hint{});   // class indices moved: every hint is stale
}

// Inserts a free block into its pool's class (blk.cls records it for pool_erase_neighbour).
// With `try_cls`, blk.cls is tried first: a freed block that merged back to the size it had when
// alloc took it from the pool (the usual case: each FSDP buffer's segment) still names its class,
// unless classes moved since; sizes are distinct, so a class of this size IS its class.
// `maybe_whole` false: the block has a neighbour (a remainder just split off), no whole-count update.
template <bool try_cls, bool maybe_whole>
[[gnu::always_inline]] inline void CachingAllocator::pool_insert(Pool& p, int b) {
  Block& blk = blocks_[b];
  const Bytes size = blk.size;
  std::size_t i = static_cast<std::size_t>(blk.cls);
  const Pool::Hint& h = p.hints[hint_slot(size)];
  if (try_cls && i < p.sizes.size() && p.sizes[i] == size) [[likely]] {
    // i is the class
  } else if (h.size == size && h.exact) [[likely]] {
    i = h.index;
  } else {
    const Pool::Hint m = lower_class(p, size);
    i = m.index;
    if (!m.exact) {
      add_class(p, i, size);
      i = lower_class(p, size).index;
    }
  }
  blk.cls = static_cast<int>(i);
  auto& v = p.list(i);
  if (v.empty()) {
    mark_nonempty(p, i);
    v.push_back(FreeEntry{blk.addr, b});
  } else if (v.back().addr > blk.addr) [[likely]] {
    v.push_back(FreeEntry{blk.addr, b});   // the usual case
  } else {
    v.insert(addr_position(v, blk.addr), FreeEntry{blk.addr, b});
  }
  if (maybe_whole && blk.prev < 0 && blk.next < 0) {
    ++cached_whole_segments_;
    ++p.whole;
  }
}

// Removes from its pool a free block that is about to merge into its neighbour: it has that neighbour,
// so it never spans a whole segment (no `whole` count to update).
[[gnu::always_inline]] inline void CachingAllocator::pool_erase_neighbour(Pool& p, int b) {
  const Block& blk = blocks_[b];
  // The class recorded at insertion, unless classes were added or compacted since (sizes are distinct,
  // so a class holding this size IS this block's class).
  std::size_t i = static_cast<std::size_t>(blk.cls);
  if (i >= p.sizes.size() || p.sizes[i] != blk.size) [[unlikely]] {
    i = class_at_least(p.sizes, blk.size);
    if (i == p.sizes.size() || p.sizes[i] != blk.size) [[unlikely]]
      throw std::logic_error("CachingAllocator: free block missing from its pool");
  }
  auto& v = p.list(i);
  if (!v.empty() && v.back().block == b) [[likely]] {
    v.pop_back();   // usually the lowest address of its class (the remainder of a block just split)
  } else {
    auto it = addr_position(v, blk.addr);
    if (it == v.end() || it->block != b) [[unlikely]]
      throw std::logic_error("CachingAllocator: free block missing from its pool");
    v.erase(it);
  }
  if (v.empty()) mark_empty(p, i);
}

// Best fit from class i on (i = class_at_least(size)): the first non-empty class, then the checks of
// get_free_block, then the class's lowest address. -1 if none fits.
[[gnu::always_inline]] inline int CachingAllocator::take_from_class(Pool& p, std::size_t i, Bytes size) {
  i = next_nonempty(p, i);
  if (i == p.sizes.size()) return -1;
  // get_free_block: do not hand an oversize block to a normal request, and round an oversize request
  // up by at most max_non_split_rounding (both inactive with the default max_split_size: no size
  // reaches kAllocNoMaxSplit, so split_limits_ skips two exact no-ops).
  if (split_limits_) [[unlikely]] {
    const Bytes found = p.sizes[i];
    if (size < config_.max_split_size && found >= config_.max_split_size) return -1;
    if (size >= config_.max_split_size && found >= size + config_.max_non_split_rounding) return -1;
  }
  // Best fit, ties by address: the lowest address of the smallest fitting size (the class's back).
  auto& v = p.list(i);
  const int b = v.back().block;
  v.pop_back();
  if (v.empty()) mark_empty(p, i);
  const Block& blk = blocks_[b];
  if (blk.prev < 0 && blk.next < 0) {
    --cached_whole_segments_;
    --p.whole;
  }
  return b;
}

[[gnu::always_inline]] inline int CachingAllocator::find_free_block(Pool& p, Bytes size) {
  const Pool::Hint& h = p.hints[hint_slot(size)];
  return take_from_class(p, h.size == size ? h.index : lower_class(p, size).index, size);
}


bool CachingAllocator::try_cuda_malloc(Bytes size) {
  if (config_.capacity > 0 && stats_.reserved + size > config_.capacity) return false;
  stats_.reserved += size;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  ++stats_.num_device_alloc;
  return true;
}


int CachingAllocator::create_segment(int pool, Bytes rounded) {
  const Bytes size = allocation_size(rounded);
  if (!try_cuda_malloc(size) &&
      !(split_limits_ && release_available_cached_blocks(pool, rounded) && try_cuda_malloc(size))) {
    // alloc_block failed (and freeing oversize blocks did not help): release_cached_blocks() then
    // alloc_block(isRetry=true).
    release_cached_blocks();
    ++stats_.num_alloc_retries;
    if (!try_cuda_malloc(size)) {
      // A real run raises OutOfMemoryError here; the model records it and goes on past capacity.
      ++stats_.num_ooms;
      stats_.reserved += size;
      stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
      ++stats_.num_device_alloc;
    }
  }
  const int seg = add_segment(pool, size);
  const int b = add_block(Block{segments_[seg].base, size, 0, seg, -1, -1, pool, 0, State::Free});
  segments_[seg].first = b;
  return b;
}

void CachingAllocator::throw_bad_alloc(Bytes bytes, int stream) const {
  if (bytes < 0) throw std::invalid_argument("CachingAllocator::alloc: bytes < 0: " + std::to_string(bytes));
  throw std::invalid_argument("CachingAllocator::alloc: stream < 0");
}

// alloc()'s end, once it has the block b (cached or a new segment's) for a request of `bytes` rounded
// to `size` in pool pi: should_split (the allocation keeps the front of the block, the remainder stays
// cached), then the statistics.
[[gnu::always_inline]] inline int CachingAllocator::place(int b, Bytes bytes, Bytes size, int pi, bool small) {
  Block& blk = blocks_[b];
  const Bytes remaining = blk.size - size;
  const bool split = small ? remaining >= kAllocMinBlockSize
                           : (size < config_.max_split_size && remaining > kAllocSmallSize);
  blk.state = State::Allocated;
  blk.requested = bytes;
  if (split) {
    // The remainder: a free block after this one in its segment (so never a whole segment).
    // (Fields written one by one into the slot: cheaper than building a Block and copying it.)
    int r;
    if (!dead_blocks_.empty()) [[likely]] {
      r = dead_blocks_.back();
      dead_blocks_.pop_back();
    } else {
      blocks_.emplace_back();   // may move blocks_: blk is not used after this
      r = static_cast<int>(blocks_.size()) - 1;
    }
    Block& nb = blocks_[b];
    Block& rb = blocks_[r];
    rb.addr = nb.addr + size;
    rb.size = remaining;
    rb.requested = 0;
    rb.segment = nb.segment;
    rb.prev = b;
    rb.next = nb.next;
    rb.pool = pi;
    rb.cls = 0;
    rb.state = State::Free;
    if (nb.next >= 0) blocks_[nb.next].prev = r;
    nb.next = r;
    nb.size = size;
    pool_insert<false, false>(pools_[pi], r);
  }
  stats_.allocated += size + (split ? 0 : remaining);   // the block's size: size, or all of it unsplit
  stats_.requested += bytes;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  ++stats_.num_allocs;
  return b;
}

int CachingAllocator::alloc(Bytes bytes, int stream) {
  if (bytes <= 0 || stream < 0) [[unlikely]] {
    if (bytes < 0 || stream < 0) throw_bad_alloc(bytes, stream);
    return -1;   // a 0-byte request
  }
  // round_size for bytes >= 1, without its branch.
  const Bytes size = (bytes + kAllocMinBlockSize - 1) & ~(kAllocMinBlockSize - 1);
  const bool small = size <= kAllocSmallSize;
  const int pi = pool_index(stream, small);
  if (expandable_) [[unlikely]]
    return place(take_expandable(size, pi), bytes, size, pi, /*small (should_split at 512 B)=*/true);
  int b = find_free_block(pools_[pi], size);
  if (b < 0) b = create_segment(pi, size);
  return place(b, bytes, size, pi, small);
}

void CachingAllocator::throw_not_live(int b, const char* what) const {
  throw std::invalid_argument(std::string("CachingAllocator::") + what + ": block " + std::to_string(b) +
                              " is not allocated");
}

void CachingAllocator::free_live(int b) {
  if (b < 0) return;   // -1: the null block of a 0-byte request
  Block& blk = blocks_[b];
  stats_.allocated -= blk.size;
  stats_.requested -= blk.requested;
  blk.requested = 0;
  merge_and_insert(b);
}

void CachingAllocator::free_after(int b, std::int64_t event) {
  if (b == -1) return;
  check_live(b, "free_after");
  Block& blk = blocks_[b];
  stats_.allocated -= blk.size;
  stats_.requested -= blk.requested;
  stats_.pending += blk.size;
  blk.requested = 0;
  blk.state = State::Pending;
  pending_.push_back(Pending{b, event});
}

void CachingAllocator::release_pending(int b) {
  stats_.pending -= blocks_[b].size;
  free_block(b);
}

void CachingAllocator::free_block(int b) { merge_and_insert(b); }

void CachingAllocator::insert_split_off(int b) { pool_insert<false, false>(pools_[blocks_[b].pool], b); }

// free_block + try_merge_blocks: a neighbour merges only if it is free (not live, not pending).
// (No Block slot is created here, so references into blocks_ stay valid.)
[[gnu::always_inline]] inline void CachingAllocator::merge_and_insert(int b) {
  Block& blk = blocks_[b];
  blk.state = State::Free;
  Pool& p = pools_[blk.pool];
  if (const int n = blk.prev; n >= 0 && blocks_[n].state == State::Free) {
    pool_erase_neighbour(p, n);
    Block& nb = blocks_[n];
    blk.addr = nb.addr;   // absorb the previous block: take its address and its prev link
    blk.prev = nb.prev;
    if (blk.prev >= 0) blocks_[blk.prev].next = b;
    else segments_[blk.segment].first = b;
    blk.size += nb.size;
    nb.state = State::Dead;
    dead_blocks_.push_back(n);
  }
  if (const int n = blk.next; n >= 0 && blocks_[n].state == State::Free) {
    pool_erase_neighbour(p, n);
    Block& nb = blocks_[n];
    blk.next = nb.next;
    if (blk.next >= 0) blocks_[blk.next].prev = b;
    blk.size += nb.size;
    nb.state = State::Dead;
    dead_blocks_.push_back(n);
  }
  pool_insert<true, true>(p, b);
}

// A free block out of its pool, whatever its neighbours (the whole-segment counts kept).
void CachingAllocator::pool_erase(Pool& p, int b) {
  const Block& blk = blocks_[b];
  if (blk.prev < 0 && blk.next < 0) {
    --cached_whole_segments_;
    --p.whole;
  }
  pool_erase_neighbour(p, b);   // (it only skips the whole count, done above)
}

// release_block: cudaFree the segment of a cached block that spans it whole (already out of its pool).
void CachingAllocator::release_whole_segment(int b) {
  Block& blk = blocks_[b];
  stats_.reserved -= blk.size;
  ++stats_.num_device_free;
  segments_[blk.segment].live = false;
  blk.state = State::Dead;
  dead_blocks_.push_back(b);
}

// release_available_cached_blocks (max_split_size set): cudaFree the smallest cached block of the
// request's pool of at least max(request, max_split_size) bytes; failing that, the largest ones of at
// least max_split_size, largest first (ties: highest address first, BlockComparatorSize walked backwards),
// until as many bytes as that key are released. True if it released enough. (A free block of at least
// max_split_size spans its whole segment: such blocks are never split, and the remainder of a split
// block is smaller than max_split_size. The model checks it and releases only whole segments.)
bool CachingAllocator::release_available_cached_blocks(int pool, Bytes size) {
  if (static_cast<std::size_t>(pool) >= pools_.size()) return false;
  Pool& p = pools_[static_cast<std::size_t>(pool)];
  const Bytes key = std::max(size, config_.max_split_size);
  const std::size_t n = p.sizes.size();
  std::size_t i = class_at_least(p.sizes, key);
  while (i < n && p.list(i).empty()) ++i;
  if (i < n) {
    const int b = p.list(i).back().block;   // the lowest address of the smallest fitting size
    const Block& blk = blocks_[b];
    if (blk.prev >= 0 || blk.next >= 0) return false;
    pool_erase(p, b);
    release_whole_segment(b);
    return true;
  }
  Bytes released = 0;
  for (std::size_t c = n; c-- > 0 && released < key;) {
    if (p.sizes[c] < config_.max_split_size) break;
    auto& v = p.list(c);
    while (!v.empty() && released < key) {
      const int b = v.front().block;   // the highest address of the class
      const Block& blk = blocks_[b];
      if (blk.prev >= 0 || blk.next >= 0) return false;
      released += blk.size;
      pool_erase(p, b);
      release_whole_segment(b);
    }
  }
  return released >= key;
}

// release_blocks on every pool: cudaFree each cached block that is a whole segment.
void CachingAllocator::release_cached_blocks() {
  if (expandable_) {
    release_expandable_cached_blocks();
    return;
  }
  if (cached_whole_segments_ == 0) return;   // nothing cudaFree-able: skip the scan
  // In (size, addr) order per pool, as PyTorch's release_blocks walks it (dead_blocks_ gets that order).
  // Only pools holding a whole-segment block are visited, only their non-empty classes, and a pool's
  // walk stops once its last whole segment is released.
  for (auto& p : pools_) {
    if (p.whole == 0) continue;
    const std::size_t n = p.sizes.size();
    for (std::size_t c = next_nonempty(p, 0); c < n && p.whole > 0; c = next_nonempty(p, c + 1)) {
      auto& v = p.list(c);
      bool released = false;
      for (auto e = v.rbegin(); e != v.rend(); ++e) {   // ascending addresses
        Block& blk = blocks_[e->block];
        if (blk.prev < 0 && blk.next < 0) {
          release_whole_segment(e->block);
          --cached_whole_segments_;
          --p.whole;
          released = true;
        }
      }
      if (released) {
        v.erase(std::remove_if(v.begin(), v.end(), [this](const FreeEntry& e) { return blocks_[e.block].state == State::Dead; }),
                v.end());
        if (v.empty()) mark_empty(p, c);
      }
    }
    if (cached_whole_segments_ == 0) break;
  }
}

void CachingAllocator::segment_blocks(int seg, std::vector<BlockInfo>& out) const {
  for (int b = segments_[seg].first; b >= 0; b = blocks_[b].next) {
    const Block& blk = blocks_[b];
    out.push_back(BlockInfo{b, blk.size, blk.requested, blk.state == State::Free});
  }
}

void CachingAllocator::all_blocks(std::vector<BlockState>& out, std::vector<SegmentState>& segments) const {
  out.clear();
  segments.clear();
  // (segments_ is in creation order, which is address order: add_segment takes the next address, and
  // an expandable segment's range is reserved whole when it is created)
  for (int k = 0; k < static_cast<int>(segments_.size()); ++k) {
    const Segment& sg = segments_[k];
    if (!sg.live) continue;
    const int rank = static_cast<int>(segments.size());
    segments.push_back(SegmentState{k, sg.base, sg.size});
    for (int b = sg.first; b >= 0; b = blocks_[b].next) {
      const Block& blk = blocks_[b];
      const std::uint8_t st = blk.state == State::Free ? 0 : blk.state == State::Allocated ? 1 : blk.state == State::Pending ? 2 : 3;
      out.push_back(BlockState{b, rank, blk.addr - sg.base, blk.size, blk.requested, st});
    }
  }
}

void CachingAllocator::relocate(const std::vector<std::pair<int, Bytes>>& moves, Bytes next_delta) {
  for (const auto& [seg, d] : moves) {
    const Segment& sg = segments_[static_cast<std::size_t>(seg)];
    if (!sg.live || sg.expandable) throw std::logic_error("CachingAllocator::relocate: not a live cudaMalloc'ed segment");
  }
  // A free block's place in its pool depends on its address: every moved segment's free blocks out, all moved, then
  // in again. (Segment by segment, a segment moved onto the addresses of one still to move would meet its blocks at
  // equal addresses in the pool, where the lookup of the other's could find the wrong entry.)
  for (const auto& [seg, d] : moves)
    for (int b = segments_[static_cast<std::size_t>(seg)].first; b >= 0; b = blocks_[b].next)
      if (blocks_[b].state == State::Free) pool_erase(pools_[blocks_[b].pool], b);
  for (const auto& [seg, d] : moves) {
    Segment& sg = segments_[static_cast<std::size_t>(seg)];
    sg.base += d;
    for (int b = sg.first; b >= 0; b = blocks_[b].next) blocks_[b].addr += d;
  }
  for (const auto& [seg, d] : moves)
    for (int b = segments_[static_cast<std::size_t>(seg)].first; b >= 0; b = blocks_[b].next)
      if (blocks_[b].state == State::Free) pool_insert<false, true>(pools_[blocks_[b].pool], b);
  next_addr_ += next_delta;
}

std::string CachingAllocator::canonical_state() const {
  std::string out;
  auto num = [&](long long v) { out += std::to_string(v); out += ' '; };
  std::vector<int> order;
  for (int i = 0; i < static_cast<int>(segments_.size()); ++i)
    if (segments_[i].live) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return segments_[a].base < segments_[b].base; });
  for (int i : order) {
    const Segment& sg = segments_[i];
    out += "seg ";
    num(sg.base), num(sg.size), num(sg.stream), num(sg.small);
    for (int b = sg.first; b >= 0; b = blocks_[b].next) {
      const Block& blk = blocks_[b];
      out += "[";
      num(blk.addr), num(blk.size), num(blk.requested), num(static_cast<int>(blk.state)), num(blk.pool);
      out += "]";
    }
    out += "\n";
  }
  for (std::size_t pi = 0; pi < pools_.size(); ++pi) {
    const Pool& p = pools_[pi];
    bool empty = p.whole == 0;
    for (const auto& v : p.lists) empty = empty && v.empty();
    if (empty) continue;   // (a reset allocator keeps its pools, empty: nothing observable)
    out += "pool " + std::to_string(pi) + " whole " + std::to_string(p.whole) + ":";
    for (std::size_t c = 0; c < p.sizes.size(); ++c)
      for (auto e = p.list(c).rbegin(); e != p.list(c).rend(); ++e) out += " " + std::to_string(p.sizes[c]) + "@" + std::to_string(e->addr);
    out += "\n";
  }
  out += "next " + std::to_string(next_addr_) + " whole " + std::to_string(cached_whole_segments_) + " pending " +
         std::to_string(pending_.size()) + "\n";
  const AllocatorStats& s = stats_;
  for (long long v : {s.allocated, s.requested, s.reserved, s.pending, s.peak_allocated, s.peak_reserved, s.num_allocs,
                      s.num_device_alloc, s.num_device_free, s.num_alloc_retries, s.num_ooms})
    num(v);
  return out;
}

Bytes CachingAllocator::empty_cache() {
  Bytes before = stats_.reserved;
  release_cached_blocks();
  return before - stats_.reserved;
}

int CachingAllocator::num_segments() const {
  int n = 0;
  for (const auto& s : segments_) n += s.live ? 1 : 0;
  return n;
}

Bytes CachingAllocator::cached_free_bytes(int stream) const {
  Bytes total = 0;
  for (int small = 0; small < 2; ++small) {
    std::size_t idx = static_cast<std::size_t>(stream) * 2 + small;
    if (idx >= pools_.size()) continue;
    const Pool& p = pools_[idx];
    for (std::size_t i = 0; i < p.sizes.size(); ++i) total += p.sizes[i] * static_cast<Bytes>(p.list(i).size());
  }
  return total;
}

}  // namespace fsdpsim::sim

// The caching-allocator model; the rules and their source are listed in caching_allocator.h.
// Pools are vectors of size classes (see SizeClass in the header): few distinct sizes with many
// blocks each in an FSDP step; no tree, so the simulator's hot path has no node allocations.
#include "sim/caching_allocator.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fsdpsim::sim {

CachingAllocator::CachingAllocator(AllocatorConfig config) : config_(config) {
  if (config_.capacity < 0) throw std::invalid_argument("CachingAllocator: capacity < 0");
  if (config_.max_split_size <= 0) throw std::invalid_argument("CachingAllocator: max_split_size <= 0");
  blocks_.reserve(256);
  segments_.reserve(64);
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

CachingAllocator::Pool& CachingAllocator::pool(int stream, bool small) {
  std::size_t idx = static_cast<std::size_t>(stream) * 2 + (small ? 1 : 0);
  if (idx >= pools_.size()) pools_.resize(idx + 1);
  return pools_[idx];
}

namespace {
// First class with size >= s.
template <class Pool>
auto class_at_least(Pool& p, Bytes s) {
  return std::lower_bound(p.begin(), p.end(), s, [](const auto& c, Bytes x) { return c.size < x; });
}
// Position of addr in a class's blocks (addr descending): the first entry with entry.addr <= addr.
template <class Vec>
auto addr_position(Vec& v, Bytes addr) {
  return std::lower_bound(v.begin(), v.end(), addr, [](const auto& e, Bytes a) { return e.addr > a; });
}
}  // namespace

// An emptied class stays in its pool, so a size that is freed and reused again and again (every FSDP
// unit's buffers) costs no vector insert/erase; lookups skip empty classes. Compaction bounds them.
constexpr std::size_t kCompactClasses = 64;

void CachingAllocator::compact(Pool& p) {
  p.erase(std::remove_if(p.begin(), p.end(), [](const SizeClass& c) { return c.blocks.empty(); }), p.end());
}

void CachingAllocator::pool_insert(int b) {
  const Block& blk = blocks_[b];
  Pool& p = pool(blk.stream, blk.small);
  auto c = class_at_least(p, blk.size);
  if (c == p.end() || c->size != blk.size) {
    if (p.size() >= kCompactClasses) {
      compact(p);
      c = class_at_least(p, blk.size);
    }
    SizeClass sc;
    sc.size = blk.size;
    c = p.insert(c, std::move(sc));
  }
  auto& v = c->blocks;
  if (v.empty() || v.back().addr > blk.addr) v.push_back(FreeEntry{blk.addr, b});   // the usual case
  else v.insert(addr_position(v, blk.addr), FreeEntry{blk.addr, b});
  if (blk.prev < 0 && blk.next < 0) ++cached_whole_segments_;
}

void CachingAllocator::pool_erase(int b) {
  const Block& blk = blocks_[b];
  Pool& p = pool(blk.stream, blk.small);
  auto c = class_at_least(p, blk.size);
  if (c == p.end() || c->size != blk.size)
    throw std::logic_error("CachingAllocator: free block missing from its pool");
  auto& v = c->blocks;
  auto it = addr_position(v, blk.addr);
  if (it == v.end() || it->block != b) throw std::logic_error("CachingAllocator: free block missing from its pool");
  v.erase(it);
  if (blk.prev < 0 && blk.next < 0) --cached_whole_segments_;
}

int CachingAllocator::find_free_block(int stream, bool small, Bytes size) {
  Pool& p = pool(stream, small);
  auto c = class_at_least(p, size);
  while (c != p.end() && c->blocks.empty()) ++c;
  if (c == p.end()) return -1;
  // get_free_block: do not hand an oversize block to a normal request, and round an oversize request
  // up by at most max_non_split_rounding (both inactive with the default max_split_size).
  if (size < config_.max_split_size && c->size >= config_.max_split_size) return -1;
  if (size >= config_.max_split_size && c->size >= size + config_.max_non_split_rounding) return -1;
  // Best fit, ties by address: the lowest address of the smallest fitting size (the class's back).
  int b = c->blocks.back().block;
  c->blocks.pop_back();
  if (blocks_[b].prev < 0 && blocks_[b].next < 0) --cached_whole_segments_;
  return b;
}

int CachingAllocator::new_block() {
  if (!dead_blocks_.empty()) {
    int b = dead_blocks_.back();
    dead_blocks_.pop_back();
    blocks_[b] = Block{};
    return b;
  }
  blocks_.emplace_back();
  return static_cast<int>(blocks_.size()) - 1;
}

bool CachingAllocator::try_cuda_malloc(Bytes size) {
  if (config_.capacity > 0 && stats_.reserved + size > config_.capacity) return false;
  stats_.reserved += size;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  ++stats_.num_device_alloc;
  return true;
}

int CachingAllocator::create_segment(int stream, bool small, Bytes size) {
  Segment s;
  s.base = next_addr_;
  s.size = size;
  s.stream = stream;
  s.small = small;
  s.live = true;
  next_addr_ += size;
  segments_.push_back(s);
  int b = new_block();
  Block& blk = blocks_[b];
  blk.addr = s.base;
  blk.size = size;
  blk.segment = static_cast<int>(segments_.size()) - 1;
  blk.stream = stream;
  blk.small = small;
  blk.state = State::Free;
  return b;
}

int CachingAllocator::alloc(Bytes bytes, int stream) {
  if (bytes < 0) throw std::invalid_argument("CachingAllocator::alloc: bytes < 0: " + std::to_string(bytes));
  if (stream < 0) throw std::invalid_argument("CachingAllocator::alloc: stream < 0");
  if (bytes == 0) return -1;
  const Bytes size = round_size(bytes);
  const bool small = size <= kAllocSmallSize;
  int b = find_free_block(stream, small, size);
  if (b < 0) {
    const Bytes seg = allocation_size(size);
    if (!try_cuda_malloc(seg)) {
      // alloc_block failed: release_cached_blocks() then alloc_block(isRetry=true).
      release_cached_blocks();
      ++stats_.num_alloc_retries;
      if (!try_cuda_malloc(seg)) {
        // A real run raises OutOfMemoryError here; the model records it and goes on past capacity.
        ++stats_.num_ooms;
        stats_.reserved += seg;
        stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
        ++stats_.num_device_alloc;
      }
    }
    b = create_segment(stream, small, seg);
  }
  // should_split: the allocation keeps the front of the block, the remainder stays cached.
  const Bytes remaining = blocks_[b].size - size;
  const bool split = small ? remaining >= kAllocMinBlockSize
                           : (size < config_.max_split_size && remaining > kAllocSmallSize);
  if (split) {
    int r = new_block();
    Block& blk = blocks_[b];   // (re-fetched after new_block may have grown the vector)
    Block& rem = blocks_[r];
    rem.addr = blk.addr + size;
    rem.size = remaining;
    rem.segment = blk.segment;
    rem.stream = blk.stream;
    rem.small = blk.small;
    rem.state = State::Free;
    rem.prev = b;
    rem.next = blk.next;
    if (blk.next >= 0) blocks_[blk.next].prev = r;
    blk.next = r;
    blk.size = size;
    pool_insert(r);
  }
  Block& blk = blocks_[b];
  blk.state = State::Allocated;
  blk.requested = bytes;
  stats_.allocated += blk.size;
  stats_.requested += bytes;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  ++stats_.num_allocs;
  return b;
}

void CachingAllocator::check_live(int b, const char* what) const {
  if (b < 0 || b >= static_cast<int>(blocks_.size()) || blocks_[b].state != State::Allocated)
    throw std::invalid_argument(std::string("CachingAllocator::") + what + ": block " + std::to_string(b) +
                                " is not allocated");
}

void CachingAllocator::free(int b) {
  if (b == -1) return;
  check_live(b, "free");
  Block& blk = blocks_[b];
  stats_.allocated -= blk.size;
  stats_.requested -= blk.requested;
  blk.requested = 0;
  free_block(b);
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

// free_block + try_merge_blocks: a neighbour merges only if it is free (not live, not pending).
void CachingAllocator::free_block(int b) {
  blocks_[b].state = State::Free;
  for (int side = 0; side < 2; ++side) {
    int n = side == 0 ? blocks_[b].prev : blocks_[b].next;
    if (n < 0 || blocks_[n].state != State::Free) continue;
    pool_erase(n);
    Block& blk = blocks_[b];
    Block& nb = blocks_[n];
    if (side == 0) {   // absorb the previous block: take its address and its prev link
      blk.addr = nb.addr;
      blk.prev = nb.prev;
      if (blk.prev >= 0) blocks_[blk.prev].next = b;
    } else {
      blk.next = nb.next;
      if (blk.next >= 0) blocks_[blk.next].prev = b;
    }
    blk.size += nb.size;
    nb.state = State::Dead;
    dead_blocks_.push_back(n);
  }
  pool_insert(b);
}

// release_blocks on every pool: cudaFree each cached block that is a whole segment.
void CachingAllocator::release_cached_blocks() {
  if (cached_whole_segments_ == 0) return;   // nothing cudaFree-able: skip the scan
  // In (size, addr) order per pool, as before the size classes: dead_blocks_ gets the same order.
  for (auto& p : pools_) {
    for (auto c = p.begin(); c != p.end(); ++c) {
      auto& v = c->blocks;
      std::vector<FreeEntry> kept;   // ascending walk over a descending vector: rebuild, then reverse
      kept.reserve(v.size());
      for (auto e = v.rbegin(); e != v.rend(); ++e) {
        Block& blk = blocks_[e->block];
        if (blk.prev < 0 && blk.next < 0) {
          stats_.reserved -= blk.size;
          ++stats_.num_device_free;
          segments_[blk.segment].live = false;
          blk.state = State::Dead;
          --cached_whole_segments_;
          dead_blocks_.push_back(e->block);
        } else {
          kept.push_back(*e);
        }
      }
      v.assign(kept.rbegin(), kept.rend());
    }
  }
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
    for (const auto& c : pools_[idx]) total += c.size * static_cast<Bytes>(c.blocks.size());
  }
  return total;
}

}  // namespace fsdpsim::sim

// Property test of the caching-allocator model (memory/caching_allocator.h) against a deliberately
// naive reference written from the same rules: every free block of a pool in one std::set ordered by
// (size, address) (PyTorch's BlockComparatorSize), segments as std::map address -> block. The fast
// allocator keeps its pools as size classes and recycles block slots; whatever it does inside, every
// observable fact must match the reference after every call of a long random sequence: each live
// block's size and address, all statistics, live segments and each stream's cached bytes.
// Sequences mix the sizes of an FSDP step (a few repeated sizes, small and large) with random ones,
// record_stream frees, event processing, empty_cache, a capacity that forces retries and OOMs, and
// a max_split_size configuration (with a capacity: release_available_cached_blocks before the full release).
#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "allocator_reference_harness.h"
#include "memory/caching_allocator.h"

namespace fsdpsim::sim {
namespace {

// ---- the reference: the rules of caching_allocator.h, written the obvious way ----
class ReferenceAllocator {
 public:
  explicit ReferenceAllocator(AllocatorConfig cfg) : cfg_(cfg) {}

  // Returns a reference block id, -1 for 0 bytes.
  int alloc(Bytes bytes, int stream) {
    if (bytes == 0) return -1;
    const Bytes size = bytes <= 512 ? 512 : (bytes + 511) / 512 * 512;
    const bool small = size <= kAllocSmallSize;
    auto& pool = pools_[{stream, small}];
    int b = -1;
    // get_free_block: lower_bound by (size, addr); then the max_split_size rules on that block only.
    auto it = pool.lower_bound(std::make_tuple(size, Bytes{-1}, -1));
    if (it != pool.end()) {
      const Bytes found = std::get<0>(*it);
      const bool oversize_for_normal = size < cfg_.max_split_size && found >= cfg_.max_split_size;
      const bool too_much_rounding = size >= cfg_.max_split_size && found >= size + cfg_.max_non_split_rounding;
      if (!oversize_for_normal && !too_much_rounding) {
        b = std::get<2>(*it);
        pool.erase(it);
      }
    }
    if (b < 0) {
      const Bytes seg = size <= kAllocSmallSize ? kAllocSmallBuffer
                        : size < kAllocMinLargeAlloc ? kAllocLargeBuffer
                                                     : (size + kAllocRoundLarge - 1) / kAllocRoundLarge * kAllocRoundLarge;
      // malloc(): alloc_block; (release_available_cached_blocks && alloc_block); (release_cached_blocks &&
      // alloc_block(isRetry)).
      if (!fits(seg) && !(cfg_.max_split_size != kAllocNoMaxSplit && release_available(stream, small, size) && fits(seg))) {
        release_cached();
        ++stats_.num_alloc_retries;
        if (!fits(seg)) ++stats_.num_ooms;
      }
      stats_.reserved += seg;
      stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
      ++stats_.num_device_alloc;
      b = static_cast<int>(blocks_.size());
      blocks_.push_back(Blk{next_addr_, seg, 0, stream, small, kFree, next_addr_, true});
      segments_[next_addr_] = seg;
      next_addr_ += seg;
    }
    Blk& blk = blocks_[b];
    const Bytes remaining = blk.size - size;
    const bool split = small ? remaining >= 512 : (size < cfg_.max_split_size && remaining > kAllocSmallSize);
    if (split) {
      const int r = static_cast<int>(blocks_.size());
      Blk rem{blk.addr + size, remaining, 0, stream, small, kFree, blk.segment, true};
      blocks_.push_back(rem);
      blocks_[b].size = size;
      pools_[{stream, small}].insert({remaining, rem.addr, r});
    }
    Blk& out = blocks_[b];
    out.state = kLive;
    out.requested = bytes;
    stats_.allocated += out.size;
    stats_.requested += bytes;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    ++stats_.num_allocs;
    return b;
  }

  void free(int b) {
    if (b < 0) return;
    stats_.allocated -= blocks_[b].size;
    stats_.requested -= blocks_[b].requested;
    release(b);
  }
  void free_after(int b, std::int64_t event) {
    stats_.allocated -= blocks_[b].size;
    stats_.requested -= blocks_[b].requested;
    stats_.pending += blocks_[b].size;
    blocks_[b].state = kPending;
    pending_.push_back({b, event});
  }
  int process_events(std::int64_t completed_up_to) {
    int n = 0;
    std::vector<std::pair<int, std::int64_t>> keep;
    for (auto [b, ev] : pending_) {
      if (ev <= completed_up_to) {
        stats_.pending -= blocks_[b].size;
        release(b);
        ++n;
      } else {
        keep.push_back({b, ev});
      }
    }
    pending_ = keep;
    return n;
  }
  Bytes empty_cache() {
    Bytes before = stats_.reserved;
    release_cached();
    return before - stats_.reserved;
  }
  int num_segments() const { return static_cast<int>(segments_.size()); }
  Bytes cached_free_bytes(int stream) const {
    Bytes t = 0;
    for (const auto& [key, pool] : pools_)
      if (key.first == stream)
        for (const auto& e : pool) t += std::get<0>(e);
    return t;
  }
  Bytes size_of(int b) const { return blocks_[b].size; }
  Bytes addr_of(int b) const { return blocks_[b].addr; }
  const AllocatorStats& stats() const { return stats_; }

 private:
  enum St { kFree, kLive, kPending, kDead };
  struct Blk {
    Bytes addr, size, requested;
    int stream;
    bool small;
    St state;
    Bytes segment;   // base address of its segment
    bool valid;
  };
  bool fits(Bytes seg) const { return cfg_.capacity <= 0 || stats_.reserved + seg <= cfg_.capacity; }
  // The free block of b's segment that ends at `addr` / starts at `addr`, if any.
  int free_neighbour(const Blk& b, bool before) const {
    const auto& pool = pools_.at({b.stream, b.small});
    for (const auto& e : pool) {
      const Blk& n = blocks_[std::get<2>(e)];
      if (n.segment != b.segment) continue;
      if (before && n.addr + n.size == b.addr) return std::get<2>(e);
      if (!before && b.addr + b.size == n.addr) return std::get<2>(e);
    }
    return -1;
  }
  void release(int b) {
    auto& pool = pools_[{blocks_[b].stream, blocks_[b].small}];
    blocks_[b].state = kFree;
    for (bool before : {true, false}) {
      int n = free_neighbour(blocks_[b], before);
      if (n < 0) continue;
      pool.erase({blocks_[n].size, blocks_[n].addr, n});
      if (before) blocks_[b].addr = blocks_[n].addr;
      blocks_[b].size += blocks_[n].size;
      blocks_[n].state = kDead;
    }
    pool.insert({blocks_[b].size, blocks_[b].addr, b});
  }
  // release_available_cached_blocks: the first block >= max(size, max_split_size) in (size, addr) order,
  // else the largest blocks >= max_split_size, walking (size, addr) backwards, until that much is released.
  bool release_available(int stream, bool small, Bytes size) {
    auto& pool = pools_[{stream, small}];
    const Bytes key = std::max(size, cfg_.max_split_size);
    auto it = pool.lower_bound(std::make_tuple(key, Bytes{-1}, -1));
    if (it != pool.end()) {
      if (!whole(std::get<2>(*it))) return false;
      release_segment(std::get<2>(*it));
      pool.erase(it);
      return true;
    }
    Bytes released = 0;
    while (released < key && !pool.empty() && std::get<0>(*pool.rbegin()) >= cfg_.max_split_size) {
      auto last = std::prev(pool.end());
      const int b = std::get<2>(*last);
      if (!whole(b)) return false;
      released += blocks_[b].size;
      release_segment(b);
      pool.erase(last);
    }
    return released >= key;
  }
  bool whole(int b) const { return blocks_[b].addr == blocks_[b].segment && blocks_[b].size == segments_.at(blocks_[b].segment); }
  void release_segment(int b) {
    stats_.reserved -= blocks_[b].size;
    ++stats_.num_device_free;
    segments_.erase(blocks_[b].segment);
    blocks_[b].state = kDead;
  }
  void release_cached() {
    for (auto& [key, pool] : pools_) {
      for (auto it = pool.begin(); it != pool.end();) {
        if (whole(std::get<2>(*it))) {
          release_segment(std::get<2>(*it));
          it = pool.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  AllocatorConfig cfg_;
  std::vector<Blk> blocks_;
  std::map<std::pair<int, bool>, std::set<std::tuple<Bytes, Bytes, int>>> pools_;
  std::map<Bytes, Bytes> segments_;   // base -> size, live ones
  std::vector<std::pair<int, std::int64_t>> pending_;
  Bytes next_addr_ = 0;
  AllocatorStats stats_;
};

AllocatorStats run_sequence(AllocatorConfig cfg, std::uint32_t seed, int steps, int streams) {
  CachingAllocator fast(cfg);
  ReferenceAllocator ref(cfg);
  return testing::run_reference_sequence(fast, ref, seed, steps, streams, /*drain_events=*/true);
}

TEST(AllocatorReference, DefaultConfigMatchesTheReference) {
  for (std::uint32_t seed = 1; seed <= 20; ++seed) {
    AllocatorStats s = run_sequence(AllocatorConfig{}, seed, 3000, 3);
    EXPECT_GT(s.num_allocs, 1000) << "seed " << seed;
    EXPECT_GT(s.num_device_free, 0) << "seed " << seed;   // empty_cache released segments
    if (HasFailure()) return;
  }
}

TEST(AllocatorReference, CapacityRetriesAndOomsMatchTheReference) {
  std::int64_t retries = 0, ooms = 0;
  for (std::uint32_t seed = 100; seed <= 115; ++seed) {
    AllocatorStats s = run_sequence(AllocatorConfig{900 * kMiB}, seed, 3000, 2);
    retries += s.num_alloc_retries;
    ooms += s.num_ooms;
    if (HasFailure()) return;
  }
  EXPECT_GT(retries, 0);
  EXPECT_GT(ooms, 0);
}

TEST(AllocatorReference, MaxSplitSizeMatchesTheReference) {
  for (std::uint32_t seed = 200; seed <= 210; ++seed) {
    run_sequence(AllocatorConfig{0, 40 * kMiB, 20 * kMiB}, seed, 3000, 2);
    run_sequence(AllocatorConfig{2 * kGiB, 100 * kMiB, 8 * kMiB}, seed + 1000, 3000, 4);
    if (HasFailure()) return;
  }
}

// Thousands of free blocks of distinct sizes in one pool: more non-empty size classes than kCompactClasses
// (every new class compacts), class insertions that invalidate the size hints, and a best fit that skips
// a run of 4,550 emptied classes (71 words of the pool's bit set); it must still pick what the reference
// picks, block by block.
TEST(AllocatorReference, ManyDistinctFreeSizesMatchTheReference) {
  CachingAllocator fast{AllocatorConfig{}};
  ReferenceAllocator ref{AllocatorConfig{}};
  std::mt19937 rng(7);
  struct Live {
    int fast, ref;
  };
  std::vector<Live> live;
  auto alloc = [&](Bytes bytes) {
    const int f = fast.alloc(bytes, 0);
    const int r = ref.alloc(bytes, 0);
    EXPECT_EQ(fast.block_size(f), ref.size_of(r)) << bytes;
    EXPECT_EQ(fast.block_address(f), ref.addr_of(r)) << bytes;
    live.push_back({f, r});
  };
  // 5,000 segments of distinct sizes (12 MiB + k x 2 MiB), every one freed whole: 5,000 non-empty classes.
  constexpr int kSegments = 5000;
  for (int k = 0; k < kSegments; ++k) alloc(12 * kMiB + 2 * kMiB * k);
  std::shuffle(live.begin(), live.end(), rng);
  for (const Live& l : live) {
    fast.free(l.fast);
    ref.free(l.ref);
  }
  live.clear();
  // Classes 50 to 4,599 taken whole (their exact sizes): a request above class 49 skips 4,550 emptied
  // classes, across a word of the summary.
  for (int k = 50; k < 4600; ++k) alloc(12 * kMiB + 2 * kMiB * k);
  std::vector<Live> held;
  held.swap(live);
  // Requests between the sizes split the best fit (new remainder classes), frees merge them back.
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      alloc(10 * kMiB + static_cast<Bytes>(rng() % (2 * kMiB * kSegments)));
    } else {
      const std::size_t i = rng() % live.size();
      fast.free(live[i].fast);
      ref.free(live[i].ref);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    testing::expect_same_stats(fast.stats(), ref.stats(), step);
    if (step % 1000 == 0) EXPECT_EQ(fast.cached_free_bytes(0), ref.cached_free_bytes(0)) << "step " << step;
    if (HasFailure()) return;
  }
  EXPECT_EQ(fast.num_segments(), ref.num_segments());
  EXPECT_EQ(held.size(), 4550u);
}

}  // namespace
}  // namespace fsdpsim::sim

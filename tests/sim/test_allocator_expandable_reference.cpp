// Property test of the caching-allocator model with expandable segments (memory/caching_allocator_expandable.cpp)
// against a deliberately naive reference written from the same rules of c10/cuda/CUDACachingAllocator.cpp
// (get_free_block's grown sizes, find_expandable_block, map_block, unmap_block, release_blocks): each
// pool's segment as std::map address -> block, its free mapped blocks in one std::set ordered by
// (size, address). The fast model keeps its pools as size classes and recycles block slots; after every
// call of long random sequences (FSDP-like sizes and random ones, frees mostly LIFO, record_stream frees,
// event processing, empty_cache, a capacity forcing cache releases, retries and OOMs) every observable
// fact must match: each new block's size and address, all statistics, live segments, cached bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "allocator_reference_harness.h"
#include "memory/caching_allocator.h"

namespace fsdpsim::sim {
namespace {

class ExpandableReference {
 public:
  explicit ExpandableReference(Bytes capacity) : capacity_(capacity) {}

  // Returns a handle (index into handles_), -1 for 0 bytes.
  int alloc(Bytes bytes, int stream) {
    if (bytes == 0) return -1;
    const Bytes size = (std::max<Bytes>(bytes, 1) + 511) / 512 * 512;
    const Key key{stream, size <= kAllocSmallSize};
    Bytes addr = -1;
    auto& fr = free_[key];
    auto it = fr.lower_bound({size, Bytes{-1}});
    if (it != fr.end()) {
      for (auto nx = std::next(it); nx != fr.end() && grown(key, *nx) < grown(key, *it); nx = std::next(it)) it = nx;
      addr = it->second;
      fr.erase(it);
    }
    if (addr < 0) {
      addr = try_allocate(key, size, false);
      if (addr < 0) {
        release_cached();
        ++stats_.num_alloc_retries;
        addr = try_allocate(key, size, false);
        if (addr < 0) {
          ++stats_.num_ooms;
          addr = try_allocate(key, size, true);
        }
      }
    }
    auto& blocks = segs_[key].blocks;
    Blk& b = blocks[addr];
    if (b.size - size >= 512) {   // should_split with expandable segments
      blocks[addr + size] = Blk{b.size - size, 0, kFree};
      fr.insert({b.size - size, addr + size});
      b.size = size;
    }
    b.state = kLive;
    b.requested = bytes;
    stats_.allocated += b.size;
    stats_.requested += bytes;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    ++stats_.num_allocs;
    handles_.push_back({key, addr});
    return static_cast<int>(handles_.size()) - 1;
  }
  void free(int h) {
    if (h < 0) return;
    Blk& b = block(h);
    stats_.allocated -= b.size;
    stats_.requested -= b.requested;
    release(handles_[h].first, handles_[h].second);
  }
  void free_after(int h, std::int64_t event) {
    Blk& b = block(h);
    stats_.allocated -= b.size;
    stats_.requested -= b.requested;
    stats_.pending += b.size;
    b.state = kPending;
    pending_.push_back({h, event});
  }
  int process_events(std::int64_t completed_up_to) {
    int n = 0;
    std::vector<std::pair<int, std::int64_t>> keep;
    for (auto [h, ev] : pending_) {
      if (ev <= completed_up_to) {
        stats_.pending -= block(h).size;
        release(handles_[h].first, handles_[h].second);
        ++n;
      } else {
        keep.push_back({h, ev});
      }
    }
    pending_ = keep;
    return n;
  }
  Bytes empty_cache() {
    const Bytes before = stats_.reserved;
    release_cached();
    return before - stats_.reserved;
  }
  int num_segments() const { return static_cast<int>(segs_.size()); }
  Bytes cached_free_bytes(int stream) const {
    Bytes t = 0;
    for (const auto& [key, fr] : free_)
      if (key.first == stream)
        for (const auto& e : fr) t += e.first;
    return t;
  }
  Bytes size_of(int h) const { return segs_.at(handles_[h].first).blocks.at(handles_[h].second).size; }
  Bytes addr_of(int h) const { return handles_[h].second; }
  const AllocatorStats& stats() const { return stats_; }

 private:
  using Key = std::pair<int, bool>;   // (stream, small)
  enum St { kFree, kLive, kPending, kUnmapped };
  struct Blk {
    Bytes size = 0, requested = 0;
    St state = kFree;
  };
  struct Seg {
    Bytes base = 0;
    std::map<Bytes, Blk> blocks;
  };
  static Bytes page(const Key& k) { return k.second ? kExpandablePageSmall : kExpandablePageLarge; }
  Blk& block(int h) { return segs_.at(handles_[h].first).blocks.at(handles_[h].second); }
  // get_free_block's size of a free block: + the unmapped block after it.
  Bytes grown(const Key& k, const std::pair<Bytes, Bytes>& e) const {
    const auto& blocks = segs_.at(k).blocks;
    auto nx = blocks.find(e.second + e.first);
    return e.first + (nx != blocks.end() && nx->second.state == kUnmapped ? nx->second.size : 0);
  }
  // A free block at addr merges with free neighbours and joins the free set; returns its address.
  Bytes release(const Key& k, Bytes addr) {
    auto& blocks = segs_[k].blocks;
    auto& fr = free_[k];
    Bytes start = addr, size = blocks[addr].size;
    auto it = blocks.find(addr);
    if (it != blocks.begin()) {
      auto pv = std::prev(it);
      if (pv->second.state == kFree) {
        fr.erase({pv->second.size, pv->first});
        start = pv->first;
        size += pv->second.size;
        blocks.erase(it);
        it = pv;
      }
    }
    auto nx = blocks.find(start + size);
    if (nx != blocks.end() && nx->second.state == kFree) {
      fr.erase({nx->second.size, nx->first});
      size += nx->second.size;
      blocks.erase(nx);
    }
    blocks[start] = Blk{size, 0, kFree};
    fr.insert({size, start});
    return start;
  }
  bool allocatable(const Blk& b) const { return b.state == kFree || b.state == kUnmapped; }
  Bytes try_allocate(const Key& k, Bytes size, bool force) {
    if (!segs_.count(k)) {
      Seg s;
      s.base = next_addr_;
      s.blocks[s.base] = Blk{page(k) * kExpandableVirtualPages, 0, kUnmapped};
      next_addr_ += page(k) * kExpandableVirtualPages;
      segs_[k] = s;
    }
    auto& blocks = segs_[k].blocks;
    Bytes c = -1;
    for (auto it = blocks.begin(); it != blocks.end() && c < 0; ++it) {
      if (it->second.state != kUnmapped) continue;
      auto from = it;
      if (it != blocks.begin() && allocatable(std::prev(it)->second)) from = std::prev(it);
      Bytes room = 0;
      for (auto w = from; w != blocks.end() && room < size && allocatable(w->second); ++w) room += w->second.size;
      if (room >= size) c = from->first;
    }
    if (blocks[c].state == kUnmapped) {
      c = map(k, c, std::min(blocks[c].size, size), force);
      if (c < 0) return -1;
    }
    while (blocks[c].size < size) {
      const Bytes nx = c + blocks[c].size;
      c = map(k, nx, std::min(size - blocks[c].size, blocks[nx].size), force);
      if (c < 0) return -1;
    }
    free_[k].erase({blocks[c].size, c});
    return c;
  }
  Bytes map(const Key& k, Bytes addr, Bytes bytes, bool force) {
    auto& blocks = segs_[k].blocks;
    const Bytes mapped = (bytes + page(k) - 1) / page(k) * page(k);
    if (!force && capacity_ > 0 && stats_.reserved + mapped > capacity_) return -1;
    const Bytes whole = blocks[addr].size;
    if (mapped < whole) blocks[addr + mapped] = Blk{whole - mapped, 0, kUnmapped};
    blocks[addr] = Blk{mapped, 0, kFree};
    stats_.reserved += mapped;
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    ++stats_.num_device_alloc;
    return release(k, addr);
  }
  void release_cached() {
    for (auto& [k, fr] : free_) {
      const std::vector<std::pair<Bytes, Bytes>> all(fr.begin(), fr.end());   // (size, addr) order
      for (const auto& [size, addr] : all) unmap(k, addr, size);
    }
  }
  void unmap(const Key& k, Bytes addr, Bytes size) {
    Seg& s = segs_[k];
    const Bytes pg = page(k), off = addr - s.base;
    const Bytes begin = (off + pg - 1) / pg * pg, end = (off + size) / pg * pg;
    if (begin >= end) return;
    free_[k].erase({size, addr});
    s.blocks.erase(addr);
    if (begin > off) {
      s.blocks[addr] = Blk{begin - off, 0, kFree};
      free_[k].insert({begin - off, addr});
    }
    if (off + size > end) {
      s.blocks[s.base + end] = Blk{off + size - end, 0, kFree};
      free_[k].insert({off + size - end, s.base + end});
    }
    Bytes ua = s.base + begin, usz = end - begin;
    auto nx = s.blocks.find(ua + usz);
    if (nx != s.blocks.end() && nx->second.state == kUnmapped) {
      usz += nx->second.size;
      s.blocks.erase(nx);
    }
    auto after = s.blocks.lower_bound(ua);
    if (after != s.blocks.begin()) {
      auto pv = std::prev(after);
      if (pv->second.state == kUnmapped && pv->first + pv->second.size == ua) {
        ua = pv->first;
        usz += pv->second.size;
        s.blocks.erase(pv);
      }
    }
    s.blocks[ua] = Blk{usz, 0, kUnmapped};
    stats_.reserved -= end - begin;
    ++stats_.num_device_free;
    if (s.blocks.size() == 1) segs_.erase(k);   // release_expandable_segment
  }

  Bytes capacity_;
  std::map<Key, Seg> segs_;
  std::map<Key, std::set<std::pair<Bytes, Bytes>>> free_;
  std::vector<std::pair<Key, Bytes>> handles_;
  std::vector<std::pair<int, std::int64_t>> pending_;
  Bytes next_addr_ = 0;
  AllocatorStats stats_;
};

AllocatorStats run_sequence(Bytes capacity, std::uint32_t seed, int steps, int streams) {
  AllocatorConfig cfg;
  cfg.capacity = capacity;
  cfg.expandable_segments = true;
  CachingAllocator fast(cfg);
  ExpandableReference ref(capacity);
  return testing::run_reference_sequence(fast, ref, seed, steps, streams, /*drain_events=*/false);
}

TEST(AllocatorExpandableReference, UnlimitedMatchesTheReference) {
  for (std::uint32_t seed = 1; seed <= 12; ++seed) {
    const AllocatorStats s = run_sequence(0, seed, 3000, 3);
    EXPECT_GT(s.num_allocs, 1000) << "seed " << seed;
    EXPECT_GT(s.num_device_free, 0) << "seed " << seed;   // empty_cache unmapped pages
    if (HasFailure()) return;
  }
}

TEST(AllocatorExpandableReference, CapacityReleasesRetriesAndOomsMatchTheReference) {
  std::int64_t retries = 0, ooms = 0;
  for (std::uint32_t seed = 100; seed <= 112; ++seed) {
    const AllocatorStats s = run_sequence(900 * kMiB, seed, 3000, 2);
    retries += s.num_alloc_retries;
    ooms += s.num_ooms;
    if (HasFailure()) return;
  }
  EXPECT_GT(retries, 0);
  EXPECT_GT(ooms, 0);
}

}  // namespace
}  // namespace fsdpsim::sim

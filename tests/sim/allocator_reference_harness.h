// The random-sequence harness both caching-allocator property tests share (test_allocator_reference.cpp,
// test_allocator_expandable_reference.cpp): the fast model and a naive reference get the same calls —
// FSDP-like and random sizes, frees mostly LIFO, record_stream frees, event processing, empty_cache —
// and after every call each observable fact must match.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "memory/caching_allocator.h"

namespace fsdpsim::sim::testing {

inline void expect_same_stats(const AllocatorStats& a, const AllocatorStats& r, int step) {
  EXPECT_EQ(a.allocated, r.allocated) << "step " << step;
  EXPECT_EQ(a.requested, r.requested) << "step " << step;
  EXPECT_EQ(a.reserved, r.reserved) << "step " << step;
  EXPECT_EQ(a.pending, r.pending) << "step " << step;
  EXPECT_EQ(a.peak_allocated, r.peak_allocated) << "step " << step;
  EXPECT_EQ(a.peak_reserved, r.peak_reserved) << "step " << step;
  EXPECT_EQ(a.num_allocs, r.num_allocs) << "step " << step;
  EXPECT_EQ(a.num_device_alloc, r.num_device_alloc) << "step " << step;
  EXPECT_EQ(a.num_device_free, r.num_device_free) << "step " << step;
  EXPECT_EQ(a.num_alloc_retries, r.num_alloc_retries) << "step " << step;
  EXPECT_EQ(a.num_ooms, r.num_ooms) << "step " << step;
}

// One random sequence on `fast` and `ref` (a reference with alloc / free / free_after / process_events(upto) /
// empty_cache / size_of / addr_of / stats / num_segments / cached_free_bytes); returns the fast model's final
// statistics, so a test can check what it exercised. `drain_events`: 3% of the calls complete every
// pending event instead of emptying the cache.
template <class Reference>
AllocatorStats run_reference_sequence(CachingAllocator& fast, Reference& ref, std::uint32_t seed, int steps,
                                      int streams, bool drain_events) {
  std::mt19937 rng(seed);
  // The sizes of an FSDP step repeat: a handful per stream, small and large, plus random ones.
  const std::vector<Bytes> common = {300,        4096,          700 * 1024,    kMiB,         kMiB + 512,
                                     3 * kMiB,   9 * kMiB + 77, 10 * kMiB,     24 * kMiB,    64 * kMiB + 512,
                                     130 * kMiB, 262 * kMiB + 1};
  struct Live {
    int fast, ref;
  };
  std::vector<Live> live;
  std::int64_t event = 0, completed = -1;
  for (int step = 0; step < steps; ++step) {
    const int what = static_cast<int>(rng() % 100);
    if (what < 50 || live.empty()) {
      Bytes bytes;
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 6) bytes = common[rng() % common.size()];
      else if (kind < 8) bytes = static_cast<Bytes>(rng() % (2 * kMiB));
      else bytes = static_cast<Bytes>(rng() % (300 * kMiB));
      const int stream = static_cast<int>(rng() % streams);
      const int f = fast.alloc(bytes, stream);
      const int r = ref.alloc(bytes, stream);
      EXPECT_EQ(f < 0, r < 0) << "step " << step;
      if ((f < 0) != (r < 0)) return fast.stats();
      if (f >= 0) {
        EXPECT_EQ(fast.block_size(f), ref.size_of(r)) << "step " << step << " bytes " << bytes;
        EXPECT_EQ(fast.block_address(f), ref.addr_of(r)) << "step " << step << " bytes " << bytes;
        live.push_back({f, r});
      }
    } else if (what < 80) {
      // FSDP frees mostly in LIFO order (backward), sometimes in any order.
      const std::size_t i =
          rng() % 3 == 0 ? rng() % live.size() : live.size() - 1 - rng() % std::min<std::size_t>(live.size(), 3);
      const Live l = live[i];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      if (rng() % 4 == 0) {
        fast.free_after(l.fast, event);
        ref.free_after(l.ref, event);
        ++event;
      } else {
        fast.free(l.fast);
        ref.free(l.ref);
      }
    } else if (what < 95) {
      completed = std::min(event - 1, completed + 1 + static_cast<std::int64_t>(rng() % 3));
      const std::int64_t upto = completed;
      EXPECT_EQ(fast.process_events([upto](std::int64_t ev) { return ev <= upto; }), ref.process_events(upto))
          << "step " << step;
    } else if (what < 97 || !drain_events) {
      EXPECT_EQ(fast.empty_cache(), ref.empty_cache()) << "step " << step;
    } else {
      // Everything cached and released, then nothing left behind.
      completed = event - 1;
      const std::int64_t upto = completed;
      fast.process_events([upto](std::int64_t ev) { return ev <= upto; });
      ref.process_events(upto);
    }
    expect_same_stats(fast.stats(), ref.stats(), step);
    EXPECT_EQ(fast.num_segments(), ref.num_segments()) << "step " << step;
    for (int s = 0; s < streams; ++s) EXPECT_EQ(fast.cached_free_bytes(s), ref.cached_free_bytes(s)) << "step " << step;
    if (::testing::Test::HasFailure()) return fast.stats();
  }
  return fast.stats();
}

}  // namespace fsdpsim::sim::testing

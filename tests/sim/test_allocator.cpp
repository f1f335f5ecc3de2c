// The caching-allocator model against hand-computed bytes (rules in memory/caching_allocator.h, from
// c10/cuda/CUDACachingAllocator.cpp): rounding, pools, splitting, coalescing, per-stream reuse,
// record_stream delay, cudaMalloc retry at capacity.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "memory/caching_allocator.h"

namespace fsdpsim::sim {
namespace {

TEST(AllocatorSizes, RoundSizeTo512) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512);
  EXPECT_EQ(CachingAllocator::round_size(512), 512);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024);
  EXPECT_EQ(CachingAllocator::round_size(10 * kMiB + 1), 10 * kMiB + 512);
}

TEST(AllocatorSizes, SegmentSizes) {
  EXPECT_EQ(CachingAllocator::allocation_size(512), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::allocation_size(1 * kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::allocation_size(1 * kMiB + 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocator::allocation_size(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocator::allocation_size(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(CachingAllocator::allocation_size(10 * kMiB + 512), 12 * kMiB);
}

TEST(Allocator, SmallRequestsShareOne2MiBSegment) {
  CachingAllocator a;
  int b1 = a.alloc(1000, 0);
  int b2 = a.alloc(3000, 0);
  EXPECT_EQ(a.block_size(b1), 1024);
  EXPECT_EQ(a.block_size(b2), 3072);
  EXPECT_EQ(a.block_address(b1), 0);
  EXPECT_EQ(a.block_address(b2), 1024);
  EXPECT_TRUE(a.block_is_small(b1));
  EXPECT_EQ(a.stats().allocated, 1024 + 3072);
  EXPECT_EQ(a.stats().requested, 4000);
  EXPECT_EQ(a.stats().reserved, 2 * kMiB);
  EXPECT_EQ(a.num_segments(), 1);
  EXPECT_EQ(a.cached_free_bytes(0), 2 * kMiB - 4096);
}

TEST(Allocator, MidSizeRequestGets20MiBSegmentAndSplits) {
  CachingAllocator a;
  int b = a.alloc(5 * kMiB, 0);
  EXPECT_FALSE(a.block_is_small(b));
  EXPECT_EQ(a.block_size(b), 5 * kMiB);
  EXPECT_EQ(a.stats().reserved, 20 * kMiB);
  EXPECT_EQ(a.cached_free_bytes(0), 15 * kMiB);
  // The 15 MiB remainder serves the next request of the same stream: no new segment.
  int c = a.alloc(15 * kMiB, 0);
  EXPECT_EQ(a.block_address(c), 5 * kMiB);
  EXPECT_EQ(a.stats().reserved, 20 * kMiB);
  EXPECT_EQ(a.stats().allocated, 20 * kMiB);
  EXPECT_EQ(a.stats().num_device_alloc, 1);
}

TEST(Allocator, LargeRemainderOfAtMost1MiBIsNotSplitAndCountsAsAllocated) {
  CachingAllocator a;
  // 11 MiB + 1 B rounds to 11 MiB + 512; its segment is 12 MiB; the 1 MiB − 512 B remainder is not
  // > 1 MiB, so the whole segment is the block (memory_allocated counts it all).
  int b = a.alloc(11 * kMiB + 1, 0);
  EXPECT_EQ(a.block_size(b), 12 * kMiB);
  EXPECT_EQ(a.stats().allocated, 12 * kMiB);
  EXPECT_EQ(a.stats().requested, 11 * kMiB + 1);
  EXPECT_EQ(a.stats().reserved, 12 * kMiB);
}

TEST(Allocator, SmallRemainderSplitsAt512) {
  CachingAllocator a;
  int b = a.alloc(2 * kMiB - 512, 0);   // > 1 MiB: large pool, 20 MiB segment
  EXPECT_FALSE(a.block_is_small(b));
  int s = a.alloc(kMiB, 0);             // small pool: new 2 MiB segment, remainder 1 MiB >= 512 splits
  EXPECT_TRUE(a.block_is_small(s));
  EXPECT_EQ(a.block_size(s), kMiB);
  EXPECT_EQ(a.stats().reserved, 22 * kMiB);
}

TEST(Allocator, ReuseWithinAStreamButNotAcrossStreams) {
  CachingAllocator a;
  int b = a.alloc(100 * kMiB, 1);
  a.free(b);
  EXPECT_EQ(a.stats().allocated, 0);
  EXPECT_EQ(a.stats().reserved, 100 * kMiB);
  int c = a.alloc(100 * kMiB, 1);       // same stream: the cached block
  EXPECT_EQ(a.stats().reserved, 100 * kMiB);
  a.free(c);
  a.alloc(100 * kMiB, 2);               // another stream's pool: a new segment
  EXPECT_EQ(a.stats().reserved, 200 * kMiB);
  EXPECT_EQ(a.stats().peak_reserved, 200 * kMiB);
  EXPECT_EQ(a.stats().num_device_alloc, 2);
}

TEST(Allocator, BestFitPicksTheSmallestSufficientBlock) {
  CachingAllocator a;
  int b60 = a.alloc(60 * kMiB, 0);
  int b40 = a.alloc(40 * kMiB, 0);
  a.free(b60);
  a.free(b40);
  int c = a.alloc(30 * kMiB, 0);
  EXPECT_EQ(a.block_address(c), 60 * kMiB);   // the 40 MiB segment (laid out after the 60 MiB one)
  EXPECT_EQ(a.block_size(c), 30 * kMiB);
  EXPECT_EQ(a.cached_free_bytes(0), 60 * kMiB + 10 * kMiB);
}

TEST(Allocator, FreedNeighboursCoalesce) {
  CachingAllocator a;
  int x = a.alloc(4 * kMiB, 0);   // [0, 4) of a 20 MiB segment
  int y = a.alloc(4 * kMiB, 0);   // [4, 8), remainder [8, 20) cached
  EXPECT_EQ(a.block_address(y), 4 * kMiB);
  a.free(x);
  a.free(y);                      // merges with [0,4) and [8,20): one 20 MiB block again
  EXPECT_EQ(a.cached_free_bytes(0), 20 * kMiB);
  int z = a.alloc(20 * kMiB, 0);
  EXPECT_EQ(a.block_address(z), 0);
  EXPECT_EQ(a.block_size(z), 20 * kMiB);
  EXPECT_EQ(a.stats().reserved, 20 * kMiB);
}

TEST(Allocator, RecordStreamDelaysReuseUntilTheEventCompletes) {
  CachingAllocator a;
  int b = a.alloc(100 * kMiB, 0);
  a.free_after(b, /*event=*/7);
  EXPECT_EQ(a.stats().allocated, 0);       // no longer allocated ...
  EXPECT_EQ(a.stats().pending, 100 * kMiB);
  int c = a.alloc(100 * kMiB, 0);          // ... but not reusable: a new segment
  EXPECT_EQ(a.stats().reserved, 200 * kMiB);
  EXPECT_EQ(a.process_events([](std::int64_t ev) { return ev < 7; }), 0);
  EXPECT_EQ(a.process_events([](std::int64_t ev) { return ev <= 7; }), 1);
  EXPECT_EQ(a.stats().pending, 0);
  a.free(c);
  a.alloc(100 * kMiB, 0);
  a.alloc(100 * kMiB, 0);                  // both cached blocks reused
  EXPECT_EQ(a.stats().reserved, 200 * kMiB);
  EXPECT_EQ(a.stats().num_device_alloc, 2);
}

TEST(Allocator, PendingBlockDoesNotCoalesce) {
  CachingAllocator a;
  int x = a.alloc(4 * kMiB, 0);
  int y = a.alloc(4 * kMiB, 0);
  a.free_after(x, 1);
  a.free(y);   // y merges with the free remainder only, not with pending x
  EXPECT_EQ(a.cached_free_bytes(0), 16 * kMiB);
  a.process_events([](std::int64_t) { return true; });
  EXPECT_EQ(a.cached_free_bytes(0), 20 * kMiB);
}

TEST(Allocator, CapacityReleasesTheCacheAndRetries) {
  CachingAllocator a(AllocatorConfig{100 * kMiB});
  int b = a.alloc(60 * kMiB, 0);
  a.free(b);
  a.alloc(60 * kMiB, 1);   // 120 MiB > 100: release stream 0's cached segment, retry
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  EXPECT_EQ(a.stats().num_ooms, 0);
  EXPECT_EQ(a.stats().reserved, 60 * kMiB);
  EXPECT_EQ(a.stats().peak_reserved, 60 * kMiB);
  EXPECT_EQ(a.stats().num_device_free, 1);
}

TEST(Allocator, CapacityExceededByLiveBlocksIsAnOom) {
  CachingAllocator a(AllocatorConfig{100 * kMiB});
  a.alloc(60 * kMiB, 0);
  a.alloc(60 * kMiB, 0);
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_EQ(a.stats().reserved, 120 * kMiB);   // recorded past capacity so the overflow is visible
}

TEST(Allocator, SplitSegmentIsNotReleased) {
  CachingAllocator a;
  int x = a.alloc(4 * kMiB, 0);
  int y = a.alloc(100 * kMiB, 0);
  a.free(y);
  EXPECT_EQ(a.empty_cache(), 100 * kMiB);   // x's segment has a live block: kept
  EXPECT_EQ(a.stats().reserved, 20 * kMiB);
  a.free(x);
  EXPECT_EQ(a.empty_cache(), 20 * kMiB);
  EXPECT_EQ(a.stats().reserved, 0);
}

TEST(Allocator, MaxSplitSizeRules) {
  CachingAllocator a(AllocatorConfig{0, 50 * kMiB, 20 * kMiB});
  int b = a.alloc(100 * kMiB, 0);
  a.free(b);
  a.alloc(60 * kMiB, 0);    // 100 >= 60 + 20: too oversized, new segment
  EXPECT_EQ(a.stats().reserved, 160 * kMiB);
  int c = a.alloc(90 * kMiB, 0);   // 100 < 90 + 20: taken whole, not split (>= max_split)
  EXPECT_EQ(a.block_size(c), 100 * kMiB);
  a.free(c);
  a.alloc(10 * kMiB, 0);    // a normal request never takes the cached oversize block: new segment
  EXPECT_EQ(a.stats().reserved, 170 * kMiB);
}

TEST(Allocator, ZeroBytesIsNullAndErrorsAreReported) {
  CachingAllocator a;
  EXPECT_EQ(a.alloc(0, 0), -1);
  a.free(-1);
  EXPECT_EQ(a.stats().reserved, 0);
  EXPECT_THROW(a.alloc(-1, 0), std::invalid_argument);
  EXPECT_THROW(a.alloc(1, -1), std::invalid_argument);
  int b = a.alloc(10, 0);
  a.free(b);
  EXPECT_THROW(a.free(b), std::invalid_argument);
  EXPECT_THROW(a.free_after(b, 3), std::invalid_argument);
  EXPECT_THROW(a.free(12345), std::invalid_argument);
}


// relocate (the fast-forward's stand-in for periods that cudaMalloc'ed a segment again elsewhere): the
// segment's blocks move with it, its free blocks take their new places in best fit's (size, address)
// order, the next cudaMalloc goes where the moved next address says, and no statistic changes.
TEST(Allocator, RelocatedSegmentsKeepTheirBlocksAndTakeTheirNewAddressesInBestFit) {
  CachingAllocator a;
  const int x = a.alloc(12 * kMiB, 0);   // segment 0 at 0 (12 MiB: >= 10 MiB, rounded to 2 MiB)
  const int y = a.alloc(12 * kMiB, 0);   // segment 1 at 12 MiB
  const int z = a.alloc(5 * kMiB, 0);    // segment 2 at 24 MiB: 20 MiB, split (15 MiB cached)
  EXPECT_EQ(a.block_address(y), 12 * kMiB);
  EXPECT_EQ(a.block_address(z), 24 * kMiB);
  a.free(y);
  const AllocatorStats before = a.stats();
  a.relocate({{a.block_segment(y), 100 * kMiB}, {a.block_segment(z), 100 * kMiB}}, 100 * kMiB);
  EXPECT_EQ(a.block_address(z), 124 * kMiB);   // an allocated block moves with its segment
  EXPECT_EQ(a.next_address(), 144 * kMiB);
  EXPECT_EQ(a.stats().reserved, before.reserved);
  EXPECT_EQ(a.stats().num_device_alloc, before.num_device_alloc);
  // The pool lists the moved free blocks at their new addresses (12 MiB at 112 MiB, 15 MiB at 129 MiB).
  const std::string state = a.canonical_state();
  EXPECT_NE(state.find(" 12582912@117440512"), std::string::npos) << state;
  EXPECT_NE(state.find(" 15728640@135266304"), std::string::npos) << state;
  EXPECT_EQ(state.find("@12582912"), std::string::npos) << state;
  a.free(x);
  // Two free 12 MiB segments, at 0 and at 112 MiB: best fit takes the lower address first.
  EXPECT_EQ(a.block_address(a.alloc(12 * kMiB, 0)), 0);
  EXPECT_EQ(a.block_address(a.alloc(12 * kMiB, 0)), 112 * kMiB);
  // The split-off 15 MiB of segment 2 moved too.
  EXPECT_EQ(a.block_address(a.alloc(15 * kMiB, 0)), 129 * kMiB);
  // A new segment goes to the moved next address.
  EXPECT_EQ(a.block_address(a.alloc(12 * kMiB, 0)), 144 * kMiB);
  EXPECT_EQ(a.stats().num_device_alloc, 4);

  // Segments moved at once, one onto the addresses of another that moves too (the memory shift moves every segment
  // its periods cudaMalloc again): both free blocks end listed at their new addresses, in best fit's order.
  // (Moved one by one, the first landed on the second's address, and the second's lookup in the pool found the first.)
  CachingAllocator c;
  const int w = c.alloc(12 * kMiB, 0), p = c.alloc(12 * kMiB, 0), q = c.alloc(12 * kMiB, 0);   // at 0, 12, 24 MiB
  c.free(w);
  c.free(p);
  c.free(q);
  c.relocate({{c.block_segment(p), 12 * kMiB}, {c.block_segment(q), 12 * kMiB}}, 12 * kMiB);
  EXPECT_EQ(c.block_address(c.alloc(12 * kMiB, 0)), 0);
  EXPECT_EQ(c.block_address(c.alloc(12 * kMiB, 0)), 24 * kMiB);
  EXPECT_EQ(c.block_address(c.alloc(12 * kMiB, 0)), 36 * kMiB);
  EXPECT_EQ(c.block_address(c.alloc(12 * kMiB, 0)), 48 * kMiB);   // a new one at the moved next address
}

}  // namespace
}  // namespace fsdpsim::sim

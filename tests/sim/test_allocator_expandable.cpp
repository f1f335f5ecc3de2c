// The caching-allocator model with PYTORCH_CUDA_ALLOC_CONF options (expandable_segments, max_split_size_mb)
// against hand-computed bytes: allocated / reserved after every call, block addresses, and the
// allocator's segment layout. Rules: memory/caching_allocator.h, from c10/cuda/CUDACachingAllocator.cpp
// (expandable segments map 20 MiB pages in the large pool, 2 MiB in the small one; a free never unmaps;
// a cache release unmaps the whole pages inside free blocks).
#include <gtest/gtest.h>

#include <string>

#include "memory/caching_allocator.h"

namespace fsdpsim::sim {
namespace {

AllocatorConfig expandable(Bytes capacity = 0) {
  AllocatorConfig c;
  c.capacity = capacity;
  c.expandable_segments = true;
  return c;
}

// The issue-19 case: a large transient allocated after a smaller block was freed.
TEST(AllocatorExpandable, LargeTransientAfterASmallerFreedBlock) {
  // Without expandable segments: 100 MiB gets a 100 MiB segment (rounded to 2 MiB); freed, it is too
  // small for 120 MiB, which gets a segment of its own: reserved 100 + 120 = 220 MiB.
  CachingAllocator off;
  int a = off.alloc(100 * kMiB, 0);
  EXPECT_EQ(off.stats().allocated, 100 * kMiB);
  EXPECT_EQ(off.stats().reserved, 100 * kMiB);
  off.free(a);
  EXPECT_EQ(off.stats().allocated, 0);
  EXPECT_EQ(off.stats().reserved, 100 * kMiB);
  int b = off.alloc(120 * kMiB, 0);
  EXPECT_EQ(off.stats().allocated, 120 * kMiB);
  EXPECT_EQ(off.stats().reserved, 220 * kMiB);
  EXPECT_EQ(off.block_address(b), 100 * kMiB);

  // With them: 100 MiB maps 5 pages of 20 MiB (100 MiB). Freed, the block lies at the end of the mapped
  // range: 120 MiB extends it by one page (20 MiB) and takes [0, 120 MiB): reserved 120 MiB, two mappings.
  CachingAllocator on(expandable());
  a = on.alloc(100 * kMiB, 0);
  EXPECT_EQ(on.stats().allocated, 100 * kMiB);
  EXPECT_EQ(on.stats().reserved, 100 * kMiB);
  on.free(a);
  EXPECT_EQ(on.stats().allocated, 0);
  EXPECT_EQ(on.stats().reserved, 100 * kMiB);
  b = on.alloc(120 * kMiB, 0);
  EXPECT_EQ(on.stats().allocated, 120 * kMiB);
  EXPECT_EQ(on.stats().reserved, 120 * kMiB);
  EXPECT_EQ(on.block_address(b), 0);
  EXPECT_EQ(on.stats().num_device_alloc, 2);
  EXPECT_EQ(on.num_segments(), 1);
}

TEST(AllocatorExpandable, FreedNeighboursServeALargerRequestWithoutGrowing) {
  // Off: 30 MiB and 30 MiB get two 30 MiB segments; both freed, 50 MiB fits neither: reserved 110 MiB.
  CachingAllocator off;
  int x = off.alloc(30 * kMiB, 0), y = off.alloc(30 * kMiB, 0);
  off.free(x);
  off.free(y);
  off.alloc(50 * kMiB, 0);
  EXPECT_EQ(off.stats().reserved, 110 * kMiB);
  // On: x maps 2 pages (40 MiB) and keeps [0, 30); y takes the free [30, 40) plus one more page:
  // [30, 60), reserved 60 MiB. Both freed merge into [0, 60); 50 MiB takes its front, 10 MiB stay free.
  CachingAllocator on(expandable());
  x = on.alloc(30 * kMiB, 0);
  EXPECT_EQ(on.stats().reserved, 40 * kMiB);
  EXPECT_EQ(on.cached_free_bytes(0), 10 * kMiB);
  y = on.alloc(30 * kMiB, 0);
  EXPECT_EQ(on.block_address(y), 30 * kMiB);
  EXPECT_EQ(on.stats().reserved, 60 * kMiB);
  EXPECT_EQ(on.cached_free_bytes(0), 0);
  on.free(x);
  on.free(y);
  const int z = on.alloc(50 * kMiB, 0);
  EXPECT_EQ(on.block_address(z), 0);
  EXPECT_EQ(on.block_size(z), 50 * kMiB);
  EXPECT_EQ(on.stats().allocated, 50 * kMiB);
  EXPECT_EQ(on.stats().reserved, 60 * kMiB);
  EXPECT_EQ(on.cached_free_bytes(0), 10 * kMiB);
}

TEST(AllocatorExpandable, PagesAreTwentyMiBLargeAndTwoMiBSmallAndBlocksSplitAt512B) {
  CachingAllocator a(expandable());
  // 25 MiB: without expandable segments a 26 MiB segment, not split (1 MiB left is not > 1 MiB), so
  // 26 MiB allocated; with them two 20 MiB pages, and the 15 MiB rest split off (should_split: >= 512 B).
  const int big = a.alloc(25 * kMiB, 0);
  EXPECT_EQ(a.block_size(big), 25 * kMiB);
  EXPECT_EQ(a.stats().allocated, 25 * kMiB);
  EXPECT_EQ(a.stats().reserved, 40 * kMiB);
  // A small request: the small pool's own segment, one 2 MiB page.
  const int small = a.alloc(1000, 0);
  EXPECT_TRUE(a.block_is_small(small));
  EXPECT_EQ(a.block_size(small), 1024);
  EXPECT_EQ(a.stats().reserved, 42 * kMiB);
  EXPECT_EQ(a.num_segments(), 2);
  // 1.5 MiB (large pool) out of the free 15 MiB: split, 13.5 MiB stay free (> 1 MiB rule not applied).
  const int mid = a.alloc(kMiB + kMiB / 2, 0);
  EXPECT_EQ(a.block_address(mid), a.block_address(big) + 25 * kMiB);
  EXPECT_EQ(a.cached_free_bytes(0), 2 * kMiB - 1024 + 13 * kMiB + kMiB / 2);
  // A remainder of 512 B is split off too: 13.5 MiB - 512 B out of the free 13.5 MiB block.
  const int tight = a.alloc(13 * kMiB + kMiB / 2 - 512, 0);
  EXPECT_EQ(a.block_size(tight), 13 * kMiB + kMiB / 2 - 512);
  EXPECT_EQ(a.cached_free_bytes(0), 2 * kMiB - 1024 + 512);
  EXPECT_EQ(a.stats().reserved, 42 * kMiB);
}

TEST(AllocatorExpandable, BestFitPassesOverTheBlockAtTheMappedEnd) {
  // get_free_block counts a free block followed by unmapped pages as the size it could grow to, so a
  // 4 MiB request takes the free 30 MiB block rather than the 5 MiB one at the end of the mapped range.
  CachingAllocator a(expandable());
  const int x = a.alloc(30 * kMiB, 0);   // [0, 30), free [30, 40)
  const int y = a.alloc(10 * kMiB, 0);   // [30, 40) exactly
  const int z = a.alloc(15 * kMiB, 0);   // one more page: [40, 55), free [55, 60)
  EXPECT_EQ(a.block_address(y), 30 * kMiB);
  EXPECT_EQ(a.block_address(z), 40 * kMiB);
  EXPECT_EQ(a.stats().reserved, 60 * kMiB);
  a.free(x);
  const int w = a.alloc(4 * kMiB, 0);
  EXPECT_EQ(a.block_address(w), 0);
  EXPECT_EQ(a.cached_free_bytes(0), 26 * kMiB + 5 * kMiB);
  // Without expandable segments best fit takes the smallest block that fits (here a 5 MiB remainder).
  CachingAllocator off;
  const int p = off.alloc(30 * kMiB, 0);
  off.alloc(5 * kMiB, 0);   // a 20 MiB segment: [0, 5) and a free 15 MiB rest
  off.free(p);
  const int q = off.alloc(4 * kMiB, 0);
  EXPECT_EQ(off.block_address(q), 30 * kMiB + 5 * kMiB);
}

TEST(AllocatorExpandable, EmptyCacheUnmapsWholePagesOfFreeBlocks) {
  CachingAllocator a(expandable());
  const int x = a.alloc(30 * kMiB, 0);   // maps [0, 40): x = [0, 30), free [30, 40)
  const int y = a.alloc(5 * kMiB, 0);    // y = [30, 35), free [35, 40)
  a.free(x);                             // free [0, 30)
  // Free blocks [35, 40) (no whole page) and [0, 30) (page [0, 20) unmapped, [20, 30) stays mapped).
  EXPECT_EQ(a.empty_cache(), 20 * kMiB);
  EXPECT_EQ(a.stats().reserved, 20 * kMiB);
  EXPECT_EQ(a.stats().num_device_free, 1);
  EXPECT_EQ(a.cached_free_bytes(0), 15 * kMiB);
  EXPECT_EQ(a.num_segments(), 1);
  // A 12 MiB request: no free block fits; the lowest unmapped range with room is the hole [0, 20),
  // mapped and merged with the free [20, 30): 12 MiB at address 0, [12, 30) free.
  const int z = a.alloc(12 * kMiB, 0);
  EXPECT_EQ(a.block_address(z), 0);
  EXPECT_EQ(a.stats().reserved, 40 * kMiB);
  a.free(z);
  a.free(y);
  // Everything free: [0, 40) is unmapped whole, merges with the rest of the range: the segment goes.
  EXPECT_EQ(a.empty_cache(), 40 * kMiB);
  EXPECT_EQ(a.stats().reserved, 0);
  EXPECT_EQ(a.num_segments(), 0);
  // A new segment later, at new addresses.
  const int w = a.alloc(kMiB * 3, 0);
  EXPECT_GT(a.block_address(w), 0);
  EXPECT_EQ(a.stats().reserved, 20 * kMiB);
}

TEST(AllocatorExpandable, OomRetryUnmapsFreePagesAndRetries) {
  CachingAllocator a(expandable(100 * kMiB));
  const int x = a.alloc(60 * kMiB, 0);   // 3 pages
  const int y = a.alloc(20 * kMiB, 0);   // 1 page: reserved 80
  EXPECT_EQ(a.block_address(y), 60 * kMiB);
  a.free(x);
  // Stream 1 has a pool (and a segment) of its own: 40 MiB there needs 2 pages, 120 > 100 MiB: the cache
  // release unmaps [0, 60) of stream 0 (reserved 20), then the retry maps: reserved 60.
  const int z = a.alloc(40 * kMiB, 1);
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  EXPECT_EQ(a.stats().num_ooms, 0);
  EXPECT_EQ(a.stats().reserved, 60 * kMiB);
  EXPECT_EQ(a.stats().peak_reserved, 80 * kMiB);
  EXPECT_EQ(a.stats().allocated, 60 * kMiB);
  EXPECT_EQ(a.num_segments(), 2);
  (void)z;
  // Live bytes beyond capacity: an OOM, recorded, and the pages mapped anyway.
  a.alloc(60 * kMiB, 1);
  EXPECT_EQ(a.stats().num_alloc_retries, 2);
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_EQ(a.stats().reserved, 120 * kMiB);
}

TEST(AllocatorExpandable, SaveRestoreKeepsTheSegmentsAndTheirHoles) {
  CachingAllocator a(expandable());
  const int x = a.alloc(30 * kMiB, 0);
  a.alloc(5 * kMiB, 0);
  a.alloc(700, 1);
  a.free(x);
  a.empty_cache();   // a hole at [0, 20)
  CachingAllocator::Snapshot snap;
  a.save(snap);
  const std::string before = a.canonical_state();
  a.alloc(12 * kMiB, 0);
  const std::string after = a.canonical_state();
  CachingAllocator b;
  b.alloc(64 * kMiB, 3);   // (another history and config: restore overrides all of it)
  b.restore(snap);
  EXPECT_EQ(b.canonical_state(), before);
  b.alloc(12 * kMiB, 0);
  EXPECT_EQ(b.canonical_state(), after);
}

TEST(AllocatorMaxSplit, FailedCudaMallocFirstReleasesOneOversizeBlock) {
  // max_split_size 40 MiB, capacity 200 MiB. Cached: 100 MiB and 60 MiB (both oversize, unsplit).
  AllocatorConfig cfg;
  cfg.capacity = 200 * kMiB;
  cfg.max_split_size = 40 * kMiB;
  CachingAllocator a(cfg);
  const int x = a.alloc(100 * kMiB, 0), y = a.alloc(60 * kMiB, 0);
  a.free(x);
  a.free(y);
  // 70 MiB: the 100 MiB block is too oversized (100 >= 70 + 20), so a cudaMalloc: 160 + 70 > 200.
  // release_available_cached_blocks frees the smallest cached block >= 70 MiB (100 MiB) and the
  // cudaMalloc succeeds: no retry counted, the 60 MiB block stays cached.
  a.alloc(70 * kMiB, 0);
  EXPECT_EQ(a.stats().reserved, 130 * kMiB);
  EXPECT_EQ(a.stats().num_device_free, 1);
  EXPECT_EQ(a.stats().num_alloc_retries, 0);
  EXPECT_EQ(a.cached_free_bytes(0), 60 * kMiB);
}

TEST(AllocatorMaxSplit, WithoutOneLargeEnoughItReleasesTheLargestFirst) {
  AllocatorConfig cfg;
  cfg.capacity = 150 * kMiB;
  cfg.max_split_size = 40 * kMiB;
  CachingAllocator a(cfg);
  const int x = a.alloc(50 * kMiB, 0), y = a.alloc(60 * kMiB, 0);
  a.free(x);
  a.free(y);
  // 80 MiB: 110 + 80 > 150. No cached block >= 80 MiB: 60 MiB then 50 MiB are released (110 >= 80).
  a.alloc(80 * kMiB, 0);
  EXPECT_EQ(a.stats().reserved, 80 * kMiB);
  EXPECT_EQ(a.stats().num_device_free, 2);
  EXPECT_EQ(a.stats().num_alloc_retries, 0);
  // With too little to release, the full cache release and the retry follow (as without max_split_size).
  AllocatorConfig small = cfg;
  small.capacity = 100 * kMiB;
  CachingAllocator b(small);
  const int p = b.alloc(45 * kMiB, 0);
  b.alloc(30 * kMiB, 0);   // (30 MiB < max_split_size: live, not releasable)
  b.free(p);
  b.alloc(60 * kMiB, 0);   // 75 + 60 > 100; releasing 45 < 60: not enough; release all, retry: 30 + 60
  EXPECT_EQ(b.stats().num_alloc_retries, 1);
  EXPECT_EQ(b.stats().reserved, 90 * kMiB);
}

}  // namespace
}  // namespace fsdpsim::sim

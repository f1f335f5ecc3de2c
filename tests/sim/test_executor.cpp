// The discrete-event executor on hand-built programs with fixed costs: every expected nanosecond and
// byte below is derived by hand in the comment next to it (semantics in program/step_program.h and at the
// top of sim/executor.cpp).
#include <gtest/gtest.h>

#include <string>

#include "common/errors.h"
#include "fixed_cost_model.h"
#include "sim/executor.h"
#include "sim/memory_tracker.h"
#include "test_executor_builder.h"

namespace fsdpsim::sim {
namespace {

using testing::FixedCostModel;
using testing::FixedCosts;
using testing::ProgramBuilder;
using PB = ProgramBuilder;

const TraceSpan* find_span(const SimResult& r, const std::string& name, const std::string& track) {
  for (const auto& s : r.trace)
    if (s.name == name && s.track == track) return &s;
  return nullptr;
}

TEST(Executor, OpsOfOneStreamRunInOrder) {
  PB b;
  b.op(OpKind::Forward, PB::kCompute, {}, "f0");
  b.op(OpKind::Backward, PB::kCompute, {}, "b0");
  FixedCosts c;
  c.forward_ns = 100;
  c.backward_ns = 50;
  SimResult r = execute(b.p, FixedCostModel(c));
  EXPECT_EQ(r.step_time_ns, 150);
  EXPECT_EQ(r.compute_ns, 150);
  EXPECT_EQ(r.comm_ns, 0);
  const TraceSpan* s = find_span(r, "b0", "default");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->start_ns, 100);
  EXPECT_EQ(s->dur_ns, 50);
  EXPECT_EQ(s->kind, "backward");
}

TEST(Executor, CrossStreamWaitAndExposedComm) {
  PB b;
  int ag = b.op(OpKind::AllGather, PB::kAllGather, {}, "AG 0");
  b.op(OpKind::Forward, PB::kCompute, {ag}, "fwd 0");
  FixedCosts c;
  c.all_gather_ns = 80;
  c.forward_ns = 100;
  SimResult r = execute(b.p, FixedCostModel(c));
  // AG [0, 80), forward waits for it: [80, 180). The compute stream idles [0, 80) while the AG runs.
  EXPECT_EQ(r.step_time_ns, 180);
  EXPECT_EQ(r.comm_ns, 80);
  EXPECT_EQ(r.exposed_comm_ns, 80);
  ASSERT_EQ(r.trace.size(), 2u);
  EXPECT_EQ(r.trace[0].name, "AG 0");
  EXPECT_EQ(r.trace[0].track, "all_gather");
  EXPECT_EQ(r.trace[0].kind, "all_gather");
  EXPECT_EQ(r.trace[0].start_ns, 0);
  EXPECT_EQ(r.trace[0].dur_ns, 80);
  EXPECT_EQ(r.trace[0].bytes, 8000);
  EXPECT_EQ(r.trace[1].name, "fwd 0");
  EXPECT_EQ(r.trace[1].track, "default");
  EXPECT_EQ(r.trace[1].start_ns, 80);
  EXPECT_EQ(r.trace[1].dur_ns, 100);
}

TEST(Executor, CollectivesOfOneGroupSerializeInIssueOrderAcrossStreams) {
  PB b;
  int f = b.op(OpKind::Forward, PB::kCompute, {}, "fwd");
  b.op(OpKind::AllGather, PB::kAllGather, {f}, "AG");
  b.op(OpKind::ReduceScatter, PB::kReduceScatter, {}, "RS");
  FixedCosts c;
  c.forward_ns = 200;
  c.all_gather_ns = 100;
  c.reduce_scatter_ns = 50;
  // The RS is ready at 0 but the AG (issued before it, same shard group) holds the NCCL queue:
  // fwd [0,200), AG [200,300), RS [300,350).
  SimResult r = execute(b.p, FixedCostModel(c));
  EXPECT_EQ(r.step_time_ns, 350);
  EXPECT_EQ(find_span(r, "RS", "reduce_scatter")->start_ns, 300);
  EXPECT_EQ(r.comm_ns, 150);

  // On another process group (the HSDP replicate group) it runs at once: RS [0,50), AG [200,300).
  b.at(2).group = CommGroup::Replicate;
  SimResult r2 = execute(b.p, FixedCostModel(c));
  EXPECT_EQ(r2.step_time_ns, 300);
  EXPECT_EQ(find_span(r2, "RS", "reduce_scatter")->start_ns, 0);
  EXPECT_EQ(r2.comm_ns, 150);
}

TEST(Executor, CpuBlocksOnCpuWaits) {
  PB b;
  int f = b.op(OpKind::Forward, PB::kCompute, {}, "fwd");
  b.op(OpKind::AllGather, PB::kAllGather, {}, "AG");
  b.last().cpu_waits = {f};
  FixedCosts c;
  c.cpu_issue_ns = 10;
  c.forward_ns = 100;
  c.all_gather_ns = 20;
  // CPU issues fwd [0,10); fwd runs [10,110); the CPU blocks [10,110) on it, issues AG [110,120);
  // AG runs [120,140).
  SimResult r = execute(b.p, FixedCostModel(c));
  EXPECT_EQ(r.step_time_ns, 140);
  EXPECT_EQ(r.cpu_blocked_ns, 100);
  const TraceSpan* blocked = find_span(r, "blocked before AG", "cpu");
  ASSERT_NE(blocked, nullptr);
  EXPECT_EQ(blocked->start_ns, 10);
  EXPECT_EQ(blocked->dur_ns, 100);
  EXPECT_EQ(find_span(r, "AG", "cpu")->start_ns, 110);
  EXPECT_EQ(find_span(r, "AG", "all_gather")->start_ns, 120);
}

// A launch queue of 2 kernels (sim/executor.cpp "Launch queue"). Five forwards on the compute stream
// (100 ns each, 1 kernel; f4 launches 3) and an all-gather on its own stream (50 ns) after f2; every issue
// costs 10 ns; each forward allocates a 100 MiB buffer at issue and frees it with record_stream on itself.
//   f0 issued [0,10), runs [10,110). f1 issued [10,20) (2 queued), runs [110,210).
//   f2 at 20: 2 + 1 > 2, blocked until f0 completes at 110; issued [110,120), runs [210,310).
//   AG at 120: its own stream's queue is empty: issued [120,130), runs [130,180).
//   f3 at 130: f1, f2 queued: blocked until f1 completes at 210; issued [210,220), runs [310,410).
//   f4 (3 kernels > 2) at 220 waits for an empty queue, f3's completion at 410: issued [410,420), runs
//   [420,520).
// Blocked 90 + 80 + 190 = 360 ns; step 520. Memory: f0 and f1 take a 100 MiB segment each; f2's alloc at 120
// reuses f0's block (f0 done at 110), f3's at 220 f1's (done at 210), f4's at 420 either: 200 MiB reserved.
// Unbounded, the CPU issues everything by 60 (f0..f4 at 10, 20, 30, 50, 60; AG at 40), before any forward
// completes: five segments, 500 MiB, and the step ends at 510.
StepProgram launch_queue_program(int reuse) {
  PB b;
  for (int k = 0; k < 5; ++k) {
    const int x = b.buffer(100 * kMiB, MemCategory::Activations, PB::kCompute);
    const int f = b.op(OpKind::Forward, PB::kCompute, {}, "f" + std::to_string(k));
    b.last().allocs = {x};
    b.last().frees = {FreeSpec{x, reuse == 0 ? f : -1}};
    if (k == 4) b.last().kernel_launches = 3;
    if (k == 2) b.op(OpKind::AllGather, PB::kAllGather, {}, "AG");
  }
  return b.p;
}

TEST(Executor, CpuBlocksOnAFullLaunchQueue) {
  FixedCosts c;
  c.cpu_issue_ns = 10;
  c.forward_ns = 100;
  c.all_gather_ns = 50;
  c.launch_queue_depth = 2;
  const SimResult r = execute(launch_queue_program(0), FixedCostModel(c));
  EXPECT_EQ(r.step_time_ns, 520);
  EXPECT_EQ(r.cpu_blocked_ns, 360);
  EXPECT_EQ(r.compute_ns, 500);
  EXPECT_EQ(r.comm_ns, 50);
  EXPECT_EQ(r.exposed_comm_ns, 0);
  const std::pair<const char*, TimeNs> issued[] = {{"f0", 0}, {"f1", 10}, {"f2", 110}, {"AG", 120}, {"f3", 210}, {"f4", 410}};
  for (const auto& [name, t] : issued) {
    const TraceSpan* s = find_span(r, name, "cpu");
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->start_ns, t) << name;
    EXPECT_EQ(s->dur_ns, 10) << name;
  }
  const std::pair<const char*, TimeNs> ran[] = {{"f0", 10}, {"f1", 110}, {"f2", 210}, {"f3", 310}, {"f4", 420}};
  for (const auto& [name, t] : ran) {
    const TraceSpan* s = find_span(r, name, "default");
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->start_ns, t) << name;
    EXPECT_EQ(s->dur_ns, 100) << name;
  }
  EXPECT_EQ(find_span(r, "AG", "all_gather")->start_ns, 130);
  const std::pair<const char*, TimeNs> blocked[] = {{"f2", 20}, {"f3", 130}, {"f4", 220}};
  for (const auto& [name, t] : blocked) {
    const TraceSpan* s = find_span(r, std::string("launch queue full before ") + name, "cpu");
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->start_ns, t) << name;
  }
  EXPECT_EQ(find_span(r, "launch queue full before f4", "cpu")->dur_ns, 190);
  EXPECT_EQ(r.peak_allocated, 100 * kMiB);
  EXPECT_EQ(r.peak_reserved, 200 * kMiB);
  EXPECT_EQ(r.first_step_peak_reserved, 200 * kMiB);

  // Unbounded (depth 0): the CPU runs ahead and every record_stream'ed block is still pending.
  c.launch_queue_depth = 0;
  const SimResult u = execute(launch_queue_program(0), FixedCostModel(c));
  EXPECT_EQ(u.step_time_ns, 510);
  EXPECT_EQ(u.cpu_blocked_ns, 0);
  EXPECT_EQ(find_span(u, "f4", "cpu")->start_ns, 50);
  EXPECT_EQ(u.peak_reserved, 500 * kMiB);

  // The same timing with memory replayed apart (no record_stream, no timeline: the CPU's tight loop),
  // with and without the fast-forward; the blocks are reusable at once: one segment.
  c.launch_queue_depth = 2;
  for (const bool ff : {false, true}) {
    ExecOptions o;
    o.record_trace = false;
    o.record_memory_timeline = false;
    o.fast_forward = ff;
    const SimResult a = execute(launch_queue_program(-1), FixedCostModel(c), o);
    EXPECT_EQ(a.step_time_ns, 520);
    EXPECT_EQ(a.cpu_blocked_ns, 360);
    EXPECT_EQ(a.peak_reserved, 100 * kMiB);
  }
  c.launch_queue_depth = -1;
  EXPECT_THROW(execute(launch_queue_program(0), FixedCostModel(c)), InputError);
}

TEST(Executor, SlowCpuIssueStarvesTheGpu) {
  PB b;
  for (int i = 0; i < 3; ++i) b.op(OpKind::Forward, PB::kCompute);
  FixedCosts c;
  c.cpu_hook_ns = 40;
  c.cpu_launch_ns = 10;
  for (auto& op : b.p.ops) op.cpu_hooks = 1;   // issue cost 40 + 1 launch * 10 = 50 per op
  c.forward_ns = 10;
  // Issued at 50, 100, 150; each runs 10 ns: the GPU is idle 40 of every 50 ns, not on comm.
  SimResult r = execute(b.p, FixedCostModel(c));
  EXPECT_EQ(r.step_time_ns, 160);
  EXPECT_EQ(r.compute_ns, 30);
  EXPECT_EQ(r.exposed_comm_ns, 0);
  EXPECT_EQ(r.cpu_blocked_ns, 0);
  EXPECT_EQ(r.cpu_issue_ns, 150);   // 3 ops x 50 ns: the CPU issued for 150 of the 160 ns
}

TEST(Executor, ComputeIsRetimedWhenCollectivesStartAndStop) {
  PB b;
  int h2d = b.op(OpKind::H2D, PB::kCopy, {}, "h2d");
  b.op(OpKind::Forward, PB::kCompute, {}, "fwd");
  b.op(OpKind::AllGather, PB::kAllGather, {h2d}, "AG");
  FixedCosts c;
  c.h2d_ns = 400;
  c.forward_ns = 1000;
  c.all_gather_ns = 300;
  c.slowdown = 1.5;
  // fwd alone from 0; AG runs [400,700): fwd has 600 ns of work left at 400, slowed ×1.5 until 700
  // (200 ns of work done), then 400 ns at full speed: ends at 1100. The H2D is not slowed.
  SimResult r = execute(b.p, FixedCostModel(c));
  EXPECT_EQ(r.step_time_ns, 1100);
  EXPECT_EQ(r.compute_ns, 1100);
  EXPECT_EQ(r.comm_ns, 300);
  EXPECT_EQ(find_span(r, "h2d", "copy")->dur_ns, 400);
}

TEST(Executor, ComputeStartedDuringACollectiveIsSlowedAndRounded) {
  PB b;
  b.op(OpKind::AllGather, PB::kAllGather, {}, "AG");
  b.op(OpKind::Forward, PB::kCompute, {}, "fwd");
  FixedCosts c;
  c.all_gather_ns = 1000;
  c.forward_ns = 101;
  c.slowdown = 1.5;
  SimResult r = execute(b.p, FixedCostModel(c));
  EXPECT_EQ(find_span(r, "fwd", "default")->dur_ns, 152);   // llround(151.5)
  EXPECT_EQ(r.step_time_ns, 1000);
}

TEST(Executor, CpuOptimizerStepRunsOnTheCpuTimeline) {
  PB b;
  int d2h = b.op(OpKind::D2H, PB::kCopy, {}, "d2h");
  int opt = b.op(OpKind::CpuOptimizerStep, PB::kCompute, {d2h}, "cpu adam");
  b.op(OpKind::H2D, PB::kCopy, {opt}, "h2d");
  FixedCosts c;
  c.d2h_ns = 100;
  c.h2d_ns = 100;
  c.cpu_optimizer_ns = 500;
  // D2H [0,100); the CPU waits for it, steps [100,600); H2D [600,700).
  SimResult r = execute(b.p, FixedCostModel(c));
  EXPECT_EQ(r.step_time_ns, 700);
  EXPECT_EQ(r.cpu_blocked_ns, 100);
  EXPECT_EQ(r.compute_ns, 0);   // the compute stream never ran it
  const TraceSpan* s = find_span(r, "cpu adam", "cpu");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->kind, "cpu_optimizer_step");
  EXPECT_EQ(s->start_ns, 100);
  EXPECT_EQ(s->dur_ns, 500);
}

TEST(Executor, PipelinedForwardChain) {
  // N units: AG(u) on the AG stream, fwd(u) waits on it. All issued at t=0, the AGs run back to back
  // [50u, 50u+50) and fwd(u) = [50 + 100u, 150 + 100u): step = 50 + 100 N, only the first AG exposed.
  PB b;
  const int n = 50;
  for (int u = 0; u < n; ++u) {
    int ag = b.op(OpKind::AllGather, PB::kAllGather);
    b.op(OpKind::Forward, PB::kCompute, {ag});
  }
  FixedCosts c;
  c.all_gather_ns = 50;
  c.forward_ns = 100;
  SimResult r = execute(b.p, FixedCostModel(c));
  EXPECT_EQ(r.step_time_ns, 50 + 100 * n);
  EXPECT_EQ(r.compute_ns, 100 * n);
  EXPECT_EQ(r.comm_ns, 50 * n);
  EXPECT_EQ(r.exposed_comm_ns, 50);
  EXPECT_EQ(r.comm_bytes_by_kind["all_gather"], n * 7000);   // (8-1)/8 * 8000 each
  // Deterministic: the same program gives the same result, trace included.
  SimResult r2 = execute(b.p, FixedCostModel(c));
  EXPECT_EQ(sim_result_to_json(r, true).dump(), sim_result_to_json(r2, true).dump());
}

TEST(Executor, CommBytesPerRankFollowNcclTests) {
  PB b;
  b.op(OpKind::AllGather, PB::kAllGather);
  b.op(OpKind::ReduceScatter, PB::kReduceScatter);
  b.op(OpKind::AllReduce, PB::kAllReduce);
  b.last().group = CommGroup::Replicate;
  SimResult r = execute(b.p, FixedCostModel());
  EXPECT_EQ(r.comm_bytes_by_kind["all_gather"], 7000);
  EXPECT_EQ(r.comm_bytes_by_kind["reduce_scatter"], 7000);
  EXPECT_EQ(r.comm_bytes_by_kind["all_reduce"], 14000);   // 2 (n-1)/n S
}

TEST(Executor, MemoryPeakBreakdownAndTimeline) {
  PB b;
  b.buffer(1000, MemCategory::ShardedParams, 0, /*persistent=*/true);
  int act = b.buffer(5 * kMiB, MemCategory::Activations);
  b.op(OpKind::Forward, PB::kCompute);
  b.last().allocs = {act};
  b.op(OpKind::Backward, PB::kCompute);
  b.last().frees = {FreeSpec{act, -1}};
  FixedCosts c;
  c.cpu_issue_ns = 10;
  SimResult r = execute(b.p, FixedCostModel(c));
  // persistent: 1000 -> 1024 B in a 2 MiB small segment; activations: 5 MiB in a 20 MiB segment.
  EXPECT_EQ(r.peak_allocated, 5 * kMiB + 1024);
  EXPECT_EQ(r.peak_reserved, 22 * kMiB);
  EXPECT_EQ(r.breakdown_at_peak.at("sharded_params"), 1000);
  EXPECT_EQ(r.breakdown_at_peak.at("activations"), 5 * kMiB);
  EXPECT_EQ(r.breakdown_at_peak.at("unsharded_params"), 0);
  EXPECT_EQ(r.breakdown_at_peak.at("allocator_slack"), 22 * kMiB - 5 * kMiB - 1000);
  // The first step (t 0-20), then the steady step on the same allocator: its segment is cached already.
  ASSERT_EQ(r.memory_timeline.size(), 5u);
  EXPECT_EQ(r.memory_timeline[0].t_ns, 0);
  EXPECT_EQ(r.memory_timeline[0].allocated, 1024);
  EXPECT_EQ(r.memory_timeline[1].t_ns, 10);
  EXPECT_EQ(r.memory_timeline[1].allocated, 5 * kMiB + 1024);
  EXPECT_EQ(r.memory_timeline[1].reserved, 22 * kMiB);
  EXPECT_EQ(r.memory_timeline[2].t_ns, 20);
  EXPECT_EQ(r.memory_timeline[2].allocated, 1024);
  EXPECT_EQ(r.memory_timeline[2].reserved, 22 * kMiB);
  EXPECT_EQ(r.memory_timeline[3].t_ns, 30);
  EXPECT_EQ(r.memory_timeline[3].allocated, 5 * kMiB + 1024);
  EXPECT_EQ(r.memory_timeline[3].reserved, 22 * kMiB);
  EXPECT_EQ(r.memory_timeline[4].t_ns, 40);
  EXPECT_EQ(r.memory_timeline[4].allocated, 1024);

  ExecOptions quiet;
  quiet.record_trace = false;
  quiet.record_memory_timeline = false;
  SimResult q = execute(b.p, FixedCostModel(c), quiet);
  EXPECT_TRUE(q.trace.empty());
  EXPECT_TRUE(q.memory_timeline.empty());
  EXPECT_EQ(q.peak_allocated, r.peak_allocated);
  EXPECT_EQ(q.step_time_ns, r.step_time_ns);
}

// The FSDP1 pattern: the unsharded param is allocated on the unshard stream's pool, used by compute,
// freed with record_stream; the next all-gather's buffer reuses it only if compute has finished.
StepProgram record_stream_program(int reuse_after_op) {
  PB b;
  int p0 = b.buffer(100 * kMiB, MemCategory::UnshardedParams, PB::kAllGather);
  int p1 = b.buffer(100 * kMiB, MemCategory::UnshardedParams, PB::kAllGather);
  int ag = b.op(OpKind::AllGather, PB::kAllGather, {}, "AG 0");
  b.last().allocs = {p0};
  b.op(OpKind::Forward, PB::kCompute, {ag}, "fwd 0");
  b.last().frees = {FreeSpec{p0, reuse_after_op}};
  b.op(OpKind::AllGather, PB::kAllGather, {}, "AG 1");
  b.last().allocs = {p1};
  b.op(OpKind::Forward, PB::kCompute, {}, "fwd 1");   // (only persistent buffers outlive a step)
  b.last().frees = {FreeSpec{p1, -1}};
  return b.p;
}

TEST(Executor, RecordStreamDelaysReuseUntilTheGpuPassesTheOp) {
  FixedCosts c;
  c.all_gather_ns = 100;
  c.forward_ns = 1000;
  // CPU cost 0: AG 1 is issued at t=0 while fwd 0 (op 1) has not run: a second segment.
  SimResult r = execute(record_stream_program(1), FixedCostModel(c));
  EXPECT_EQ(r.peak_allocated, 100 * kMiB);
  EXPECT_EQ(r.peak_reserved, 200 * kMiB);
  // Without record_stream the block is reusable at once.
  SimResult r2 = execute(record_stream_program(-1), FixedCostModel(c));
  EXPECT_EQ(r2.peak_reserved, 100 * kMiB);
  // A slow CPU: AG 0 [600,700), fwd 0 issued 1200 runs [1200,1800); AG 1 is issued at 1800, exactly when
  // fwd 0 completes: the CPU sees the completion, the block is reused.
  c.cpu_issue_ns = 600;
  c.forward_ns = 600;
  SimResult r3 = execute(record_stream_program(1), FixedCostModel(c));
  EXPECT_EQ(r3.peak_reserved, 100 * kMiB);
  // One nanosecond later and it is not.
  c.forward_ns = 601;
  SimResult r4 = execute(record_stream_program(1), FixedCostModel(c));
  EXPECT_EQ(r4.peak_reserved, 200 * kMiB);
}

TEST(Executor, CapacityTriggersAllocatorRetry) {
  PB b;
  int a = b.buffer(100 * kMiB, MemCategory::CommBuffers, PB::kAllGather);
  int d = b.buffer(100 * kMiB, MemCategory::Activations, PB::kCompute);
  b.op(OpKind::AllGather, PB::kAllGather);
  b.last().allocs = {a};
  b.last().frees = {FreeSpec{a, -1}};
  b.op(OpKind::Forward, PB::kCompute);
  b.last().allocs = {d};
  b.op(OpKind::Backward, PB::kCompute);   // (only persistent buffers outlive a step)
  b.last().frees = {FreeSpec{d, -1}};
  ExecOptions o;
  o.memory_capacity = 150 * kMiB;
  SimResult r = execute(b.p, FixedCostModel(), o);
  // The first step retries once (d: the all-gather pool's cached segment is released); the steady step twice
  // (a, then d: each finds the other pool's segment cached).
  EXPECT_EQ(r.alloc_retries, 3);
  EXPECT_EQ(r.peak_reserved, 100 * kMiB);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes.back().find("retr"), std::string::npos);
  SimResult unlimited = execute(b.p, FixedCostModel());
  EXPECT_EQ(unlimited.alloc_retries, 0);
  EXPECT_EQ(unlimited.peak_reserved, 200 * kMiB);
}

std::string error_field(const StepProgram& p) {
  try {
    execute(p, FixedCostModel());
  } catch (const InputError& e) {
    return e.field();
  }
  return "<no error>";
}

TEST(Executor, IllFormedProgramsAreInputErrors) {
  {
    PB b;
    b.op(OpKind::Forward, PB::kCompute, {1});
    b.op(OpKind::Forward, PB::kCompute);
    EXPECT_EQ(error_field(b.p), "program.ops[0].waits");
  }
  {
    PB b;
    b.op(OpKind::Forward, 9);
    EXPECT_EQ(error_field(b.p), "program.ops[0].stream");
  }
  {
    PB b;
    int x = b.buffer(10, MemCategory::Activations);
    b.op(OpKind::Forward, PB::kCompute);
    b.last().allocs = {x};
    b.op(OpKind::Forward, PB::kCompute);
    b.last().allocs = {x};
    EXPECT_EQ(error_field(b.p), "program.ops[1].allocs");
  }
  {
    PB b;
    int x = b.buffer(10, MemCategory::Activations);
    b.op(OpKind::Forward, PB::kCompute);
    b.last().frees = {FreeSpec{x, -1}};
    EXPECT_EQ(error_field(b.p), "program.ops[0].frees");
  }
  {
    PB b;
    b.op(OpKind::Forward, PB::kCompute);
    b.last().cpu_waits = {0};
    EXPECT_EQ(error_field(b.p), "program.ops[0].cpu_waits");
  }
  {
    PB b;
    b.buffer(-5, MemCategory::Activations);
    EXPECT_EQ(error_field(b.p), "program.buffers[0].bytes");
  }
  {
    PB b;
    b.p.streams.clear();
    EXPECT_EQ(error_field(b.p), "program.streams");
  }
  {
    PB b;
    b.op(OpKind::Forward, PB::kCompute);
    FixedCosts c;
    c.forward_ns = -1;
    EXPECT_THROW(execute(b.p, FixedCostModel(c)), InputError);
    c.forward_ns = 1;
    c.slowdown = 0.5;
    EXPECT_THROW(execute(b.p, FixedCostModel(c)), InputError);
  }
}

// Frees inside an op (FreeSpec free_inside_op: a forward's temporaries, freed at their last use between
// later allocations) by hand. One op allocates a (40 MiB), b (30 MiB), frees a after those two, then
// allocates c (40 MiB) and frees b and c after enqueueing; a second op allocates d (40 MiB). Inside the op a
// and b are live together: peak allocated 70 MiB; c reuses a's freed 40 MiB segment (best fit), so reserved
// stays 70 MiB (two segments). With all frees after enqueueing, c would need a third segment (110 MiB
// allocated and reserved). Both memory paths (inline, with the memory timeline; apart) and the fast-forward
// give the same bytes.
TEST(Executor, FreesInsideAnOpByHand) {
  auto program = [](bool inside) {
    PB b;
    const int a = b.buffer(40 * kMiB, MemCategory::Activations), bb = b.buffer(30 * kMiB, MemCategory::Activations),
              c = b.buffer(40 * kMiB, MemCategory::Activations), d = b.buffer(40 * kMiB, MemCategory::Activations);
    b.op(OpKind::Forward, PB::kCompute);
    b.last().allocs = {a, bb, c};
    if (inside) b.last().frees = {FreeSpec{a, free_inside_op(2)}, FreeSpec{bb, -1}, FreeSpec{c, -1}};
    else b.last().frees = {FreeSpec{a, -1}, FreeSpec{bb, -1}, FreeSpec{c, -1}};
    b.op(OpKind::Forward, PB::kCompute);
    b.last().allocs = {d};
    b.last().frees = {FreeSpec{d, -1}};
    return b.p;
  };
  for (const bool timeline : {true, false}) {
    ExecOptions o;
    o.record_memory_timeline = timeline;
    o.record_trace = timeline;
    const SimResult r = execute(program(true), FixedCostModel(FixedCosts{}), o);
    EXPECT_EQ(r.peak_allocated, 70 * kMiB) << timeline;
    EXPECT_EQ(r.peak_reserved, 70 * kMiB) << timeline;
    const SimResult after = execute(program(false), FixedCostModel(FixedCosts{}), o);
    EXPECT_EQ(after.peak_allocated, 110 * kMiB) << timeline;
    EXPECT_EQ(after.peak_reserved, 110 * kMiB) << timeline;
  }
}

// The engine evaluates every per-op and per-buffer check as one yes/no on its fast path and names the
// failure through validate_program's checks: each condition must still reach its named error (the
// first one, in validate_program's order, when an op or a buffer breaks several).
TEST(Executor, EveryCheckNamesItsField) {
  auto op_error = [](auto&& edit) {
    PB b;
    int x = b.buffer(10, MemCategory::Activations);
    b.op(OpKind::Forward, PB::kCompute);
    b.op(OpKind::AllGather, PB::kAllGather, {0});
    b.last().allocs = {x};
    b.last().frees = {FreeSpec{x, 0}};
    edit(b);
    return error_field(b.p);
  };
  EXPECT_EQ(op_error([](PB&) {}), "<no error>");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).id = 7; }), "program.ops[1].id");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).stream = -1; }), "program.ops[1].stream");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).kind = static_cast<OpKind>(15); }), "program.ops[1].kind");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).kind = static_cast<OpKind>(-1); }), "program.ops[1].kind");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).waits = {1}; }), "program.ops[1].waits");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).cpu_waits = {0, -1}; }), "program.ops[1].cpu_waits");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).allocs = {1}; }), "program.ops[1].allocs");
  EXPECT_EQ(op_error([](PB& b) { b.p.buffers[0].persistent = true; }), "program.ops[1].allocs");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).frees = {FreeSpec{-1, -1}}; }), "program.ops[1].frees.buffer");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).frees = {FreeSpec{0, 2}}; }), "program.ops[1].frees.reuse_after_op");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).frees = {FreeSpec{0, -2}}; }), "program.ops[1].frees.reuse_after_op");
  // frees inside the op: after its first k allocs (1 <= k <= allocs), before the frees after enqueueing
  EXPECT_EQ(op_error([](PB& b) { b.at(1).frees = {FreeSpec{0, free_inside_op(1)}}; }), "<no error>");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).frees = {FreeSpec{0, free_inside_op(2)}}; }), "program.ops[1].frees.reuse_after_op");
  EXPECT_EQ(op_error([](PB& b) {
              int y = b.buffer(10, MemCategory::Activations);
              b.at(1).allocs.push_back(y);
              b.at(1).frees = {FreeSpec{y, -1}, FreeSpec{0, free_inside_op(1)}};
            }),
            "program.ops[1].frees.reuse_after_op");
  EXPECT_EQ(op_error([](PB& b) {
              int y = b.buffer(10, MemCategory::Activations);
              b.at(1).allocs.push_back(y);
              b.at(1).frees = {FreeSpec{y, free_inside_op(2)}, FreeSpec{0, free_inside_op(1)}};
            }),
            "program.ops[1].frees.reuse_after_op");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).group = static_cast<CommGroup>(4); }), "program.ops[1].group");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).group_size = 0; }), "program.ops[1].group_size");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).comm_bytes = -1; }), "program.ops[1].comm_bytes");
  EXPECT_EQ(op_error([](PB& b) { b.at(0).group = static_cast<CommGroup>(4); }), "<no error>");   // not a collective
  EXPECT_EQ(op_error([](PB& b) { b.at(1).copy_bytes = -1; }), "program.ops[1].copy_bytes");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).cpu_hooks = -1; }), "program.ops[1].cpu_hooks");
  EXPECT_EQ(op_error([](PB& b) { b.at(1).kernel_launches = -1; }), "program.ops[1].kernel_launches");
  EXPECT_EQ(op_error([](PB& b) {
              b.at(1).kernel_launches = -1;
              b.at(1).waits = {5};
            }),
            "program.ops[1].waits");   // the first in check_op's order

  auto buffer_error = [](auto&& edit) {
    PB b;
    b.buffer(10, MemCategory::Activations);
    b.buffer(10, MemCategory::Logits, PB::kAllGather);
    edit(b.p.buffers[1]);
    return error_field(b.p);
  };
  EXPECT_EQ(buffer_error([](Buffer&) {}), "<no error>");
  EXPECT_EQ(buffer_error([](Buffer& x) { x.id = 0; }), "program.buffers[1].id");
  EXPECT_EQ(buffer_error([](Buffer& x) { x.bytes = -1; }), "program.buffers[1].bytes");
  EXPECT_EQ(buffer_error([](Buffer& x) { x.pool_stream = 5; }), "program.buffers[1].pool_stream");
  EXPECT_EQ(buffer_error([](Buffer& x) { x.pool_stream = -1; }), "program.buffers[1].pool_stream");
  EXPECT_EQ(buffer_error([](Buffer& x) { x.category = MemCategory::AllocatorSlack; }), "program.buffers[1].category");
  EXPECT_EQ(buffer_error([](Buffer& x) { x.category = MemCategory::CudaContext; }), "program.buffers[1].category");
  EXPECT_EQ(buffer_error([](Buffer& x) { x.category = static_cast<MemCategory>(kNumMemCategories); }),
            "program.buffers[1].category");
  EXPECT_EQ(buffer_error([](Buffer& x) { x.category = static_cast<MemCategory>(40); }), "program.buffers[1].category");
  EXPECT_EQ(buffer_error([](Buffer& x) { x.category = static_cast<MemCategory>(-1); }), "program.buffers[1].category");
  EXPECT_EQ(buffer_error([](Buffer& x) {
              x.category = MemCategory::CudaContext;
              x.bytes = -1;
            }),
            "program.buffers[1].bytes");
}

TEST(MemoryTimeline, DecimationKeepsPeaksAndEnds) {
  std::vector<MemorySample> in;
  for (int i = 0; i < 10000; ++i) in.push_back(MemorySample{i, (i * 7919) % 1000, 2000 + (i * 104729) % 1000});
  in[4321].allocated = 5000;   // the allocated peak
  in[8765].reserved = 9000;    // the reserved peak, elsewhere
  std::vector<MemorySample> out = decimate_timeline(in, 100);
  EXPECT_LE(out.size(), 100u);
  bool has_alloc_peak = false, has_res_peak = false;
  for (std::size_t i = 0; i < out.size(); ++i) {
    has_alloc_peak |= out[i].t_ns == 4321 && out[i].allocated == 5000;
    has_res_peak |= out[i].t_ns == 8765 && out[i].reserved == 9000;
    if (i > 0) {
      EXPECT_LT(out[i - 1].t_ns, out[i].t_ns);
    }
  }
  EXPECT_TRUE(has_alloc_peak);
  EXPECT_TRUE(has_res_peak);
  EXPECT_EQ(out.back().t_ns, 9999);
  EXPECT_EQ(decimate_timeline(in, 0).size(), in.size());
}

TEST(Executor, EmptyProgram) {
  PB b;
  SimResult r = execute(b.p, FixedCostModel());
  EXPECT_EQ(r.step_time_ns, 0);
  EXPECT_EQ(r.peak_allocated, 0);
}

}  // namespace
}  // namespace fsdpsim::sim

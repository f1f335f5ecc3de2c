// The executor's two steps of memory (note "first and steady step", sim/memory_tracker.h), hand-checked
// on tiny programs: optimizer state created lazily at the optimizer op in the first step and present from
// the start of the steady step, gradients freed at the end of each step, the allocator's cached segments
// carried from the first step into the second, each step's own peaks and where they are. And the same
// figures from every path: memory replayed apart or with the run (a timeline), record_stream frees
// following the first step's times shifted by the step time.
#include <gtest/gtest.h>

#include <string>

#include "common/errors.h"
#include "fixed_cost_model.h"
#include "sim/executor.h"
#include "sim/reference_engine.h"
#include "test_executor_builder.h"

namespace fsdpsim::sim {
namespace {

using namespace testing;

// P (10 MiB, persistent), A (activation, 30 MiB) allocated by the forward and freed by the backward,
// G (gradient, 20 MiB) allocated by the backward and freed after the optimizer step (zero_grad), S
// (optimizer state, 40 MiB, persistent + first_step_lazy) allocated at the optimizer step.
StepProgram lazy_state_program() {
  ProgramBuilder b;
  const int P = b.buffer(10 * kMiB, MemCategory::ShardedParams, 0, true, "P");
  const int A = b.buffer(30 * kMiB, MemCategory::Activations, 0, false, "A");
  const int G = b.buffer(20 * kMiB, MemCategory::ShardedGrads, 0, false, "G");
  const int S = b.buffer(40 * kMiB, MemCategory::OptimizerState, 0, true, "S");
  b.p.buffers[S].first_step_lazy = true;
  (void)P;
  b.op(OpKind::Forward, ProgramBuilder::kCompute, {}, "fwd");
  b.last().allocs = {A};
  b.op(OpKind::Backward, ProgramBuilder::kCompute, {}, "bwd");
  b.last().allocs = {G};
  b.last().frees = {FreeSpec{A, -1}};
  b.op(OpKind::OptimizerStep, ProgramBuilder::kCompute, {}, "step");
  b.last().allocs = {S};
  b.last().frees = {FreeSpec{G, -1}};
  return b.p;
}

SimResult run(const StepProgram& p, bool timeline, bool fast = true) {
  FixedCosts c;
  c.forward_ns = 100;
  c.backward_ns = 200;
  c.optimizer_ns = 50;
  c.cpu_issue_ns = 10;
  ExecOptions o;
  o.record_trace = false;
  o.record_memory_timeline = timeline;
  o.fast_forward = fast;
  return execute(p, FixedCostModel(c), o);
}

TEST(FirstAndSteadyStep, LazyOptimizerStateAndCachedSegmentsHandChecked) {
  // First step (no allocator option: each request >= 10 MiB gets a segment of its size):
  //   start: P              allocated 10, reserved 10
  //   fwd:   A (new seg)    allocated 40, reserved 40
  //   bwd:   G (new seg)    allocated 60, reserved 60; frees A: 30 (A's segment cached)
  //   step:  S (40 > 30: new segment) allocated 70, reserved 100 <- both first-step peaks, at "step";
  //          frees G: 50 (G's segment cached)
  // Steady step, from allocated 50 (P + S), reserved 100, A's and G's segments cached:
  //   fwd:   A takes the cached 30 MiB   allocated 80
  //   bwd:   G takes the cached 20 MiB   allocated 100 <- steady allocated peak, at "bwd"; frees A: 70
  //   step:  S exists (no allocation); frees G: 50
  //   reserved stays 100: its steady peak is the step's start.
  for (bool timeline : {false, true}) {
    SCOPED_TRACE(timeline ? "memory with the run (timeline)" : "memory apart");
    const SimResult r = run(lazy_state_program(), timeline);
    EXPECT_EQ(r.first_step_peak_allocated, 70 * kMiB);
    EXPECT_EQ(r.first_step_peak_reserved, 100 * kMiB);
    EXPECT_EQ(r.peak_allocated, 100 * kMiB);
    EXPECT_EQ(r.peak_reserved, 100 * kMiB);
    EXPECT_EQ(r.first_step_peak_allocated_at.op, 2);
    EXPECT_EQ(r.first_step_peak_allocated_at.kind, "optimizer_step");
    EXPECT_EQ(r.first_step_peak_allocated_at.phase, "optimizer");
    EXPECT_EQ(r.first_step_peak_allocated_at.name, "step");
    EXPECT_EQ(r.first_step_peak_reserved_at.op, 2);
    EXPECT_EQ(r.peak_allocated_at.op, 1);
    EXPECT_EQ(r.peak_allocated_at.kind, "backward");
    EXPECT_EQ(r.peak_allocated_at.phase, "backward");
    EXPECT_EQ(r.peak_reserved_at.op, -1);
    EXPECT_EQ(r.peak_reserved_at.phase, "start");
    // The breakdown is the steady step's, at its allocated peak: P + S + A + G, nothing cached.
    EXPECT_EQ(r.breakdown_at_peak.at("sharded_params"), 10 * kMiB);
    EXPECT_EQ(r.breakdown_at_peak.at("optimizer_state"), 40 * kMiB);
    EXPECT_EQ(r.breakdown_at_peak.at("activations"), 30 * kMiB);
    EXPECT_EQ(r.breakdown_at_peak.at("sharded_grads"), 20 * kMiB);
    EXPECT_EQ(r.breakdown_at_peak.at("allocator_slack"), 0);
  }
}

// StepProgram::init_scratch (FSDP1's lazy init): requests allocated and freed before the first step leave their
// segments reserved, and the step's tensors land in them. lazy_state_program with a 36 MiB request:
//   init:  P (10), then 36 MiB (a new segment) allocated and freed   allocated 10 (46 for a moment), reserved 46
//   fwd:   A (30) cut from the cached 36 MiB segment                  allocated 40, reserved 46
//   bwd:   G (20): the 6 MiB left is too small: a new segment         allocated 60, reserved 66; frees A
//   step:  S (40 > 36): a new segment                                 allocated 70, reserved 106 (first-step peaks)
// Steady step: A in the 36 MiB segment again, G in the 20: allocated 100 at bwd, reserved 106. A request equal to
// one before it (the lowering leaves such out) would change nothing: the block that served it is free again.
// The executor (memory apart, with a timeline) and the reference engine agree.
TEST(FirstAndSteadyStep, InitScratchLeavesItsSegmentsReservedHandChecked) {
  for (int copies : {1, 2}) {
    StepProgram p = lazy_state_program();
    for (int i = 0; i < copies; ++i) p.init_scratch.push_back(InitRequest{36 * kMiB, 0});
    for (bool timeline : {false, true}) {
      SCOPED_TRACE(std::to_string(copies) + (timeline ? " timeline" : " apart"));
      const SimResult r = run(p, timeline);
      EXPECT_EQ(r.first_step_peak_allocated, 70 * kMiB);
      EXPECT_EQ(r.first_step_peak_reserved, 106 * kMiB);
      EXPECT_EQ(r.peak_allocated, 100 * kMiB);
      EXPECT_EQ(r.peak_reserved, 106 * kMiB);
    }
    FixedCosts c;
    const SimResult ref = reference_execute(p, compute_op_costs(p, FixedCostModel(c)));
    EXPECT_EQ(ref.first_step_peak_reserved, 106 * kMiB);
    EXPECT_EQ(ref.peak_reserved, 106 * kMiB);
    EXPECT_EQ(ref.peak_allocated, 100 * kMiB);
  }
  const SimResult none = run(lazy_state_program(), false);
  EXPECT_EQ(none.first_step_peak_reserved, 100 * kMiB);   // (without it: the test above)
}

TEST(FirstAndSteadyStep, TimelineCoversBothSteps) {
  // Issue times: fwd 10, bwd 20, step 30; the step ends when the optimizer step completes:
  // fwd 10..110, bwd 110..310, step 310..360. The steady step's samples are at 360 + the same times.
  const SimResult r = run(lazy_state_program(), true);
  EXPECT_EQ(r.step_time_ns, 360);
  EXPECT_EQ(r.steady_step_start_ns, 360);
  ASSERT_FALSE(r.memory_timeline.empty());
  const MemorySample& last = r.memory_timeline.back();
  EXPECT_EQ(last.t_ns, 360 + 30);
  EXPECT_EQ(last.allocated, 50 * kMiB);
  EXPECT_EQ(last.reserved, 100 * kMiB);
  bool steady_peak_seen = false;
  for (const MemorySample& s : r.memory_timeline)
    if (s.t_ns == 360 + 20 && s.allocated == 70 * kMiB) steady_peak_seen = true;   // (after bwd's free of A)
  EXPECT_TRUE(steady_peak_seen);
}

TEST(FirstAndSteadyStep, RecordStreamFreesFollowTheFirstStepsTimesShifted) {
  // X (20 MiB) is used by op0 (fwd, 10..110) and freed by op1 at its issue (20) with reuse after op0:
  // pending until 110. op2 (issued at 30) allocates Y (20 MiB): X's block is not reusable yet, so Y gets a
  // segment of its own (reserved 40); Y is freed by op2 with reuse after op2 itself (pending at the end).
  // Steady step (times + the step time): both blocks cached and free at its start (the first step's
  // pending ones released at its first allocation), X takes one, is pending again when Y is allocated,
  // Y takes the other: reserved stays 40, allocated peaks at 20 (X, at op0).
  ProgramBuilder b;
  const int X = b.buffer(20 * kMiB, MemCategory::UnshardedParams);
  const int Y = b.buffer(20 * kMiB, MemCategory::UnshardedParams);
  b.op(OpKind::Forward, ProgramBuilder::kCompute);
  b.last().allocs = {X};
  b.op(OpKind::CopyIn, ProgramBuilder::kCopy);
  b.last().frees = {FreeSpec{X, 0}};
  b.op(OpKind::Forward, ProgramBuilder::kCompute);
  b.last().allocs = {Y};
  b.last().frees = {FreeSpec{Y, 2}};
  for (bool timeline : {false, true}) {
    for (bool fast : {false, true}) {
      SCOPED_TRACE(std::string(timeline ? "timeline" : "no timeline") + (fast ? ", fast" : ""));
      const SimResult r = run(b.p, timeline, fast);
      EXPECT_EQ(r.first_step_peak_reserved, 40 * kMiB);
      EXPECT_EQ(r.first_step_peak_allocated, 20 * kMiB);
      EXPECT_EQ(r.peak_reserved, 40 * kMiB);
      EXPECT_EQ(r.peak_allocated, 20 * kMiB);
      EXPECT_EQ(r.peak_allocated_at.op, 0);
      EXPECT_EQ(r.peak_reserved_at.op, -1);
    }
  }
  // The same program with op2 issued after op0 has completed (CPU issue 200 ns per op: op0 done at
  // 300 < op2's issue at 600): X's block is reusable, Y takes it in both steps; reserved 20 MiB.
  FixedCosts c;
  c.forward_ns = 100;
  c.cpu_issue_ns = 200;
  ExecOptions o;
  o.record_trace = false;
  const SimResult late = execute(b.p, FixedCostModel(c), o);
  EXPECT_EQ(late.first_step_peak_reserved, 20 * kMiB);
  EXPECT_EQ(late.peak_reserved, 20 * kMiB);
}

TEST(FirstAndSteadyStep, BuffersThatOutliveTheStepAreErrors) {
  // A non-persistent buffer allocated and never freed: the steady step allocates it again.
  ProgramBuilder b;
  const int A = b.buffer(kMiB, MemCategory::Activations, 0, false, "leak");
  b.op(OpKind::Forward, ProgramBuilder::kCompute);
  b.last().allocs = {A};
  try {
    run(b.p, false);
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("only persistent buffers outlive a step"), std::string::npos) << e.what();
  }
  // first_step_lazy is for persistent buffers only; a persistent buffer that is not lazy is never allocated by an op.
  ProgramBuilder c;
  const int L = c.buffer(kMiB, MemCategory::OptimizerState, 0, false);
  c.p.buffers[L].first_step_lazy = true;
  c.op(OpKind::OptimizerStep, ProgramBuilder::kCompute);
  EXPECT_THROW(run(c.p, false), InputError);
  ProgramBuilder d;
  const int Q = d.buffer(kMiB, MemCategory::OptimizerState, 0, true);
  d.op(OpKind::OptimizerStep, ProgramBuilder::kCompute);
  d.last().allocs = {Q};
  EXPECT_THROW(run(d.p, false), InputError);
}

TEST(FirstAndSteadyStep, ExpandableSegmentsCarryTheirPagesIntoTheSteadyStep) {
  // The lazy-state program with expandable segments (20 MiB pages, one segment for the compute stream):
  //   first step: P maps [0,20) (P = [0,10), free [10,20)); A (30) extends the free [10,20) by one page:
  //   [10,40), reserved 40; G (20) maps [40,60), reserved 60, allocated 60; A freed: [10,40) free.
  //   S (40): best fit finds no free block >= 40 (the free [10,40) is 30); the mapped end is G, so pages
  //   [60,100) are mapped: S = [60,100), reserved 100, allocated 70. G freed: [10,60) free (merged).
  // Steady step: A = [10,40), G = [40,60): allocated 100, reserved 100 (no page mapped).
  ExecOptions o;
  o.record_trace = false;
  o.record_memory_timeline = false;
  o.expandable_segments = true;
  FixedCosts c;
  c.forward_ns = 100;
  const SimResult r = execute(lazy_state_program(), FixedCostModel(c), o);
  EXPECT_EQ(r.first_step_peak_allocated, 70 * kMiB);
  EXPECT_EQ(r.first_step_peak_reserved, 100 * kMiB);
  EXPECT_EQ(r.peak_allocated, 100 * kMiB);
  EXPECT_EQ(r.peak_reserved, 100 * kMiB);
}

}  // namespace
}  // namespace fsdpsim::sim

// Exposed communication at the end of a step (issue 20, item 2): what the step waits on before its
// optimizer step counts as exposed whether the step runs on the GPU or, with CPU offload, on the CPU.
// Hand-built programs with fixed costs; every nanosecond is derived in the comment next to it.
#include <gtest/gtest.h>

#include "fixed_cost_model.h"
#include "sim/executor.h"
#include "test_executor_builder.h"

namespace fsdpsim::sim {
namespace {

using testing::FixedCostModel;
using testing::FixedCosts;
using testing::ProgramBuilder;
using PB = ProgramBuilder;

// The tail of a backward: the last backward [0, 100), its reduce-scatter [100, 400), then the HSDP
// all-reduce [400, 1400) on its own stream.
struct Tail {
  PB b;
  int rs = -1, ar = -1;
  Tail() {
    const int bwd = b.op(OpKind::Backward, PB::kCompute, {}, "bwd");
    rs = b.op(OpKind::ReduceScatter, PB::kReduceScatter, {bwd}, "RS");
    ar = b.op(OpKind::AllReduce, PB::kAllReduce, {rs}, "AR");
  }
  static FixedCosts costs() {
    FixedCosts c;
    c.backward_ns = 100;
    c.reduce_scatter_ns = 300;
    c.all_reduce_ns = 1000;
    c.optimizer_ns = 50;
    c.d2h_ns = 20;
    c.cpu_optimizer_ns = 500;
    return c;
  }
};

TEST(ExposedComm, GpuOptimizerStepWaitsOnTheTailReduction) {
  Tail t;
  t.b.op(OpKind::OptimizerStep, PB::kCompute, {t.ar}, "optim");
  // The compute stream is idle [100, 1400) waiting for the AR; collectives run [100, 1400): 1300 exposed.
  // The step ends with the optimizer [1400, 1450).
  SimResult r = execute(t.b.p, FixedCostModel(Tail::costs()));
  EXPECT_EQ(r.step_time_ns, 1450);
  EXPECT_EQ(r.comm_ns, 1300);
  EXPECT_EQ(r.exposed_comm_ns, 1300);
}

TEST(ExposedComm, CpuOffloadStepWaitsOnTheTailReductionThroughTheD2H) {
  // CPU offload (M11, F2.11): the grad D2H on the reduce-scatter stream after the AR [1400, 1420); the
  // CPU blocks on it (cpu_waits) and steps [1420, 1920). The compute stream is idle from 100 on, the
  // CPU waits from the time it reached the step (t = 0: issue costs nothing here) to 1420: the step
  // waits [100, 1420), of which the collectives run [100, 1400): 1300 exposed, as on the GPU.
  Tail t;
  const int d2h = t.b.op(OpKind::D2H, PB::kReduceScatter, {t.ar}, "grad D2H");
  t.b.op(OpKind::CpuOptimizerStep, PB::kCompute, {}, "optim cpu");
  t.b.last().cpu_waits = {d2h};
  SimResult r = execute(t.b.p, FixedCostModel(Tail::costs()));
  EXPECT_EQ(r.step_time_ns, 1920);
  EXPECT_EQ(r.comm_ns, 1300);
  EXPECT_EQ(r.cpu_blocked_ns, 1420);
  EXPECT_EQ(r.exposed_comm_ns, 1300);
}

TEST(ExposedComm, CpuStepWhileTheComputeStreamIsBusyHidesNothing) {
  // The CPU step waits on a D2H after the RS only [100, 400) + [400, 420); meanwhile the compute stream
  // runs a long backward [100, 2100) (issued before the step): the compute stream is never idle while
  // the RS runs, so nothing is exposed even though the CPU waited.
  PB b;
  const int bwd = b.op(OpKind::Backward, PB::kCompute, {}, "bwd");
  const int rs = b.op(OpKind::ReduceScatter, PB::kReduceScatter, {bwd}, "RS");
  b.op(OpKind::Backward, PB::kCompute, {}, "bwd 2");
  const int d2h = b.op(OpKind::D2H, PB::kReduceScatter, {rs}, "grad D2H");
  b.op(OpKind::CpuOptimizerStep, PB::kCompute, {}, "optim cpu");
  b.last().cpu_waits = {d2h};
  FixedCosts c = Tail::costs();
  c.by_op = {-1, -1, 2000};   // bwd 2: [100, 2100)
  // RS [100, 400) runs alongside bwd 2; D2H [400, 420); CPU step [420, 920); step ends with bwd 2 at 2100.
  SimResult r = execute(b.p, FixedCostModel(c));
  EXPECT_EQ(r.step_time_ns, 2100);
  EXPECT_EQ(r.exposed_comm_ns, 0);
}

TEST(ExposedComm, CollectivesNobodyWaitsOnStillEndTheStep) {
  // A program that ends with a reduce-scatter no later op waits on: the step ends when it does, and
  // the time after the last compute-stream and CPU work during which it runs is exposed: [100, 400).
  PB b;
  const int bwd = b.op(OpKind::Backward, PB::kCompute, {}, "bwd");
  b.op(OpKind::ReduceScatter, PB::kReduceScatter, {bwd}, "RS");
  SimResult r = execute(b.p, FixedCostModel(Tail::costs()));
  EXPECT_EQ(r.step_time_ns, 400);
  EXPECT_EQ(r.exposed_comm_ns, 300);
}

}  // namespace
}  // namespace fsdpsim::sim

#include "runtime/cpu/rank_runner.h"

#include "runtime/cpu/cpu_device.h"
#include "runtime/model/dims.h"
#include "runtime/plan_support.h"

namespace fsdpsim::runtime {

void check_runtime_supports(const models::ModelSpec& m, const sim::Plan& plan) {
  check_plan_supported(plan, RuntimeBackend::Cpu);
  runtime_dims(m, plan.micro_batch, plan.seq_len);
}

RankRunner::RankRunner(const RunConfig& cfg, Communicator& comm) : Runner(cfg, comm, make_cpu_device(comm)) {}

}  // namespace fsdpsim::runtime

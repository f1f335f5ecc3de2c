// What the two runtime workers (fsdpsim-run-cpu under runtime/mpi, fsdpsim-run-cuda under
// runtime/cuda) share: the command-line options launcher.cpp passes to both, the training loop and the
// result files (--out, --dump) around a backend's rank runner and communicator.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/args.h"
#include "common/context.h"
#include "common/output_file.h"
#include "common/units.h"
#include "sim/sim_result.h"

namespace fsdpsim::runtime {

// model, plan, steps, seed, lr, gpus-per-node, out, dump; `plan_help` says which dtypes the backend takes.
std::vector<OptionSpec> worker_common_options(const std::string& plan_help);
// {name: [values...]} in the given order.
nlohmann::json tensors_json(const std::vector<std::pair<std::string, std::vector<float>>>& ts);

// `steps` optimizer steps of `runner` (RankRunner or cuda::CudaRankRunner) with every rank starting
// each step together; rank 0 writes --out: a context block, `fields` (the backend's own), world, steps,
// losses, step_times_s (each the slowest rank's), untracked_bytes and the last step measured (with its
// trace); and, with --dump, every parameter and reduced gradient after the last step. Collective.
template <class Runner, class Comm>
void run_worker_steps(const Args& a, Runner& runner, Comm& comm, int steps, nlohmann::json fields) {
  nlohmann::json losses = nlohmann::json::array(), times = nlohmann::json::array();
  sim::SimResult last;
  for (int s = 0; s < steps; ++s) {
    comm.barrier();   // ranks start each step together, as a training loop's data loading would not
    auto outcome = runner.step();
    losses.push_back(outcome.loss);
    const double t = comm.max_world(to_seconds(outcome.measured.step_time_ns));
    times.push_back(t);
    last = std::move(outcome.measured);
    last.step_time_ns = static_cast<TimeNs>(t * 1e9);   // the step ends when the slowest rank ends
  }
  // Only for --dump: gathering every unsharded fp32 tensor to the host is collective and costly (an
  // 8B model: 2 x 32 GB of host memory, minutes), so a plain run skips it. --dump is the same on every rank.
  std::vector<std::pair<std::string, std::vector<float>>> params, grads;
  if (a.has("dump")) {
    params = runner.gather_params();
    grads = runner.gather_grads();
  }
  if (comm.rank() == 0) {
    nlohmann::json j;
    j["context"] = context_block_with_profile("");
    for (auto& [k, v] : fields.items()) j[k] = v;
    j["world"] = comm.world();
    j["steps"] = steps;
    j["losses"] = losses;
    j["step_times_s"] = times;
    j["untracked_bytes"] = runner.untracked_bytes();
    j["measured"] = sim::sim_result_to_json(last, true);
    write_file_atomic(a.require("out"), j.dump(1), "--out");
    if (a.has("dump")) {
      nlohmann::json d;
      d["params"] = tensors_json(params);
      d["grads"] = tensors_json(grads);
      write_file_atomic(a.get("dump"), d.dump(), "--dump");
    }
  }
  comm.barrier();
}

}  // namespace fsdpsim::runtime

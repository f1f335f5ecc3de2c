// What the two runtime workers (fsdpsim-run-cpu under runtime/mpi, fsdpsim-run-cuda under
// runtime/cuda) share: the command-line options launcher.cpp passes to both, the run's configuration
// they describe, the training loop and the result files (--out, --dump) around a backend's rank runner
// and communicator.
#pragma once
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/args.h"
#include "common/context.h"
#include "common/output_file.h"
#include "common/units.h"
#include "program/sim_result.h"
#include "runtime/rank_runner.h"

namespace fsdpsim::runtime {

// model, plan, steps, seed, lr, gpus-per-node, out, dump, then the backend's own `extra` options;
// `plan_help` says which dtypes the backend takes.
std::vector<OptionSpec> worker_options(const std::string& plan_help, std::vector<OptionSpec> extra = {});
// The run of `world` ranks the common options describe: --model (validated), --plan resolved for `world`
// ranks and --gpus-per-node (default: all on one node), --seed, --lr. InputError on bad input.
RunConfig worker_config(const Args& a, int world);
// {name: [values...]} in the given order.
nlohmann::json tensors_json(const std::vector<std::pair<std::string, std::vector<float>>>& ts);

// `steps` optimizer steps of `runner` (RankRunner or cuda::CudaRankRunner) with every rank starting
// each step together; rank 0 writes --out: a context block, `fields` (the backend's own), world, steps,
// losses, step_times_s (each the slowest rank's), untracked_bytes and the measured step (with its
// trace); and, with --dump, every parameter and reduced gradient after the last step. Collective.
// The measured step is the median one (by the slowest rank's time) of the steps after the first (the
// first allocates and warms caches; with one or two steps, the last): one step preempted on a shared
// machine must not stand for the run. Its memory figures are the last step's (peaks of the whole run).
template <class Runner, class Comm>
void run_worker_steps(const Args& a, Runner& runner, Comm& comm, int steps, nlohmann::json fields) {
  nlohmann::json losses = nlohmann::json::array(), times = nlohmann::json::array();
  std::vector<sim::SimResult> measured;
  for (int s = 0; s < steps; ++s) {
    comm.barrier();   // ranks start each step together, as a training loop's data loading would not
    auto outcome = runner.step();
    losses.push_back(outcome.loss);
    const double t = comm.max_world(to_seconds(outcome.measured.step_time_ns));
    times.push_back(t);
    measured.push_back(std::move(outcome.measured));
    measured.back().step_time_ns = static_cast<TimeNs>(t * 1e9);   // the step ends when the slowest rank ends
  }
  std::vector<int> order;
  for (int s = steps > 2 ? 1 : steps - 1; s < steps; ++s) order.push_back(s);
  std::sort(order.begin(), order.end(), [&](int x, int y) { return measured[x].step_time_ns < measured[y].step_time_ns; });
  const size_t pick = static_cast<size_t>(order[(order.size() - 1) / 2]);
  if (pick + 1 != measured.size()) {   // memory: the whole run's peaks, as the last step reports them
    const sim::SimResult& end = measured.back();
    sim::SimResult& m = measured[pick];
    m.peak_allocated = end.peak_allocated, m.peak_reserved = end.peak_reserved, m.context_bytes = end.context_bytes;
    m.peak_total_device = end.peak_total_device, m.capacity = end.capacity, m.fits = end.fits;
    m.breakdown_at_peak = end.breakdown_at_peak, m.alloc_retries = end.alloc_retries;
    m.memory_timeline = end.memory_timeline;
  }
  sim::SimResult last = std::move(measured[pick]);
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
    if constexpr (requires(const Runner& r) { r.device_memory(); }) j["device_memory"] = runner.device_memory();
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

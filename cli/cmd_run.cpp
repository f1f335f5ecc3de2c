// fsdpsim run: execute one plan with the bundled FSDP runtime (--backend cpu: CPU + MPI, the
// default; --backend cuda: CUDA + NCCL) and measure it: per-op times and memory in the simulator's
// result schema (the "measured" step), plus the loss.
#include <iostream>

#include "cli/commands.h"
#include "cli/host_memory.h"
#include "models/zoo.h"
#include "common/args.h"
#include "common/context.h"
#include "common/output_file.h"
#include "reports/trace.h"
#include "runtime/launcher.h"
#include "program/sim_result.h"

namespace fsdpsim::cli {

namespace {
std::vector<OptionSpec> run_options() {
  auto o = runtime::launch_option_specs();
  o.push_back({"json", true, false, "write the measured result (JSON)", "OUT"});
  o.push_back({"trace", true, false, "write the measured Chrome/Perfetto trace", "OUT"});
  return o;
}
}  // namespace

int cmd_run(const Argv& argv) {
  const auto specs = run_options();
  Args a(argv, specs);
  if (a.help()) {
    std::cout << usage_text("run",
                            "Execute a plan with the bundled FSDP runtime (CPU + MPI, or CUDA + NCCL) and measure one step.",
                            specs);
    return 0;
  }
  const runtime::LaunchOptions o = runtime::launch_options_from_args(a);
  check_host_memory(o, models::load_model(o.model, "--model"));
  const runtime::LaunchResult r = runtime::launch_run(o);
  const auto& m = r.measured;
  const bool cuda = o.backend == "cuda";
  std::cout << "measured on " << o.ranks << (cuda ? " GPU rank(s) (" + r.worker.value("device", std::string("?")) + ")" : std::string(" CPU rank(s)"))
            << (o.emulate_world > 0 ? ", rank 0 of an emulated world of " + std::to_string(o.emulate_world) : std::string(""))
            << ", step " << o.steps << " of " << o.steps << ":\n"
            << "  step time        " << to_seconds(m.step_time_ns) << " s (slowest rank)\n"
            << "  peak allocated   " << to_gib(m.peak_allocated) << " GiB (caching-allocator model, rank 0)\n"
            << "  peak reserved    " << to_gib(m.peak_reserved) << " GiB\n"
            << "  compute busy     " << to_seconds(m.compute_ns) << " s, exposed comm " << to_seconds(m.exposed_comm_ns)
            << " s\n  loss per step    " << r.worker["losses"].dump() << "\n";
  const nlohmann::json ctx = context_block_with_profile("");
  if (a.has("json")) {
    nlohmann::json j;
    j["context"] = ctx;
    j["run"] = {{"model", o.model}, {"plan", o.plan}, {"ranks", o.ranks}, {"steps", o.steps},
                {"backend", cuda ? "cuda+nccl" : "cpu+mpi"}};
    if (cuda) j["run"]["device"] = r.worker.value("device", std::string("?"));
    if (o.emulate_world > 0) j["run"]["emulated_world"] = o.emulate_world;
    j["losses"] = r.worker["losses"];
    j["step_times_s"] = r.worker["step_times_s"];
    j["untracked_bytes"] = r.worker["untracked_bytes"];
    j["measured"] = sim::sim_result_to_json(m, false);
    write_file_atomic(a.get("json"), j.dump(2) + "\n", "--json");
  }
  if (a.has("trace")) reports::write_trace(a.get("trace"), m, ctx, "--trace");
  return 0;
}

}  // namespace fsdpsim::cli

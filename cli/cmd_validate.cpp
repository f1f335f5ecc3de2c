// fsdpsim validate: the simulator and the bundled runtime on the same plan (hence the same
// StepProgram), compared op by op: signed relative errors (predicted - measured) / measured of peak
// allocated, peak reserved and step time, plus per-stream, per-kind and per-op errors.
#include <cmath>
#include <iostream>
#include <thread>

#include "calibrate/hardware_profile.h"
#include "cli/commands.h"
#include "cli/host_memory.h"
#include "common/args.h"
#include "common/context.h"
#include "common/errors.h"
#include "common/json_reader.h"
#include "common/output_file.h"
#include "models/zoo.h"
#include "reports/trace.h"
#include "runtime/compare.h"
#include "runtime/launcher.h"
#include "runtime/runtime_plan.h"
#include "program/plan.h"
#include "sim/simulator.h"

namespace fsdpsim::cli {

namespace {
std::vector<OptionSpec> validate_options() {
  auto o = runtime::launch_option_specs();
  o.push_back({"profile", true, false,
               "calibrated profile (fsdpsim calibrate --backend cpu|cuda); default: the cluster's built-in one", "FILE"});
  o.push_back({"cluster", true, false,
               "cluster of the prediction (default: N CPU ranks on this host; --backend cuda: NxH100-SXM)", "C"});
  o.push_back({"json", true, false, "write the comparison (JSON)", "OUT"});
  o.push_back({"trace-predicted", true, false, "write the predicted step's Chrome/Perfetto trace", "OUT"});
  o.push_back({"trace-measured", true, false, "write the measured step's Chrome/Perfetto trace", "OUT"});
  return o;
}

std::string pct(const nlohmann::json& e) {
  if (e.is_null()) return "n/a (measured 0)";
  char b[64];
  std::snprintf(b, sizeof(b), "%+.2f%%", 100.0 * e.get<double>());
  return b;
}
}  // namespace

int cmd_validate(const Argv& argv) {
  const auto specs = validate_options();
  Args a(argv, specs);
  if (a.help()) {
    std::cout << usage_text("validate",
                            "Run the simulator and the bundled runtime (CPU + MPI, or CUDA + NCCL) on one plan and "
                            "compare them.", specs);
    return 0;
  }
  runtime::LaunchOptions o = runtime::launch_options_from_args(a);
  // The bundled runtimes compute the norms, rotary embedding and SwiGLU each in one kernel (runtime/layers,
  // runtime/cuda) and keep one activation buffer per block: implementation "runtime" in the simulator's terms
  // (runtime/runtime_plan.h). Validation compares like with like, so the prediction uses it whatever the plan
  // says (a note says so when the plan named another).
  // The prediction, for the cluster the runtime runs on: N CPU ranks on this host.
  const models::ModelSpec model = models::load_model(o.model, "--model");
  const int W = o.world();   // ranks of the program (the emulated world with --emulate-world)
  const int gpn = o.gpus_per_node > 0 ? o.gpus_per_node : W;
  const bool cuda = o.backend == "cuda";
  const std::string device = cuda ? "H100-SXM" : "CPU";
  if (cuda && !a.has("cluster") && gpn != W)
    throw InputError("--cluster", "(none)", "a cluster name or file with --backend cuda across nodes (--gpus-per-node)");
  const std::string cluster_name =
      a.has("cluster") ? a.get("cluster")
      : gpn == W ? std::to_string(W) + "x" + device
                 : std::to_string(W / gpn) + "x" + std::to_string(gpn) + "x" + device;
  const calibrate::Cluster cluster = calibrate::load_cluster(cluster_name, a.has("cluster") ? "--cluster" : "--ranks");
  const calibrate::HardwareProfile hw = a.has("profile") ? calibrate::HardwareProfile::from_file(a.get("profile"), cluster)
                                                         : calibrate::HardwareProfile::for_cluster(cluster);
  if (!o.pad_cluster.empty()) {   // the delays follow the prediction's cluster and profile
    o.pad_cluster = cluster_name;
    if (a.has("profile")) o.pad_profile = a.get("profile");
  }
  const sim::Plan plan = sim::resolve_plan(sim::load_plan(o.plan, "--plan"), W, gpn);
  const std::string implementation_note =
      plan.implementation == models::ModelImpl::Runtime
          ? std::string()
          : "  note: the plan's implementation \"" + models::model_impl_name(plan.implementation) +
                "\" is replaced by \"runtime\": the bundled runtime runs one kernel per norm, rotary and SwiGLU (the "
                "fused recipe's kernels) and saves one activation buffer per block\n";
  // The runtime runs its own kernels: the prediction is of the same program (implementation "runtime").
  const sim::SimResult predicted = sim::simulate(model, hw, runtime::runtime_plan(plan));
  check_host_memory(o, model);
  const runtime::LaunchResult run = runtime::launch_run(o);
  nlohmann::json cmp = runtime::compare_results(predicted, run.measured);

  std::cout << "validation of " << o.model << " on " << o.ranks
            << (cuda ? " GPU rank(s) (" + run.worker.value("device", std::string("?")) + ")" : std::string(" CPU rank(s)"))
            << (o.emulate_world > 0 ? ", rank 0 of an emulated world of " + std::to_string(W) +
                                          (o.pad_cluster.empty()
                                               ? " (collectives are local copies: compare memory, not communication)"
                                               : " (collectives are local copies plus their predicted duration)")
                                    : std::string(""))
            << " (profile: " << hw.name() << ")\n"
            << implementation_note
            << "  peak allocated  predicted " << to_gib(predicted.peak_allocated) << " GiB, measured "
            << to_gib(run.measured.peak_allocated) << " GiB, error " << pct(cmp["peak_allocated_error"]) << "\n"
            << "  peak reserved   predicted " << to_gib(predicted.peak_reserved) << " GiB, measured "
            << to_gib(run.measured.peak_reserved) << " GiB, error " << pct(cmp["peak_reserved_error"]) << "\n"
            << "  step time       predicted " << to_seconds(predicted.step_time_ns) << " s, measured "
            << to_seconds(run.measured.step_time_ns) << " s, error " << pct(cmp["step_time_error"]) << "\n";
  // Where the step time went: compute-stream busy time and communication the compute waited for.
  auto rel = [](double p, double m) { return m > 0 ? nlohmann::json((p - m) / m) : nlohmann::json(); };
  std::cout << "  compute busy    predicted " << to_seconds(predicted.compute_ns) << " s, measured "
            << to_seconds(run.measured.compute_ns) << " s, error "
            << pct(rel(static_cast<double>(predicted.compute_ns), static_cast<double>(run.measured.compute_ns)))
            << "\n"
            << "  exposed comm    predicted " << to_seconds(predicted.exposed_comm_ns) << " s, measured "
            << to_seconds(run.measured.exposed_comm_ns) << " s\n";
  // Which comparison proves what (issue 19): the runtime places its buffers with the simulator's own
  // caching-allocator model, so the allocated / reserved rows check that the program and its placement
  // agree; PyTorch's memory is checked by tests/fixtures/torch_memory. The driver's figures below are
  // what the device really used.
  // More CPU ranks than cores: the calibration times one rank at a time and scales by ranks per core (every
  // rank computing at once), and the simulator replays one rank for all; measured ranks drift apart and take
  // turns on the cores (one computes while another waits in a collective), which that symmetric model cannot
  // show. Said with the figures, not hidden.
  const unsigned cores = std::thread::hardware_concurrency();
  const bool oversubscribed = !cuda && cores > 0 && static_cast<unsigned>(o.ranks) > cores;
  if (oversubscribed)
    std::cout << "  note: " << o.ranks << " ranks on " << cores
              << " cores: the prediction assumes every rank computes at once (ranks per core x one rank's kernel "
                 "time); measured ranks take turns on the cores, so compute busy and step time are approximate here\n";
  std::cout << "  memory rows above: the runtime places the program's buffers with fsdpsim's allocator model, so they "
               "check the program's consistency, not PyTorch's allocator (that is test_torch_memory_fixtures)\n";
  const nlohmann::json device_memory = run.worker.value("device_memory", nlohmann::json());
  if (device_memory.is_object()) {
    const auto b = [&](const char* k) { return device_memory.value(k, Bytes{0}); };
    const Bytes outside = b("outside_region_bytes"), untracked = b("untracked_bytes");
    std::cout << "  device (driver) used " << to_gib(b("used_peak_bytes")) << " of " << to_gib(b("device_total_bytes"))
              << " GiB at most (cudaMemGetInfo): the allocator's fixed region " << to_gib(b("allocator_region_bytes"))
              << " GiB + " << to_gib(outside) << " GiB outside it (CUDA context, cuBLAS, NCCL, "
              << to_gib(untracked) << " GiB untracked scratch); predicted outside the allocator: context "
              << to_gib(predicted.context_bytes) << " GiB, error "
              << pct(rel(static_cast<double>(predicted.context_bytes + untracked), static_cast<double>(outside))) << "\n";
  }
  if (a.has("json")) {
    nlohmann::json j;
    j["context"] = context_block_with_profile(a.has("profile") ? a.get("profile") : hw.name());
    j["run"] = {{"model", o.model}, {"plan", sim::plan_to_json(plan)}, {"ranks", o.ranks}, {"steps", o.steps},
                {"backend", cuda ? "cuda+nccl" : "cpu+mpi"}, {"cluster", cluster_name},
                {"emulated_world", o.emulate_world}, {"collectives_padded", !o.pad_cluster.empty()}, {"measured_step", "the median (by time) of the run's steps after the first; its time is the slowest rank's"},
                {"host_cores", cores}, {"oversubscribed", oversubscribed}};
    if (cuda) j["run"]["device"] = run.worker.value("device", std::string("?"));
    j["losses"] = run.worker["losses"];
    j["untracked_runtime_bytes"] = run.worker["untracked_bytes"];
    if (device_memory.is_object()) {
      j["device_memory"] = device_memory;
      j["device_memory"]["predicted_context_bytes"] = predicted.context_bytes;
      j["device_memory"]["predicted_total_device_bytes"] = predicted.peak_total_device;
    }
    j["comparison"] = cmp;
    write_file_atomic(a.get("json"), j.dump(2) + "\n", "--json");
  }
  if (a.has("trace-predicted") || a.has("trace-measured")) {
    const nlohmann::json ctx = context_block_with_profile(a.has("profile") ? a.get("profile") : hw.name());
    if (a.has("trace-predicted")) reports::write_trace(a.get("trace-predicted"), predicted, ctx, "--trace-predicted");
    if (a.has("trace-measured")) reports::write_trace(a.get("trace-measured"), run.measured, ctx, "--trace-measured");
  }
  return 0;
}

}  // namespace fsdpsim::cli

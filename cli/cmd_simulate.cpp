// `fsdpsim simulate`: predict the memory and step time of one plan (design.md "Contract").
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "calibrate/hardware_profile.h"
#include "cli/commands.h"
#include "common/args.h"
#include "common/context.h"
#include "common/errors.h"
#include "common/output_file.h"
#include "models/zoo.h"
#include "planner/explain.h"
#include "reports/trace.h"
#include "program/plan.h"
#include "sim/accuracy.h"
#include "sim/simulator.h"

namespace fsdpsim::cli {

namespace {

const std::vector<OptionSpec>& specs() {
  static const std::vector<OptionSpec> s = {
      {"model", true, false, "zoo name (e.g. llama3-8b) or a Hugging Face config.json", "M"},
      {"cluster", true, false, "cluster name (e.g. 8xH100-SXM, 16x8xH100-SXM-IB-NDR400) or a cluster JSON file", "C"},
      {"plan", true, false, "plan JSON file or an inline JSON object ('{\"sharding_strategy\": \"FULL_SHARD\"}')", "P"},
      {"profile", true, false, "calibrated hardware profile JSON (default: the built-in profile of the cluster)", "FILE"},
      {"json", true, false, "write the result as JSON (context, inputs, result) to OUT", "OUT"},
      {"trace", true, false, "write a Chrome/Perfetto trace of the predicted step to OUT", "OUT"},
      {"memory-margin", true, false, "fraction of GPU memory kept free when deciding fits (default 0.05, as plan and diagnose)", "F"},
      {"require-fit", false, false, "exit with code 3 if the plan does not fit in GPU memory", ""},
  };
  return s;
}

const char* kSummary =
    "Predict one FSDP plan: peak memory per GPU (allocated and reserved, by category), whether it fits,\n"
    "step time, tokens/s per GPU, MFU and exposed communication. Memory in GiB (2^30).";

std::string gib(Bytes b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", to_gib(b));
  return buf;
}

std::string num(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

nlohmann::json cluster_to_json(const calibrate::Cluster& c) {
  return {{"name", c.name},           {"nodes", c.nodes},           {"gpus_per_node", c.gpus_per_node},
          {"gpu", c.gpu},             {"intra_node", c.intra_node}, {"inter_node", c.inter_node},
          {"nics_per_node", c.nics_per_node}, {"gpu_memory_override_bytes", c.gpu_memory_override}};
}

// "the backward of micro-batch 1 (reduce_scatter of unit 31, op 812)", or "the start of the step".
std::string peak_words(const sim::PeakLocation& at) {
  if (at.op < 0) return "the start of the step";
  std::string s = "the " + at.phase;
  if (at.micro_batch >= 0) s += " of micro-batch " + std::to_string(at.micro_batch);
  s += " (" + at.kind;
  if (at.unit >= 0) s += " of unit " + std::to_string(at.unit);
  s += ", op " + std::to_string(at.op) + (at.name.empty() ? "" : " \"" + at.name + "\"") + ")";
  return s;
}

void print_summary(std::ostream& os, const models::ModelSpec& model, const calibrate::HardwareProfile& hw,
                   const sim::Plan& p, const sim::SimResult& r, double margin) {
  const auto& c = hw.cluster();
  os << "fsdpsim simulate: " << model.name << " on " << c.name << " (" << c.world() << " GPUs; profile "
     << hw.name() << ", " << hw.source() << ")\n";
  os << "plan: FSDP" << static_cast<int>(p.fsdp_version) << " " << sim::strategy_name(sim::effective_strategy(p))
     << ", mesh (replicate " << p.mesh_replicate << ", shard " << p.mesh_shard << "), micro_batch "
     << p.micro_batch << " x seq_len " << p.seq_len << " x grad_accum " << p.grad_accum << ", param_dtype "
     << dtype_name(p.param_dtype) << ", reduce_dtype " << dtype_name(p.reduce_dtype) << ", AC "
     << sim::checkpointing_name(p.activation_checkpointing);
  if (p.lora.on()) {
    std::string targets;
    for (const auto& t : p.lora.targets) targets += (targets.empty() ? "" : ",") + t;
    os << ", " << (p.lora.quantize_nf4 ? "QLoRA (NF4 base weights)" : "LoRA") << " r" << p.lora.rank << " on " << targets;
  }
  os << "\n\n";

  os << "Memory per GPU (GiB = 2^30 bytes)\n";
  os << "  peak allocated (live tensors)     " << gib(r.peak_allocated) << "\n";
  os << "  peak reserved (caching allocator) " << gib(r.peak_reserved) << "\n";
  os << "  + CUDA context / NCCL buffers     " << gib(r.context_bytes) << "\n";
  os << "  = peak device total               " << gib(r.peak_total_device) << " of " << gib(r.capacity)
     << " -> " << (r.fits ? "fits" : "DOES NOT FIT") << "\n";
  os << "  " << planner::memory_text(r, margin) << "\n";
  os << "  peak at " << peak_words(r.peak_allocated_at) << " (allocated), " << peak_words(r.peak_reserved_at)
     << " (reserved)\n";
  os << "  first step (optimizer state created in it): allocated " << gib(r.first_step_peak_allocated)
     << ", reserved " << gib(r.first_step_peak_reserved) << ", at " << peak_words(r.first_step_peak_allocated_at)
     << "\n";
  if (r.construction_peak_reserved > 0)
    os << "  FSDP1 construction (before the first step): allocated " << gib(r.construction_peak_allocated)
       << ", reserved " << gib(r.construction_peak_reserved) << "\n";
  os << "  breakdown at the allocated peak (requested bytes; slack = reserved - requested):\n";
  for (const auto& [k, v] : r.breakdown_at_peak)
    if (v > 0) os << "    " << k << std::string(k.size() < 18 ? 18 - k.size() : 1, ' ') << gib(v) << "\n";
  if (r.alloc_retries > 0) os << "  cudaMalloc retries: " << r.alloc_retries << "\n";

  os << "\nTime per optimizer step\n";
  os << "  step time          " << num("%.4f", to_seconds(r.step_time_ns)) << " s\n";
  os << "  compute stream     " << num("%.4f", to_seconds(r.compute_ns)) << " s busy\n";
  os << "  collectives        " << num("%.4f", to_seconds(r.comm_ns)) << " s busy, "
     << num("%.4f", to_seconds(r.exposed_comm_ns)) << " s exposed (compute idle waiting)\n";
  if (r.cpu_issue_ns > 0)
    os << "  CPU issue          " << num("%.4f", to_seconds(r.cpu_issue_ns))
       << " s busy (framework hooks and eager PyTorch ops, profile overheads)\n";
  if (r.cpu_blocked_ns > 0) os << "  CPU blocked        " << num("%.4f", to_seconds(r.cpu_blocked_ns)) << " s\n";
  os << "  tokens per step    " << num("%.0f", r.tokens_per_step) << " (global)\n";
  os << "  tokens/s per GPU   " << num("%.1f", r.tokens_per_s_per_gpu) << "\n";
  os << "  MFU                " << num("%.1f", 100.0 * r.mfu) << " % of the dense " << r.peak_flops_dtype
     << " peak " << num("%.0f", r.peak_flops / 1e12) << " TFLOP/s (model FLOPs 6N + attention, no recompute)\n";
  const double step_s = to_seconds(r.step_time_ns);
  if (step_s > 0 && r.peak_flops > 0)
    os << "  HFU                " << num("%.1f", 100.0 * r.hardware_flops_per_step_per_gpu / (step_s * r.peak_flops))
       << " % (hardware FLOPs, recompute included)\n";
  if (!r.notes.empty()) {
    os << "\nNotes (approximations and warnings)\n";
    for (const auto& n : r.notes) os << "  - " << n << "\n";
  }
  os << sim::validation_record_section();
}

}  // namespace

int cmd_simulate(const Argv& argv) {
  Args args(argv, specs());
  if (args.help()) {
    std::cout << usage_text("simulate", kSummary, specs());
    return kExitOk;
  }
  if (!args.positional().empty())
    throw InputError("simulate", args.positional().front(), "no positional arguments (use --model/--cluster/--plan)");
  const models::ModelSpec model = models::load_model(args.require("model"), "--model");
  const calibrate::Cluster cluster = calibrate::load_cluster(args.require("cluster"), "--cluster");
  const sim::Plan plan = sim::load_plan(args.require("plan"), "--plan");
  const calibrate::HardwareProfile hw = args.has("profile")
                                            ? calibrate::HardwareProfile::from_file(args.get("profile"), cluster)
                                            : calibrate::HardwareProfile::for_cluster(cluster);
  sim::SimOptions so;
  so.record_trace = args.has("trace");
  so.record_memory_timeline = args.has("trace");
  so.memory_margin = args.get_double("memory-margin", 0.05, 0.0, 0.99);
  const sim::SimResult r = sim::simulate(model, hw, plan, so);
  const sim::Plan resolved = sim::resolve_plan(plan, cluster.world(), cluster.gpus_per_node);

  const std::string profile_label = hw.name() + " (" + hw.source() + ")";
  const nlohmann::json context = context_block_with_profile(profile_label);
  if (args.has("json")) {
    nlohmann::json doc;
    doc["schema_version"] = "fsdpsim.simulate/1";
    doc["context"] = context;
    doc["inputs"] = {{"model", models::model_to_json(model)},
                     {"cluster", cluster_to_json(cluster)},
                     {"plan", sim::plan_to_json(resolved)},
                     {"profile", hw.to_json()}};
    doc["result"] = sim::sim_result_to_json(r, false);
    doc["accuracy"] = sim::validation_record_json();
    write_file_atomic(args.get("json"), doc.dump(2) + "\n", "--json");
  }
  if (args.has("trace")) reports::write_trace(args.get("trace"), r, context, "--trace");

  // memory_text measures the headroom itself against the margin; the simulator's fits already includes it.
  print_summary(std::cout, model, hw, resolved, r, so.memory_margin);
  if (args.has("require-fit") && !r.fits)
    throw DoesNotFitError(planner::memory_text(r, so.memory_margin) + " (--require-fit)");
  return kExitOk;
}

}  // namespace fsdpsim::cli

// `fsdpsim plan`: search FSDP plans for a model, cluster and batch target; write DIR/plan.json,
// DIR/report.html and DIR/trace.json (the recommendation's trace); print the top K.
// With no arguments: llama3-8b on one node of 8 H100s at 8192 tokens, 4M-token global batch.
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <sstream>
#include <thread>

#include "calibrate/hardware_profile.h"
#include "cli/commands.h"
#include "common/args.h"
#include "common/errors.h"
#include "common/output_file.h"
#include "models/zoo.h"
#include "planner/planner.h"
#include "reports/html_report.h"
#include "reports/trace.h"

namespace fsdpsim::cli {
namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int cmd_plan(const Argv& argv) {
  const std::vector<OptionSpec> specs = {
      {"model", true, false, "zoo name or config.json (default llama3-8b)", "M"},
      {"cluster", true, false, "cluster name or JSON file (default 8xH100-SXM)", "C"},
      {"seq-len", true, false, "tokens per sequence (default 8192)", "N"},
      {"global-batch-tokens", true, false, "global batch in tokens (default 4M = 2^22, rounded up to whole sequences per GPU)", "N"},
      {"global-batch", true, false, "global batch in sequences (a multiple of the GPU count)", "N"},
      {"out", true, false, "output directory (default fsdpsim-plan)", "DIR"},
      {"top", true, false, "rows of the printed table and explained runners-up (default 5)", "K"},
      {"fix", true, true, "pin a plan key: --fix fsdp_version=2 --fix activation_checkpointing=full", "KEY=VALUE"},
      {"exclude", true, true, "exclude a value: --exclude cpu_offload=true", "KEY=VALUE"},
      {"precision", true, false, "allowed precision presets, comma-separated (default bf16; also bf16-bf16reduce, bf16-true, fp32, fp8-ag)", "LIST"},
      {"memory-margin", true, false, "fraction of GPU memory kept free (default 0.05)", "F"},
      {"profile", true, false, "calibrated hardware profile JSON (default: the built-in profile of the cluster)", "FILE"},
      {"threads", true, false, "simulation threads (default: all cores)", "N"},
      {"format", true, false, "the printed ranked table: text (default), markdown or csv (csv prints the table alone)", "F"},
  };
  Args args(argv, specs);
  if (args.help()) {
    std::cout << usage_text("plan",
                            "Search FSDP configurations (mesh, strategy / reshard_after_forward, prefetch, activation "
                            "checkpointing, micro-batch x accumulation, offload, precision, FSDP1 vs FSDP2) for a model, "
                            "cluster and global batch; simulate the candidates in parallel and rank them by predicted "
                            "tokens/s per GPU among plans that fit with the memory margin. Writes DIR/plan.json, "
                            "DIR/report.html and DIR/trace.json. Exit 3 when nothing fits (the report says why).",
                            specs);
    return kExitOk;
  }
  planner::PlanRequest req;
  const std::string model_arg = args.get("model", "llama3-8b");
  const std::int64_t seq_len = args.get_int("seq-len", 8192, 1, 1 << 22);
  req.model = models::with_seq_len(models::load_model(model_arg, "--model"), seq_len);
  req.cluster = calibrate::load_cluster(args.get("cluster", "8xH100-SXM"), "--cluster");
  if (args.has("profile")) {
    req.hw = calibrate::HardwareProfile::from_file(args.get("profile"), req.cluster, "--profile");
    req.profile_name = args.get("profile");
  } else {
    req.hw = calibrate::HardwareProfile::for_cluster(req.cluster);
    req.profile_name = "builtin: " + req.hw.name();
  }
  const int world = req.cluster.world();
  req.space.batch = planner::resolve_batch_target(seq_len, args.get_int("global-batch-tokens", 0, 1, std::int64_t{1} << 40),
                                                  args.get_int("global-batch", 0, 1, std::int64_t{1} << 30), world);
  if (args.has("precision")) {
    req.space.precisions = split_list(args.get("precision"));
    if (req.space.precisions.empty()) throw InputError("--precision", args.get("precision"), "a comma-separated list of presets");
    for (const auto& p : req.space.precisions) planner::find_precision_preset(p, "--precision");
  }
  for (const auto& f : args.all("fix")) {
    auto c = planner::parse_constraint(f, "--fix");
    const auto& bk = planner::base_keys();
    if (std::find(bk.begin(), bk.end(), c.key) != bk.end()) planner::apply_base_constraint(req.space.base, c);
    req.space.fixed.push_back(c);
  }
  for (const auto& f : args.all("exclude")) {
    auto c = planner::parse_constraint(f, "--exclude");
    const auto& bk = planner::base_keys();
    if (std::find(bk.begin(), bk.end(), c.key) != bk.end())
      throw InputError("--exclude", f, "base keys (optimizer, trainable_fraction, auto_wrap_policy, use_orig_params, "
                                       "cross_entropy, implementation, compile, optimizer_impl, alloc_conf, lora) are not searched; "
                                       "set them with --fix");
    req.space.excluded.push_back(c);
  }
  req.memory_margin = args.get_double("memory-margin", 0.05, 0.0, 0.9);
  int hw_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  req.threads = static_cast<int>(args.get_int("threads", hw_threads, 1, 1024));
  req.top_k = static_cast<int>(args.get_int("top", 5, 1, 1000));
  req.table_format = args.get("format", "text");
  if (req.table_format != "text" && req.table_format != "markdown" && req.table_format != "csv")
    throw InputError("--format", req.table_format, "text, markdown or csv");
  req.progress = isatty(2) != 0;
  const std::string dir = args.get("out", "fsdpsim-plan");
  ensure_directory(dir, "--out");

  planner::PlanOutcome out = planner::run_planner(req);
  if (out.search.stats.interrupted || interrupted()) {
    std::cerr << "fsdpsim plan: interrupted; no output written (existing files in " << dir << " are unchanged)\n";
    return 130;  // 128 + SIGINT, the shell convention
  }
  nlohmann::json doc = planner::plan_document(req, out);
  write_file_atomic(dir + "/plan.json", planner::plan_document_text(doc), "--out");
  reports::HtmlOptions html;
  if (out.has_detail) html.detail = &out.recommended_detail;
  reports::write_html(dir + "/report.html", doc, html, "--out");
  if (out.has_detail) reports::write_trace(dir + "/trace.json", out.recommended_detail, doc["context"], "--out");
  std::cout << planner::summary_table(req, out);
  if (req.table_format != "csv") std::cout << "wrote " << dir << "/plan.json, " << dir << "/report.html" << (out.has_detail ? ", " + dir + "/trace.json" : "")
            << "\n";
  if (out.ranking.recommended < 0)
    throw DoesNotFitError("no candidate plan fits in " + planner::gib_text(req.hw.memory_capacity()) + " per GPU with a " +
                          planner::pct_text(req.memory_margin) + " margin; see " + dir + "/report.html for why");
  return kExitOk;
}

}  // namespace fsdpsim::cli

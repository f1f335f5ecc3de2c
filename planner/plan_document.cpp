// The plan.json document (schema reports/schema/plan.schema.json, "fsdpsim.plan/1").
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/context.h"
#include "sim/accuracy.h"
#include "models/zoo.h"
#include "planner/exports.h"
#include "planner/planner.h"
#include "program/plan.h"

namespace fsdpsim::planner {

// The first ranks written in full in plan.json (at least --top); the rest are summary rows.
constexpr int kDetailedCandidates = 10;

nlohmann::json cluster_json(const calibrate::Cluster& c, Bytes gpu_memory) {
  return {{"name", c.name},         {"nodes", c.nodes},          {"gpus_per_node", c.gpus_per_node},
          {"gpu", c.gpu},           {"intra_node", c.intra_node}, {"inter_node", c.inter_node},
          {"nics_per_node", c.nics_per_node}, {"gpu_memory_bytes", gpu_memory}};
}

nlohmann::json plan_document(const PlanRequest& req, const PlanOutcome& out) {
  using nlohmann::json;
  json doc;
  doc["schema_version"] = "fsdpsim.plan/1";
  doc["context"] = context_block_with_profile(req.profile_name);
  doc["accuracy"] = sim::validation_record_json();
  json model = models::model_to_json(req.model);
  if (!model.contains("params_total")) model["params_total"] = models::count_params(req.model).total;
  json fixed = json::object();
  for (const auto& c : req.space.fixed) fixed[c.key] = c.value;
  json excluded = json::array();
  for (const auto& c : req.space.excluded) excluded.push_back(c.key + "=" + c.value);
  doc["inputs"] = {{"model", model},
                   {"cluster", cluster_json(req.cluster, req.hw.memory_capacity())},
                   {"profile", req.profile_name},
                   {"seq_len", req.space.batch.seq_len},
                   {"global_batch_tokens", req.space.batch.tokens()},
                   {"global_batch_sequences", req.space.batch.global_batch_sequences},
                   {"memory_margin", req.memory_margin},
                   {"usable_memory_bytes", usable_capacity(req.hw.memory_capacity(), req.memory_margin)},
                   {"precisions", req.space.precisions},
                   {"fixed", fixed},
                   {"excluded", excluded}};
  if (!req.space.batch.note.empty()) doc["inputs"]["batch_note"] = req.space.batch.note;
  const auto& st = out.search.stats;
  // Deterministic mode (--deterministic / FSDPSIM_FIXED_CONTEXT=1): the wall-clock figures are fixed at
  // 0 so the same inputs give byte-identical files (the thread count is an input and stays).
  const char* fixed_env = std::getenv("FSDPSIM_FIXED_CONTEXT");
  const bool deterministic = run_context().deterministic || (fixed_env && std::string(fixed_env) == "1");
  doc["search"] = {{"candidates_total", st.candidates_total},
                   {"candidates_simulated", st.simulated},
                   {"candidates_pruned", st.pruned_memory + st.skipped_dominated},
                   {"candidates_pruned_memory_bound", st.pruned_memory},
                   {"candidates_skipped_dominated", st.skipped_dominated},
                   {"candidates_invalid", st.invalid},
                   {"seconds", deterministic ? 0.0 : st.seconds},
                   {"threads", st.threads},
                   {"pruning", "memory lower bound (persistent sharded state, saved activations, logits or the loss's "
                               "backward, the head's unsharded unit, units kept unsharded after forward, gradients "
                               "carried across micro-batches; no allocator slack) against capacity less the margin; "
                               "then plans "
                               "dominated on both memory and throughput by an already simulated plan are skipped"}};
  // Candidates in rank order; positions (rank - 1) index "candidates" followed by the rows of
  // "other_candidates". The first ranks are written in full (plan, result, why); the rest as one
  // summary row each - the search can simulate thousands of plans, and the document stays small.
  const int detailed = std::max(req.top_k, kDetailedCandidates);
  std::vector<int> pos(out.candidates.size(), -1);
  json cands = json::array(), rows = json::array();
  int rank = 0;
  for (int i : out.ranking.order) {
    const auto& c = out.candidates[static_cast<size_t>(i)];
    const auto& e = out.search.evals[static_cast<size_t>(i)];
    pos[static_cast<size_t>(i)] = rank;
    bool pareto = std::find(out.ranking.pareto.begin(), out.ranking.pareto.end(), i) != out.ranking.pareto.end();
    if (rank < detailed) {
      cands.push_back({{"rank", rank + 1},
                       {"id", c.id},
                       {"label", c.label},
                       {"family", c.family},
                       {"plan", sim::plan_to_json(c.plan)},
                       {"result", sim::sim_result_to_json(e.result, false)},
                       {"fits_with_margin", e.fits_with_margin},
                       {"pareto", pareto},
                       {"why", out.explanations.why[static_cast<size_t>(i)]}});
    } else {
      const auto& r = e.result;
      rows.push_back({rank + 1, c.id, c.label, c.family, r.fits, e.fits_with_margin, pareto, r.peak_total_device,
                      r.peak_allocated, to_seconds(r.step_time_ns), r.tokens_per_s_per_gpu, r.mfu, to_seconds(r.exposed_comm_ns)});
    }
    ++rank;
  }
  doc["recommended"] = out.ranking.recommended >= 0 ? json(pos[static_cast<size_t>(out.ranking.recommended)]) : json(nullptr);
  doc["candidates"] = cands;
  doc["other_candidates"] = {{"columns", {"rank", "id", "label", "family", "fits", "fits_with_margin", "pareto",
                                          "peak_total_device_bytes", "peak_allocated_bytes", "step_time_s",
                                          "tokens_per_s_per_gpu", "mfu", "exposed_comm_s"}},
                             {"rows", rows}};
  json front = json::array();
  for (int i : out.ranking.pareto) front.push_back(pos[static_cast<size_t>(i)]);
  doc["pareto_front"] = front;
  json rej = json::array();
  for (const auto& f : out.explanations.rejected_families) rej.push_back({{"family", f.family}, {"reason", f.reason}});
  doc["rejected_families"] = rej;
  doc["explanations"] = {{"recommended", out.explanations.recommended},
                         {"runners_up", out.explanations.runners_up},
                         {"choices", out.explanations.choices},
                         {"ddp_baseline", out.explanations.ddp_baseline}};
  if (out.ranking.recommended >= 0) {
    json ex = json::object();
    for (const auto& fp : out.framework_plans) {
      ExportInput in{req.model, req.cluster, fp.plan, fp.label};
      Export e = make_export(fp.framework, in);
      if (!fp.same_as_recommended) {
        // The export says first that it is not the recommended plan, what changed and what it predicts.
        std::string head = "# NOTE: " + fp.framework + " cannot express the recommended plan as is; this is " + fp.source + ":\n";
        for (const auto& ch : fp.changes) head += "#   - " + ch + "\n";
        char line[256];
        const auto& rr = out.recommended_detail;
        std::snprintf(line, sizeof line, "#   predicted %.0f tokens/s per GPU (%+.1f%% vs the recommendation), peak %.1f GiB%s\n",
                      fp.result.tokens_per_s_per_gpu,
                      rr.tokens_per_s_per_gpu > 0 ? 100 * (fp.result.tokens_per_s_per_gpu / rr.tokens_per_s_per_gpu - 1) : 0.0,
                      to_gib(fp.result.peak_total_device), fp.fits_with_margin ? "" : " - it does not fit with the margin");
        e.text = head + line + e.text;
      }
      json j = export_to_json(e);
      j["plan_label"] = fp.label;
      j["same_as_recommended"] = fp.same_as_recommended;
      j["source"] = fp.source;
      j["changed"] = fp.changes;
      j["predicted"] = {{"tokens_per_s_per_gpu", fp.result.tokens_per_s_per_gpu},
                        {"peak_total_device_bytes", fp.result.peak_total_device},
                        {"fits_with_margin", fp.fits_with_margin}};
      j["plan"] = sim::plan_to_json(fp.plan);
      ex[fp.framework] = j;
    }
    doc["exports"] = ex;
  } else {
    doc["exports"] = json::object();
  }
  // The recommendation's trace and memory timeline go to trace.json (and the report), not here.
  doc["recommended_detail"] = out.has_detail ? sim::sim_result_to_json(out.recommended_detail, false) : json(nullptr);
  return doc;
}

std::string plan_document_text(const nlohmann::json& doc) {
  // Indented, except that each summary row of other_candidates stays on one line.
  nlohmann::json shell = doc;
  const nlohmann::json rows = doc.contains("other_candidates") ? doc["other_candidates"]["rows"] : nlohmann::json::array();
  if (doc.contains("other_candidates")) shell["other_candidates"]["rows"] = nlohmann::json::array();
  std::string text = shell.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  if (!rows.empty()) {
    const std::string key = "\"rows\": []";
    size_t at = text.find(key);
    std::string body = "\"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i)
      body += std::string(i ? "," : "") + "\n      " + rows[i].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    body += "\n    ]";
    if (at != std::string::npos) text.replace(at, key.size(), body);
  }
  return text + "\n";
}

}  // namespace fsdpsim::planner

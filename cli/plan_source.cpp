// Plan sources for fit and compare (plan_source.h).
#include "cli/plan_source.h"

#include "common/errors.h"
#include "common/json_reader.h"
#include "planner/diagnose.h"

namespace fsdpsim::cli {
namespace {

}  // namespace

PlanSource load_plan_source(const std::string& spec, const models::ModelSpec& model, const calibrate::Cluster& cl,
                            const planner::ReadOptions& ro, const std::string& field) {
  PlanSource out;
  auto resolve = [&](const sim::Plan& p) { return sim::resolve_plan(p, cl.world(), cl.gpus_per_node); };
  if (!spec.empty() && spec.front() == '{') {
    out.plan = resolve(sim::load_plan(spec, field));
    out.described = "plan " + spec;
    return out;
  }
  std::string path = spec;
  int rank = 0;   // plan.json#N
  if (auto h = spec.rfind('#'); h != std::string::npos && spec.substr(0, h).ends_with(".json")) {
    path = spec.substr(0, h);
    const std::string n = spec.substr(h + 1);
    char* end = nullptr;
    long v = std::strtol(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || v < 1) throw InputError(field, spec, "FILE.json#N with N >= 1 (a rank of plan.json)");
    rank = static_cast<int>(v);
  }
  if (path.ends_with(".json")) try {
    const nlohmann::json j = read_json_file(path, field);
    const std::string schema = j.is_object() && j.contains("schema_version") && j["schema_version"].is_string()
                                   ? j["schema_version"].get<std::string>() : "";
    if (schema == "fsdpsim.plan/1") {
      const auto& cands = j.at("candidates");
      int pos = rank > 0 ? rank - 1 : (j["recommended"].is_null() ? -1 : j["recommended"].get<int>());
      if (pos < 0) throw InputError(field, spec, "a plan.json with a recommendation (nothing fitted), or FILE.json#N");
      if (pos >= static_cast<int>(cands.size()))
        throw InputError(field, spec, "a rank up to " + std::to_string(cands.size()) +
                                          " (plan.json keeps the plans of its first ranks; the others are summary rows)");
      out.plan = resolve(sim::parse_plan(cands[static_cast<size_t>(pos)].at("plan")));
      out.described = path + ": " + (rank > 0 ? "rank " + std::to_string(rank) : std::string("the recommendation")) + " (" +
                      cands[static_cast<size_t>(pos)].value("label", std::string()) + ")";
      return out;
    }
    if (schema == "fsdpsim.diagnose/1") {
      out.plan = resolve(sim::parse_plan(j.at("plan")));
      out.described = path + ": the diagnosed config's plan";
      return out;
    }
    if (schema == "fsdpsim.simulate/1") {
      out.plan = resolve(sim::parse_plan(j.at("inputs").at("plan")));
      out.described = path + ": the simulated plan";
      return out;
    }
    out.plan = resolve(sim::parse_plan(j));
    out.described = "plan " + path;
    return out;
  } catch (const nlohmann::json::exception& e) {   // a document of ours with a key missing or mistyped
    throw InputError(field, path, std::string("a plan JSON or an fsdpsim plan/diagnose/simulate document (") + e.what() + ")");
  }
  planner::UserConfig cfg = planner::read_user_config(path, ro, model);
  out.plan = planner::user_plan(cfg, cl);
  out.described = cfg.format + " config " + path;
  return out;
}

}  // namespace fsdpsim::cli

#include "reports/plan_doc.h"

#include "reports/memory_align.h"

#include <algorithm>
#include <limits>

#include "common/errors.h"
#include "common/json_reader.h"

namespace fsdpsim::reports {

namespace {

using nlohmann::json;
constexpr double kHuge = std::numeric_limits<double>::max();
constexpr std::int64_t kMaxI64 = std::numeric_limits<std::int64_t>::max();

std::string idx(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

const json& array_at(const JsonReader& r, const std::string& key) {
  const json& a = r.raw(key);
  if (!a.is_array()) throw InputError(r.field(key), json_value_for_message(a), "expected an array");
  return a;
}

std::vector<std::string> string_list(const json& a, const std::string& path) {
  if (!a.is_array()) throw InputError(path, json_value_for_message(a), "expected an array of strings");
  std::vector<std::string> out;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_string()) throw InputError(idx(path, i), json_value_for_message(a[i]), "expected a string");
    out.push_back(a[i].get<std::string>());
  }
  return out;
}

std::vector<std::string> optional_string_list(const JsonReader& r, const std::string& key) {
  return r.has(key) ? string_list(r.raw(key), r.field(key)) : std::vector<std::string>{};
}

}  // namespace

ResultView read_result(const json& j, const std::string& path) {
  JsonReader r(j, path);
  ResultView v;
  JsonReader peak = r.get_object("peak_memory_bytes");
  v.peak_allocated_bytes = peak.get_double("allocated", 0, kHuge);
  v.peak_reserved_bytes = peak.get_double("reserved", 0, kHuge);
  v.context_bytes = peak.get_double("context", 0, kHuge, 0);
  v.peak_total_device_bytes = peak.get_double("total_device", 0, kHuge, v.peak_reserved_bytes + v.context_bytes);
  if (r.has("first_step_peak_memory_bytes"))
    v.first_step_peak_reserved_bytes = r.get_object("first_step_peak_memory_bytes").get_double("reserved", 0, kHuge);
  if (r.has("construction_peak_memory_bytes"))
    v.construction_peak_reserved_bytes = r.get_object("construction_peak_memory_bytes").get_double("reserved", 0, kHuge);
  v.capacity_bytes = r.get_double("capacity_bytes", 0, kHuge);
  v.fits = r.get_bool("fits");
  JsonReader bd = r.get_object("memory_breakdown_bytes");
  const json& bdj = r.raw("memory_breakdown_bytes");
  // Display order: the simulator's category order, then unknown categories by name (a newer
  // simulator may add one; the report shows it rather than dropping bytes).
  std::vector<std::string> known;
  for (int c = 0; c < sim::kNumMemCategories; ++c) known.push_back(sim::mem_category_name(static_cast<sim::MemCategory>(c)));
  for (const auto& k : known)
    if (bd.has(k)) v.breakdown.emplace_back(k, bd.get_double(k, 0, kHuge));
  for (auto it = bdj.begin(); it != bdj.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end())
      v.breakdown.emplace_back(it.key(), bd.get_double(it.key(), 0, kHuge));
  v.step_time_s = r.get_double("step_time_s", 0, kHuge);
  v.compute_s = r.get_double("compute_s", 0, kHuge, 0);
  v.comm_s = r.get_double("comm_s", 0, kHuge, 0);
  v.exposed_comm_s = r.get_double("exposed_comm_s", 0, kHuge, 0);
  v.tokens_per_s_per_gpu = r.get_double("tokens_per_s_per_gpu", 0, kHuge);
  v.mfu = r.get_double("mfu", 0, kHuge);
  v.peak_flops_per_s = r.get_double("peak_flops_per_s", 0, kHuge, 0);
  v.peak_flops_dtype = r.get_string("peak_flops_dtype", "");
  v.notes = optional_string_list(r, "notes");
  return v;
}

DetailView read_detail(const json& j, const std::string& path) {
  JsonReader r(j, path);
  DetailView d;
  d.result = read_result(j, path);
  if (r.has("trace")) {
    const json& t = array_at(r, "trace");
    d.trace.reserve(t.size());
    for (size_t i = 0; i < t.size(); ++i) {
      JsonReader s(t[i], idx(r.field("trace"), i));
      sim::TraceSpan sp;
      sp.name = s.get_string("name");
      sp.track = s.get_string("track");
      sp.kind = s.get_string("kind", "");
      sp.unit = static_cast<int>(s.get_int("unit", -1, 1 << 30, -1));
      sp.start_ns = s.get_int("start_ns", 0, kMaxI64);
      sp.dur_ns = s.get_int("dur_ns", 0, kMaxI64 - sp.start_ns);
      sp.bytes = s.get_int("bytes", 0, kMaxI64, 0);
      if (sp.track.empty()) throw InputError(s.field("track"), "\"\"", "a non-empty track name");
      d.trace.push_back(std::move(sp));
    }
  }
  if (r.has("memory_timeline")) {
    const json& m = array_at(r, "memory_timeline");
    d.memory_timeline.reserve(m.size());
    for (size_t i = 0; i < m.size(); ++i) {
      JsonReader s(m[i], idx(r.field("memory_timeline"), i));
      sim::MemorySample ms;
      ms.t_ns = s.get_int("t_ns", 0, kMaxI64);
      ms.allocated = s.get_int("allocated_bytes", 0, kMaxI64);
      ms.reserved = s.get_int("reserved_bytes", 0, kMaxI64);
      d.memory_timeline.push_back(ms);
    }
    // (a first and a steady step: the chart shows the steady one, whose peaks are the headline)
    d.memory_timeline = steady_step_samples(d.memory_timeline, r.get_int("steady_step_start_ns", 0, kMaxI64, 0));
  }
  return d;
}

PlanDocView read_plan_doc(const json& doc, const std::string& root) {
  JsonReader r(doc, root);
  std::string version = r.get_string("schema_version");
  if (version != kPlanSchemaVersion)
    throw InputError(r.field("schema_version"), "\"" + version + "\"", std::string("expected \"") + kPlanSchemaVersion + "\"");
  PlanDocView v;
  v.context = r.raw("context");
  JsonReader(v.context, r.field("context"));  // must be an object
  v.inputs = r.raw("inputs");
  JsonReader in(v.inputs, r.field("inputs"));
  in.get_object("model").get_string("name");
  in.get_object("cluster").get_string("name");
  if (r.has("search")) {
    v.search = r.raw("search");
    JsonReader(v.search, r.field("search"));
  }
  if (r.has("accuracy")) {
    const JsonReader mem = r.get_object("accuracy").get_object("memory");
    const JsonReader rsv = mem.get_object("steady_state_reserved");
    const JsonReader fits = mem.get_object("fits_verdicts");
    PlanDocView::MemoryAccuracy a;
    a.plans = static_cast<int>(mem.get_int("plans", 1, 1 << 30));
    a.reserved_within = static_cast<int>(rsv.get_int("within", 0, a.plans));
    a.reserved_tolerance = rsv.get_double("tolerance", 0, 1);
    a.reserved_mae = rsv.get_double("mean_abs_error", 0, 10);
    a.fits_compared = static_cast<int>(fits.get_int("compared", 0, 1 << 30));
    a.fits_agree = static_cast<int>(fits.get_int("agree", 0, a.fits_compared));
    v.memory_accuracy = a;
  }

  const json& cands = array_at(r, "candidates");
  for (size_t i = 0; i < cands.size(); ++i) {
    std::string p = idx(r.field("candidates"), i);
    JsonReader c(cands[i], p);
    CandidateView cv;
    cv.index = static_cast<int>(i);
    cv.rank = static_cast<int>(c.get_int("rank", 1, 1 << 30));
    cv.id = c.get_string("id");
    cv.label = c.get_string("label");
    cv.family = c.get_string("family");
    cv.plan = c.has("plan") ? c.raw("plan") : json::object();
    cv.result = read_result(c.raw("result"), c.field("result"));
    cv.fits_with_margin = c.get_bool("fits_with_margin", cv.result.fits);
    cv.pareto = c.get_bool("pareto", false);
    cv.why = optional_string_list(c, "why");
    v.candidates.push_back(std::move(cv));
  }
  if (r.has("other_candidates")) {
    // Summary rows: rank, id, label, family, fits, fits_with_margin, pareto, peak_total_device_bytes,
    // peak_allocated_bytes, step_time_s, tokens_per_s_per_gpu, mfu, exposed_comm_s (plan.schema.json).
    JsonReader o = r.get_object("other_candidates");
    const json& rows = array_at(o, "rows");
    const double capacity = JsonReader(v.inputs, r.field("inputs")).get_object("cluster").get_double("gpu_memory_bytes", 0, kHuge, 0);
    for (size_t i = 0; i < rows.size(); ++i) {
      const std::string p = idx(o.field("rows"), i);
      const json& row = rows[i];
      if (!row.is_array() || row.size() != 13) throw InputError(p, json_value_for_message(row), "an array of 13 values (see columns)");
      auto num = [&](size_t k) {
        if (!row[k].is_number() || !(row[k].get<double>() >= 0)) throw InputError(idx(p, k), json_value_for_message(row[k]), "a number >= 0");
        return row[k].get<double>();
      };
      auto str = [&](size_t k) {
        if (!row[k].is_string()) throw InputError(idx(p, k), json_value_for_message(row[k]), "a string");
        return row[k].get<std::string>();
      };
      auto flag = [&](size_t k) {
        if (!row[k].is_boolean()) throw InputError(idx(p, k), json_value_for_message(row[k]), "true or false");
        return row[k].get<bool>();
      };
      CandidateView cv;
      cv.index = static_cast<int>(v.candidates.size());
      cv.rank = static_cast<int>(num(0));
      cv.id = str(1);
      cv.label = str(2);
      cv.family = str(3);
      cv.result.fits = flag(4);
      cv.fits_with_margin = flag(5);
      cv.pareto = flag(6);
      cv.result.peak_total_device_bytes = num(7);
      cv.result.peak_allocated_bytes = num(8);
      cv.result.step_time_s = num(9);
      cv.result.tokens_per_s_per_gpu = num(10);
      cv.result.mfu = num(11);
      cv.result.exposed_comm_s = num(12);
      cv.result.capacity_bytes = capacity;
      cv.plan = json::object();
      cv.summary = true;
      v.candidates.push_back(std::move(cv));
    }
  }
  const int n = static_cast<int>(v.candidates.size());

  if (r.has("recommended")) {
    v.recommended = static_cast<int>(r.get_int("recommended", 0, std::max(0, n - 1)));
    if (n == 0) throw InputError(r.field("recommended"), json_value_for_message(r.raw("recommended")), "null (there are no candidates)");
  }
  if (r.has("pareto_front")) {
    const json& pf = array_at(r, "pareto_front");
    for (size_t i = 0; i < pf.size(); ++i) {
      if (!pf[i].is_number_integer() || pf[i].get<std::int64_t>() < 0 || pf[i].get<std::int64_t>() >= n)
        throw InputError(idx(r.field("pareto_front"), i), json_value_for_message(pf[i]),
                         "a candidate index in [0, " + std::to_string(n - 1) + "]");
      v.pareto_front.push_back(pf[i].get<int>());
    }
  }
  if (r.has("rejected_families")) {
    const json& rf = array_at(r, "rejected_families");
    for (size_t i = 0; i < rf.size(); ++i) {
      JsonReader f(rf[i], idx(r.field("rejected_families"), i));
      v.rejected_families.emplace_back(f.get_string("family"), f.get_string("reason"));
    }
  }
  if (r.has("explanations")) {
    JsonReader e = r.get_object("explanations");
    v.why_recommended = optional_string_list(e, "recommended");
    v.choices = optional_string_list(e, "choices");
    v.ddp_baseline = e.get_string("ddp_baseline", "");
    if (e.has("runners_up")) {
      const json& ru = array_at(e, "runners_up");
      for (size_t i = 0; i < ru.size(); ++i) v.runners_up.push_back(string_list(ru[i], idx(e.field("runners_up"), i)));
    }
  }
  if (r.has("exports")) {
    JsonReader ex = r.get_object("exports");
    const json& exj = r.raw("exports");
    std::vector<std::string> order = {"fsdp2", "torchtitan", "lightning", "accelerate"};
    for (auto it = exj.begin(); it != exj.end(); ++it)
      if (std::find(order.begin(), order.end(), it.key()) == order.end()) order.push_back(it.key());
    for (const auto& k : order) {
      if (!ex.has(k)) continue;
      JsonReader e = ex.get_object(k);
      ExportView ev;
      ev.key = k;
      ev.format = e.get_string("format");
      ev.target = e.get_string("target", "");
      ev.text = e.get_string("text");
      ev.unsupported = optional_string_list(e, "unsupported");
      ev.same_as_recommended = e.get_bool("same_as_recommended", true);
      ev.plan_label = e.get_string("plan_label", "");
      ev.source = e.get_string("source", "");
      ev.changed = optional_string_list(e, "changed");
      v.exports.push_back(std::move(ev));
    }
  }
  if (r.has("recommended_detail") && !r.raw("recommended_detail").is_null())
    v.detail = read_detail(r.raw("recommended_detail"), r.field("recommended_detail"));
  {
    JsonReader in(v.inputs, r.field("inputs"));
    const double margin = in.get_double("memory_margin", 0.0, 0.99, 0.0);
    double cap = in.get_object("cluster").get_double("gpu_memory_bytes", 0, kHuge, 0);
    if (cap <= 0 && !v.candidates.empty()) cap = v.candidates.front().result.capacity_bytes;
    v.usable_memory_bytes = in.get_double("usable_memory_bytes", 0, kHuge, cap * (1.0 - margin));
  }
  if (r.has("measured")) {
    v.measured = r.raw("measured");
    JsonReader(v.measured, r.field("measured"));
  }
  return v;
}

}  // namespace fsdpsim::reports

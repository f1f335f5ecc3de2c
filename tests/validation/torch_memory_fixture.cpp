// Reading and comparing PyTorch memory fixtures (torch_memory_fixture.h).
#include "torch_memory_fixture.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/errors.h"
#include "common/json_reader.h"
#include "models/zoo.h"
#include "sim/simulator.h"

namespace fsdpsim::validation {
namespace {

const char* kSchema = "fsdpsim.torch_memory_fixture/1";
// Plan keys issue 19 adds to the simulator (scripts/torch_memory/plan.py NEW_KEYS): a fixture naming one
// the simulator does not know yet is skipped with a message, not failed.
const std::vector<std::string> kIssue19Keys = {"implementation", "compile", "float8", "alloc_conf",
                                               "free_logits_before_backward", "optimizer_impl", "module_overrides"};

// The issue-19 key an "unknown key" error of parse_plan names, or "".
std::string pending_issue19_key(const InputError& e) {
  if (e.allowed().rfind("unknown key", 0) != 0) return "";
  for (const auto& k : kIssue19Keys)
    if (e.field() == "plan." + k) return k;
  return "";
}

// ModelSpec fields added after fixtures were measured, with the value every ModelSpec had before them: a fixture
// without the key was measured on a model with that value.
Json value_before_the_field(const std::string& key, const models::ModelSpec& model) {
  if (key == "parallel_residual" || key == "lm_head_bias") return false;
  if (key == "rotary_dim") return model.positions == models::PositionKind::Rotary ? model.head_dim : 0;
  return Json();   // (not such a field: a missing key is a different ModelSpec)
}

void check_model_spec(const Json& spec, const models::ModelSpec& model, const JsonReader& c) {
  const std::string field = c.field("model_spec");
  if (!spec.is_object()) throw InputError(field, json_value_for_message(spec), "expected the ModelSpec object");
  const Json zoo = models::model_to_json(model);
  for (const auto& [key, value] : zoo.items()) {
    if (!spec.contains(key) && value_before_the_field(key, model) == value) continue;
    if (!spec.contains(key) || spec[key] != value)
      throw InputError(field + "." + key, spec.contains(key) ? json_value_for_message(spec[key]) : "<missing>",
                       "the zoo's " + model.name + " has " + value.dump() +
                           ": the fixture was measured on another ModelSpec; measure it again");
  }
  for (const auto& [key, value] : spec.items())
    if (!zoo.contains(key))
      throw InputError(field + "." + key, json_value_for_message(value), "not a ModelSpec field of this fsdpsim");
}

Peak read_peak(const JsonReader& peaks, const std::string& key) {
  JsonReader p = peaks.get_object(key);
  constexpr std::int64_t kMaxBytes = std::int64_t{1} << 50;
  return {p.get_int("allocated_bytes", 0, kMaxBytes), p.get_int("reserved_bytes", 0, kMaxBytes)};
}

TorchMemoryFixture parse_unchecked(const Json& j, const std::string& file) {
  if (!j.is_object()) throw InputError("fixture", json_value_for_message(j), "expected a JSON object");
  JsonReader r(j, "");
  TorchMemoryFixture f;
  f.file = file;
  r.get_enum("schema", {kSchema});
  f.synthetic = r.get_bool("synthetic", false);
  if (f.synthetic) f.synthetic_reason = r.get_string("synthetic_reason");
  f.outcome = r.get_enum("outcome", {"ok", "oom"});

  JsonReader c = r.get_object("case");
  f.name = c.get_string("name");
  f.model = models::load_model(c.get_string("model"), c.field("model"));
  check_model_spec(c.raw("model_spec"), f.model, c);
  f.cluster = calibrate::load_cluster(c.get_string("cluster"), c.field("cluster"));
  const std::int64_t world = c.get_int("world", 1, 1 << 20);
  if (world != f.cluster.world())
    throw InputError(c.field("world"), std::to_string(world),
                     "the cluster " + f.cluster.name + " has " + std::to_string(f.cluster.world()) + " GPUs");
  f.plan_json = c.raw("plan");
  if (!f.plan_json.is_object()) throw InputError(c.field("plan"), json_value_for_message(f.plan_json), "expected a plan object");
  try {
    f.plan = sim::parse_plan(f.plan_json);
    sim::resolve_plan(*f.plan, f.cluster.world(), f.cluster.gpus_per_node);
  } catch (const InputError& e) {
    f.pending_key = pending_issue19_key(e);
    if (f.pending_key.empty()) throw InputError("case." + e.field(), e.value(), e.allowed());
    f.plan.reset();
    f.pending_message = e.what();
    // The README keys are still checked: the plan without the issue-19 keys must parse.
    Json known = f.plan_json;
    for (const auto& k : kIssue19Keys) known.erase(k);
    try {
      sim::resolve_plan(sim::parse_plan(known), f.cluster.world(), f.cluster.gpus_per_node);
    } catch (const InputError& e2) {
      throw InputError("case." + e2.field(), e2.value(), e2.allowed());
    }
  }

  if (f.outcome == "ok") {
    JsonReader peaks = r.get_object("peaks");
    f.steady = read_peak(peaks, "steady_state");
    f.first = read_peak(peaks, "first_step");
  } else {
    r.get_object("oom").get_string("phase");
  }
  if (r.has("repeats")) {
    if (f.outcome != "ok") throw InputError("repeats", "[...]", "only a fixture whose run completed (outcome ok) has repeats");
    const Json& a = r.raw("repeats");
    if (!a.is_array() || a.empty()) throw InputError("repeats", json_value_for_message(a), "a non-empty array");
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::string at = "repeats[" + std::to_string(i) + "]";
      if (!a[i].is_object()) throw InputError(at, json_value_for_message(a[i]), "expected an object");
      JsonReader e(a[i], at);
      RepeatRun run;
      run.date = e.get_string("date");
      run.conditions = e.get_string("conditions");
      if (run.conditions.size() < 10)
        throw InputError(e.field("conditions"), json_value_for_message(e.raw("conditions")), "say how the run was made");
      JsonReader peaks = e.get_object("peaks");
      run.first = read_peak(peaks, "first_step");
      run.steady = read_peak(peaks, "steady_state");
      f.repeats.push_back(run);
    }
  }
  if (r.has("known_miss")) {
    JsonReader k = r.get_object("known_miss");
    f.known_miss = true;
    f.known_miss_reason = k.get_string("reason");
    if (f.known_miss_reason.size() < 10)
      throw InputError(k.field("reason"), json_value_for_message(k.raw("reason")), "say why the miss is expected");
    if (k.has("metrics")) {
      const Json& m = k.raw("metrics");
      const std::vector<std::string> names = {"steady_state.allocated", "steady_state.reserved", "first_step.allocated",
                                              "first_step.reserved", "fits"};
      if (!m.is_array() || m.empty()) throw InputError(k.field("metrics"), json_value_for_message(m), "a non-empty array");
      for (const auto& e : m) {
        if (!e.is_string() || std::find(names.begin(), names.end(), e.get<std::string>()) == names.end())
          throw InputError(k.field("metrics"), json_value_for_message(e),
                           "expected steady_state.allocated, steady_state.reserved, first_step.allocated, "
                           "first_step.reserved or fits");
        f.known_miss_metrics.push_back(e.get<std::string>());
      }
    }
  }
  return f;
}

// One figure against the measured range [lo, hi] (the fixture's run and its repeats): inside it the error
// is 0; outside, it is taken from the nearer end, and the tolerance is checked in integer bytes against it:
// |predicted - nearest| * 1000 <= tolerance_permille * nearest.
Metric bytes_metric(const std::string& name, Bytes measured, Bytes lo, Bytes hi, Bytes predicted, double tolerance) {
  Metric m;
  m.name = name;
  m.measured = static_cast<double>(measured);
  m.measured_lo = static_cast<double>(lo);
  m.measured_hi = static_cast<double>(hi);
  m.predicted = static_cast<double>(predicted);
  m.tolerance = tolerance;
  const Bytes nearest = predicted < lo ? lo : predicted > hi ? hi : predicted;
  m.error = nearest > 0 ? static_cast<double>(predicted - nearest) / static_cast<double>(nearest)
                        : (predicted > 0 ? 1.0 : 0.0);
  const auto permille = static_cast<std::int64_t>(std::llround(tolerance * 1000));
  const std::int64_t diff = predicted > nearest ? predicted - nearest : nearest - predicted;
  m.miss = diff * 1000 > permille * nearest;
  return m;
}

// The range of one figure over the fixture's run and its repeats.
std::pair<Bytes, Bytes> measured_range(const TorchMemoryFixture& f, bool first_step, bool allocated) {
  auto pick = [&](const Peak& first, const Peak& steady) {
    const Peak& p = first_step ? first : steady;
    return allocated ? p.allocated : p.reserved;
  };
  Bytes lo = pick(f.first, f.steady), hi = lo;
  for (const auto& run : f.repeats) {
    lo = std::min(lo, pick(run.first, run.steady));
    hi = std::max(hi, pick(run.first, run.steady));
  }
  return {lo, hi};
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / static_cast<double>(kGiB));
  return buf;
}

}  // namespace

TorchMemoryFixture parse_torch_memory_fixture(const Json& j, const std::string& file) {
  try {
    return parse_unchecked(j, file);
  } catch (const InputError& e) {
    throw InputError(file + ": " + e.field(), e.value(), e.allowed());
  }
}

TorchMemoryFixture read_torch_memory_fixture(const std::string& path) {
  const std::string file = path.substr(path.find_last_of('/') + 1);
  return parse_torch_memory_fixture(read_json_file(path, file), file);
}

// The simulator's first step (optimizer state created in it, sim/sim_result.h); none from a result that
// did not replay one.
std::optional<Peak> predicted_first_step(const sim::SimResult& r) {
  if (r.first_step_peak_allocated <= 0) return std::nullopt;
  Peak p;
  p.allocated = r.first_step_peak_allocated;
  p.reserved = r.first_step_peak_reserved;
  return p;
}

bool Comparison::failed() const {
  return std::any_of(metrics.begin(), metrics.end(), [](const Metric& m) { return m.miss && !m.explained; });
}

bool Comparison::missed() const {
  return std::any_of(metrics.begin(), metrics.end(), [](const Metric& m) { return m.miss; });
}

Comparison compare(const TorchMemoryFixture& f, const sim::SimResult& r) {
  Comparison c;
  if (f.outcome == "ok") {
    const std::optional<Peak> first = predicted_first_step(r);
    for (const bool first_step : {false, true}) {
      for (const bool alloc : {true, false}) {
        const std::string name = std::string(first_step ? "first_step." : "steady_state.") + (alloc ? "allocated" : "reserved");
        const Peak& own = first_step ? f.first : f.steady;
        const Bytes measured = alloc ? own.allocated : own.reserved;
        if (first_step && !first) {
          Metric m;
          m.name = name;
          m.compared = false;
          m.measured = m.measured_lo = m.measured_hi = static_cast<double>(measured);
          c.metrics.push_back(m);
          continue;
        }
        const Peak& pred = first_step ? *first : Peak{r.peak_allocated, r.peak_reserved};
        const auto [lo, hi] = measured_range(f, first_step, alloc);
        c.metrics.push_back(bytes_metric(name, measured, lo, hi, alloc ? pred.allocated : pred.reserved,
                                         alloc ? kAllocatedTolerance : kReservedTolerance));
      }
    }
  }
  Metric fits;
  fits.name = "fits";
  fits.measured = f.outcome == "ok" ? 1 : 0;
  fits.predicted = r.fits ? 1 : 0;
  fits.miss = fits.measured != fits.predicted;
  c.metrics.push_back(fits);
  for (auto& m : c.metrics) {
    const bool listed = f.known_miss_metrics.empty() ||
                        std::find(f.known_miss_metrics.begin(), f.known_miss_metrics.end(), m.name) != f.known_miss_metrics.end();
    m.explained = m.miss && f.known_miss && listed;
  }
  return c;
}

Comparison compare_with_simulator(const TorchMemoryFixture& f) {
  sim::SimOptions opts;
  opts.record_trace = false;
  opts.record_memory_timeline = false;
  const calibrate::HardwareProfile hw = calibrate::HardwareProfile::for_cluster(f.cluster);
  return compare(f, sim::simulate(f.model, hw, *f.plan, opts));
}

FixtureSummary summarize(const std::vector<std::pair<TorchMemoryFixture, Comparison>>& rows) {
  FixtureSummary s;
  const char* const* names = FixtureSummary::kNames;
  for (const auto& [f, c] : rows)
    for (const auto& m : c.metrics) {
      if (m.name == "fits") {
        ++s.fits_total;
        s.fits_agree += m.miss ? 0 : 1;
        continue;
      }
      const int i = static_cast<int>(std::find(names, names + 4, m.name) - names);
      if (i >= 4 || !m.compared) continue;
      ++s.compared[i];
      s.within[i] += m.miss ? 0 : 1;
      s.mean_abs_error[i] += std::fabs(m.error);
    }
  for (int i = 0; i < 4; ++i)
    if (s.compared[i] > 0) s.mean_abs_error[i] /= s.compared[i];
  return s;
}

std::string comparison_table(const std::vector<std::pair<TorchMemoryFixture, Comparison>>& rows) {
  std::ostringstream o;
  char line[320];
  std::snprintf(line, sizeof line, "%-40s %-7s %21s %8s %21s %8s %10s %10s %-9s %s\n", "fixture", "outcome",
                "allocated GiB meas/pred", "err %", "reserved GiB meas/pred", "err %", "1st alloc%", "1st rsv%",
                "fits", "verdict");
  o << line;
  const char* const* names = FixtureSummary::kNames;
  for (const auto& [f, c] : rows) {
    std::string cells[4][2];
    std::string fits = "-";
    for (const auto& m : c.metrics) {
      if (m.name == "fits") {
        fits = std::string(m.measured > 0 ? "ran" : "OOM") + "/" + (m.predicted > 0 ? "fits" : "OOM");
        continue;
      }
      const int i = static_cast<int>(std::find(names, names + 4, m.name) - names);
      if (i >= 4 || !m.compared) continue;
      char err[16];
      std::snprintf(err, sizeof err, "%+.1f%s", 100 * m.error, f.repeats.empty() ? "" : "~");
      cells[i][0] = gib(m.measured) + " / " + gib(m.predicted);
      cells[i][1] = err;
    }
    const std::string verdict = c.failed() ? "MISS" : c.missed() ? "known miss" : "ok";
    std::snprintf(line, sizeof line, "%-40s %-7s %21s %8s %21s %8s %10s %10s %-9s %s\n", f.name.c_str(),
                  f.outcome.c_str(), cells[0][0].c_str(), cells[0][1].c_str(), cells[1][0].c_str(), cells[1][1].c_str(),
                  cells[2][1].c_str(), cells[3][1].c_str(), fits.c_str(), verdict.c_str());
    o << line;
  }
  // The summary: per compared metric, how many lie within its tolerance and the mean absolute error.
  const FixtureSummary sum = summarize(rows);
  for (int i = 0; i < 4; ++i) {
    if (sum.compared[i] == 0) continue;
    std::snprintf(line, sizeof line, "%-24s within %.0f%% on %d of %d, mean absolute error %.2f%%\n", names[i],
                  100 * (i % 2 == 0 ? kAllocatedTolerance : kReservedTolerance), sum.within[i], sum.compared[i],
                  100 * sum.mean_abs_error[i]);
    o << line;
  }
  const int fits_agree = sum.fits_agree, fits_total = sum.fits_total;
  std::snprintf(line, sizeof line, "%-24s agree on %d of %d\n", "fits verdicts", fits_agree, fits_total);
  o << line;
  // The fixtures measured more than once (~): the spread of each figure that differs between the runs; the
  // errors above are taken from the nearer end of that range (0 inside it).
  for (const auto& [f, c] : rows) {
    if (f.repeats.empty()) continue;
    std::string spread;
    for (const auto& m : c.metrics) {
      if (m.name == "fits" || m.measured_hi <= m.measured_lo) continue;
      char part[160];
      std::snprintf(part, sizeof part, "%s%s %s..%s GiB (%.1f%%, predicted %s)", spread.empty() ? "" : "; ", m.name.c_str(),
                    gib(m.measured_lo).c_str(), gib(m.measured_hi).c_str(), 100 * (m.measured_hi / m.measured_lo - 1),
                    m.compared ? gib(m.predicted).c_str() : "-");
      spread += part;
    }
    o << "runs " << f.name << " (" << f.repeats.size() + 1 << "): " << (spread.empty() ? "every figure identical" : spread)
      << "\n";
  }
  return o.str();
}

}  // namespace fsdpsim::validation

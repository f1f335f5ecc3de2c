// The simulator against PyTorch itself (issue 19): every measured fixture in tests/fixtures/torch_memory/
// must match sim::simulate within 2% of the allocated and 3% of the reserved steady-state peak, with the
// same fits/OOM call; a miss passes only with a known_miss entry that says why (printed). The reader and
// the comparison are tested on the hand-written fixtures of tests/fixtures/torch_memory/synthetic/.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/json_reader.h"
#include "models/wrap_graph.h"
#include "program/lowering.h"
#include "sim/accuracy.h"
#include "sim/memory_tracker.h"
#include "sim/simulator.h"
#include "torch_memory_fixture.h"

namespace fsdpsim::validation {
namespace {

namespace fs = std::filesystem;
const std::string kDir = std::string(FSDPSIM_SOURCE_DIR) + "/tests/fixtures/torch_memory";

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.2f%%", 100 * fraction);
  return buf;
}

std::vector<std::string> fixture_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".json" && e.path().filename() != "schema.json")
      out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

Json synthetic(const std::string& name) { return read_json_file(kDir + "/synthetic/" + name, name); }

const Metric& metric(const Comparison& c, const std::string& name) {
  for (const auto& m : c.metrics)
    if (m.name == name) return m;
  throw std::runtime_error("no metric " + name);
}

// A malformed fixture: the field its InputError must name, and how a good fixture is spoiled.
struct SpoilCase {
  std::string field;
  void (*spoil)(Json&);
};

// Every spoiled copy of `good` is refused with an InputError naming the file and that field.
void expect_each_spoil_names_its_field(const Json& good, const std::vector<SpoilCase>& cases) {
  for (const auto& c : cases) {
    Json j = good;
    c.spoil(j);
    try {
      parse_torch_memory_fixture(j, "spoiled.json");
      ADD_FAILURE() << "accepted a fixture with a bad " << c.field;
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), "spoiled.json: " + c.field) << e.what();
    }
  }
}

// What the outputs state about memory (sim/accuracy.h, "How close these predictions have come to measurements")
// is what these fixtures measure: counts exact, mean absolute errors to the two decimals of a percent printed.
// A change that moves them fails here until the record is updated.
void expect_record_is_current(const FixtureSummary& s) {
  const sim::ValidationRecord& r = sim::validation_record();
  const sim::MetricRecord* rec[4] = {&r.steady_allocated, &r.steady_reserved, &r.first_allocated, &r.first_reserved};
  for (int i = 0; i < 4; ++i) {
    const std::string what = std::string(FixtureSummary::kNames[i]) + ": update sim/accuracy.cpp to what the fixtures measure";
    EXPECT_EQ(rec[i]->within, s.within[i]) << what;
    EXPECT_EQ(rec[i]->compared, s.compared[i]) << what;
    EXPECT_NEAR(rec[i]->mean_abs_error, s.mean_abs_error[i], 0.00005) << what;
    EXPECT_DOUBLE_EQ(rec[i]->tolerance, i % 2 == 0 ? kAllocatedTolerance : kReservedTolerance) << what;
  }
  EXPECT_EQ(r.memory_plans, s.compared[1]);
  EXPECT_EQ(r.fits_agree, s.fits_agree);
  EXPECT_EQ(r.fits_compared, s.fits_total);
}

TEST(TorchMemoryFixtures, MeasuredFixturesMatchTheSimulator) {
  std::vector<std::pair<TorchMemoryFixture, Comparison>> rows;
  std::vector<std::string> pending;
  for (const auto& path : fixture_files(kDir)) {
    TorchMemoryFixture f;
    try {
      f = read_torch_memory_fixture(path);
    } catch (const InputError& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    if (f.synthetic) continue;   // hand-written fixtures test the reader below, they are not measurements
    if (!f.plan) {
      pending.push_back(f.file + " (" + f.pending_key + ")");
      continue;
    }
    rows.emplace_back(f, compare_with_simulator(f));
  }
  if (!rows.empty()) std::cout << comparison_table(rows);
  if (!rows.empty()) expect_record_is_current(summarize(rows));
  for (const auto& [f, c] : rows) {
    // A known_miss whose figures all agree now is stale: its reason no longer describes the simulator.
    if (f.known_miss && std::none_of(c.metrics.begin(), c.metrics.end(), [](const auto& m) { return m.miss; }))
      ADD_FAILURE() << f.file << ": every figure is within tolerance but the fixture still has a known_miss; remove it";
    for (const auto& m : c.metrics) {
      if (!m.miss) continue;
      if (m.explained) {
        std::cout << "known miss " << f.file << " " << m.name << " (" << percent(m.error) << "): " << f.known_miss_reason << "\n";
      } else {
        ADD_FAILURE() << f.file << ": " << m.name << " predicted " << static_cast<std::int64_t>(m.predicted) << ", measured "
                      << static_cast<std::int64_t>(m.measured) << " (" << percent(m.error) << ", tolerance "
                      << percent(m.tolerance) << "); explain it with a known_miss entry or fix the simulator";
      }
    }
  }
  for (const auto& p : pending)
    std::cout << "skipped " << p << ": the simulator does not accept this issue-19 plan key yet\n";
  if (rows.empty() && !HasFailure())
    GTEST_SKIP() << (pending.empty() ? "no measured fixtures committed yet: run scripts/gpu-validate.sh torch-memory on a "
                                       "lent GPU (README, 'On a lent GPU')"
                                     : "every measured fixture names an issue-19 plan key the simulator does not accept yet");
}

// The reserved bytes at the end of a fixture's init phase (the reader keeps the peaks only: from the file); -1: none.
// PyTorch's reserved (or allocated) bytes at the end of the harness's init phase; -1 without one.
Bytes init_end_bytes(const std::string& path, const char* key = "end_reserved_bytes") {
  const Json j = read_json_file(path, path);
  for (const auto& ph : j.at("phases"))
    if (ph.at("phase") == "init") return ph.at(key).get<Bytes>();
  return -1;
}

double relative_error(Bytes predicted, Bytes measured) {
  return measured > 0 ? static_cast<double>(predicted - measured) / static_cast<double>(measured) : (predicted == 0 ? 0.0 : 1.0);
}

// A step-start comparison: `ok` expected unless the fixture is listed in `differs` (then printed with the reason).
void expect_step_start(const std::map<std::string, std::string>& differs, const std::string& name, bool ok,
                       Bytes predicted, Bytes measured, double err) {
  const auto d = differs.find(name);
  if (d != differs.end()) {
    EXPECT_FALSE(ok) << name << ": matches now (" << predicted << " B); remove it from the list";
    std::cout << "differs " << name << ": predicted " << predicted << " B, measured " << measured << " B ("
              << percent(err) << "): " << d->second << "\n";
  } else {
    EXPECT_TRUE(ok) << name << ": the step starts at " << predicted << " B reserved, PyTorch's init ended at " << measured
                    << " B (" << percent(err) << ")";
  }
}

// Where the step starts: FSDP2 keeps each parameter's shard as a tensor of its own, which the caching
// allocator places one by one when the model is materialized (the harness: fully_shard on the meta device,
// to_empty, initialization in place, torch.cuda.empty_cache). The simulator's persistent buffers (its memory
// at t = 0, before the first op) must then leave the same reserved bytes as the harness's "init" phase
// ends with, within 0.5%, on every measured FSDP2 fixture but those listed below with what differs.
// (FSDP1 is compared by the next test, before the lazy initialization that the simulator's t = 0 includes and
// PyTorch runs in the first forward.)
TEST(TorchMemoryFixtures, Fsdp2StepStartsFromTheSegmentsInitializationLeft) {
  // fixture -> what differs (the measured and predicted bytes are printed)
  const std::map<std::string, std::string> differs = {
      {"gpt2-fsdp2-w8-fused", "expandable segments: PyTorch's init leaves 96 MiB mapped (16 MiB small-pool pages, "
                              "80 MiB large-pool pages), the simulator 74 MiB; not explained yet"},
      {"l1b-fsdp2-raf8-w64-tt", "not explained yet (100 MiB against 80 MiB; no allocator history of this case)"},
  };
  int compared = 0, exact = 0, within = 0;
  for (const auto& path : fixture_files(kDir)) {
    const TorchMemoryFixture f = read_torch_memory_fixture(path);
    if (f.synthetic || !f.plan || f.plan->fsdp_version != sim::FsdpVersion::FSDP2) continue;
    const std::string name = fs::path(path).stem().string();
    // QLoRA: the harness quantizes whole weights on the GPU before sharding (load-time fragmentation, not
    // modelled: the known misses of the QLoRA fixtures measure it).
    if (f.plan->lora.quantize_nf4) continue;
    const Bytes init_reserved = init_end_bytes(path);
    ASSERT_GE(init_reserved, 0) << name << ": no init phase";
    sim::SimOptions o;
    o.record_trace = false;
    o.record_memory_timeline = true;
    const sim::SimResult r = sim::simulate(f.model, calibrate::HardwareProfile::for_cluster(f.cluster), *f.plan, o);
    ASSERT_FALSE(r.memory_timeline.empty()) << name;
    ASSERT_EQ(r.memory_timeline.front().t_ns, 0) << name;
    const Bytes predicted = r.memory_timeline.front().reserved;
    ++compared;
    exact += predicted == init_reserved ? 1 : 0;
    const double err = relative_error(predicted, init_reserved);
    const bool ok = std::abs(err) <= 0.005;
    within += ok ? 1 : 0;
    expect_step_start(differs, name, ok, predicted, init_reserved, err);
  }
  std::cout << "FSDP2 step start (reserved after init): " << exact << " of " << compared << " byte for byte, " << within
            << " within 0.5%\n";
  EXPECT_GT(compared, 40);
}

// FSDP1's construction (StepProgram::init_flatten_world: each unit's original parameters materialized, its
// FlatParameter flattened whole, then this rank's chunk cloned, then the originals freed (Buffer::init_originals); the
// blocks (a LoRA block's adapters first: a FlatParameter of their own) before the root; then the training loop's batch
// and rotary tables (Buffer::after_construction), then the harness's empty_cache): the reserved and allocated bytes it
// leaves against PyTorch's at the end of the harness's init phase, before the lazy init of the first forward (which
// the simulator replays after it: init_scratch, left out here). Every FSDP1 fixture, to the byte. (Until 2026-11-29
// the simulator left out the batch and the rotary tables, then every fixture was one 2 MiB small-pool segment short;
// and until the originals and the LoRA adapters' FlatParameter apart were modelled, gpt2-fsdp1-w8-hf was 20 MiB short
// (it has no allocator history to show where) and l1b-fsdp1-lora-r16-qkv-hf 2 MiB short with 16 x 73,728 B less
// allocated: its adapters' shards, small-pool tensors of their own in PyTorch; and until each offloaded shard was
// made on the device and moved to the CPU (StepProgram::init_offloaded), l1b-fsdp1-offload-w8-hf's construction was
// not modelled.)
TEST(TorchMemoryFixtures, Fsdp1StepStartsFromTheSegmentsConstructionLeft) {
  const std::map<std::string, std::string> differs = {};
  const std::map<std::string, std::string> construction_differs = {
      {"l1b-fsdp1-orig-lora-r8-qv-litgpt", "peak allocated exact, reserved 12 MiB above PyTorch's (3,110,076,416 B "
                                           "against 3,097,493,504): use_orig_params with litgpt's fused-qkv adapters "
                                           "(no allocator history of its construction)"},
  };
  int compared = 0, exact = 0, exact_allocated = 0, exact_construction = 0;
  for (const auto& path : fixture_files(kDir)) {
    const TorchMemoryFixture f = read_torch_memory_fixture(path);
    if (f.synthetic || !f.plan || f.plan->fsdp_version != sim::FsdpVersion::FSDP1) continue;
    const std::string name = fs::path(path).stem().string();
    if (f.plan->lora.quantize_nf4) continue;   // (bitsandbytes' QLoRA: not modelled, StepProgram::init_flatten_world)
    const Bytes init_reserved = init_end_bytes(path);
    ASSERT_GE(init_reserved, 0) << name << ": no init phase";
    const calibrate::Cluster& cl = f.cluster;
    const sim::Plan plan = sim::resolve_plan(*f.plan, cl.world(), cl.gpus_per_node);
    sim::StepProgram p = sim::lower(f.model, models::build_wrap_graph(f.model, plan.auto_wrap_policy), plan,
                                    sim::Topology{cl.world(), cl.gpus_per_node});
    p.init_scratch.clear();
    sim::MemoryTracker t(p, 0, false);
    t.allocate_persistent();
    const Bytes predicted = t.stats().reserved;
    ++compared;
    exact += predicted == init_reserved ? 1 : 0;
    const bool ok = predicted == init_reserved;
    const double err = relative_error(predicted, init_reserved);
    expect_step_start(differs, name, ok, predicted, init_reserved, err);
    const Bytes init_allocated = init_end_bytes(path, "end_allocated_bytes");
    EXPECT_EQ(t.stats().allocated, init_allocated) << name << ": allocated at the step's start";
    exact_allocated += t.stats().allocated == init_allocated ? 1 : 0;
    // The construction's own peaks (the originals, the flattened whole and the shard of the unit being made, on the
    // shards made before), against the harness's init phase: byte for byte where the construction is modelled.
    const Bytes peak_alloc = init_end_bytes(path, "peak_allocated_bytes");
    const Bytes peak_rsv = init_end_bytes(path, "peak_reserved_bytes");
    const bool modelled = p.init_flatten_world >= 1;
    const auto c = construction_differs.find(name);
    if (c != construction_differs.end()) {
      EXPECT_FALSE(t.construction_peak_allocated() == peak_alloc && t.construction_peak_reserved() == peak_rsv)
          << name << ": its construction peaks match now; remove it from the list";
      std::cout << "construction " << name << ": predicted " << t.construction_peak_allocated() << " / "
                << t.construction_peak_reserved() << " B, measured " << peak_alloc << " / " << peak_rsv << " B: "
                << c->second << "\n";
    } else {
      EXPECT_TRUE(modelled) << name;
      EXPECT_EQ(t.construction_peak_allocated(), peak_alloc) << name << ": the construction's peak allocated";
      EXPECT_EQ(t.construction_peak_reserved(), peak_rsv) << name << ": the construction's peak reserved";
      exact_construction += t.construction_peak_allocated() == peak_alloc && t.construction_peak_reserved() == peak_rsv;
    }
  }
  std::cout << "FSDP1 step start (after construction): reserved " << exact << " of " << compared << ", allocated "
            << exact_allocated << " of " << compared << " byte for byte; the construction's peaks (allocated and "
            << "reserved) " << exact_construction << " of " << compared << "\n";
  EXPECT_GT(compared, 10);
}

TEST(TorchMemoryFixtureReader, SyntheticFixturesSayWhy) {
  for (const auto& path : fixture_files(kDir + "/synthetic")) {
    const TorchMemoryFixture f = read_torch_memory_fixture(path);
    EXPECT_TRUE(f.synthetic) << path;
    EXPECT_GE(f.synthetic_reason.size(), 10u) << path;
  }
}

TEST(TorchMemoryFixtureReader, AFixtureFarFromThePredictionIsAMiss) {
  const TorchMemoryFixture f = parse_torch_memory_fixture(synthetic("synthetic-miss.json"), "synthetic-miss.json");
  ASSERT_TRUE(f.plan.has_value());
  EXPECT_EQ(f.steady.allocated, std::int64_t{1} << 30);        // 1 GiB as written
  EXPECT_EQ(f.steady.reserved, std::int64_t{3} << 29);         // 1.5 GiB
  const Comparison c = compare_with_simulator(f);
  EXPECT_TRUE(metric(c, "steady_state.allocated").miss);
  EXPECT_TRUE(metric(c, "steady_state.reserved").miss);
  EXPECT_FALSE(metric(c, "fits").miss);                         // it ran; llama-1b on 8 GPUs fits
  EXPECT_TRUE(c.failed());
  std::cout << comparison_table({{f, c}});
}

TEST(TorchMemoryFixtureReader, AKnownMissIsAWarning) {
  const TorchMemoryFixture f = parse_torch_memory_fixture(synthetic("synthetic-known-miss.json"), "synthetic-known-miss.json");
  EXPECT_TRUE(f.known_miss);
  const Comparison c = compare_with_simulator(f);
  EXPECT_TRUE(c.missed());
  EXPECT_FALSE(c.failed());
  EXPECT_TRUE(metric(c, "steady_state.allocated").explained);
  // The reason covers only the listed metrics: a fits miss would still fail.
  TorchMemoryFixture oom = f;
  oom.outcome = "oom";
  const Comparison c2 = compare_with_simulator(oom);
  EXPECT_TRUE(metric(c2, "fits").miss);
  EXPECT_FALSE(metric(c2, "fits").explained);
  EXPECT_TRUE(c2.failed());
}

TEST(TorchMemoryFixtureReader, AnOomOfAPlanThatFitsIsAFitsMiss) {
  const TorchMemoryFixture f = parse_torch_memory_fixture(synthetic("synthetic-oom.json"), "synthetic-oom.json");
  const Comparison c = compare_with_simulator(f);
  ASSERT_EQ(c.metrics.size(), 1u);        // an OOM run has no peaks to compare, only the call
  EXPECT_TRUE(metric(c, "fits").miss);
  EXPECT_TRUE(c.failed());
}

// Figures equal to the simulator's pass; the tolerances are 2% (allocated) and 3% (reserved) of the
// measured value, checked in whole bytes.
TEST(TorchMemoryFixtureReader, MatchingFiguresPassAndTheTolerancesHold) {
  TorchMemoryFixture f = parse_torch_memory_fixture(synthetic("synthetic-miss.json"), "synthetic-miss.json");
  sim::SimOptions opts;
  opts.record_trace = false;
  opts.record_memory_timeline = false;
  const sim::SimResult r = sim::simulate(f.model, calibrate::HardwareProfile::for_cluster(f.cluster), *f.plan, opts);
  f.steady = {r.peak_allocated, r.peak_reserved};
  f.first = {r.first_step_peak_allocated, r.first_step_peak_reserved};
  EXPECT_FALSE(compare(f, r).missed());

  // Hand-made result against measured 1,000,000 / 1,000,000 bytes:
  sim::SimResult near;
  near.fits = true;
  f.steady = {1'000'000, 1'000'000};
  near.peak_allocated = 1'020'000;   // +2.0% exactly: inside
  near.peak_reserved = 970'000;      // -3.0% exactly: inside
  EXPECT_FALSE(compare(f, near).missed());
  near.peak_allocated = 1'020'001;   // 20,001 B > 2% of 1,000,000
  EXPECT_TRUE(metric(compare(f, near), "steady_state.allocated").miss);
  near.peak_reserved = 969'999;      // 30,001 B > 3%
  EXPECT_TRUE(metric(compare(f, near), "steady_state.reserved").miss);
  EXPECT_NEAR(metric(compare(f, near), "steady_state.allocated").error, 0.020001, 1e-9);
}

// A fixture measured more than once (`repeats`) is compared with the measured range: a prediction inside it
// has no error, one outside it is measured from the nearer end, with the same tolerances.
TEST(TorchMemoryFixtureReader, RepeatedRunsAreComparedAsARange) {
  Json j = synthetic("synthetic-miss.json");
  j["peaks"]["steady_state"]["reserved_bytes"] = 1'000'000;
  j["repeats"] = Json::array({{{"date", "d"}, {"command", "c"}, {"gpu", "g"}, {"torch", "t"},
                               {"conditions", "alone on the GPU, no history"},
                               {"peaks", {{"first_step", j["peaks"]["first_step"]},
                                          {"steady_state", {{"allocated_bytes", j["peaks"]["steady_state"]["allocated_bytes"]},
                                                            {"reserved_bytes", 1'100'000}}}}}}});
  const TorchMemoryFixture f = parse_torch_memory_fixture(j, "repeats.json");
  ASSERT_EQ(f.repeats.size(), 1u);
  EXPECT_EQ(f.repeats[0].steady.reserved, 1'100'000);
  sim::SimResult r;
  r.fits = true;
  r.peak_allocated = f.steady.allocated;
  r.peak_reserved = 1'050'000;                       // inside [1,000,000, 1,100,000]
  Metric m = metric(compare(f, r), "steady_state.reserved");
  EXPECT_EQ(m.error, 0.0);
  EXPECT_FALSE(m.miss);
  EXPECT_EQ(m.measured, 1'000'000.0);                // the fixture's own run
  EXPECT_EQ(m.measured_lo, 1'000'000.0);
  EXPECT_EQ(m.measured_hi, 1'100'000.0);
  r.peak_reserved = 1'133'000;                       // +3.0% of the upper end exactly: inside the tolerance
  EXPECT_FALSE(metric(compare(f, r), "steady_state.reserved").miss);
  r.peak_reserved = 1'133'001;
  m = metric(compare(f, r), "steady_state.reserved");
  EXPECT_TRUE(m.miss);
  EXPECT_NEAR(m.error, 33'001.0 / 1'100'000.0, 1e-12);
  r.peak_reserved = 970'000;                         // -3.0% of the lower end: inside
  EXPECT_FALSE(metric(compare(f, r), "steady_state.reserved").miss);
  r.peak_reserved = 969'999;
  EXPECT_TRUE(metric(compare(f, r), "steady_state.reserved").miss);
  // Without the repeat, 1,050,000 would be +5% from the fixture's own run: a miss.
  TorchMemoryFixture alone = f;
  alone.repeats.clear();
  r.peak_reserved = 1'050'000;
  EXPECT_TRUE(metric(compare(alone, r), "steady_state.reserved").miss);
  // The table marks the fixture (~) and prints the spread of the figures that differ.
  const std::string table = comparison_table({{f, compare(f, r)}});
  EXPECT_NE(table.find("+0.0~"), std::string::npos) << table;
  EXPECT_NE(table.find("runs synthetic-miss (2): steady_state.reserved"), std::string::npos) << table;
}

TEST(TorchMemoryFixtureReader, MalformedRepeatsNameTheField) {
  Json good = synthetic("synthetic-miss.json");
  good["repeats"] = Json::array({{{"date", "d"}, {"command", "c"}, {"gpu", "g"}, {"torch", "t"},
                                  {"conditions", "alone on the GPU, no history"}, {"peaks", good["peaks"]}}});
  EXPECT_NO_THROW(parse_torch_memory_fixture(good, "spoiled.json"));
  const std::vector<SpoilCase> cases = {
      {"repeats", [](Json& j) { j["repeats"] = Json::array(); }},
      {"repeats[0].conditions", [](Json& j) { j["repeats"][0]["conditions"] = "short"; }},
      {"repeats[0].peaks", [](Json& j) { j["repeats"][0].erase("peaks"); }},
      {"repeats[0].peaks.steady_state.reserved_bytes",
       [](Json& j) { j["repeats"][0]["peaks"]["steady_state"]["reserved_bytes"] = -5; }},
      {"repeats", [](Json& j) { j["outcome"] = "oom"; j["oom"] = {{"phase", "forward"}}; }},
  };
  expect_each_spoil_names_its_field(good, cases);
}

// The first step (torch.optim creates its state in it) is compared like the steady state, once the result
// has one; a result without a first-step replay lists the measured figures uncompared.
TEST(TorchMemoryFixtureReader, FirstStepPeaksAreComparedWhenTheResultHasThem) {
  TorchMemoryFixture f = parse_torch_memory_fixture(synthetic("synthetic-miss.json"), "synthetic-miss.json");
  sim::SimResult r;
  r.fits = true;
  r.peak_allocated = f.steady.allocated;
  r.peak_reserved = f.steady.reserved;
  Comparison c = compare(f, r);
  EXPECT_FALSE(metric(c, "first_step.allocated").compared);
  EXPECT_EQ(metric(c, "first_step.allocated").measured, static_cast<double>(std::int64_t{1} << 29));
  EXPECT_FALSE(c.missed());
  // measured first step 512 MiB allocated, 1 GiB reserved (synthetic-miss.json)
  r.first_step_peak_allocated = (std::int64_t{1} << 29) + (std::int64_t{1} << 29) / 50;   // +2.0%: inside
  r.first_step_peak_reserved = std::int64_t{1} << 30;
  c = compare(f, r);
  EXPECT_TRUE(metric(c, "first_step.allocated").compared);
  EXPECT_FALSE(c.missed());
  r.first_step_peak_reserved = (std::int64_t{1} << 30) * 97 / 100 - 1;                       // past -3%
  c = compare(f, r);
  EXPECT_TRUE(metric(c, "first_step.reserved").miss);
  EXPECT_FALSE(metric(c, "first_step.allocated").miss);
  EXPECT_TRUE(c.failed());
}

// Every malformed fixture is an InputError naming the file and the field.
TEST(TorchMemoryFixtureReader, MalformedFixturesNameTheFileAndTheField) {
  const Json good = synthetic("synthetic-miss.json");
  const std::vector<SpoilCase> cases = {
      {"schema", [](Json& j) { j["schema"] = "other/1"; }},
      {"outcome", [](Json& j) { j.erase("outcome"); }},
      {"synthetic_reason", [](Json& j) { j.erase("synthetic_reason"); }},
      {"case.world", [](Json& j) { j["case"]["world"] = 16; }},
      {"case.cluster", [](Json& j) { j["case"]["cluster"] = "8xNoSuchGPU"; }},
      {"case.model", [](Json& j) { j["case"]["model"] = "llama-70b-typo"; }},
      {"case.model_spec.hidden", [](Json& j) { j["case"]["model_spec"]["hidden"] = 4096; }},
      {"case.model_spec.extra", [](Json& j) { j["case"]["model_spec"]["extra"] = 1; }},
      {"case.plan.micro_batch", [](Json& j) { j["case"]["plan"]["micro_batch"] = "two"; }},
      {"case.plan.no_such_key", [](Json& j) { j["case"]["plan"]["no_such_key"] = 1; }},
      {"peaks", [](Json& j) { j.erase("peaks"); }},
      {"peaks.steady_state.reserved_bytes", [](Json& j) { j["peaks"]["steady_state"]["reserved_bytes"] = -1; }},
      {"known_miss.reason", [](Json& j) { j["known_miss"] = {{"reason", "short"}}; }},
      {"known_miss.metrics", [](Json& j) { j["known_miss"] = {{"reason", "a long enough reason"}, {"metrics", {"speed"}}}; }},
      {"oom", [](Json& j) { j["outcome"] = "oom"; }},
  };
  expect_each_spoil_names_its_field(good, cases);
}

TEST(TorchMemoryFixtureReader, APlanKeyTheSimulatorDoesNotKnowYetIsPendingNotAnError) {
  Json j = synthetic("synthetic-miss.json");
  j["case"]["plan"]["implementation"] = "hf";
  bool simulator_knows = true;
  try {
    sim::parse_plan(j["case"]["plan"]);
  } catch (const InputError&) {
    simulator_knows = false;
  }
  const TorchMemoryFixture f = parse_torch_memory_fixture(j, "pending.json");
  EXPECT_EQ(f.plan.has_value(), simulator_knows);
  EXPECT_EQ(f.pending_key, simulator_knows ? "" : "implementation");
  // A README key with a bad value is an error, pending or not.
  j["case"]["plan"]["seq_len"] = 0;
  EXPECT_THROW(parse_torch_memory_fixture(j, "pending.json"), InputError);
}

}  // namespace
}  // namespace fsdpsim::validation

// fit, compare, the ranked table's formats and the memory words, on synthetic simulations whose
// figures are written out here (no simulator): each expected number follows from the toy model.
#include <gtest/gtest.h>

#include <sstream>

#include "models/zoo.h"
#include "planner/compare.h"
#include "planner/explain.h"
#include "planner/fit.h"
#include "planner/planner.h"

using namespace fsdpsim;
using namespace fsdpsim::planner;
using AcMode = sim::ActivationCheckpointing::Mode;

namespace {

calibrate::HardwareProfile h100x8() { return calibrate::HardwareProfile::for_cluster(calibrate::load_cluster("8xH100-SXM")); }

// Toy memory model: 10 GiB + micro_batch x (8 GiB without checkpointing, 4 GiB selective, 1 GiB full);
// tokens/s 10000 x (1, 0.95, 0.8) for the modes, x 0.9 below micro_batch 4.
sim::SimResult toy(const sim::Plan& p, Bytes capacity) {
  sim::SimResult r;
  const auto m = p.activation_checkpointing.mode;
  const Bytes per = m == AcMode::None ? 8 * kGiB : m == AcMode::SelectiveOp ? 4 * kGiB : kGiB;
  r.capacity = capacity;
  r.peak_total_device = 10 * kGiB + p.micro_batch * per;
  r.fits = r.peak_total_device <= capacity;
  r.tokens_per_s_per_gpu = 10000 * (m == AcMode::None ? 1.0 : m == AcMode::SelectiveOp ? 0.95 : 0.8) * (p.micro_batch >= 4 ? 1.0 : 0.9);
  r.step_time_ns = 1'000'000'000;
  r.compute_ns = 900'000'000;
  return r;
}

}  // namespace

TEST(MemoryWords, HeadroomIsUsableMinusPeak) {
  sim::SimResult r;
  r.capacity = 80 * kGiB;
  r.peak_total_device = 70 * kGiB;
  r.fits = true;
  // usable = 80 x 0.95 = 76 GiB; headroom = 76 - 70 = 6 GiB
  const MemoryVerdict v = memory_verdict(r, 0.05);
  EXPECT_EQ(v.usable, 76 * kGiB);
  EXPECT_EQ(v.headroom(), 6 * kGiB);
  EXPECT_TRUE(v.fits);
  EXPECT_EQ(memory_text(r, 0.05), "peak 70.0 GiB of 80.0 GiB: 6.0 GiB headroom under the 76.0 GiB usable (capacity less the 5% margin)");
  r.peak_total_device = 78 * kGiB;   // fits the GPU, not the margin: 2 GiB over
  EXPECT_FALSE(memory_verdict(r, 0.05).fits);
  EXPECT_EQ(memory_text(r, 0.05), "peak 78.0 GiB of 80.0 GiB: 2.0 GiB over the 76.0 GiB usable (capacity less the 5% margin)");
  // Under the usable memory but refused by the simulator (host memory): its note is quoted.
  r.peak_total_device = 70 * kGiB;
  r.fits = false;
  r.notes = {"does not fit: host memory 2.1 TiB > 2.0 TiB per node"};
  EXPECT_FALSE(memory_verdict(r, 0.05).fits);
  EXPECT_NE(memory_text(r, 0.05).find("host memory"), std::string::npos);
}

TEST(Fit, LargestMicroBatchAndTheSmallestChange) {
  const auto hw = h100x8();
  const Bytes cap = hw.memory_capacity();
  const double margin = 0.05;
  const double usable_gib = to_gib(usable_capacity(cap, margin));
  sim::Plan p;
  p.micro_batch = 16;
  p.grad_accum = 1;
  FitAnswer a = fit_plan(models::load_model("tiny-llama"), hw, p, margin, [&](const sim::Plan& q) { return toy(q, cap); });
  EXPECT_FALSE(a.fits);   // 10 + 16 x 8 = 138 GiB
  ASSERT_EQ(a.largest.size(), 3u);
  // Largest micro-batch b with 10 + b x per <= usable: floor((usable - 10) / per).
  EXPECT_EQ(a.largest[0].micro_batch, static_cast<std::int64_t>((usable_gib - 10) / 8));
  EXPECT_EQ(a.largest[1].micro_batch, static_cast<std::int64_t>((usable_gib - 10) / 4));
  EXPECT_EQ(a.largest[2].micro_batch, static_cast<std::int64_t>(usable_gib - 10));
  // The fitting single change that keeps the most tokens/s: 8 sequences x 2 micro-batches without
  // checkpointing (10000 tokens/s) beats selective checkpointing (9500) and full (8000).
  ASSERT_FALSE(a.changes.empty());
  EXPECT_TRUE(a.changes.front().fits);
  EXPECT_NE(a.changes.front().what.find("micro_batch 8 with grad_accum 2"), std::string::npos) << a.changes.front().what;
  const std::string text = fit_text(a);
  EXPECT_NE(text.find("Smallest change that makes it fit: micro_batch 8"), std::string::npos) << text;
  EXPECT_EQ(fit_json(a)["smallest_change"], a.changes.front().what);
}

// Full checkpointing in fit keeps the plan's order of checkpoint and compile (torchtune wraps compiled layers);
// the other modes cannot have it.
TEST(Fit, FullCheckpointingKeepsTheCheckpointAroundCompile) {
  const auto hw = h100x8();
  const Bytes cap = hw.memory_capacity();
  sim::Plan p;
  p.compile = true;
  p.activation_checkpointing.mode = AcMode::Full;
  p.activation_checkpointing.outside_compile = true;
  int full = 0, around = 0;
  FitAnswer a = fit_plan(models::load_model("tiny-llama"), hw, p, 0.05, [&](const sim::Plan& q) {
    const auto& ac = q.activation_checkpointing;
    full += ac.mode == AcMode::Full;
    around += ac.outside_compile;
    EXPECT_TRUE(!ac.outside_compile || ac.mode == AcMode::Full);
    return toy(q, cap);
  });
  EXPECT_GT(full, 1);
  EXPECT_EQ(around, full);
  // Activation offloading (modelled with every checkpointing mode: a block without checkpointing offloads what it
  // saves) stays with each mode fit tries, and each mode's largest micro-batch is found.
  p = sim::Plan{};
  p.activation_checkpointing.mode = AcMode::Full;
  p.activation_offloading = sim::ActivationOffload::Streams;
  int offloaded = 0, tried = 0;
  a = fit_plan(models::load_model("tiny-llama"), hw, p, 0.05, [&](const sim::Plan& q) {
    ++tried;
    offloaded += q.activation_offloading != sim::ActivationOffload::None;
    return toy(q, cap);
  });
  EXPECT_GT(tried, 3);
  EXPECT_EQ(offloaded, tried);
  ASSERT_EQ(a.largest.size(), 3u);
  for (const auto& lb : a.largest) EXPECT_GT(lb.micro_batch, 0) << lb.checkpointing;
}

TEST(Compare, EachDifferenceAlone) {
  const auto hw = h100x8();
  const Bytes cap = hw.memory_capacity();
  auto resolve = [](sim::Plan q) { return sim::resolve_plan(q, 8, 8); };
  CompareSide a, b;
  a.source = "A";
  b.source = "B";
  a.plan.micro_batch = 2;
  a.plan.grad_accum = 4;
  b.plan = a.plan;
  b.plan.micro_batch = 4;
  b.plan.grad_accum = 2;
  b.plan.activation_checkpointing.mode = AcMode::SelectiveOp;
  a.plan = resolve(a.plan);
  b.plan = resolve(b.plan);
  Comparison c = compare_plans(hw, a, b, 0.05, [&](const sim::Plan& q) { return toy(q, cap); });
  ASSERT_EQ(c.diffs.size(), 2u);
  // micro-batch 2 -> 4 alone: tokens/s 9000 -> 10000 (+11.1%); selective checkpointing alone: 9000 -> 8550 (-5%).
  EXPECT_EQ(c.diffs[0].group, "micro-batch split");
  EXPECT_NEAR(c.diffs[0].tokens_gain, 10000.0 / 9000 - 1, 1e-12);
  EXPECT_EQ(c.diffs[1].group, "activation_checkpointing");
  EXPECT_NEAR(c.diffs[1].tokens_gain, -0.05, 1e-12);
  // Memory: 10 + 2 x 8 = 26 GiB (A) against 10 + 4 x 4 = 26 GiB (B); micro-batch 4 alone: 42 GiB.
  EXPECT_EQ(c.diffs[0].memory_delta, 16 * kGiB);
  const std::string t = compare_text(c);
  EXPECT_NE(t.find("micro_batch: 2 -> 4"), std::string::npos) << t;
  EXPECT_NE(t.find("tokens/s per GPU"), std::string::npos);
}

TEST(RankedTable, MarkdownAndCsv) {
  PlanRequest req;
  req.model = models::load_model("tiny-llama");
  req.cluster = calibrate::load_cluster("8xH100-SXM");
  req.hw = calibrate::HardwareProfile::for_cluster(req.cluster);
  req.space.batch = resolve_batch_target(512, 0, 16, 8);
  for (const char* f : {"fsdp_version=2", "cpu_offload=false", "activation_checkpointing=none", "grad_sync=false"})
    req.space.fixed.push_back(parse_constraint(f, "--fix"));
  req.top_k = 3;
  const Bytes cap = req.hw.memory_capacity();
  EvalFn eval = [&](const sim::Plan& q) { return toy(q, cap); };
  PlanOutcome out = run_planner(req, &eval);
  ASSERT_GE(out.ranking.recommended, 0);
  std::string csv = ranked_table(req, out, "csv");
  std::istringstream lines(csv);
  std::string header, row;
  std::getline(lines, header);
  EXPECT_EQ(header, "rank,id,plan,family,tokens_per_s_per_gpu,mfu,peak_total_device_gib,headroom_gib,step_time_s,exposed_comm_s,fits");
  int rows = 0;
  while (std::getline(lines, row)) {
    ++rows;
    // 11 fields; a label's commas ("mesh(1,8)") sit inside its quotes (RFC 4180).
    int fields = 1;
    bool quoted = false;
    for (char ch : row) {
      if (ch == '"') quoted = !quoted;
      else if (ch == ',' && !quoted) ++fields;
    }
    EXPECT_EQ(fields, 11) << row;
    EXPECT_NE(row.find(",\"FSDP2 "), std::string::npos) << row;   // the label, quoted
  }
  EXPECT_EQ(rows, 3);
  std::string md = ranked_table(req, out, "markdown");
  EXPECT_EQ(md.rfind("| rank | id | plan |", 0), 0u) << md;
  EXPECT_NE(md.find("|---:|---|---|"), std::string::npos);
  req.table_format = "csv";
  EXPECT_EQ(summary_table(req, out), csv);   // csv prints the table alone
}

// The recommendation's checkpointing sentence follows the plan, not only the recomputed FLOPs: selective
// op AC recomputes a sliver of the FLOPs (its saved set is the matmuls and attention) and must not be
// described as "no recomputation" (it was, for the default plan's FSDP1 + selective_op recommendation).
namespace {

// The recommendation's sentences for one candidate of plan `plan` whose simulation gave `r`.
std::vector<std::string> recommended_sentences(const sim::Plan& plan, const sim::SimResult& r) {
  const calibrate::Cluster cluster = calibrate::load_cluster("8xH100-SXM");
  Candidate c;
  c.id = "c0001";
  c.plan = plan;
  c.label = "toy";
  Evaluation e;
  e.status = EvalStatus::Simulated;
  e.result = r;
  e.fits_with_margin = true;
  const std::vector<Candidate> cands{c};
  const std::vector<Evaluation> evals{e};
  const Ranking ranking = rank_candidates(evals);
  const std::vector<MemoryBound> bounds(1);
  return explain(ExplainInput{cands, evals, ranking, bounds, 80 * kGiB, 0.05, cluster}).recommended;
}

}  // namespace

TEST(Explain, CheckpointingSentenceFollowsThePlan) {
  auto sentence = [&](AcMode mode, double hardware_over_model) {
    sim::Plan plan;
    plan.activation_checkpointing.mode = mode;
    sim::SimResult r = toy(plan, 80 * kGiB);
    r.model_flops_per_step_per_gpu = 1e15;
    r.hardware_flops_per_step_per_gpu = 1e15 * hardware_over_model;
    for (const auto& s : recommended_sentences(plan, r))
      if (s.find("ecomput") != std::string::npos) return s;
    return std::string("(none)");
  };
  EXPECT_EQ(sentence(AcMode::None, 1.0), "No recomputation: activations fit without checkpointing.");
  // 1 - 1/1.002 = 0.2% of the FLOPs recomputed
  EXPECT_EQ(sentence(AcMode::SelectiveOp, 1.002),
            "Activation checkpointing (selective_op) recomputes under 0.5% of the step's FLOPs (the ops it does not "
            "save are cheap) and frees their activations.");
  // 1 - 1/1.25 = 20%
  EXPECT_EQ(sentence(AcMode::Full, 1.25), "Activation checkpointing (full) recomputes 20% of the step's FLOPs.");
}

// A recommendation whose CPU issues for 90% of the step or more is called CPU-bound (the step then rests on the
// profile's CPU cost per op); one at 89% is not.
TEST(Explain, CpuBoundRecommendationIsSaid) {
  auto cpu_line = [&](TimeNs cpu_issue) {
    const sim::Plan plan;
    sim::SimResult r = toy(plan, 80 * kGiB);   // step 1 s, compute 0.9 s
    r.cpu_issue_ns = cpu_issue;
    for (const auto& s : recommended_sentences(plan, r))
      if (s.rfind("CPU-bound", 0) == 0) return s;
    return std::string("(none)");
  };
  EXPECT_EQ(cpu_line(950'000'000),
            "CPU-bound: the CPU issues eager ops for 0.950 s of the step against 0.900 s of GPU compute; this step time "
            "rests on the host and the PyTorch version (the profile's fitted CPU cost per op) more than on the GPU.");
  EXPECT_EQ(cpu_line(900'000'000).rfind("CPU-bound", 0), 0u);   // exactly 90%
  EXPECT_EQ(cpu_line(899'999'999), "(none)");
}

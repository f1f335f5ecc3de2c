// The planner end to end with the real simulator: pruned search == exhaustive search (same
// recommendation and Pareto front), deterministic across thread counts, a complete plan.json.
#include <gtest/gtest.h>

#include "models/zoo.h"
#include "planner/planner.h"
#include "sim/simulator.h"

using namespace fsdpsim;
using namespace fsdpsim::planner;

namespace {

PlanRequest request(const std::string& model, const std::string& cluster, std::int64_t seq, std::int64_t seqs, int threads) {
  PlanRequest r;
  r.model = models::with_seq_len(models::load_model(model), seq);
  r.cluster = calibrate::load_cluster(cluster);
  r.hw = calibrate::HardwareProfile::for_cluster(r.cluster);
  r.profile_name = "builtin";
  r.space.batch = resolve_batch_target(seq, 0, seqs, r.cluster.world());
  r.threads = threads;
  return r;
}

}  // namespace

TEST(PlanEndToEnd, PrunedSearchMatchesExhaustiveAndIsDeterministic) {
  // A tight memory budget so pruning bites: llama-1b at 4096 tokens on 2 GPUs.
  PlanRequest req = request("llama-1b", "2xH100-SXM", 4096, 16, 1);
  PlanOutcome a = run_planner(req);
  req.threads = 3;
  PlanOutcome b = run_planner(req);
  ASSERT_EQ(a.candidates.size(), b.candidates.size());
  EXPECT_EQ(a.ranking.order, b.ranking.order);
  EXPECT_EQ(a.ranking.recommended, b.ranking.recommended);
  EXPECT_EQ(a.ranking.pareto, b.ranking.pareto);
  EXPECT_GT(a.search.stats.pruned_memory + a.search.stats.skipped_dominated, 0);

  // Exhaustive: simulate everything, no bounds.
  sim::SimOptions so;
  so.record_trace = false;
  so.record_memory_timeline = false;
  std::vector<Bytes> zero(a.candidates.size(), 0);
  std::vector<double> inf(a.candidates.size(), 1e300);
  SearchOptions o;
  o.capacity = req.hw.memory_capacity();
  o.memory_margin = req.memory_margin;
  o.threads = 2;
  EvalFn eval = [&](const sim::Plan& p) { return sim::simulate(req.model, req.hw, p, so); };
  auto ex = run_search(a.candidates, zero, inf, eval, o);
  RankPolicy pol;
  for (const auto& c : a.candidates) pol.cpu_offload.push_back(c.plan.cpu_offload.params || c.plan.cpu_offload.optimizer);
  auto rex = rank_candidates(ex.evals, pol);
  EXPECT_EQ(a.ranking.recommended, rex.recommended);
  EXPECT_EQ(a.ranking.pareto, rex.pareto);
  // No pruned candidate would have fit.
  for (size_t i = 0; i < a.candidates.size(); ++i)
    if (a.search.evals[i].status == EvalStatus::PrunedMemory) {
      EXPECT_FALSE(ex.evals[i].fits_with_margin) << a.candidates[i].label;
    }

  nlohmann::json doc = plan_document(req, a);
  EXPECT_EQ(doc["schema_version"], "fsdpsim.plan/1");
  ASSERT_FALSE(doc["recommended"].is_null());
  EXPECT_EQ(doc["recommended"], 0);
  EXPECT_EQ(doc["candidates"][0]["rank"], 1);
  // The trace goes to trace.json, not plan.json (issue 21: plan.json stays small).
  EXPECT_FALSE(doc["recommended_detail"].contains("trace"));
  EXPECT_FALSE(a.recommended_detail.trace.empty());
  for (const char* k : {"fsdp2", "lightning", "accelerate", "torchtitan"}) {
    ASSERT_TRUE(doc["exports"].contains(k)) << k;
    // An export either carries the recommendation or says what it changed.
    const auto& e = doc["exports"][k];
    EXPECT_EQ(e["same_as_recommended"].get<bool>(), e["changed"].empty()) << k;
  }
  EXPECT_FALSE(doc["explanations"]["recommended"].empty());
  EXPECT_EQ(doc["search"]["candidates_total"], static_cast<int>(a.candidates.size()));
}

TEST(PlanEndToEnd, NothingFitsSaysWhy) {
  // llama3-70b on one GPU cannot fit without CPU offload: every family gets a reason, no recommendation.
  PlanRequest req = request("llama3-70b", "1xH100-SXM", 2048, 1, 1);
  req.space.excluded = {parse_constraint("cpu_offload=true", "--exclude")};
  PlanOutcome out = run_planner(req);
  EXPECT_EQ(out.ranking.recommended, -1);
  ASSERT_FALSE(out.explanations.rejected_families.empty());
  bool optimizer = false;
  for (const auto& f : out.explanations.rejected_families) optimizer |= f.reason.find("optimizer state alone") != std::string::npos;
  EXPECT_TRUE(optimizer);
  nlohmann::json doc = plan_document(req, out);
  EXPECT_TRUE(doc["recommended"].is_null());
  EXPECT_TRUE(doc["recommended_detail"].is_null());
}

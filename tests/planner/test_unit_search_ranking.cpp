// The search engine and the ranking on synthetic evaluations (no simulator): pruning by the memory
// bound, dominance skipping, determinism across thread counts, ranking order and the Pareto front.
#include <gtest/gtest.h>

#include <atomic>

#include "common/errors.h"
#include "planner/ranking.h"
#include "planner/search.h"

using namespace fsdpsim;
using namespace fsdpsim::planner;

namespace {

// A synthetic space: candidate i has peak = mem[i], tokens/s = tps[i]; the bounds are exact or
// below/above by a factor, as the real bounds are.
struct Synthetic {
  std::vector<Candidate> cands;
  std::vector<Bytes> peak, lb;
  std::vector<double> tps, ub;
};

Synthetic make(int n, unsigned seed) {
  Synthetic s;
  unsigned x = seed;
  auto rnd = [&]() { x = x * 1103515245u + 12345u; return (x >> 8) & 0xffff; };
  for (int i = 0; i < n; ++i) {
    Candidate c;
    c.index = i;
    c.id = "c" + std::to_string(i);
    c.plan.micro_batch = i + 1;  // the evaluator reads the index back from here
    s.cands.push_back(c);
    Bytes peak = (20 + static_cast<Bytes>(rnd() % 100)) * kGiB;
    double tps = 1000.0 + static_cast<double>(rnd() % 5000);
    s.peak.push_back(peak);
    s.tps.push_back(tps);
    s.lb.push_back(peak * (60 + static_cast<Bytes>(rnd() % 41)) / 100);   // 60-100% of the peak
    s.ub.push_back(tps * (1.0 + static_cast<double>(rnd() % 100) / 100.0)); // 1-2x the throughput
  }
  return s;
}

EvalFn synthetic_eval(const Synthetic& s, std::atomic<int>* calls = nullptr) {
  return [&s, calls](const sim::Plan& p) {
    if (calls) ++*calls;
    int i = static_cast<int>(p.micro_batch) - 1;
    sim::SimResult r;
    r.peak_total_device = s.peak[static_cast<size_t>(i)];
    r.capacity = 80 * kGiB;
    r.fits = r.peak_total_device <= r.capacity;
    r.tokens_per_s_per_gpu = s.tps[static_cast<size_t>(i)];
    return r;
  };
}

}  // namespace

TEST(Search, PrunesOnlyByTheBoundAndIsDeterministicAcrossThreads) {
  Synthetic s = make(500, 7);
  SearchOptions o;
  o.capacity = 80 * kGiB;
  o.memory_margin = 0.05;
  o.threads = 1;
  std::atomic<int> calls{0};
  auto a = run_search(s.cands, s.lb, s.ub, synthetic_eval(s, &calls), o);
  o.threads = 4;
  auto b = run_search(s.cands, s.lb, s.ub, synthetic_eval(s), o);
  ASSERT_EQ(a.evals.size(), b.evals.size());
  const Bytes usable = usable_capacity(o.capacity, o.memory_margin);
  for (size_t i = 0; i < a.evals.size(); ++i) {
    EXPECT_EQ(a.evals[i].status, b.evals[i].status) << i;
    if (a.evals[i].status == EvalStatus::PrunedMemory) {
      EXPECT_GT(s.lb[i], usable);
    }
  }
  EXPECT_EQ(a.stats.simulated, calls.load());
  EXPECT_EQ(a.stats.simulated + a.stats.pruned_memory + a.stats.skipped_dominated, 500);
  EXPECT_GT(a.stats.skipped_dominated, 0);  // dominance does skip work on this space

  // Exhaustive: every candidate simulated. The recommendation and the Pareto front must agree.
  Synthetic all = s;
  std::vector<Bytes> zero(500, 0);
  std::vector<double> inf(500, 1e300);
  auto ex = run_search(all.cands, zero, inf, synthetic_eval(all), o);
  EXPECT_EQ(ex.stats.simulated, 500);
  auto ra = rank_candidates(a.evals), re = rank_candidates(ex.evals);
  EXPECT_EQ(ra.recommended, re.recommended);
  EXPECT_EQ(ra.pareto, re.pareto);
  ASSERT_GE(ra.recommended, 0);
}

// The statuses against a naive reference of the rule (search.h, "dominance in order"): in order of the
// upper bound, a candidate is simulated unless a kept plan before it that fits with the margin dominates
// it. Also with bounds that are wrong for some candidates (the upper bound below the throughput), where a
// worker's skip may rest on a plan that the rule itself skips: every thread count agrees with the rule.
TEST(Search, SkipsExactlyWhatAKeptPlanBeforeItDominates) {
  for (bool wrong_bounds : {false, true}) {
    Synthetic s = make(400, 11);
    if (wrong_bounds)
      for (size_t i = 0; i < s.ub.size(); i += 5) s.ub[i] = s.tps[i] * 0.7;
    SearchOptions o;
    o.capacity = 80 * kGiB;
    o.memory_margin = 0.05;
    const Bytes usable = usable_capacity(o.capacity, o.memory_margin);
    std::vector<int> order(400);
    for (int i = 0; i < 400; ++i) order[static_cast<size_t>(i)] = i;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return s.ub[static_cast<size_t>(a)] > s.ub[static_cast<size_t>(b)]; });
    std::vector<EvalStatus> want(400, EvalStatus::NotRun);
    std::vector<int> kept;
    for (int c : order) {
      const size_t i = static_cast<size_t>(c);
      if (s.lb[i] > usable) {
        want[i] = EvalStatus::PrunedMemory;
        continue;
      }
      bool dom = false;
      for (int d : kept)
        dom = dom || (s.peak[static_cast<size_t>(d)] <= s.lb[i] && s.tps[static_cast<size_t>(d)] > s.ub[i]);
      want[i] = dom ? EvalStatus::SkippedDominated : EvalStatus::Simulated;
      if (!dom && s.peak[i] <= usable) kept.push_back(c);
    }
    for (int threads : {1, 3, 8}) {
      o.threads = threads;
      std::atomic<int> calls{0};
      auto out = run_search(s.cands, s.lb, s.ub, synthetic_eval(s, &calls), o);
      int simulated = 0;
      for (size_t i = 0; i < 400; ++i) {
        EXPECT_EQ(out.evals[i].status, want[i]) << "candidate " << i << ", " << threads << " threads, wrong bounds " << wrong_bounds;
        simulated += want[i] == EvalStatus::Simulated;
        if (want[i] != EvalStatus::Simulated) {
          EXPECT_EQ(out.evals[i].result.tokens_per_s_per_gpu, 0.0);
        }
      }
      EXPECT_EQ(out.stats.simulated, simulated);
      EXPECT_GT(out.stats.skipped_dominated, 0);
      if (threads == 1) {
        EXPECT_EQ(calls.load(), simulated);   // nothing simulated in vain
      }
    }
  }
}

TEST(Ranking, OrderTieBreaksAndPareto) {
  std::vector<Evaluation> ev(6);
  auto set = [&](int i, Bytes gib, double tps, bool fitm, bool fits) {
    ev[static_cast<size_t>(i)].status = EvalStatus::Simulated;
    ev[static_cast<size_t>(i)].result.peak_total_device = gib * kGiB;
    ev[static_cast<size_t>(i)].result.tokens_per_s_per_gpu = tps;
    ev[static_cast<size_t>(i)].result.fits = fits;
    ev[static_cast<size_t>(i)].fits_with_margin = fitm;
  };
  set(0, 50, 3000, true, true);
  set(1, 40, 3000, true, true);   // same speed, less memory: ranks above 0
  set(2, 60, 3500, true, true);   // fastest
  set(3, 78, 4000, false, true);  // fits only without the margin
  set(4, 90, 5000, false, false); // does not fit
  ev[5].status = EvalStatus::PrunedMemory;
  auto r = rank_candidates(ev);
  EXPECT_EQ(r.order, (std::vector<int>{2, 1, 0, 3, 4}));
  EXPECT_EQ(r.recommended, 2);
  EXPECT_EQ(r.pareto, (std::vector<int>{1, 2}));  // 0 is dominated by 1 (same speed, more memory)
  // Exact ties (memory and speed) fall back to the candidate index.
  set(0, 40, 3000, true, true);
  r = rank_candidates(ev);
  EXPECT_EQ(r.order, (std::vector<int>{2, 0, 1, 3, 4}));
  EXPECT_EQ(r.pareto, (std::vector<int>{0, 2}));
  // Nothing fits with the margin: no recommendation, empty front.
  for (int i : {0, 1, 2}) ev[static_cast<size_t>(i)].fits_with_margin = false;
  r = rank_candidates(ev);
  EXPECT_EQ(r.recommended, -1);
  EXPECT_TRUE(r.pareto.empty());
}

TEST(Search, InvalidPlansAreRecordedNotFatal) {
  Synthetic s = make(10, 3);
  SearchOptions o;
  o.capacity = 80 * kGiB;
  EvalFn eval = [](const sim::Plan& p) -> sim::SimResult {
    if (p.micro_batch % 2 == 0) throw InputError("plan.mesh", "(3, 3)", "bad");
    sim::SimResult r;
    r.peak_total_device = kGiB;
    r.tokens_per_s_per_gpu = 1;
    return r;
  };
  std::vector<Bytes> zero(10, 0);
  std::vector<double> ub(10, 1e9);
  auto out = run_search(s.cands, zero, ub, eval, o);
  EXPECT_EQ(out.stats.invalid, 5);
  EXPECT_EQ(out.stats.simulated, 5);
  EXPECT_NE(out.evals[1].error.find("plan.mesh"), std::string::npos);
}

// The recommendation rule (ranking.h): within 1% of the fastest, the plan with the least memory; CPU
// offload only when nothing else fits or it is more than 10% faster. The recommendation comes first.
TEST(Ranking, TieWindowAndOffloadRule) {
  std::vector<Evaluation> ev(5);
  auto set = [&](int i, Bytes gib, double tps) {
    ev[static_cast<size_t>(i)].status = EvalStatus::Simulated;
    ev[static_cast<size_t>(i)].result.peak_total_device = gib * kGiB;
    ev[static_cast<size_t>(i)].result.tokens_per_s_per_gpu = tps;
    ev[static_cast<size_t>(i)].result.fits = true;
    ev[static_cast<size_t>(i)].fits_with_margin = true;
  };
  set(0, 70, 10000);   // fastest
  set(1, 60, 9950);    // 0.5% slower (inside the 1% window), 10 GiB less: recommended
  set(2, 50, 9800);    // 2% slower: outside the window
  set(3, 40, 10800);   // offload, 8% faster than the best plan without: not enough
  set(4, 30, 5000);
  RankPolicy pol;
  pol.cpu_offload = {false, false, false, true, false};
  Ranking r = rank_candidates(ev, pol);
  EXPECT_EQ(r.recommended, 1);
  EXPECT_EQ(r.order.front(), 1);
  EXPECT_EQ(r.fastest, 3);
  EXPECT_EQ(r.fastest_without_offload, 0);
  // Offload 12% faster than the best without: allowed, and alone in its window.
  ev[3].result.tokens_per_s_per_gpu = 11200;
  r = rank_candidates(ev, pol);
  EXPECT_EQ(r.recommended, 3);
  // Nothing without offload fits: offload it is.
  for (int i : {0, 1, 2, 4}) ev[static_cast<size_t>(i)].fits_with_margin = false;
  ev[3].result.tokens_per_s_per_gpu = 10800;
  r = rank_candidates(ev, pol);
  EXPECT_EQ(r.recommended, 3);
  // Without the policy's offload list the plain order applies: the fastest fitting plan.
  r = rank_candidates(ev);
  EXPECT_EQ(r.recommended, 3);
}

// Ranking (notes in ranking.h).
#include "planner/ranking.h"

#include <algorithm>

namespace fsdpsim::planner {

Ranking rank_candidates(const std::vector<Evaluation>& evals, const RankPolicy& policy) {
  Ranking r;
  auto group = [&](int i) {
    const auto& e = evals[static_cast<size_t>(i)];
    if (e.fits_with_margin) return 0;
    return e.result.fits ? 1 : 2;
  };
  auto offload = [&](int i) { return static_cast<size_t>(i) < policy.cpu_offload.size() && policy.cpu_offload[static_cast<size_t>(i)]; };
  auto tps = [&](int i) { return evals[static_cast<size_t>(i)].result.tokens_per_s_per_gpu; };
  auto peak = [&](int i) { return evals[static_cast<size_t>(i)].result.peak_total_device; };
  for (int i = 0; i < static_cast<int>(evals.size()); ++i)
    if (evals[static_cast<size_t>(i)].status == EvalStatus::Simulated) r.order.push_back(i);
  std::sort(r.order.begin(), r.order.end(), [&](int a, int b) {
    int ga = group(a), gb = group(b);
    if (ga != gb) return ga < gb;
    if (ga < 2 && tps(a) != tps(b)) return tps(a) > tps(b);
    if (peak(a) != peak(b)) return peak(a) < peak(b);
    return a < b;
  });
  std::vector<int> fit;
  for (int i : r.order)
    if (group(i) == 0) fit.push_back(i);

  // The recommendation: offload only when needed or clearly faster, then the tie rule.
  if (!fit.empty()) {
    r.fastest = fit.front();
    for (int i : fit)
      if (!offload(i)) { r.fastest_without_offload = i; break; }
    bool allow_offload = r.fastest_without_offload < 0 ||
                         tps(r.fastest) > tps(r.fastest_without_offload) * (1.0 + policy.offload_min_gain);
    int lead = allow_offload ? r.fastest : r.fastest_without_offload;
    int best = lead;
    for (int i : fit) {
      if (offload(i) && !allow_offload) continue;
      if (tps(i) < tps(lead) * (1.0 - policy.tie_fraction)) break;   // fit is sorted by tokens/s
      if (peak(i) + policy.tie_min_saving <= peak(best)) best = i;
    }
    r.recommended = best;
    auto it = std::find(r.order.begin(), r.order.end(), best);
    std::rotate(r.order.begin(), it, it + 1);
  }

  std::sort(fit.begin(), fit.end(), [&](int a, int b) {
    if (peak(a) != peak(b)) return peak(a) < peak(b);
    if (tps(a) != tps(b)) return tps(a) > tps(b);
    return a < b;
  });
  double top = -1;
  for (int i : fit) {
    if (tps(i) > top) {
      r.pareto.push_back(i);
      top = tps(i);
    }
  }
  return r;
}

}  // namespace fsdpsim::planner

#include "planner/ranking.h"

#include <algorithm>

namespace fsdpsim::planner {

Ranking rank_candidates(const std::vector<Evaluation>& evals) {
  Ranking r;
  auto group = [&](int i) {
    const auto& e = evals[static_cast<size_t>(i)];
    if (e.fits_with_margin) return 0;
    return e.result.fits ? 1 : 2;
  };
  for (int i = 0; i < static_cast<int>(evals.size()); ++i)
    if (evals[static_cast<size_t>(i)].status == EvalStatus::Simulated) r.order.push_back(i);
  std::sort(r.order.begin(), r.order.end(), [&](int a, int b) {
    int ga = group(a), gb = group(b);
    if (ga != gb) return ga < gb;
    const auto& ra = evals[static_cast<size_t>(a)].result;
    const auto& rb = evals[static_cast<size_t>(b)].result;
    if (ga < 2 && ra.tokens_per_s_per_gpu != rb.tokens_per_s_per_gpu) return ra.tokens_per_s_per_gpu > rb.tokens_per_s_per_gpu;
    if (ra.peak_total_device != rb.peak_total_device) return ra.peak_total_device < rb.peak_total_device;
    return a < b;
  });
  if (!r.order.empty() && group(r.order.front()) == 0) r.recommended = r.order.front();

  std::vector<int> fit;
  for (int i : r.order)
    if (group(i) == 0) fit.push_back(i);
  std::sort(fit.begin(), fit.end(), [&](int a, int b) {
    const auto& ra = evals[static_cast<size_t>(a)].result;
    const auto& rb = evals[static_cast<size_t>(b)].result;
    if (ra.peak_total_device != rb.peak_total_device) return ra.peak_total_device < rb.peak_total_device;
    if (ra.tokens_per_s_per_gpu != rb.tokens_per_s_per_gpu) return ra.tokens_per_s_per_gpu > rb.tokens_per_s_per_gpu;
    return a < b;
  });
  double best = -1;
  for (int i : fit) {
    double t = evals[static_cast<size_t>(i)].result.tokens_per_s_per_gpu;
    if (t > best) {
      r.pareto.push_back(i);
      best = t;
    }
  }
  return r;
}

}  // namespace fsdpsim::planner

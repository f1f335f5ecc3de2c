// The search engine (note "dominance in order" in search.h).
#include "planner/search.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <thread>

#include "common/errors.h"
#include "common/output_file.h"

namespace fsdpsim::planner {

const char* eval_status_name(EvalStatus s) {
  switch (s) {
    case EvalStatus::Simulated: return "simulated";
    case EvalStatus::PrunedMemory: return "pruned_memory_bound";
    case EvalStatus::SkippedDominated: return "skipped_dominated";
    case EvalStatus::Invalid: return "invalid";
    case EvalStatus::NotRun: return "not_run";
  }
  return "not_run";
}

Bytes usable_capacity(Bytes capacity, double margin) {
  return static_cast<Bytes>(std::floor(static_cast<double>(capacity) * (1.0 - margin)));
}

namespace {

// The terminal progress line: candidates done / total, simulated, pruned or skipped, elapsed time and
// an ETA from the rate so far. Drawn only when stderr is a terminal, at most 10 times a second.
class ProgressBar {
 public:
  ProgressBar(bool on, int total) : on_(on && isatty(2)), total_(total), t0_(std::chrono::steady_clock::now()) {}
  void draw(int done, int simulated, int skipped, bool force = false) {
    if (!on_) return;
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - t0_).count();
    const int width = 24;
    int filled = total_ > 0 ? done * width / total_ : width;
    std::string bar(static_cast<size_t>(filled), '#');
    bar += std::string(static_cast<size_t>(width - filled), '.');
    char eta[32] = "--:--";
    if (done > done_at_start_ && done < total_) {
      double rate = (done - done_at_start_) / std::max(1e-9, elapsed);
      clock_text(eta, sizeof eta, (total_ - done) / rate);
    } else if (done >= total_) {
      clock_text(eta, sizeof eta, 0);
    }
    char el[32];
    clock_text(el, sizeof el, elapsed);
    std::fprintf(stderr, "\rplan [%s] %d/%d candidates  simulated %d  pruned/skipped %d  elapsed %s  ETA %s ", bar.c_str(),
                 done, total_, simulated, skipped, el, eta);
    std::fflush(stderr);
  }
  void start_at(int done) { done_at_start_ = done; }   // candidates settled before any simulation (pruned)
  void finish() {
    if (on_) std::fprintf(stderr, "\n");
  }

 private:
  static void clock_text(char* buf, size_t n, double s) {
    long t = std::lround(s);
    std::snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
  }
  bool on_;
  int total_;
  int done_at_start_ = 0;
  std::chrono::steady_clock::time_point t0_, last_{};
  std::mutex mu_;
};

}  // namespace

SearchOutcome run_search(const std::vector<Candidate>& cands, const std::vector<Bytes>& mem_lb,
                         const std::vector<double>& tps_ub, const EvalFn& eval, const SearchOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  const int n = static_cast<int>(cands.size());
  SearchOutcome out;
  out.evals.resize(cands.size());
  out.stats.candidates_total = n;
  out.stats.threads = std::max(1, opts.threads);
  const Bytes usable = usable_capacity(opts.capacity, opts.memory_margin);

  std::vector<int> order;
  for (int i = 0; i < n; ++i) {
    auto& e = out.evals[static_cast<size_t>(i)];
    e.memory_lower_bound = mem_lb[static_cast<size_t>(i)];
    e.tokens_per_s_upper_bound = tps_ub[static_cast<size_t>(i)];
    if (e.memory_lower_bound > usable) {
      e.status = EvalStatus::PrunedMemory;
      ++out.stats.pruned_memory;
    } else {
      order.push_back(i);
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    double ua = tps_ub[static_cast<size_t>(a)], ub = tps_ub[static_cast<size_t>(b)];
    if (ua != ub) return ua > ub;
    return a < b;
  });
  auto is_offload = [&](int c) { return cands[static_cast<size_t>(c)].plan.cpu_offload.params; };
  // Does one of `plans` (positions in `order` of simulated plans that fit with the margin) before position k
  // dominate candidate c (search.h)? An offload plan dominates only offload plans: the ranking recommends
  // offload only when it is clearly faster (ranking.h), so a plan without offload stays even when one beats it.
  auto dominated = [&](const std::vector<size_t>& plans, size_t k, int c) {
    const auto& e = out.evals[static_cast<size_t>(c)];
    for (size_t j : plans) {
      const int d = order[j];
      const auto& r = out.evals[static_cast<size_t>(d)].result;
      if (j < k && (!is_offload(d) || is_offload(c)) && r.peak_total_device <= e.memory_lower_bound &&
          r.tokens_per_s_per_gpu > e.tokens_per_s_upper_bound)
        return true;
    }
    return false;
  };

  auto evaluate = [&](int c) {
    Evaluation e = out.evals[static_cast<size_t>(c)];
    try {
      e.result = eval(cands[static_cast<size_t>(c)].plan);
      e.status = EvalStatus::Simulated;
      // The simulator's verdict (GPU capacity, and host memory for offloaded state) and the margin.
      e.fits_with_margin = e.result.fits && e.result.peak_total_device <= usable;
    } catch (const InputError& err) {
      e.status = EvalStatus::Invalid;
      e.error = err.what();
    } catch (const std::exception& err) {
      e.status = EvalStatus::Invalid;
      e.error = std::string("internal error: ") + err.what();
    }
    return e;
  };

  ProgressBar bar(opts.progress, n);
  const int settled = out.stats.pruned_memory;
  bar.start_at(settled);
  // Shared by the workers (under mu): the next position in `order` to take, how many have finished,
  // how many were skipped, and the positions of finished plans that fit with the margin.
  std::mutex mu;
  size_t next = 0;
  int finished = 0, skipped = 0;
  std::vector<size_t> fitting;
  std::atomic<bool> stop{false};
  auto worker = [&]() {
    for (;;) {
      if (interrupted()) {
        stop = true;
        return;
      }
      size_t k;
      int c;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next >= order.size()) return;
        k = next++;
        c = order[k];
        if (dominated(fitting, k, c)) {
          out.evals[static_cast<size_t>(c)].status = EvalStatus::SkippedDominated;
          ++finished;
          ++skipped;
          continue;
        }
      }
      Evaluation e = evaluate(c);
      std::lock_guard<std::mutex> lock(mu);
      out.evals[static_cast<size_t>(c)] = std::move(e);
      if (out.evals[static_cast<size_t>(c)].fits_with_margin) fitting.push_back(k);
      int f = ++finished;
      if ((f & 7) == 0) bar.draw(settled + f, f - skipped, settled + skipped);
    }
  };
  const int nt = std::max(1, std::min<int>(out.stats.threads, static_cast<int>(order.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < nt; ++t) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  out.stats.interrupted = stop;

  // The result does not depend on the threads: in order, a candidate is skipped exactly when a plan
  // before it that is kept dominates it. On more threads a worker may have simulated a candidate that a
  // plan before it, still running then, dominates: its result is dropped here. A worker's skip used some
  // of the plans before it; the kept ones dominate it too (dominance passes through the bounds: lower
  // bound <= peak, throughput <= upper bound), and were that ever not so, it is simulated here.
  std::vector<size_t> kept;   // positions of the candidates kept that fit with the margin
  for (size_t k = 0; k < order.size(); ++k) {
    const int c = order[k];
    auto& e = out.evals[static_cast<size_t>(c)];
    if (e.status == EvalStatus::NotRun) continue;   // interrupted
    if (dominated(kept, k, c)) {
      e.status = EvalStatus::SkippedDominated;
      e.result = sim::SimResult{};
      e.fits_with_margin = false;
    } else if (e.status == EvalStatus::SkippedDominated && !out.stats.interrupted) {
      e = evaluate(c);
    }
    if (e.status == EvalStatus::Simulated && e.fits_with_margin) kept.push_back(k);
    switch (e.status) {
      case EvalStatus::Simulated: ++out.stats.simulated; break;
      case EvalStatus::SkippedDominated: ++out.stats.skipped_dominated; break;
      case EvalStatus::Invalid: ++out.stats.invalid; break;
      default: break;
    }
  }
  bar.draw(settled + finished, out.stats.simulated, settled + out.stats.skipped_dominated, true);
  bar.finish();
  out.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace fsdpsim::planner

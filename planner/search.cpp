// The search engine (notes "deterministic waves" in search.h).
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

  ProgressBar bar(opts.progress, n);
  int done = out.stats.pruned_memory;
  bar.start_at(done);
  // (peak, tokens/s) of simulated plans that fit with the margin, from finished waves: plans without
  // CPU offload [0] and with it [1]. An offload plan dominates only offload plans, because the
  // ranking recommends offload only when it is clearly faster (ranking.h): a plan without offload
  // must stay simulated even when an offload plan beats it.
  std::vector<std::pair<Bytes, double>> front_pts[2];
  auto is_offload = [&](int c) { return cands[static_cast<size_t>(c)].plan.cpu_offload.params ? 1 : 0; };
  const size_t wave = static_cast<size_t>(std::max(1, opts.wave_size));
  for (size_t w0 = 0; w0 < order.size() && !out.stats.interrupted; w0 += wave) {
    // Staircases of finished results: by peak ascending, best throughput so far.
    std::vector<double> best[2];
    for (int f = 0; f < 2; ++f) {
      std::sort(front_pts[f].begin(), front_pts[f].end());
      best[f].resize(front_pts[f].size());
      double run = -1;
      for (size_t i = 0; i < front_pts[f].size(); ++i) best[f][i] = run = std::max(run, front_pts[f][i].second);
    }
    auto dominated = [&](int f, const Evaluation& e) {
      auto it = std::upper_bound(front_pts[f].begin(), front_pts[f].end(), std::make_pair(e.memory_lower_bound, 1e308));
      size_t cnt = static_cast<size_t>(it - front_pts[f].begin());
      return cnt > 0 && best[f][cnt - 1] > e.tokens_per_s_upper_bound;
    };
    std::vector<int> todo;
    for (size_t k = w0; k < std::min(order.size(), w0 + wave); ++k) {
      int c = order[k];
      auto& e = out.evals[static_cast<size_t>(c)];
      if (dominated(0, e) || (is_offload(c) && dominated(1, e))) {
        e.status = EvalStatus::SkippedDominated;
        ++out.stats.skipped_dominated;
        ++done;
      } else {
        todo.push_back(c);
      }
    }
    std::atomic<size_t> next{0};
    std::atomic<int> finished{0};
    std::atomic<bool> stop{false};
    auto worker = [&]() {
      for (;;) {
        if (interrupted()) {
          stop = true;
          return;
        }
        size_t k = next.fetch_add(1);
        if (k >= todo.size()) return;
        int c = todo[k];
        auto& e = out.evals[static_cast<size_t>(c)];
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
        int f = ++finished;
        if ((f & 7) == 0) bar.draw(done + f, out.stats.simulated + f, out.stats.pruned_memory + out.stats.skipped_dominated);
      }
    };
    int nt = std::min<int>(out.stats.threads, static_cast<int>(todo.size()));
    std::vector<std::thread> pool;
    for (int t = 1; t < nt; ++t) pool.emplace_back(worker);
    worker();
    for (auto& th : pool) th.join();
    if (stop) out.stats.interrupted = true;
    for (int c : todo) {
      const auto& e = out.evals[static_cast<size_t>(c)];
      if (e.status == EvalStatus::Simulated) {
        ++out.stats.simulated;
        if (e.fits_with_margin) front_pts[is_offload(c)].emplace_back(e.result.peak_total_device, e.result.tokens_per_s_per_gpu);
      } else if (e.status == EvalStatus::Invalid) {
        ++out.stats.invalid;
      }
    }
    done += static_cast<int>(todo.size());
    bar.draw(done, out.stats.simulated, out.stats.pruned_memory + out.stats.skipped_dominated, true);
  }
  bar.finish();
  out.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace fsdpsim::planner

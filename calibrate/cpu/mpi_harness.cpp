#include "calibrate/cpu/mpi_harness.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "calibrate/cpu/mpi_check.h"
#include "common/output_file.h"

namespace fsdpsim::calibrate::cpu {

namespace {

struct Timed {
  double time_ns = 0;   // max over ranks of each rank's median iteration
  double spread = 1;    // max over ranks of (75th / 25th percentile) of the iterations
};

Timed time_size(const MpiCollective& c, const MpiGroup& g, const SweepOptions& o, std::vector<float>& buf, Bytes s,
                const Transport& run) {
  const Bytes elem = sizeof(float);
  std::size_t count = c.count(static_cast<std::size_t>(s / elem), g.size);
  std::size_t elems = c.buffer_elems(count, g.size);
  // Zeros while timing: sums stay exact and finite however many iterations run.
  std::fill(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(elems), 0.0f);
  for (int i = 0; i < o.warmup_iters; ++i) run(buf.data(), count);
  int iters = std::max(timed_iters_for(o, s), 4);
  FSDPSIM_MPI_CHECK(MPI_Barrier(g.comm));
  std::vector<double> t(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    double t0 = MPI_Wtime();
    run(buf.data(), count);
    t[static_cast<size_t>(i)] = MPI_Wtime() - t0;
  }
  // The median of the iterations rather than nccl-tests' mean: CPU ranks share cores with the
  // rest of the machine, and one preempted iteration must not set the profile.
  std::sort(t.begin(), t.end());
  double mine[2] = {t[static_cast<size_t>(iters / 2)] * 1e9,
                    t[static_cast<size_t>(3 * iters / 4)] / std::max(t[static_cast<size_t>(iters / 4)], 1e-12)};
  double worst[2] = {0, 0};
  FSDPSIM_MPI_CHECK(MPI_Allreduce(mine, worst, 2, MPI_DOUBLE, MPI_MAX, g.comm));
  return {worst[0], worst[1]};
}

// A point is suspect when its iterations spread widely (75th percentile > kNoisySpread x the 25th) or
// when it took longer than the next, larger size by more than kNonMonotone (a collective's time does not
// fall with its size: the machine was busier then, e.g. another calibration running at once).
constexpr double kNoisySpread = 2.0;
constexpr double kNonMonotone = 1.25;
constexpr int kRetries = 2;

bool suspect(const std::vector<Timed>& t, size_t i) {
  return t[i].spread > kNoisySpread || (i + 1 < t.size() && t[i].time_ns > kNonMonotone * t[i + 1].time_ns);
}

}  // namespace

SweepResult run_mpi_sweep(const MpiCollective& c, const MpiGroup& g, const SweepOptions& o, const std::string& host,
                          const SizeDone& done, std::vector<std::string>* warnings, const Transport* transport) {
  const Transport run = transport ? *transport : Transport([&](float* buf, std::size_t count) { c.run(buf, count, g.comm); });
  SweepResult res;
  res.op = c.op;
  res.group_size = g.size;
  res.nodes = g.nodes;
  res.dtype = "fp32";
  res.source = std::string("measured by fsdpsim-calibrate-cpu: ") +
               (transport ? std::string("the CPU runtime's MpiCommunicator (") + c.name + " semantics, non-blocking, polled)"
                          : std::string(c.name)) +
               " in place, fp32, " + std::to_string(g.size) +
               " ranks on " + host + "; time = max over ranks of the median of the timed iterations";
  const Bytes elem = sizeof(float);
  std::vector<Bytes> sizes = sweep_sizes(o, elem * g.size);
  if (sizes.empty()) return res;
  std::size_t max_elems = c.buffer_elems(c.count(static_cast<std::size_t>(sizes.back() / elem), g.size), g.size);
  std::vector<float> buf(max_elems, 0.0f);
  std::vector<Timed> timed;
  for (Bytes s : sizes) {
    // Stop together on Ctrl-C: a rank that stopped alone would leave the others waiting.
    int stop = interrupted() ? 1 : 0, any_stop = 0;
    FSDPSIM_MPI_CHECK(MPI_Allreduce(&stop, &any_stop, 1, MPI_INT, MPI_MAX, g.comm));
    if (any_stop) break;
    timed.push_back(time_size(c, g, o, buf, s, run));
    // Correctness: a fresh run on initialized data.
    std::size_t count = c.count(static_cast<std::size_t>(s / elem), g.size);
    std::size_t elems = c.buffer_elems(count, g.size);
    c.init(buf.data(), count, g.rank, g.size);
    run(buf.data(), count);
    unsigned long long wrong = c.check(buf.data(), count, g.rank, g.size), total_wrong = 0;
    FSDPSIM_MPI_CHECK(MPI_Allreduce(&wrong, &total_wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, g.comm));
    SweepPoint p;
    p.bytes = static_cast<Bytes>(elems) * elem;   // the full buffer: n*count for AG/RS, count for AR
    p.time_ns = timed.back().time_ns;
    p.check_ok = total_wrong == 0;
    res.points.push_back(p);
    if (g.rank == 0 && done) done(res, p);
  }
  // Suspect points are measured again (every rank sees the same reduced times, so all agree on which),
  // keeping the fastest median; what stays suspect is reported.
  for (int retry = 0; retry < kRetries; ++retry)
    for (size_t i = 0; i < timed.size(); ++i) {
      if (!suspect(timed, i)) continue;
      Timed again = time_size(c, g, o, buf, sizes[i], run);
      if (again.time_ns < timed[i].time_ns) timed[i].time_ns = again.time_ns;
      timed[i].spread = std::min(timed[i].spread, again.spread);
      res.points[i].time_ns = timed[i].time_ns;
    }
  for (size_t i = 0; i < timed.size(); ++i) {
    if (!suspect(timed, i) || !warnings) continue;
    char line[240];
    std::snprintf(line, sizeof line, "%s on %d ranks at %lld bytes: %s after %d re-measurements (%.1f us%s)",
                  c.name, g.size, static_cast<long long>(res.points[i].bytes),
                  timed[i].spread > kNoisySpread ? "noisy iterations" : "slower than the next larger size", kRetries,
                  timed[i].time_ns / 1e3,
                  i + 1 < timed.size() ? (", next size " + std::to_string(timed[i + 1].time_ns / 1e3) + " us").c_str() : "");
    warnings->push_back(line);
  }
  return res;
}

}  // namespace fsdpsim::calibrate::cpu

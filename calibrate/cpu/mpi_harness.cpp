#include "calibrate/cpu/mpi_harness.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "calibrate/cpu/mpi_check.h"
#include "common/output_file.h"

namespace fsdpsim::calibrate::cpu {

std::string mpi_where() {
  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0, rank = -1, init = 0;
  MPI_Initialized(&init);
  if (init) {
    MPI_Get_processor_name(host, &len);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  return std::string(host) + ":rank " + std::to_string(rank);
}

SweepResult run_mpi_sweep(const MpiCollective& c, const MpiGroup& g, const SweepOptions& o, const std::string& host,
                          const SizeDone& done) {
  SweepResult res;
  res.op = c.op;
  res.group_size = g.size;
  res.nodes = g.nodes;
  res.dtype = "fp32";
  res.source = std::string("measured by fsdpsim-calibrate-cpu: ") + c.name + " in place, fp32, " + std::to_string(g.size) +
               " ranks on " + host + "; time = max over ranks of the median of the timed iterations";
  const Bytes elem = sizeof(float);
  std::vector<Bytes> sizes = sweep_sizes(o, elem * g.size);
  if (sizes.empty()) return res;
  std::size_t max_elems = c.buffer_elems(c.count(static_cast<std::size_t>(sizes.back() / elem), g.size), g.size);
  std::vector<float> buf(max_elems, 0.0f);
  for (Bytes s : sizes) {
    // Stop together on Ctrl-C: a rank that stopped alone would leave the others waiting.
    int stop = interrupted() ? 1 : 0, any_stop = 0;
    FSDPSIM_MPI_CHECK(MPI_Allreduce(&stop, &any_stop, 1, MPI_INT, MPI_MAX, g.comm));
    if (any_stop) break;
    std::size_t count = c.count(static_cast<std::size_t>(s / elem), g.size);
    std::size_t elems = c.buffer_elems(count, g.size);
    // Zeros while timing: sums stay exact and finite however many iterations run.
    std::fill(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(elems), 0.0f);
    for (int i = 0; i < o.warmup_iters; ++i) c.run(buf.data(), count, g.comm);
    int iters = timed_iters_for(o, s);
    FSDPSIM_MPI_CHECK(MPI_Barrier(g.comm));
    std::vector<double> t(static_cast<size_t>(iters));
    for (int i = 0; i < iters; ++i) {
      double t0 = MPI_Wtime();
      c.run(buf.data(), count, g.comm);
      t[static_cast<size_t>(i)] = MPI_Wtime() - t0;
    }
    // The median of the iterations rather than nccl-tests' mean: CPU ranks share cores with the
    // rest of the machine, and one preempted iteration must not set the profile.
    std::nth_element(t.begin(), t.begin() + iters / 2, t.end());
    double mine = t[static_cast<size_t>(iters / 2)], slowest = 0;
    FSDPSIM_MPI_CHECK(MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, g.comm));
    // Correctness: a fresh run on initialized data.
    c.init(buf.data(), count, g.rank, g.size);
    c.run(buf.data(), count, g.comm);
    unsigned long long wrong = c.check(buf.data(), count, g.rank, g.size), total_wrong = 0;
    FSDPSIM_MPI_CHECK(MPI_Allreduce(&wrong, &total_wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, g.comm));
    SweepPoint p;
    p.bytes = static_cast<Bytes>(elems) * elem;   // the full buffer: n*count for AG/RS, count for AR
    p.time_ns = slowest * 1e9;
    p.check_ok = total_wrong == 0;
    res.points.push_back(p);
    if (g.rank == 0 && done) done(res, p);
  }
  return res;
}

}  // namespace fsdpsim::calibrate::cpu

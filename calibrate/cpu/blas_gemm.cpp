#include "calibrate/cpu/blas_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "calibrate/cpu/mpi_check.h"

namespace fsdpsim::calibrate::cpu {
namespace {

double max_over_ranks(double mine, MPI_Comm comm) {
  double out = 0;
  FSDPSIM_MPI_CHECK(MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MAX, comm));
  return out;
}

// C[m,n] = op(A) op(B) with op(A) [m,k] and op(B) [k,n]; A stored [k,m] when trans_a, B [n,k] when
// trans_b (row major), as runtime/layers/blas.cpp calls cblas_sgemm for forward (NT), dgrad (NN) and
// wgrad (TN) GEMMs.
struct Operands {
  std::int64_t m, n, k;
  bool ta, tb;
  std::vector<float> a, b, c;
  Operands(std::int64_t m_, std::int64_t n_, std::int64_t k_, bool ta_ = false, bool tb_ = false)
      : m(m_), n(n_), k(k_), ta(ta_), tb(tb_), a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)),
        c(static_cast<size_t>(m * n)) {
    // Small integers: every product and partial sum is exact in fp32 for k < 2^24 / 16.
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 3);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i % 4) + 1);
  }
  float a_at(std::int64_t i, std::int64_t p) const { return a[static_cast<size_t>(ta ? p * m + i : i * k + p)]; }
  float b_at(std::int64_t p, std::int64_t j) const { return b[static_cast<size_t>(tb ? j * k + p : p * n + j)]; }
  void run(float beta = 0.0f) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                static_cast<int>(n), static_cast<int>(k), 1.0f, a.data(), static_cast<int>(ta ? m : k), b.data(),
                static_cast<int>(tb ? k : n), beta, c.data(), static_cast<int>(n));
  }
};

}  // namespace

double typical_call_seconds(const std::function<void()>& fn, int reps) {
  std::vector<double> t(static_cast<std::size_t>(std::max(reps, 1)));
  for (double& x : t) {
    const double t0 = MPI_Wtime();
    fn();
    x = MPI_Wtime() - t0;
  }
  std::sort(t.begin(), t.end());
  const auto kept = std::upper_bound(t.begin(), t.end(), kUndisturbed * t.front()) - t.begin();
  return t[static_cast<std::size_t>(kept / 2)];   // the median of the undisturbed calls (the upper one of two)
}

namespace {
// A barrier whose waiting ranks sleep (MPI_Barrier spins, taking the core the timed rank needs).
void quiet_barrier(MPI_Comm comm) {
  MPI_Request req;
  FSDPSIM_MPI_CHECK(MPI_Ibarrier(comm, &req));
  for (int done = 0;;) {
    FSDPSIM_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}
}  // namespace

double timed_on_ranks(const std::function<double()>& measure, MPI_Comm comm, const ComputeTiming& ct) {
  double mine = 0;
  if (!ct.one_at_a_time) {
    FSDPSIM_MPI_CHECK(MPI_Barrier(comm));
    mine = measure();
  } else {
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    for (int r = 0; r < size; ++r) {
      quiet_barrier(comm);
      if (r == rank) mine = measure();
    }
  }
  return max_over_ranks(mine, comm) * ct.share;
}

GemmTiming time_sgemm(std::int64_t m, std::int64_t n, std::int64_t k, int reps, MPI_Comm comm, bool trans_a,
                      bool trans_b, float beta, const ComputeTiming& ct) {
  Operands op(m, n, k, trans_a, trans_b);
  op.run();   // warm-up (page faults, OpenBLAS thread start), with beta 0: the checked result
  // Check the last element against a direct dot product.
  std::int64_t i = m - 1, j = n - 1;
  double expect = 0;
  for (std::int64_t p = 0; p < k; ++p) expect += static_cast<double>(op.a_at(i, p)) * op.b_at(p, j);
  int ok = op.c[static_cast<size_t>(i * n + j)] == static_cast<float>(expect) ? 1 : 0, all_ok = 0;
  FSDPSIM_MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm));
  GemmTiming t;
  t.time_ns = timed_on_ranks([&] { return typical_call_seconds([&] { op.run(beta); }, reps); }, comm, ct) * 1e9;
  t.check_ok = all_ok == 1;
  return t;
}

double memcpy_bandwidth(std::int64_t bytes, int reps, MPI_Comm comm) {
  std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes), 0);
  std::memcpy(dst.data(), src.data(), src.size());
  FSDPSIM_MPI_CHECK(MPI_Barrier(comm));
  double t0 = MPI_Wtime();
  for (int r = 0; r < reps; ++r) {
    std::memcpy(dst.data(), src.data(), src.size());
    src[static_cast<size_t>(r) % src.size()] = dst[0];   // keep the copies observable
  }
  double t = max_over_ranks((MPI_Wtime() - t0) / reps, comm);
  return 2.0 * static_cast<double>(bytes) / t;
}

namespace {
// Seconds per call of `op`, the mean over back-to-back calls for at least `min_s` (not the fastest
// call: a slowdown by threads that share the core shows only in the mean, as the fastest call is one
// the other thread happened to leave alone).
double mean_time(Operands& op, double min_s) {
  int calls = 0;
  const double t0 = MPI_Wtime();
  double t = t0;
  while (t - t0 < min_s || calls < 3) {
    op.run();
    ++calls;
    t = MPI_Wtime();
  }
  return (t - t0) / calls;
}
}  // namespace

double overlap_slowdown(std::int64_t n, double min_s, MPI_Comm comm, bool thread_multiple,
                        const std::function<void()>& one_collective) {
  if (!thread_multiple) return 0;
  Operands op(n, n, n);
  op.run();
  FSDPSIM_MPI_CHECK(MPI_Barrier(comm));
  const double alone = max_over_ranks(mean_time(op, min_s), comm);
  // A second communicator so the background thread's stop votes never mix with the barriers above.
  MPI_Comm bg;
  FSDPSIM_MPI_CHECK(MPI_Comm_dup(comm, &bg));
  std::atomic<int> stop{0};
  std::atomic<int> started{0};
  // The comm thread stops after the round in which every rank has seen stop (a collective decision).
  std::thread comm_thread([&] {
    for (;;) {
      one_collective();
      started.store(1);
      int mine = stop.load(), all = 0;
      MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, bg);
      if (all) break;
    }
  });
  while (!started.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  const double busy = mean_time(op, min_s);
  stop = 1;
  comm_thread.join();
  FSDPSIM_MPI_CHECK(MPI_Comm_free(&bg));
  const double with = max_over_ranks(busy, comm);
  return std::max(1.0, with / alone);
}

struct BackgroundCompute::State {
  std::atomic<bool> stop{false};
  std::thread thread;
};

BackgroundCompute::BackgroundCompute(std::int64_t n) : state_(new State) {
  state_->thread = std::thread([n, st = state_] {
    Operands op(n, n, n);
    while (!st->stop.load(std::memory_order_relaxed)) op.run();
  });
}

BackgroundCompute::~BackgroundCompute() {
  state_->stop = true;
  state_->thread.join();
  delete state_;
}

}  // namespace fsdpsim::calibrate::cpu

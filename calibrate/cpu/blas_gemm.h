// CPU compute measurements for the CPU backend's profile: OpenBLAS sgemm at given shapes (every
// rank at once, as during training), a memcpy bandwidth, the cost of a minimal BLAS call, and the
// slowdown of a GEMM while an MPI all-gather runs in another thread.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>

namespace fsdpsim::calibrate::cpu {

// How compute is timed on a node whose ranks share cores. The profile must give each kernel's time as
// the runtime sees it: with more ranks than cores every rank's compute thread gets cores/ranks of a core.
// Timing all ranks at once would mix that sharing with the scheduler's luck, so then each rank times alone
// (the others wait without spinning) and the result is multiplied by `share` = ranks per core (>= 1).
struct ComputeTiming {
  bool one_at_a_time = false;
  double share = 1.0;
};
// `measure` returns this rank's seconds; the result is the slowest rank's, times ct.share.
double timed_on_ranks(const std::function<double()>& measure, MPI_Comm comm, const ComputeTiming& ct);
// Seconds of a typical call of `fn` over `reps` timed calls (reps >= 1): the median of the calls that took
// at most kUndisturbed x the fastest one. A training step sums many calls, each with the cache and
// scheduler state of its moment, so the profile needs a kernel's typical time, not its best: the fastest
// of N falls as N grows (with the fastest call, a --quick calibration, 3 calls per runtime kernel, left the
// CPU runtime's compute 8% short of its measured steps and a full one, 7 calls, 17%: issue 20,
// reports/validation/cpu-validate-2026-11-26.txt). But on a machine shared with other work a call of a few
// milliseconds is often preempted and takes 2-4x longer (seen on this project's VM under load: the plain
// median of 3 calls then doubled the predicted compute): such calls say nothing about the kernel and are
// left out.
constexpr double kUndisturbed = 1.5;
double typical_call_seconds(const std::function<void()>& fn, int reps);

struct GemmTiming {
  double time_ns = 0;   // max over ranks of each rank's typical call (typical_call_seconds)
  bool check_ok = false;
};
// C[m,n] = op(A)[m,k] op(B)[k,n] in fp32 (cblas_sgemm, row major; A stored transposed when trans_a,
// B when trans_b; C = AB + beta C while timed); checks one output element of a beta-0 run exactly.
GemmTiming time_sgemm(std::int64_t m, std::int64_t n, std::int64_t k, int reps, MPI_Comm comm, bool trans_a = false,
                      bool trans_b = false, float beta = 0.0f, const ComputeTiming& ct = {});
// Bytes moved per second by memcpy of `bytes` (read + write counted), slowest rank.
double memcpy_bandwidth(std::int64_t bytes, int reps, MPI_Comm comm);
// Mean time of an n^3 sgemm (over at least min_s seconds of calls) while another thread of every rank
// loops `one_collective` (the runtime's own collectives, as its stream threads run them), divided by its
// mean time alone (>= 1). Returns 0 when the MPI library cannot run collectives from a second thread.
double overlap_slowdown(std::int64_t n, double min_s, MPI_Comm comm, bool thread_multiple,
                        const std::function<void()>& one_collective);

// While alive, a thread of this rank runs n^3 sgemms back to back, as the CPU runtime's compute stream
// does while its collectives run on other threads: a sweep taken meanwhile measures collectives the way
// the runtime sees them (its ranks' cores are busy computing, so an MPI peer is often descheduled).
class BackgroundCompute {
 public:
  explicit BackgroundCompute(std::int64_t n);
  ~BackgroundCompute();
  BackgroundCompute(const BackgroundCompute&) = delete;
  BackgroundCompute& operator=(const BackgroundCompute&) = delete;

 private:
  struct State;
  State* state_;
};

}  // namespace fsdpsim::calibrate::cpu

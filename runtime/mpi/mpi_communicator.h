// The CPU backend's collectives on MPI (OpenMPI): one communicator per process group of the
// (replicate, shard) mesh, created with MPI_Comm_split. Each collective is started non-blocking and
// completed by polling MPI_Test with short sleeps, so a rank's stream threads can run collectives of
// different groups at once (MPI_THREAD_MULTIPLE) without burning the cores compute needs.
// Reductions are deterministic (communicator.h): reduce-scatter is an all-to-all of the chunks
// followed by a local sum in group-rank order; all-reduce is that reduce-scatter plus an all-gather
// (the ring's traffic, 2(n-1)/n of the buffer per rank). Every MPI call is checked with file:line
// and the rank (style.md lesson 7).
//
// Faults (issue 9): every collective, the world barrier and the world reductions included, is
// polled against a deadline (collective_timeout_s, default kDefaultCollectiveTimeoutS, environment
// FSDPSIM_COLLECTIVE_TIMEOUT_S): past it the call throws CollectiveTimeout naming this rank and
// host, the collective, its sequence number on the group and the group's world ranks, and the
// communicator enters the failed state: the rank's other pending collectives give up at once, and
// if the rank has not aborted within kAbortGraceS of the first failure a watchdog calls MPI_Abort
// itself (so a rank whose other threads are stuck still ends). The worker catches the exception,
// reports it and calls MPI_Abort, which makes mpirun end every rank.
#pragma once
#include <mpi.h>

#include <array>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/communicator.h"

namespace fsdpsim::runtime {

inline constexpr double kDefaultCollectiveTimeoutS = 300;   // generous: CPU collectives take milliseconds
inline constexpr double kAbortGraceS = 10;

// A collective that did not complete before its deadline (or was abandoned after another one failed).
class CollectiveTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// FSDPSIM_COLLECTIVE_TIMEOUT_S if set (seconds, > 0; InputError naming the variable otherwise),
// else kDefaultCollectiveTimeoutS.
double collective_timeout_from_env();
// "rank 1 of 2 (host vm, pid 1234)": how every fault message names the rank.
std::string rank_label(int rank, int world);

class MpiCommunicator : public Communicator {
 public:
  // MPI must be initialized (MPI_THREAD_MULTIPLE). shard_size = the mesh's shard dimension.
  explicit MpiCommunicator(int shard_size, double collective_timeout_s = kDefaultCollectiveTimeoutS);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int group_rank(sim::CommGroup g) const override;
  int group_size(sim::CommGroup g) const override;
  void all_gather(const float* in, float* out, std::int64_t count, sim::CommGroup g) override;
  void reduce_scatter(const float* in, float* out, std::int64_t count, sim::CommGroup g, ReduceOp op) override;
  void all_reduce(float* inout, std::int64_t count, sim::CommGroup g, ReduceOp op) override;
  void barrier() override;
  double sum_world(double v) override;
  double max_world(double v) override;

  double collective_timeout_s() const { return timeout_s_; }
  // The first failure's message ("" while none): set by a timeout or by fail().
  std::string failure() const;
  // Enters the failed state (pending and later collectives of this rank throw) and arms the abort
  // watchdog. Idempotent: the first message is kept.
  void fail(const std::string& what);

 private:
  MPI_Comm comm(sim::CommGroup g) const;
  // "the shard group (world ranks 0, 1)"
  std::string describe_group(sim::CommGroup g) const;
  // Waits for req; what = "all_gather" etc. Throws CollectiveTimeout past the deadline.
  void wait(MPI_Request& req, const char* what, sim::CommGroup g, long seq);
  long next_seq(sim::CommGroup g) { return seq_[static_cast<int>(g)].fetch_add(1); }

  int rank_ = 0, world_ = 1, shard_ = 1;
  double timeout_s_ = kDefaultCollectiveTimeoutS;
  MPI_Comm shard_comm_ = MPI_COMM_NULL, replicate_comm_ = MPI_COMM_NULL;
  std::array<std::atomic<long>, 4> seq_{};   // per sim::CommGroup: collectives started on the group
  std::atomic<bool> failed_{false};
  mutable std::mutex failure_m_;
  std::string failure_;
};

}  // namespace fsdpsim::runtime

#include "runtime/mpi/mpi_communicator.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "common/check_mpi.h"
#include "common/errors.h"
#include "runtime/mpi/mpi_lsan.h"

namespace fsdpsim::runtime {

namespace {

int to_int(std::int64_t n) {
  if (n < 0 || n > INT_MAX) throw std::runtime_error("MPI count out of int range: " + std::to_string(n));
  return static_cast<int>(n);
}

const char* group_name(sim::CommGroup g) {
  switch (g) {
    case sim::CommGroup::Shard: return "shard";
    case sim::CommGroup::Replicate: return "replicate";
    case sim::CommGroup::World: return "world";
    case sim::CommGroup::PostForward: return "post-forward";
  }
  return "?";
}

std::string seconds_text(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%g", s);
  return b;
}
}  // namespace

double collective_timeout_from_env() {
  const char* v = std::getenv("FSDPSIM_COLLECTIVE_TIMEOUT_S");
  if (!v || !*v) return kDefaultCollectiveTimeoutS;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(s) || s <= 0 || s > 1e6)
    throw InputError("FSDPSIM_COLLECTIVE_TIMEOUT_S", std::string("\"") + v + "\"",
                     "a number of seconds in (0, 1e6] (default " + seconds_text(kDefaultCollectiveTimeoutS) + ")");
  return s;
}

std::string rank_label(int rank, int world) {
  char host[256] = "?";
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  host[sizeof(host) - 1] = '\0';
  return "rank " + std::to_string(rank) + " of " + std::to_string(world) + " (host " + host + ", pid " +
         std::to_string(static_cast<long>(getpid())) + ")";
}

MpiCommunicator::MpiCommunicator(int shard_size, double collective_timeout_s)
    : shard_(shard_size), timeout_s_(collective_timeout_s) {
  FSDPSIM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  set_check_rank(rank_);   // every later check names this rank
  FSDPSIM_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_));
  if (shard_ < 1 || world_ % shard_ != 0)
    throw std::runtime_error("MpiCommunicator: shard size " + std::to_string(shard_) + " does not divide world " +
                             std::to_string(world_));
  if (!(timeout_s_ > 0)) throw std::runtime_error("MpiCommunicator: collective timeout must be > 0");
  ScopedLeakCheckOff lsan_off;   // OpenMPI's per-communicator state (mpi_lsan.h)
  FSDPSIM_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank_ / shard_, rank_, &shard_comm_));
  FSDPSIM_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank_ % shard_, rank_, &replicate_comm_));
}

MpiCommunicator::~MpiCommunicator() {
  ScopedLeakCheckOff lsan_off;
  if (shard_comm_ != MPI_COMM_NULL) MPI_Comm_free(&shard_comm_);
  if (replicate_comm_ != MPI_COMM_NULL) MPI_Comm_free(&replicate_comm_);
}

MPI_Comm MpiCommunicator::comm(sim::CommGroup g) const {
  switch (g) {
    case sim::CommGroup::Shard: return shard_comm_;
    case sim::CommGroup::Replicate: return replicate_comm_;
    case sim::CommGroup::World: return MPI_COMM_WORLD;
    case sim::CommGroup::PostForward: break;
  }
  throw std::runtime_error("MpiCommunicator: the post-forward group (reshard_after_forward=int) is not supported");
}

std::string MpiCommunicator::describe_group(sim::CommGroup g) const {
  std::vector<int> members;
  if (g == sim::CommGroup::Shard)
    for (int r = rank_ - rank_ % shard_; r < rank_ - rank_ % shard_ + shard_; ++r) members.push_back(r);
  else if (g == sim::CommGroup::Replicate)
    for (int r = rank_ % shard_; r < world_; r += shard_) members.push_back(r);
  else
    for (int r = 0; r < world_; ++r) members.push_back(r);
  std::string s = std::string("the ") + group_name(g) + " group (world ranks ";
  const size_t show = members.size() <= 16 ? members.size() : 8;
  for (size_t i = 0; i < show; ++i) s += (i ? ", " : "") + std::to_string(members[i]);
  if (show < members.size()) s += ", ... " + std::to_string(members.back()) + ": " + std::to_string(members.size()) + " ranks";
  return s + ")";
}

std::string MpiCommunicator::failure() const {
  std::lock_guard<std::mutex> lk(failure_m_);
  return failure_;
}

void MpiCommunicator::fail(const std::string& what) {
  {
    std::lock_guard<std::mutex> lk(failure_m_);
    if (failed_.load()) return;
    failure_ = what;
    failed_.store(true);
  }
  // The abort watchdog: the worker normally reports and aborts at once; if this rank is still alive
  // after the grace period (e.g. another of its threads is stuck outside MPI), abort from here.
  std::thread([msg = what, label = rank_label(rank_, world_)] {
    std::this_thread::sleep_for(std::chrono::duration<double>(kAbortGraceS));
    std::cerr << "fsdpsim-run-cpu: " << label << ": still running " << kAbortGraceS
              << " s after a collective failure, aborting the job: " << msg << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }).detach();
}

void MpiCommunicator::wait(MPI_Request& req, const char* what, sim::CommGroup g, long seq) {
  // Polls with a 20 us sleep: the rank's compute thread keeps the core while a collective is in flight.
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  for (int polls = 0;; ++polls) {
    int done = 0;
    FSDPSIM_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (failed_.load()) {
      throw CollectiveTimeout(rank_label(rank_, world_) + ": " + what + " #" + std::to_string(seq) + " on " +
                              describe_group(g) + " abandoned: an earlier collective of this rank failed (" +
                              failure() + ")");
    }
    if ((polls & 63) == 0 && Clock::now() > deadline) {
      const std::string msg =
          rank_label(rank_, world_) + ": collective " + what + " #" + std::to_string(seq) + " on " + describe_group(g) +
          " did not complete within " + seconds_text(timeout_s_) +
          " s (FSDPSIM_COLLECTIVE_TIMEOUT_S): another rank of that group died, hangs or is far behind";
      fail(msg);
      throw CollectiveTimeout(msg);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void MpiCommunicator::all_gather(const float* in, float* out, std::int64_t count, sim::CommGroup g) {
  MPI_Request req;
  const int n = to_int(count);
  const long seq = next_seq(g);
  if (in == out + static_cast<std::int64_t>(group_rank(g)) * count)
    FSDPSIM_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, n, MPI_FLOAT, comm(g), &req));
  else
    FSDPSIM_MPI_CHECK(MPI_Iallgather(in, n, MPI_FLOAT, out, n, MPI_FLOAT, comm(g), &req));
  wait(req, "all_gather", g, seq);
}

void MpiCommunicator::reduce_scatter(const float* in, float* out, std::int64_t count, sim::CommGroup g, ReduceOp op) {
  const int members = group_size(g);
  std::vector<float> recv(static_cast<size_t>(members) * count);
  MPI_Request req;
  const long seq = next_seq(g);
  FSDPSIM_MPI_CHECK(MPI_Ialltoall(in, to_int(count), MPI_FLOAT, recv.data(), to_int(count), MPI_FLOAT, comm(g), &req));
  wait(req, "reduce_scatter", g, seq);
  // recv[r*count + i] is member r's contribution to my chunk: sum in member order.
  for (std::int64_t i = 0; i < count; ++i) {
    float s = 0;
    for (int r = 0; r < members; ++r) s += recv[static_cast<size_t>(r) * count + i];
    out[i] = op == ReduceOp::Avg ? s / static_cast<float>(members) : s;
  }
}

void MpiCommunicator::all_reduce(float* inout, std::int64_t count, sim::CommGroup g, ReduceOp op) {
  const int members = group_size(g);
  if (members == 1) return;
  const std::int64_t chunk = (count + members - 1) / members;
  std::vector<float> padded(static_cast<size_t>(chunk) * members, 0.0f), mine(chunk);
  std::memcpy(padded.data(), inout, sizeof(float) * count);
  reduce_scatter(padded.data(), mine.data(), chunk, g, op);
  all_gather(mine.data(), padded.data(), chunk, g);
  std::memcpy(inout, padded.data(), sizeof(float) * count);
}

int MpiCommunicator::group_rank(sim::CommGroup g) const {
  int r = 0;
  FSDPSIM_MPI_CHECK(MPI_Comm_rank(comm(g), &r));
  return r;
}

int MpiCommunicator::group_size(sim::CommGroup g) const {
  int n = 0;
  FSDPSIM_MPI_CHECK(MPI_Comm_size(comm(g), &n));
  return n;
}

void MpiCommunicator::barrier() {
  MPI_Request req;
  const long seq = next_seq(sim::CommGroup::World);
  FSDPSIM_MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &req));
  wait(req, "barrier", sim::CommGroup::World, seq);
}

double MpiCommunicator::sum_world(double v) {
  std::vector<double> all(world_);
  MPI_Request req;
  const long seq = next_seq(sim::CommGroup::World);
  FSDPSIM_MPI_CHECK(MPI_Iallgather(&v, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD, &req));
  wait(req, "sum_world (all_gather)", sim::CommGroup::World, seq);
  double s = 0;
  for (double x : all) s += x;   // rank order: the same sum on every rank
  return s;
}

double MpiCommunicator::max_world(double v) {
  double m = 0;
  MPI_Request req;
  const long seq = next_seq(sim::CommGroup::World);
  FSDPSIM_MPI_CHECK(MPI_Iallreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &req));
  wait(req, "max_world (all_reduce)", sim::CommGroup::World, seq);
  return m;
}

}  // namespace fsdpsim::runtime

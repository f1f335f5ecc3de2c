#include "runtime/mpi/mpi_communicator.h"

#include <chrono>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace fsdpsim::runtime {

namespace {
// MPI_CHECK: every MPI call, with file:line and the rank in the message.
void mpi_check(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": rank " + std::to_string(rank) + ": " +
                           call + " failed: " + std::string(msg, len));
}
#define MPI_CHECK(call) mpi_check((call), #call, __FILE__, __LINE__)

int to_int(std::int64_t n) {
  if (n < 0 || n > INT_MAX) throw std::runtime_error("MPI count out of int range: " + std::to_string(n));
  return static_cast<int>(n);
}
}  // namespace

MpiCommunicator::MpiCommunicator(int shard_size) : shard_(shard_size) {
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_));
  if (shard_ < 1 || world_ % shard_ != 0)
    throw std::runtime_error("MpiCommunicator: shard size " + std::to_string(shard_) + " does not divide world " +
                             std::to_string(world_));
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank_ / shard_, rank_, &shard_comm_));
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank_ % shard_, rank_, &replicate_comm_));
}

MpiCommunicator::~MpiCommunicator() {
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

int MpiCommunicator::group_rank(sim::CommGroup g) const {
  int r = 0;
  MPI_CHECK(MPI_Comm_rank(comm(g), &r));
  return r;
}

int MpiCommunicator::group_size(sim::CommGroup g) const {
  int n = 0;
  MPI_CHECK(MPI_Comm_size(comm(g), &n));
  return n;
}

void MpiCommunicator::wait(MPI_Request& req, const char* what) const {
  // Polls with a 20 us sleep: the rank's compute thread keeps the core while a collective is in flight.
  for (;;) {
    int done = 0;
    MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void MpiCommunicator::all_gather(const float* in, float* out, std::int64_t count, sim::CommGroup g) {
  MPI_Request req;
  const int n = to_int(count);
  if (in == out + static_cast<std::int64_t>(group_rank(g)) * count)
    MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, n, MPI_FLOAT, comm(g), &req));
  else
    MPI_CHECK(MPI_Iallgather(in, n, MPI_FLOAT, out, n, MPI_FLOAT, comm(g), &req));
  wait(req, "all_gather");
}

void MpiCommunicator::reduce_scatter(const float* in, float* out, std::int64_t count, sim::CommGroup g, ReduceOp op) {
  const int members = group_size(g);
  std::vector<float> recv(static_cast<size_t>(members) * count);
  MPI_Request req;
  MPI_CHECK(MPI_Ialltoall(in, to_int(count), MPI_FLOAT, recv.data(), to_int(count), MPI_FLOAT, comm(g), &req));
  wait(req, "reduce_scatter");
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

void MpiCommunicator::barrier() { MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }

double MpiCommunicator::sum_world(double v) {
  std::vector<double> all(world_);
  MPI_CHECK(MPI_Allgather(&v, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD));
  double s = 0;
  for (double x : all) s += x;   // rank order: the same sum on every rank
  return s;
}

double MpiCommunicator::max_world(double v) {
  double m = 0;
  MPI_CHECK(MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return m;
}

}  // namespace fsdpsim::runtime

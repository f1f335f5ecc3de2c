#include "runtime/cuda/nccl_communicator.h"

#include <mpi.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "common/check_mpi.h"
#include "runtime/cuda/cuda_check.h"

namespace fsdpsim::runtime::cuda {

namespace {
ncclDataType_t nccl_type(Elem t) { return t == Elem::F32 ? ncclFloat32 : ncclBfloat16; }
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Avg ? ncclAvg : ncclSum; }

// One communicator over the ranks of `group` (MPI), rooted at its rank 0.
ncclComm_t init_group(MPI_Comm group) {
  int n = 0, r = 0;
  FSDPSIM_MPI_CHECK(MPI_Comm_size(group, &n));
  FSDPSIM_MPI_CHECK(MPI_Comm_rank(group, &r));
  ncclUniqueId id;
  if (r == 0) FSDPSIM_NCCL_CHECK(ncclGetUniqueId(&id));
  FSDPSIM_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, group));
  ncclComm_t c = nullptr;
  FSDPSIM_NCCL_CHECK(ncclCommInitRank(&c, n, id, r));
  return c;
}

long elem_bytes(Elem t) { return t == Elem::F32 ? 4 : 2; }
}  // namespace

NcclCommunicator::NcclCommunicator(int shard_size, bool use_mpi) : mpi_(use_mpi), shard_(shard_size) {
  if (mpi_) {
    FSDPSIM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    FSDPSIM_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_));
  }
  if (shard_ < 1 || world_ % shard_ != 0)
    throw std::runtime_error("NcclCommunicator: shard size " + std::to_string(shard_) + " does not divide world " +
                             std::to_string(world_));
  if (mpi_) {
    // Shard groups (disjoint) first, then replicate groups, then the world: the same order on every
    // rank, so each blocking ncclCommInitRank meets its peers.
    MPI_Comm shard = MPI_COMM_NULL, replicate = MPI_COMM_NULL;
    FSDPSIM_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank_ / shard_, rank_, &shard));
    FSDPSIM_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank_ % shard_, rank_, &replicate));
    comms_[0] = init_group(shard);
    comms_[1] = init_group(replicate);
    comms_[2] = init_group(MPI_COMM_WORLD);
    MPI_Comm_free(&shard);
    MPI_Comm_free(&replicate);
  }   // without MPI every group has one member: collectives are local copies, no NCCL communicator
}

NcclCommunicator::~NcclCommunicator() {
  for (auto& c : comms_)
    if (c) ncclCommDestroy(c);
}

ncclComm_t NcclCommunicator::comm(sim::CommGroup g) const {
  switch (g) {
    case sim::CommGroup::Shard: return comms_[0];
    case sim::CommGroup::Replicate: return comms_[1];
    case sim::CommGroup::World: return comms_[2];
    case sim::CommGroup::PostForward: break;
  }
  throw std::runtime_error("NcclCommunicator: the post-forward group (reshard_after_forward=int) is not supported");
}

int NcclCommunicator::group_rank(sim::CommGroup g) const {
  if (!mpi_) return 0;
  int r = 0;
  FSDPSIM_NCCL_CHECK(ncclCommUserRank(comm(g), &r));
  return r;
}

int NcclCommunicator::group_size(sim::CommGroup g) const {
  if (!mpi_) {
    comm(g);   // rejects the post-forward group as with MPI
    return 1;
  }
  int n = 0;
  FSDPSIM_NCCL_CHECK(ncclCommCount(comm(g), &n));
  return n;
}

void NcclCommunicator::all_gather(const void* in, void* out, long count, Elem t, sim::CommGroup g, cudaStream_t s) {
  if (!mpi_) {
    if (in != out) FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(out, in, static_cast<size_t>(count * elem_bytes(t)), cudaMemcpyDeviceToDevice, s));
    return;
  }
  FSDPSIM_NCCL_CHECK(ncclAllGather(in, out, static_cast<size_t>(count), nccl_type(t), comm(g), s));
}

void NcclCommunicator::reduce_scatter(const void* in, void* out, long count, Elem t, sim::CommGroup g, ReduceOp op,
                                      cudaStream_t s) {
  if (!mpi_) {   // the sum (or average) over one member
    if (in != out) FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(out, in, static_cast<size_t>(count * elem_bytes(t)), cudaMemcpyDeviceToDevice, s));
    return;
  }
  FSDPSIM_NCCL_CHECK(ncclReduceScatter(in, out, static_cast<size_t>(count), nccl_type(t), nccl_op(op), comm(g), s));
}

void NcclCommunicator::all_reduce(void* inout, long count, Elem t, sim::CommGroup g, ReduceOp op, cudaStream_t s) {
  if (!mpi_) return;
  FSDPSIM_NCCL_CHECK(ncclAllReduce(inout, inout, static_cast<size_t>(count), nccl_type(t), nccl_op(op), comm(g), s));
}

void NcclCommunicator::barrier() {
  if (mpi_) FSDPSIM_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

double NcclCommunicator::sum_world(double v) {
  if (!mpi_) return v;
  std::vector<double> all(world_);
  FSDPSIM_MPI_CHECK(MPI_Allgather(&v, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD));
  double s = 0;
  for (double x : all) s += x;   // rank order: the same sum on every rank
  return s;
}

double NcclCommunicator::max_world(double v) {
  if (!mpi_) return v;
  double m = 0;
  FSDPSIM_MPI_CHECK(MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return m;
}

}  // namespace fsdpsim::runtime::cuda

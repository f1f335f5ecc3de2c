#include "calibrate/cuda/nccl_harness.h"

#include <unistd.h>

#include <algorithm>

#include "common/output_file.h"

namespace fsdpsim::calibrate::cuda {

double max_over(double mine, MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) return mine;
  double out = 0;
  FSDPSIM_MPI_CHECK(MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MAX, comm));
  return out;
}

void NcclGroup::destroy() {
  for (auto& l : local) {
    FSDPSIM_CUDA_CHECK(cudaSetDevice(l.device));
    if (l.buf) FSDPSIM_CUDA_CHECK(cudaFree(l.buf));
    if (l.stream) FSDPSIM_CUDA_CHECK(cudaStreamDestroy(l.stream));
    if (l.comm) FSDPSIM_NCCL_CHECK(ncclCommDestroy(l.comm));
  }
  local.clear();
  if (mpi != MPI_COMM_NULL) FSDPSIM_MPI_CHECK(MPI_Comm_free(&mpi));
}

NcclGroup make_local_group(int n) {
  NcclGroup g;
  g.size = n;
  std::vector<int> devs(n);
  std::vector<ncclComm_t> comms(n);
  for (int i = 0; i < n; ++i) devs[i] = i;
  FSDPSIM_NCCL_CHECK(ncclCommInitAll(comms.data(), n, devs.data()));
  for (int i = 0; i < n; ++i) {
    LocalRank l;
    l.device = i, l.rank = i, l.comm = comms[i];
    FSDPSIM_CUDA_CHECK(cudaSetDevice(i));
    FSDPSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
    g.local.push_back(l);
  }
  return g;
}

NcclGroup make_mpi_group(MPI_Comm comm, int device, int nodes) {
  NcclGroup g;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &g.size);
  g.nodes = nodes;
  g.mpi = comm;
  ncclUniqueId id;
  if (rank == 0) FSDPSIM_NCCL_CHECK(ncclGetUniqueId(&id));
  FSDPSIM_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));   // MPI bootstraps NCCL
  LocalRank l;
  l.device = device, l.rank = rank;
  FSDPSIM_CUDA_CHECK(cudaSetDevice(device));
  FSDPSIM_NCCL_CHECK(ncclCommInitRank(&l.comm, g.size, id, rank));
  FSDPSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
  g.local.push_back(l);
  return g;
}

namespace {

void run_all(const NcclCollective& c, NcclGroup& g, std::size_t count) {
  FSDPSIM_NCCL_CHECK(ncclGroupStart());
  for (auto& l : g.local) {
    FSDPSIM_CUDA_CHECK(cudaSetDevice(l.device));
    c.run(l.buf, count, l.rank, l.comm, l.stream);
  }
  FSDPSIM_NCCL_CHECK(ncclGroupEnd());
}

void sync_all(NcclGroup& g) {
  for (auto& l : g.local) {
    FSDPSIM_CUDA_CHECK(cudaSetDevice(l.device));
    FSDPSIM_CUDA_CHECK(cudaStreamSynchronize(l.stream));
  }
}

}  // namespace

SweepResult run_nccl_sweep(const NcclCollective& c, NcclGroup& g, const SweepOptions& o, const std::string& host,
                           const SizeDone& done) {
  SweepResult res;
  res.op = c.op, res.group_size = g.size, res.nodes = g.nodes, res.dtype = "bf16";
  res.source = std::string("measured by fsdpsim-calibrate-cuda: ") + c.name + " in place, bf16, " + std::to_string(g.size) +
               " GPUs on " + host + "; time = max over ranks of the mean over the timed iterations (CUDA events)";
  const Bytes elem = sizeof(Bf16Bits);
  auto sizes = sweep_sizes(o, elem * g.size);
  if (sizes.empty()) return res;
  std::size_t max_bytes = c.buffer_elems(c.count(sizes.back() / elem, g.size), g.size) * elem;
  for (auto& l : g.local) {
    if (l.buf_bytes >= max_bytes) continue;
    FSDPSIM_CUDA_CHECK(cudaSetDevice(l.device));
    if (l.buf) FSDPSIM_CUDA_CHECK(cudaFree(l.buf));
    FSDPSIM_CUDA_CHECK(cudaMalloc(&l.buf, max_bytes));
    l.buf_bytes = max_bytes;
  }
  std::vector<Bf16Bits> host_buf;
  int my_rank0 = 0;
  if (g.mpi != MPI_COMM_NULL) MPI_Comm_rank(g.mpi, &my_rank0);
  for (Bytes s : sizes) {
    int stop = interrupted() ? 1 : 0;
    if (max_over(stop, g.mpi) > 0) break;
    std::size_t count = c.count(static_cast<std::size_t>(s / elem), g.size);
    std::size_t elems = c.buffer_elems(count, g.size);
    for (auto& l : g.local) {
      FSDPSIM_CUDA_CHECK(cudaSetDevice(l.device));
      FSDPSIM_CUDA_CHECK(cudaMemsetAsync(l.buf, 0, elems * elem, l.stream));
    }
    for (int i = 0; i < o.warmup_iters; ++i) run_all(c, g, count);
    sync_all(g);
    if (g.mpi != MPI_COMM_NULL) FSDPSIM_MPI_CHECK(MPI_Barrier(g.mpi));
    int iters = timed_iters_for(o, s);
    std::vector<cudaEvent_t> start(g.local.size()), stop_ev(g.local.size());
    for (size_t i = 0; i < g.local.size(); ++i) {
      FSDPSIM_CUDA_CHECK(cudaSetDevice(g.local[i].device));
      FSDPSIM_CUDA_CHECK(cudaEventCreate(&start[i]));
      FSDPSIM_CUDA_CHECK(cudaEventCreate(&stop_ev[i]));
      FSDPSIM_CUDA_CHECK(cudaEventRecord(start[i], g.local[i].stream));
    }
    for (int i = 0; i < iters; ++i) run_all(c, g, count);
    double mine = 0;
    for (size_t i = 0; i < g.local.size(); ++i) {
      FSDPSIM_CUDA_CHECK(cudaSetDevice(g.local[i].device));
      FSDPSIM_CUDA_CHECK(cudaEventRecord(stop_ev[i], g.local[i].stream));
      FSDPSIM_CUDA_CHECK(cudaEventSynchronize(stop_ev[i]));
      float ms = 0;
      FSDPSIM_CUDA_CHECK(cudaEventElapsedTime(&ms, start[i], stop_ev[i]));
      mine = std::max(mine, static_cast<double>(ms) * 1e6 / iters);
      FSDPSIM_CUDA_CHECK(cudaEventDestroy(start[i]));
      FSDPSIM_CUDA_CHECK(cudaEventDestroy(stop_ev[i]));
    }
    double slowest = max_over(mine, g.mpi);
    // Correctness: initialized inputs, one run, every rank checks its result.
    for (auto& l : g.local) {
      c.init(host_buf, count, l.rank, g.size);
      FSDPSIM_CUDA_CHECK(cudaSetDevice(l.device));
      FSDPSIM_CUDA_CHECK(cudaMemcpy(l.buf, host_buf.data(), elems * elem, cudaMemcpyHostToDevice));
    }
    run_all(c, g, count);
    sync_all(g);
    double wrong = 0;
    for (auto& l : g.local) {
      host_buf.resize(elems);
      FSDPSIM_CUDA_CHECK(cudaSetDevice(l.device));
      FSDPSIM_CUDA_CHECK(cudaMemcpy(host_buf.data(), l.buf, elems * elem, cudaMemcpyDeviceToHost));
      wrong += static_cast<double>(c.check(host_buf, count, l.rank, g.size));
    }
    wrong = max_over(wrong, g.mpi);
    SweepPoint p;
    p.bytes = static_cast<Bytes>(elems) * elem;
    p.time_ns = slowest;
    p.check_ok = wrong == 0;
    res.points.push_back(p);
    if (my_rank0 == 0 && done) done(res, p);
  }
  return res;
}

}  // namespace fsdpsim::calibrate::cuda

#include "runtime/cuda/cuda_device.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "common/errors.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_rank_runner.h"
#include "runtime/cuda/spin.h"

namespace fsdpsim::runtime::cuda {

namespace {

std::vector<bf16*> bf16s(const std::vector<char*>& ps) {
  std::vector<bf16*> out;
  for (char* p : ps) out.push_back(reinterpret_cast<bf16*>(p));
  return out;
}

cudaStream_t stream_of(Stream s) { return static_cast<cudaStream_t>(s); }

}  // namespace

CudaDevice::CudaDevice(DeviceCommunicator& comm) : comm_(comm) {
  size_t free0 = 0, total0 = 0;
  FSDPSIM_CUDA_CHECK(cudaMemGetInfo(&free0, &total0));
  device_total_ = static_cast<Bytes>(total0);
  used_at_start_ = used_peak_ = static_cast<Bytes>(total0 - free0);
}

CudaDevice::~CudaDevice() {
  for (void* p : outside_) cudaFree(p);
  if (scratch_zeroed_) cudaEventDestroy(scratch_zeroed_);
}

void CudaDevice::check_supports(const models::ModelSpec& m, const sim::Plan& plan) const {
  check_cuda_runtime_supports(m, plan);
}

void CudaDevice::prepare(const RankProgram& rp, float dloss_scale, Bytes address_space) {
  exec_ = std::make_unique<CudaStreamExecutor>(rp.program);
  gemm_ = std::make_unique<Gemm>(exec_->stream(0));
  compute_ = std::make_unique<CudaSegmentCompute>(rp.dims, dloss_scale, rp.checkpointed, *gemm_);
  compute_->set_recompute_early_stop(rp.recompute_early_stop);

  // The allocator's region: what is free on the device, less headroom for what the CUDA runtime and
  // libraries allocate lazily outside it (cuBLAS workspaces, NCCL buffers, kernel modules loaded on
  // first launch, the local memory of the attention kernels' register spills, sized per resident
  // thread on the first launch, and gather_to_host's fp32 staging of the largest unit), capped by
  // address_space. Measured on an H100: 512 MiB was not enough for llama-1b/llama3-8b shapes.
  // FSDPSIM_CUDA_HEADROOM_MIB overrides the default max(4 GiB, 10% of the device).
  size_t free_b = 0, total_b = 0;
  FSDPSIM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  Bytes headroom = std::max<Bytes>(4 * kGiB, static_cast<Bytes>(total_b) / 10);
  if (const char* h = std::getenv("FSDPSIM_CUDA_HEADROOM_MIB")) {
    char* end = nullptr;
    const long long mib = std::strtoll(h, &end, 10);
    if (end == h || *end != '\0' || mib < 0 || mib > (1LL << 30))
      throw InputError("FSDPSIM_CUDA_HEADROOM_MIB", "\"" + std::string(h) + "\"", "a whole number of MiB >= 0");
    headroom = static_cast<Bytes>(mib) * kMiB;
  }
  for (const UnitLayout& l : rp.layouts) headroom = std::max<Bytes>(headroom, l.unsharded * 4 + 512 * kMiB);
  const Bytes region = std::min<Bytes>(address_space, static_cast<Bytes>(free_b) - headroom);
  if (region <= 0) throw std::runtime_error("CUDA runtime: no device memory left for the allocator (" + ::fsdpsim::check_where() + ")");
  mem_ = std::make_unique<CudaDeviceMemory>(rp.program, region);
  region_ = region;
}

std::vector<std::string> CudaDevice::finish_setup() {
  sample_device_use();
  return {"measured on the CUDA backend (bf16 compute, fp32 accumulation and masters, cuBLAS, NCCL); " +
              std::to_string(untracked_bytes()) +
              " B of device scratch (residual stream, checkpointed blocks' transient forward, backward "
              "temporaries, final-norm activations, tokens, rotary table) are outside the caching allocator",
          "the head's logits buffer is sized for PyTorch's fp32 log_softmax copy; the fused cross-entropy "
          "uses its bf16 logits and 4 B per token of the fp32 part"};
}

void* CudaDevice::alloc_outside(Bytes bytes) {
  void* p = nullptr;
  FSDPSIM_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(bytes)));
  outside_.push_back(p);
  outside_bytes_ += bytes;
  return p;
}

std::string CudaDevice::outside_state_note(int unit, Bytes have, Bytes need) const {
  return "optimizer state of unit " + std::to_string(unit) + ": the program's buffer (" + std::to_string(have) +
         " B) is smaller than the padded shard needs (" + std::to_string(need) +
         " B); kept in a separate cudaMalloc outside the allocator";
}

void* CudaDevice::grad_scratch(int unit, Bytes bytes) {
  if (static_cast<size_t>(unit) >= grad_scratch_.size()) grad_scratch_.resize(static_cast<size_t>(unit) + 1, nullptr);
  void*& p = grad_scratch_[static_cast<size_t>(unit)];
  if (!p) {
    p = alloc_outside(bytes);
    FSDPSIM_CUDA_CHECK(cudaMemset(p, 0, static_cast<size_t>(bytes)));
  }
  return p;
}

void CudaDevice::upload(void* dst, const void* host, Bytes bytes) {
  FSDPSIM_CUDA_CHECK(cudaMemcpy(dst, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
}
void CudaDevice::zero_now(void* dst, Bytes bytes) { FSDPSIM_CUDA_CHECK(cudaMemset(dst, 0, static_cast<size_t>(bytes))); }

sim::SimResult CudaDevice::execute_step(OpHandler& handler) {
  return exec_->execute_step(*mem_, handler);
}

void CudaDevice::compute_waits_for(Stream s) {
  if (!scratch_zeroed_) FSDPSIM_CUDA_CHECK(cudaEventCreateWithFlags(&scratch_zeroed_, cudaEventDisableTiming));
  FSDPSIM_CUDA_CHECK(cudaEventRecord(scratch_zeroed_, stream_of(s)));
  FSDPSIM_CUDA_CHECK(cudaStreamWaitEvent(gemm_->stream(), scratch_zeroed_, 0));
}

void CudaDevice::synchronize() { FSDPSIM_CUDA_CHECK(cudaDeviceSynchronize()); }

void CudaDevice::set_batch(int mb, std::vector<std::int32_t> inputs, std::vector<std::int32_t> targets) {
  compute_->set_batch(mb, inputs, targets);
}
void CudaDevice::forward(int seg, int mb, const std::vector<char*>& params, char* act) {
  compute_->forward(seg, mb, bf16s(params), act);
}
void CudaDevice::recompute(int seg, int mb, const std::vector<char*>& params, char* act, char* recomp) {
  compute_->recompute(seg, mb, bf16s(params), act, recomp);
}
void CudaDevice::backward(int seg, int mb, const std::vector<char*>& params, const std::vector<char*>& grads, char* act,
                          char* recomp) {
  compute_->backward(seg, mb, bf16s(params), bf16s(grads), act, recomp);
}

void CudaDevice::copy(void* dst, Elem dst_type, const void* src, Elem src_type, std::int64_t n, Stream s) {
  convert(dst, dst_type, src, src_type, n, stream_of(s));
}
void CudaDevice::copy_rows(void* dst, Bytes dpitch, const void* src, Bytes spitch, Bytes width, std::int64_t rows,
                           Stream s) {
  FSDPSIM_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, stream_of(s)));
}
void CudaDevice::zero(void* dst, Bytes bytes, Stream s) {
  FSDPSIM_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), stream_of(s)));
}

void CudaDevice::accumulate(void* dst, Elem dst_type, const void* src, Elem src_type, std::int64_t n, bool assign,
                            Stream s) {
  if (assign) convert(dst, dst_type, src, src_type, n, stream_of(s));
  else if (dst_type == Elem::F32) accumulate_f32(static_cast<float*>(dst), src, src_type, n, stream_of(s));
  else if (src_type == Elem::BF16) add_bf16(static_cast<bf16*>(dst), static_cast<const bf16*>(src), n, stream_of(s));
  else throw std::runtime_error("CUDA runtime: an fp32 into bf16 accumulation");
}

void CudaDevice::divide(void* x, Elem type, int factor, std::int64_t n, Stream s) {
  scale(x, type, 1.0f / static_cast<float>(factor), n, stream_of(s));
}

void CudaDevice::optimizer_step(const OptimizerConfig& c, int step, float* p, const float* g, float* state,
                                std::int64_t n, Stream s) {
  if (c.adamw) {
    const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), step);
    const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), step);
    const float step_size = static_cast<float>(c.lr / bc1), bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    adamw_step(p, g, state, state + n, n, c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, step_size, bc2_sqrt, stream_of(s));
  } else {
    sgd_step(p, g, state, n, c.lr, c.momentum, c.weight_decay, step == 1, stream_of(s));
  }
}

void CudaDevice::all_gather(const void* in, void* out, std::int64_t count, Elem type, sim::CommGroup g, Stream s) {
  comm_.all_gather(in, out, count, type, g, stream_of(s));
}
void CudaDevice::reduce_scatter(const void* in, void* out, std::int64_t count, Elem type, sim::CommGroup g, ReduceOp op,
                                Stream s) {
  comm_.reduce_scatter(in, out, count, type, g, op, stream_of(s));
}
void CudaDevice::all_reduce(void* inout, std::int64_t count, Elem type, sim::CommGroup g, ReduceOp op, Stream s) {
  comm_.all_reduce(inout, count, type, g, op, stream_of(s));
}
void CudaDevice::after_collective(const sim::Op& op, Stream s) {
  if (!pad_ns_.empty()) spin_for_ns(pad_ns_[op.id], stream_of(s));
}

void CudaDevice::gather_to_host(const float* shard, std::int64_t count, float* host) {
  const size_t bytes = static_cast<size_t>(count) * comm_.group_size(sim::CommGroup::Shard) * 4;
  float* dev = nullptr;
  FSDPSIM_CUDA_CHECK(cudaMalloc(&dev, bytes));
  try {
    comm_.all_gather(shard, dev, count, sim::CommGroup::Shard);
    FSDPSIM_CUDA_CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
  } catch (...) {
    cudaFree(dev);
    throw;
  }
  cudaFree(dev);
}

void CudaDevice::pad_collectives(std::vector<TimeNs> per_op_ns, size_t program_ops) {
  if (!comm_.emulated())
    throw std::logic_error("CudaRankRunner::pad_collectives: only an emulated world stands collectives in by delays");
  if (per_op_ns.size() != program_ops)
    throw std::logic_error("CudaRankRunner::pad_collectives: one duration per op of the program expected");
  pad_ns_ = std::move(per_op_ns);
}

void CudaDevice::sample_device_use() {
  FSDPSIM_CUDA_CHECK(cudaDeviceSynchronize());   // lazily created workspaces exist once their kernels ran
  size_t free_b = 0, total_b = 0;
  FSDPSIM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  used_peak_ = std::max<Bytes>(used_peak_, static_cast<Bytes>(total_b - free_b));
}

nlohmann::json CudaDevice::device_memory() const {
  return {{"source", "cudaMemGetInfo (total - free) on this rank's device, sampled at the runner's start, after setup "
                     "and after each step"},
          {"device_total_bytes", device_total_},
          {"used_at_start_bytes", used_at_start_},
          {"allocator_region_bytes", region_},
          {"used_peak_bytes", used_peak_},
          {"outside_region_bytes", used_peak_ - region_},
          {"untracked_bytes", untracked_bytes()}};
}

}  // namespace fsdpsim::runtime::cuda

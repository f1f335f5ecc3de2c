#include "runtime/cpu/cpu_device.h"

#include <cstring>
#include <stdexcept>

#include "runtime/cpu/rank_runner.h"
#include "runtime/cpu/stream_executor.h"

namespace fsdpsim::runtime {

namespace {

// The CPU backend computes and communicates in fp32 only (plan_support.h refuses other dtypes).
void fp32_only(Elem a, Elem b, const char* what) {
  if (a != Elem::F32 || b != Elem::F32) throw std::logic_error(std::string("CPU device: ") + what + " of a non-fp32 buffer");
}

std::vector<float*> floats(const std::vector<char*>& ps) {
  std::vector<float*> out;
  for (char* p : ps) out.push_back(reinterpret_cast<float*>(p));
  return out;
}

class Handler : public OpRunner {
 public:
  explicit Handler(OpHandler& h) : h_(h) {}
  void run(const sim::Op& op) override { h_.run(op, nullptr); }

 private:
  OpHandler& h_;
};

}  // namespace

CpuDevice::~CpuDevice() = default;

void CpuDevice::check_supports(const models::ModelSpec& m, const sim::Plan& plan) const { check_runtime_supports(m, plan); }

void CpuDevice::prepare(const RankProgram& rp, float dloss_scale, Bytes address_space) {
  program_ = &rp.program;
  compute_ = std::make_unique<SegmentCompute>(rp.dims, dloss_scale, rp.checkpointed);
  compute_->set_recompute_early_stop(rp.recompute_early_stop);
  mem_ = std::make_unique<DeviceMemory>(rp.program, address_space);
}

std::vector<std::string> CpuDevice::finish_setup() {
  return {"measured on the CPU backend (fp32, OpenBLAS, MPI); " + std::to_string(untracked_bytes()) +
          " B of per-rank scratch (residual-stream hand-off, transient forward intermediates of checkpointed "
          "blocks, backward gradient temporaries, final-norm activations) are outside the caching allocator, "
          "as the simulator's activation model leaves them out"};
}

void* CpuDevice::alloc_outside(Bytes bytes) {
  outside_.emplace_back(static_cast<size_t>(bytes / 4), 0.0f);
  return outside_.back().data();
}

std::string CpuDevice::outside_state_note(int unit, Bytes have, Bytes need) const {
  return "optimizer state of unit " + std::to_string(unit) + ": the program's buffer (" + std::to_string(have) +
         " B, from the unpadded parameter count) is smaller than the padded shard needs (" + std::to_string(need) +
         " B); the runtime keeps these states in host memory outside the allocator";
}

void* CpuDevice::grad_scratch(int unit, Bytes bytes) {
  std::vector<float>& s = grad_scratch_[unit];
  if (s.empty()) s.assign(static_cast<size_t>(bytes / 4), 0.0f);
  return s.data();
}

void CpuDevice::upload(void* dst, const void* host, Bytes bytes) { std::memcpy(dst, host, static_cast<size_t>(bytes)); }
void CpuDevice::zero_now(void* dst, Bytes bytes) { std::memset(dst, 0, static_cast<size_t>(bytes)); }

sim::SimResult CpuDevice::execute_step(OpHandler& handler) {
  Handler h(handler);
  return runtime::execute_step(*program_, *mem_, h);
}

void CpuDevice::set_batch(int mb, std::vector<std::int32_t> inputs, std::vector<std::int32_t> targets) {
  compute_->set_batch(mb, std::move(inputs), std::move(targets));
}
void CpuDevice::forward(int seg, int mb, const std::vector<char*>& params, char* act) {
  compute_->forward(seg, mb, floats(params), reinterpret_cast<float*>(act));
}
void CpuDevice::recompute(int seg, int mb, const std::vector<char*>& params, char* act, char* recomp) {
  compute_->recompute(seg, mb, floats(params), reinterpret_cast<float*>(act), reinterpret_cast<float*>(recomp));
}
void CpuDevice::backward(int seg, int mb, const std::vector<char*>& params, const std::vector<char*>& grads, char* act,
                         char* recomp) {
  compute_->backward(seg, mb, floats(params), floats(grads), reinterpret_cast<float*>(act), reinterpret_cast<float*>(recomp));
}

void CpuDevice::copy(void* dst, Elem dst_type, const void* src, Elem src_type, std::int64_t n, Stream) {
  fp32_only(dst_type, src_type, "copy");
  std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
}
void CpuDevice::copy_rows(void* dst, Bytes dpitch, const void* src, Bytes spitch, Bytes width, std::int64_t rows, Stream) {
  for (std::int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, static_cast<size_t>(width));
}
void CpuDevice::zero(void* dst, Bytes bytes, Stream) { std::memset(dst, 0, static_cast<size_t>(bytes)); }

void CpuDevice::accumulate(void* dst, Elem dst_type, const void* src, Elem src_type, std::int64_t n, bool assign, Stream) {
  fp32_only(dst_type, src_type, "accumulation");
  float* d = static_cast<float*>(dst);
  const float* x = static_cast<const float*>(src);
  for (std::int64_t i = 0; i < n; ++i) d[i] = (assign ? 0.0f : d[i]) + x[i];
}

void CpuDevice::divide(void* x, Elem type, int factor, std::int64_t n, Stream) {
  fp32_only(type, type, "divide");
  float* v = static_cast<float*>(x);
  const float f = static_cast<float>(factor);
  for (std::int64_t i = 0; i < n; ++i) v[i] /= f;
}

void CpuDevice::optimizer_step(const OptimizerConfig& cfg, int step, float* params, const float* grads, float* state,
                               std::int64_t n, Stream) {
  runtime::optimizer_step(cfg, params, grads, state, n, step);
}

void CpuDevice::all_gather(const void* in, void* out, std::int64_t count, Elem type, sim::CommGroup g, Stream) {
  fp32_only(type, type, "all-gather");
  comm_.all_gather(static_cast<const float*>(in), static_cast<float*>(out), count, g);
}
void CpuDevice::reduce_scatter(const void* in, void* out, std::int64_t count, Elem type, sim::CommGroup g, ReduceOp op,
                               Stream) {
  fp32_only(type, type, "reduce-scatter");
  comm_.reduce_scatter(static_cast<const float*>(in), static_cast<float*>(out), count, g, op);
}
void CpuDevice::all_reduce(void* inout, std::int64_t count, Elem type, sim::CommGroup g, ReduceOp op, Stream) {
  fp32_only(type, type, "all-reduce");
  comm_.all_reduce(static_cast<float*>(inout), count, g, op);
}
void CpuDevice::gather_to_host(const float* shard, std::int64_t count, float* host) {
  comm_.all_gather(shard, host, count, sim::CommGroup::Shard);
}

}  // namespace fsdpsim::runtime

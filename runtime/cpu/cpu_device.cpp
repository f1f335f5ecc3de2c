#include "runtime/cpu/cpu_device.h"

#include <cstring>
#include <map>
#include <stdexcept>

#include "runtime/cpu/device_memory.h"
#include "runtime/cpu/rank_runner.h"
#include "runtime/cpu/segment_compute.h"
#include "runtime/cpu/stream_executor.h"

namespace fsdpsim::runtime {

namespace {

float* f32(void* p) { return static_cast<float*>(p); }
const float* f32(const void* p) { return static_cast<const float*>(p); }

std::vector<float*> f32s(const std::vector<char*>& ps) {
  std::vector<float*> out;
  for (char* p : ps) out.push_back(reinterpret_cast<float*>(p));
  return out;
}

// The CPU backend computes and communicates in fp32 only (plan_support.h refuses other dtypes).
void fp32_only(Elem a, Elem b, const char* what) {
  if (a != Elem::F32 || b != Elem::F32) throw std::logic_error(std::string("CPU device: ") + what + " of a non-fp32 buffer");
}

class CpuDevice : public Device {
 public:
  explicit CpuDevice(Communicator& comm) : comm_(comm) {}

  std::string name() const override { return "CPU"; }
  void check_supports(const models::ModelSpec& m, const sim::Plan& plan) const override { check_runtime_supports(m, plan); }
  Elem compute_elem() const override { return Elem::F32; }
  void prepare(const RankProgram& rp, float dloss_scale, Bytes address_space) override {
    program_ = &rp.program;
    compute_ = std::make_unique<SegmentCompute>(rp.dims, dloss_scale, rp.checkpointed);
    compute_->set_recompute_early_stop(rp.recompute_early_stop);
    mem_ = std::make_unique<DeviceMemory>(rp.program, address_space);
  }
  std::vector<std::string> finish_setup() override {
    return {"measured on the CPU backend (fp32, OpenBLAS, MPI); " + std::to_string(untracked_bytes()) +
            " B of per-rank scratch (residual-stream hand-off, transient forward intermediates of checkpointed "
            "blocks, backward gradient temporaries, final-norm activations) are outside the caching allocator, "
            "as the simulator's activation model leaves them out"};
  }

  // Memory: the placed buffers are host memory, so is everything outside them.
  PlacedMemory& memory() override { return *mem_; }
  void* alloc_outside(Bytes bytes) override { return outside_.emplace_back(static_cast<size_t>(bytes / 4), 0.0f).data(); }
  std::string outside_state_note(int unit, Bytes have, Bytes need) const override {
    return "optimizer state of unit " + std::to_string(unit) + ": the program's buffer (" + std::to_string(have) +
           " B, from the unpadded parameter count) is smaller than the padded shard needs (" + std::to_string(need) +
           " B); the runtime keeps these states in host memory outside the allocator";
  }
  void* grad_scratch(int unit, Bytes bytes) override {
    std::vector<float>& s = grad_scratch_[unit];
    if (s.empty()) s.assign(static_cast<size_t>(bytes / 4), 0.0f);
    return s.data();
  }
  void upload(void* dst, const void* host, Bytes bytes) override { std::memcpy(dst, host, static_cast<size_t>(bytes)); }
  void zero_now(void* dst, Bytes bytes) override { std::memset(dst, 0, static_cast<size_t>(bytes)); }
  Bytes untracked_bytes() const override { return compute_->untracked_bytes(); }

  // Streams: threads that run each op when it is issued and ready; the program's waits order them.
  sim::SimResult execute_step(OpHandler& handler) override { return runtime::execute_step(*program_, *mem_, handler); }
  Stream compute_stream() const override { return nullptr; }
  void compute_waits_for(Stream) override {}
  void synchronize() override {}

  // Kernels, run at once.
  void set_batch(int mb, std::vector<std::int32_t> inputs, std::vector<std::int32_t> targets) override {
    compute_->set_batch(mb, std::move(inputs), std::move(targets));
  }
  Bytes act_bytes(int seg) const override { return compute_->act_bytes(seg); }
  Bytes recomp_bytes(int seg) const override { return compute_->recomp_bytes(seg); }
  void forward(int seg, int mb, const std::vector<char*>& params, char* act) override {
    compute_->forward(seg, mb, f32s(params), f32(act));
  }
  void recompute(int seg, int mb, const std::vector<char*>& params, char* act, char* recomp) override {
    compute_->recompute(seg, mb, f32s(params), f32(act), f32(recomp));
  }
  void backward(int seg, int mb, const std::vector<char*>& params, const std::vector<char*>& grads, char* act,
                char* recomp) override {
    compute_->backward(seg, mb, f32s(params), f32s(grads), f32(act), f32(recomp));
  }
  double loss_sum(int mb) override { return compute_->loss_sum(mb); }
  void copy(void* dst, Elem dst_type, const void* src, Elem src_type, std::int64_t n, Stream) override {
    fp32_only(dst_type, src_type, "copy");
    std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
  }
  void copy_rows(void* dst, Bytes dpitch, const void* src, Bytes spitch, Bytes width, std::int64_t rows, Stream) override {
    for (std::int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, static_cast<size_t>(width));
  }
  void zero(void* dst, Bytes bytes, Stream) override { std::memset(dst, 0, static_cast<size_t>(bytes)); }
  void accumulate(void* dst, Elem dst_type, const void* src, Elem src_type, std::int64_t n, bool assign, Stream) override {
    fp32_only(dst_type, src_type, "accumulation");
    float* d = f32(dst);
    const float* x = f32(src);
    for (std::int64_t i = 0; i < n; ++i) d[i] = (assign ? 0.0f : d[i]) + x[i];
  }
  void divide(void* x, Elem type, int factor, std::int64_t n, Stream) override {
    fp32_only(type, type, "divide");
    float* v = f32(x);
    const float f = static_cast<float>(factor);
    for (std::int64_t i = 0; i < n; ++i) v[i] /= f;
  }
  void optimizer_step(const OptimizerConfig& cfg, int step, float* params, const float* grads, float* state,
                      std::int64_t n, Stream) override {
    runtime::optimizer_step(cfg, params, grads, state, n, step);
  }

  // Communicator: the blocking fp32 collectives, on the stream thread.
  void all_gather(const void* in, void* out, std::int64_t count, Elem type, sim::CommGroup g, Stream) override {
    fp32_only(type, type, "all-gather");
    comm_.all_gather(f32(in), f32(out), count, g);
  }
  void reduce_scatter(const void* in, void* out, std::int64_t count, Elem type, sim::CommGroup g, ReduceOp op,
                      Stream) override {
    fp32_only(type, type, "reduce-scatter");
    comm_.reduce_scatter(f32(in), f32(out), count, g, op);
  }
  void all_reduce(void* inout, std::int64_t count, Elem type, sim::CommGroup g, ReduceOp op, Stream) override {
    fp32_only(type, type, "all-reduce");
    comm_.all_reduce(f32(inout), count, g, op);
  }
  void gather_to_host(const float* shard, std::int64_t count, float* host) override {
    comm_.all_gather(shard, host, count, sim::CommGroup::Shard);
  }

 private:
  Communicator& comm_;
  const sim::StepProgram* program_ = nullptr;
  std::unique_ptr<SegmentCompute> compute_;
  std::unique_ptr<DeviceMemory> mem_;
  std::vector<std::vector<float>> outside_;          // alloc_outside's host arrays
  std::map<int, std::vector<float>> grad_scratch_;   // per unit
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(Communicator& comm) { return std::make_unique<CpuDevice>(comm); }

}  // namespace fsdpsim::runtime

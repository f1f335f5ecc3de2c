#include "runtime/cuda/cuda_rank_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include "common/errors.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/spin.h"
#include "runtime/plan_support.h"
#include "runtime/train/reference_trainer.h"
#include "runtime/train/synthetic_data.h"
#include "sim/executor.h"
#include "sim/lowering.h"

namespace fsdpsim::runtime::cuda {

namespace {

std::string internal(const std::string& what) { return "CUDA runtime and lowering disagree: " + what; }

long esize(Elem e) { return e == Elem::F32 ? 4 : 2; }

Elem elem_of(Dtype d) { return d == Dtype::FP32 ? Elem::F32 : Elem::BF16; }

}  // namespace

void check_cuda_runtime_supports(const models::ModelSpec& m, const sim::Plan& plan) {
  check_plan_supported(plan, RuntimeBackend::Cuda);
  const Dims d = runtime_dims(m, plan.micro_batch, plan.seq_len);
  if (d.C % 2 != 0)   // the fp32 statistics follow the bf16 block input in the activation buffer
    throw InputError("model.hidden", std::to_string(d.C), "an even number on the CUDA runtime");
  if (!attention_supports_head_dim(d.HD))
    throw InputError("model.head_dim", std::to_string(d.HD), "16, 32, 64 or 128 (the CUDA attention kernels' sizes)");
}

CudaRankRunner::CudaRankRunner(const RunConfig& cfg, DeviceCommunicator& comm) : cfg_(cfg), comm_(comm) {
  {
    size_t free0 = 0, total0 = 0;
    FSDPSIM_CUDA_CHECK(cudaMemGetInfo(&free0, &total0));
    device_total_ = static_cast<Bytes>(total0);
    used_at_start_ = used_peak_ = static_cast<Bytes>(total0 - free0);
  }
  check_cuda_runtime_supports(cfg.model, cfg.plan);
  cfg_.optimizer.adamw = cfg.plan.optimizer == sim::Optimizer::AdamW;
  rp_ = build_rank_program(cfg.model, cfg.plan, comm.world(), cfg.gpus_per_node, comm.group_size(sim::CommGroup::Shard),
                           "CUDA runtime");
  const int U = static_cast<int>(rp_.layouts.size());
  classify_buffers();
  for (int u = 0; u < U; ++u) {
    if (rp_.layouts[u].tensors.empty()) continue;
    if (numel(rp_.shard_buf[u]) != rp_.layouts[u].shard || numel(rp_.grad_shard_buf[u]) != rp_.layouts[u].grad_shard)
      throw std::runtime_error(internal("unit " + std::to_string(u) + "'s sharded buffers do not match the runtime's layout"));
  }
  const int S = rp_.dims.L + 2;
  act_buf_.assign(rp_.micro_batches, std::vector<int>(S, -1));
  recomp_buf_.assign(rp_.micro_batches, std::vector<int>(S, -1));

  exec_ = std::make_unique<CudaStreamExecutor>(rp_.program);
  gemm_ = std::make_unique<Gemm>(exec_->stream(0));
  compute_ = std::make_unique<CudaSegmentCompute>(
      rp_.dims, 1.0f / static_cast<float>(rp_.dims.tokens() * rp_.micro_batches), rp_.checkpointed, *gemm_);
  compute_->set_recompute_early_stop(rp_.recompute_early_stop);

  // The allocator's region: what is free on the device, less headroom for what the CUDA runtime and
  // libraries allocate lazily outside it (cuBLAS workspaces, NCCL buffers, kernel modules loaded on
  // first launch, the local memory of the attention kernels' register spills, sized per resident
  // thread on the first launch, and gather()'s fp32 staging of the largest unit), capped by
  // cfg.address_space. Measured on an H100: 512 MiB was not enough for llama-1b/llama3-8b shapes.
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
  for (const UnitLayout& l : rp_.layouts) headroom = std::max<Bytes>(headroom, l.unsharded * 4 + 512 * kMiB);
  const Bytes region = std::min<Bytes>(cfg.address_space, static_cast<Bytes>(free_b) - headroom);
  if (region <= 0) throw std::runtime_error("CUDA runtime: no device memory left for the allocator (" + ::fsdpsim::check_where() + ")");
  mem_ = std::make_unique<CudaDeviceMemory>(rp_.program, region);
  region_ = region;
  for (const auto& b : rp_.program.buffers)
    if (b.persistent) mem_->alloc(b.id, 0);

  const int gr = comm.group_rank(sim::CommGroup::Shard);
  state_ptr_.assign(U, nullptr);
  for (int u = 0; u < U; ++u) {
    const UnitLayout& l = rp_.layouts[u];
    if (l.tensors.empty()) continue;
    std::vector<float> host(l.shard);
    init_shard(l, gr, cfg.seed, host.data());
    FSDPSIM_CUDA_CHECK(cudaMemcpy(ptr(rp_.shard_buf[u]), host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    const Bytes need = l.shard * cfg_.optimizer.states() * 4;
    const Bytes have = rp_.program.buffers[rp_.optim_buf[u]].bytes;
    if (have >= need) {
      state_ptr_[u] = reinterpret_cast<float*>(ptr(rp_.optim_buf[u]));
    } else {
      void* p = nullptr;
      FSDPSIM_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(need)));
      side_state_.push_back(p);
      side_state_bytes_ += need;
      state_ptr_[u] = static_cast<float*>(p);
      notes_.push_back("optimizer state of unit " + std::to_string(u) + ": the program's buffer (" + std::to_string(have) +
                       " B) is smaller than the padded shard needs (" + std::to_string(need) +
                       " B); kept in a separate cudaMalloc outside the allocator");
    }
    FSDPSIM_CUDA_CHECK(cudaMemset(state_ptr_[u], 0, static_cast<size_t>(need)));
  }
  sample_device_use();
  notes_.push_back("measured on the CUDA backend (bf16 compute, fp32 accumulation and masters, cuBLAS, NCCL); " +
                   std::to_string(untracked_bytes()) +
                   " B of device scratch (residual stream, checkpointed blocks' transient forward, backward "
                   "temporaries, final-norm activations, tokens, rotary table) are outside the caching allocator");
  notes_.push_back("the head's logits buffer is sized for PyTorch's fp32 log_softmax copy; the fused cross-entropy "
                   "uses its bf16 logits and 4 B per token of the fp32 part");
}

CudaRankRunner::~CudaRankRunner() {
  for (void* p : side_state_) cudaFree(p);
  for (bf16* p : grad_scratch_) cudaFree(p);
  if (scratch_zeroed_) cudaEventDestroy(scratch_zeroed_);
}

// Element type of every buffer: sharded state in the master dtype (fp32); unsharded params in
// param_dtype; unsharded grads in param_dtype, or reduce_dtype for FSDP2's upcast accumulation
// (told apart by size: both hold the unit's unsharded grad numel); communication buffers on the
// parameter side (cast shards, all-gather in/out) in param_dtype, on the gradient side in reduce_dtype.
void CudaRankRunner::classify_buffers() {
  const int B = static_cast<int>(rp_.program.buffers.size());
  const Elem bp = elem_of(cfg_.plan.param_dtype), br = elem_of(cfg_.plan.reduce_dtype);
  std::vector<char> param_side(B, 0);
  auto cat = [&](int b) { return rp_.program.buffers[b].category; };
  for (const sim::Op& op : rp_.program.ops) {
    auto mark_out = [&] {
      for (int b : op.outputs) param_side[b] = 1;
    };
    if (op.kind == sim::OpKind::AllGather) {
      for (int b : op.inputs) param_side[b] = 1;
      mark_out();
    }
    if ((op.kind == sim::OpKind::Cast || op.kind == sim::OpKind::CopyIn) && !op.inputs.empty() &&
        (cat(op.inputs[0]) == sim::MemCategory::ShardedParams || param_side[op.inputs[0]]))
      mark_out();
    if (op.kind == sim::OpKind::CopyOut)
      for (int b : op.inputs) param_side[b] = 1;
  }
  elem_.assign(B, Elem::F32);
  for (const auto& b : rp_.program.buffers) {
    switch (b.category) {
      case sim::MemCategory::UnshardedParams: elem_[b.id] = bp; break;
      case sim::MemCategory::UnshardedGrads: {
        const std::int64_t n = b.unit >= 0 ? rp_.layouts.at(b.unit).grad : 0;
        elem_[b.id] = n > 0 && b.bytes == 4 * n ? Elem::F32 : Elem::BF16;
        break;
      }
      case sim::MemCategory::CommBuffers: elem_[b.id] = param_side[b.id] ? bp : br; break;
      default: elem_[b.id] = Elem::F32; break;
    }
    const bool typed = b.category != sim::MemCategory::Activations && b.category != sim::MemCategory::Logits;
    if (typed && b.bytes % esize(elem_[b.id]) != 0)
      throw std::runtime_error(internal("buffer \"" + b.name + "\" of " + std::to_string(b.bytes) +
                                        " B is not a whole number of its elements"));
  }
}

long CudaRankRunner::numel(int b) const { return rp_.program.buffers.at(b).bytes / esize(elem_.at(b)); }

std::vector<bf16*> CudaRankRunner::segment_params(int seg, const sim::Op& op) {
  const int u = rp_.seg_unit[seg];
  const UnitLayout& l = rp_.layouts[u];
  bf16* base = nullptr;
  for (int b : op.inputs)
    if (rp_.program.buffers[b].category == sim::MemCategory::UnshardedParams && rp_.program.buffers[b].unit == u) {
      if (elem_[b] != Elem::BF16 || numel(b) != l.unsharded)
        throw std::runtime_error(internal("unsharded params \"" + rp_.program.buffers[b].name + "\" are not bf16[" +
                                          std::to_string(l.unsharded) + "]"));
      base = reinterpret_cast<bf16*>(ptr(b));
    }
  if (!base) throw std::runtime_error(internal(op.name + " reads no bf16 unsharded parameters of unit " + std::to_string(u)));
  std::vector<bf16*> out;
  for (int i : rp_.seg_tensors[seg]) out.push_back(base + (l.fsdp2 ? l.unsharded_offset[i] : l.flat_offset[i]));
  return out;
}

bf16* CudaRankRunner::grad_scratch(int unit) {
  if (grad_scratch_.empty()) grad_scratch_.assign(rp_.layouts.size(), nullptr);
  bf16*& p = grad_scratch_.at(static_cast<size_t>(unit));
  if (!p) {
    const size_t bytes = static_cast<size_t>(rp_.layouts[unit].grad) * 2;
    FSDPSIM_CUDA_CHECK(cudaMalloc(&p, bytes));
    FSDPSIM_CUDA_CHECK(cudaMemset(p, 0, bytes));
    side_state_bytes_ += static_cast<Bytes>(bytes);
  }
  return p;
}

std::vector<bf16*> CudaRankRunner::segment_grads(int seg, const sim::Op& op, cudaStream_t s) {
  const int u = rp_.seg_unit[seg];
  const UnitLayout& l = rp_.layouts[u];
  for (int b : op.outputs) {
    if (rp_.program.buffers[b].category != sim::MemCategory::UnshardedGrads || rp_.program.buffers[b].unit != u) continue;
    if (!l.fsdp2) {   // FSDP1: the views' grads go to the unit's scratch until the split-backward cat
      bf16* base = grad_scratch(u);
      std::vector<bf16*> out;
      for (int i : rp_.seg_tensors[seg]) out.push_back(base + l.grad_offset[i]);
      return out;
    }
    if (elem_[b] != Elem::BF16 || numel(b) != l.grad)
      throw std::runtime_error(internal("unsharded grads \"" + rp_.program.buffers[b].name + "\" are not bf16[" +
                                        std::to_string(l.grad) + "]"));
    bf16* base = reinterpret_cast<bf16*>(ptr(b));
    // A grad buffer this op allocates is a fresh .grad: autograd writes it; our kernels accumulate.
    if (std::find(op.allocs.begin(), op.allocs.end(), b) != op.allocs.end())
      FSDPSIM_CUDA_CHECK(cudaMemsetAsync(base, 0, static_cast<size_t>(l.grad) * 2, s));
    std::vector<bf16*> out;
    for (int i : rp_.seg_tensors[seg]) out.push_back(base + l.grad_offset[i]);
    return out;
  }
  throw std::runtime_error(internal(op.name + " writes no unsharded grad of unit " + std::to_string(u)));
}

void CudaRankRunner::run_compute(const sim::Op& op) {
  const int seg = rp_.op_segment[op.id], mb = op.micro_batch;
  auto sized = [&](int b, Bytes want, const char* what) {
    if (rp_.program.buffers[b].bytes != want)
      throw std::runtime_error("activation memory: the program's " + std::string(what) + " buffer \"" +
                               rp_.program.buffers[b].name + "\" has " + std::to_string(rp_.program.buffers[b].bytes) +
                               " B but the CUDA kernels save " + std::to_string(want) +
                               " B (models' activation formula vs runtime)");
  };
  if (op.kind == sim::OpKind::Forward) {
    char* act = nullptr;
    if (compute_->act_bytes(seg) > 0) {
      if (op.allocs.empty()) throw std::runtime_error(internal(op.name + " allocates no activation buffer"));
      sized(op.allocs[0], compute_->act_bytes(seg), "saved-activation");
      act_buf_[mb][seg] = op.allocs[0];
      act = ptr(op.allocs[0]);
    }
    compute_->forward(seg, mb, segment_params(seg, op), act);
    return;
  }
  char* act = act_buf_[mb][seg] >= 0 ? ptr(act_buf_[mb][seg]) : nullptr;
  if (op.kind == sim::OpKind::Recompute) {
    if (op.allocs.empty()) throw std::runtime_error(internal(op.name + " allocates no recompute buffer"));
    sized(op.allocs[0], compute_->recomp_bytes(seg), "recompute");
    recomp_buf_[mb][seg] = op.allocs[0];
    compute_->recompute(seg, mb, segment_params(seg, op), act, ptr(op.allocs[0]));
    return;
  }
  char* recomp = recomp_buf_[mb][seg] >= 0 ? ptr(recomp_buf_[mb][seg]) : nullptr;
  compute_->backward(seg, mb, segment_params(seg, op), segment_grads(seg, op, gemm_->stream()), act, recomp);
  act_buf_[mb][seg] = recomp_buf_[mb][seg] = -1;
}

void CudaRankRunner::pad_collectives(std::vector<TimeNs> per_op_ns) {
  if (!comm_.emulated())
    throw std::logic_error("CudaRankRunner::pad_collectives: only an emulated world stands collectives in by delays");
  if (per_op_ns.size() != rp_.program.ops.size())
    throw std::logic_error("CudaRankRunner::pad_collectives: one duration per op of the program expected");
  pad_ns_ = std::move(per_op_ns);
}

void CudaRankRunner::pad_collective(const sim::Op& op, cudaStream_t s) {
  if (!pad_ns_.empty()) spin_for_ns(pad_ns_[op.id], s);
}

void CudaRankRunner::accumulate_grad(int unit, int src, cudaStream_t s) {
  accumulate_f32(reinterpret_cast<float*>(ptr(rp_.grad_shard_buf[unit])), ptr(src), elem_[src], rp_.layouts[unit].grad_shard, s);
}

void CudaRankRunner::enqueue(const sim::Op& op, cudaStream_t s) {
  using sim::OpKind;
  const ReduceOp rop = rp_.fsdp2 ? ReduceOp::Avg : ReduceOp::Sum;   // F2.10 AVG; FSDP1 SUM + divides (F1.12)
  auto cat = [&](int b) { return rp_.program.buffers[b].category; };
  const int u = op.unit;
  switch (op.kind) {
    case OpKind::CopyIn: {
      const int in = op.inputs.at(0), out = op.outputs.at(0);
      const UnitLayout& l = rp_.layouts.at(u);
      const bool ag_copy_in = cat(in) != sim::MemCategory::UnshardedGrads && numel(in) == l.shard &&
                              numel(out) == l.unsharded;
      if (ag_copy_in) {
        // FSDP2 all-gather copy-in (F2.2): this rank's slice of the all-gather output.
        const int gr = comm_.group_rank(sim::CommGroup::Shard);
        convert(ptr(out) + gr * l.shard * esize(elem_[out]), elem_[out], ptr(in), elem_[in], l.shard, s);
      } else if (cat(in) == sim::MemCategory::UnshardedGrads) {
        // FSDP2 reduce-scatter copy-in (F2.9, chunk_cat): per tensor and rank chunk, widened to
        // reduce_dtype, zero-padded to the chunk size.
        if (numel(out) != l.rs_input) throw std::runtime_error(internal("reduce-scatter input size of " + op.name));
        const long si = esize(elem_[in]), so = esize(elem_[out]);
        for (size_t i = 0; i < l.tensors.size(); ++i) {
          const std::int64_t chunk = l.chunk_rows[i] * l.rest[i], n = l.tensors[i].numel();
          for (int r = 0; r < l.N; ++r) {
            char* dst = ptr(out) + (r * l.shard + l.shard_offset[i]) * so;
            const std::int64_t lo = std::min(n, r * chunk), hi = std::min(n, (r + 1) * chunk);
            convert(dst, elem_[out], ptr(in) + (l.grad_offset[i] + lo) * si, elem_[in], hi - lo, s);
            if (chunk > hi - lo)
              FSDPSIM_CUDA_CHECK(cudaMemsetAsync(dst + (hi - lo) * so, 0, static_cast<size_t>((chunk - (hi - lo)) * so), s));
          }
        }
      } else {
        throw std::runtime_error(internal("copy-in from an unexpected buffer in " + op.name));
      }
      break;
    }
    case OpKind::AllGather: {
      const int out = op.outputs.at(0);
      const Elem t = elem_[out];
      const long count = op.comm_bytes / esize(t) / op.group_size;
      const char* in = op.inputs.at(0) == out ? ptr(out) + comm_.group_rank(op.group) * count * esize(t) : ptr(op.inputs[0]);
      comm_.all_gather(in, ptr(out), count, t, op.group, s);
      pad_collective(op, s);
      break;
    }
    case OpKind::CopyOut: {   // FSDP2 split_with_sizes_copy: all-gather output [N][shard] -> per-parameter storage
      const UnitLayout& l = rp_.layouts.at(u);
      if (!l.fsdp2 && cat(op.outputs.at(0)) == sim::MemCategory::UnshardedGrads) {
        // FSDP1 split-backward cat + AccumulateGrad: a fresh .grad takes the views' grads, a kept one adds them.
        const int out = op.outputs[0];
        if (elem_[out] != Elem::BF16 || numel(out) != l.grad)
          throw std::runtime_error(internal("the flat grad of " + op.name + " is not bf16[" + std::to_string(l.grad) + "]"));
        bf16* scratch = grad_scratch(u);
        const bool fresh = std::find(op.allocs.begin(), op.allocs.end(), out) != op.allocs.end();
        if (fresh)
          FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(ptr(out), scratch, static_cast<size_t>(l.grad) * 2, cudaMemcpyDeviceToDevice, s));
        else
          add_bf16(reinterpret_cast<bf16*>(ptr(out)), scratch, l.grad, s);
        FSDPSIM_CUDA_CHECK(cudaMemsetAsync(scratch, 0, static_cast<size_t>(l.grad) * 2, s));
        if (!scratch_zeroed_) FSDPSIM_CUDA_CHECK(cudaEventCreateWithFlags(&scratch_zeroed_, cudaEventDisableTiming));
        FSDPSIM_CUDA_CHECK(cudaEventRecord(scratch_zeroed_, s));
        FSDPSIM_CUDA_CHECK(cudaStreamWaitEvent(gemm_->stream(), scratch_zeroed_, 0));
        break;
      }
      const int in = op.inputs.at(0), out = op.outputs.at(0);
      const long es = esize(elem_[out]);
      if (elem_[in] != elem_[out] || numel(out) != l.unsharded) throw std::runtime_error(internal("copy-out of " + op.name));
      for (size_t i = 0; i < l.tensors.size(); ++i) {
        const std::int64_t chunk = l.chunk_rows[i] * l.rest[i];
        // One strided copy per tensor: N chunks of `chunk` elements, source pitch = the shard.
        FSDPSIM_CUDA_CHECK(cudaMemcpy2DAsync(ptr(out) + l.unsharded_offset[i] * es, chunk * es,
                                           ptr(in) + l.shard_offset[i] * es, l.shard * es, chunk * es, l.N,
                                           cudaMemcpyDeviceToDevice, s));
      }
      break;
    }
    case OpKind::Forward:
    case OpKind::Backward:
    case OpKind::Recompute:
      if (s != gemm_->stream()) throw std::runtime_error(internal(op.name + " enqueued off the compute stream"));
      run_compute(op);
      break;
    case OpKind::ReduceScatter: {
      const Elem t = elem_[op.inputs.at(0)];
      comm_.reduce_scatter(ptr(op.inputs[0]), ptr(op.outputs.at(0)), op.comm_bytes / esize(t) / op.group_size, t,
                           op.group, rop, s);
      pad_collective(op, s);
      break;
    }
    case OpKind::AllReduce: {
      const Elem t = elem_[op.inputs.at(0)];
      comm_.all_reduce(ptr(op.inputs[0]), op.comm_bytes / esize(t), t, op.group, rop, s);
      pad_collective(op, s);
      break;
    }
    case OpKind::Divide: {
      const int b = op.inputs.at(0);
      scale(ptr(b), elem_[b], 1.0f / static_cast<float>(rp_.op_divide[op.id]), numel(b), s);
      break;
    }
    case OpKind::Pad: {   // FSDP1 F.pad of the flat grad to N * ceil(numel / N)
      const int in = op.inputs.at(0), out = op.outputs.at(0);
      const long es = esize(elem_[out]);
      if (elem_[in] != elem_[out]) throw std::runtime_error(internal("pad changes the dtype in " + op.name));
      FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(ptr(out), ptr(in), numel(in) * es, cudaMemcpyDeviceToDevice, s));
      FSDPSIM_CUDA_CHECK(cudaMemsetAsync(ptr(out) + numel(in) * es, 0, static_cast<size_t>((numel(out) - numel(in)) * es), s));
      break;
    }
    case OpKind::Cast: {
      const int in = op.inputs.at(0), out = op.outputs.at(0);
      if (u >= 0 && out == rp_.grad_shard_buf.at(u)) {
        // into .grad (fp32): the cast that creates it assigns, a later one accumulates
        if (std::find(op.allocs.begin(), op.allocs.end(), out) != op.allocs.end())
          FSDPSIM_CUDA_CHECK(cudaMemsetAsync(ptr(out), 0, static_cast<size_t>(rp_.layouts[u].grad_shard) * 4, s));
        accumulate_grad(u, in, s);
      } else if (op.inputs.size() >= 2 && op.inputs[1] == out) {
        // FSDP2 no_sync accumulation into unsharded_accumulated_grad (reduce_dtype).
        if (elem_[out] == Elem::F32) accumulate_f32(reinterpret_cast<float*>(ptr(out)), ptr(in), elem_[in], numel(out), s);
        else if (elem_[in] == Elem::BF16) add_bf16(reinterpret_cast<bf16*>(ptr(out)), reinterpret_cast<bf16*>(ptr(in)), numel(out), s);
        else throw std::runtime_error(internal("fp32 into bf16 accumulation in " + op.name));
      } else {
        if (numel(in) != numel(out)) throw std::runtime_error(internal("cast between different sizes in " + op.name));
        convert(ptr(out), elem_[out], ptr(in), elem_[in], numel(out), s);
      }
      break;
    }
    case OpKind::OptimizerStep: {
      const int step = steps_done_ + 1;
      const OptimizerConfig& c = cfg_.optimizer;
      const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), step);
      const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), step);
      const float step_size = static_cast<float>(c.lr / bc1), bc2_sqrt = static_cast<float>(std::sqrt(bc2));
      for (size_t k = 0; k < rp_.layouts.size(); ++k) {
        if (rp_.layouts[k].tensors.empty()) continue;
        float* p = reinterpret_cast<float*>(ptr(rp_.shard_buf[k]));
        const float* g = reinterpret_cast<const float*>(ptr(rp_.grad_shard_buf[k]));
        const long n = rp_.layouts[k].shard;
        if (c.adamw) adamw_step(p, g, state_ptr_[k], state_ptr_[k] + n, n, c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, step_size, bc2_sqrt, s);
        else sgd_step(p, g, state_ptr_[k], n, c.lr, c.momentum, c.weight_decay, step == 1, s);
      }
      break;
    }
    default:
      throw std::runtime_error(std::string("CUDA runtime: op kind ") + sim::op_kind_name(op.kind) + " is not supported");
  }
  // The end of a reduction: its output is the sharded grad itself (reduce dtype = the parameters') or is
  // added to the one an earlier micro-batch created.
  const ChainEnd& end = rp_.op_chain_end[op.id];
  if (end.unit >= 0 && end.result_buffer != rp_.grad_shard_buf[end.unit]) accumulate_grad(end.unit, end.result_buffer, s);
}

StepOutcome CudaRankRunner::step() {
  // zero_grad(set_to_none=True): no sharded grad exists until the step's first reduction creates it.
  const int W = comm_.world();
  std::vector<TokenBatch> batches = rank_step_batches(rp_, cfg_.seed, steps_done_, comm_.rank(), W);
  for (int mb = 0; mb < rp_.micro_batches; ++mb) compute_->set_batch(mb, batches[mb].inputs, batches[mb].targets);
  mem_->reset_timeline();
  StepOutcome out;
  out.measured = exec_->execute_step(*mem_, *this);
  mem_->fill(out.measured);
  double local = 0;
  for (int mb = 0; mb < rp_.micro_batches; ++mb) local += compute_->loss_sum(mb);
  out.loss = global_mean_loss(rp_, comm_.sum_world(local), W);
  complete_measured(rp_, W, notes_, out.measured);
  sample_device_use();
  ++steps_done_;
  return out;
}

void CudaRankRunner::sample_device_use() {
  FSDPSIM_CUDA_CHECK(cudaDeviceSynchronize());   // lazily created workspaces exist once their kernels ran
  size_t free_b = 0, total_b = 0;
  FSDPSIM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  used_peak_ = std::max<Bytes>(used_peak_, static_cast<Bytes>(total_b - free_b));
}

nlohmann::json CudaRankRunner::device_memory() const {
  return {{"source", "cudaMemGetInfo (total - free) on this rank's device, sampled at the runner's start, after setup "
                     "and after each step"},
          {"device_total_bytes", device_total_},
          {"used_at_start_bytes", used_at_start_},
          {"allocator_region_bytes", region_},
          {"used_peak_bytes", used_peak_},
          {"outside_region_bytes", used_peak_ - region_},
          {"untracked_bytes", untracked_bytes()}};
}

std::vector<std::pair<std::string, std::vector<float>>> CudaRankRunner::gather_params() { return gather(rp_.shard_buf); }
// The sharded grads of the last step: zero_grad freed their buffers after the optimizer step, and nothing
// ran after it in the placed region, so their bytes are the step's.
std::vector<std::pair<std::string, std::vector<float>>> CudaRankRunner::gather_grads() { return gather(rp_.grad_shard_buf); }

std::vector<std::pair<std::string, std::vector<float>>> CudaRankRunner::gather(const std::vector<int>& bufs) {
  FSDPSIM_CUDA_CHECK(cudaDeviceSynchronize());
  std::map<std::string, std::vector<float>> by_name;
  for (size_t u = 0; u < rp_.layouts.size(); ++u) {
    const UnitLayout& l = rp_.layouts[u];
    if (l.tensors.empty()) continue;
    float* dev = nullptr;
    FSDPSIM_CUDA_CHECK(cudaMalloc(&dev, static_cast<size_t>(l.unsharded) * 4));
    std::vector<float> all(l.unsharded);
    try {
      comm_.all_gather(reinterpret_cast<const float*>(ptr(bufs[u])), dev, l.shard, sim::CommGroup::Shard);
      FSDPSIM_CUDA_CHECK(cudaMemcpy(all.data(), dev, all.size() * 4, cudaMemcpyDeviceToHost));
    } catch (...) {
      cudaFree(dev);
      throw;
    }
    cudaFree(dev);
    auto ts = tensors_from_shards(l, all.data());
    for (size_t i = 0; i < ts.size(); ++i) by_name[l.tensors[i].name] = std::move(ts[i]);
  }
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const auto& t : model_param_tensors(rp_.dims)) out.push_back({t.name, by_name.at(t.name)});
  return out;
}

}  // namespace fsdpsim::runtime::cuda

#include "runtime/cuda/cuda_rank_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include "common/errors.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/train/reference_trainer.h"
#include "runtime/train/synthetic_data.h"
#include "sim/executor.h"
#include "sim/lowering.h"

namespace fsdpsim::runtime::cuda {

namespace {

std::string internal(const std::string& what) { return "CUDA runtime and lowering disagree: " + what; }

int predivide_factor(int n) {   // F1.12, as rank_runner.cpp
  int f = 1;
  while (n % f == 0 && n / f > f) f *= 2;
  return f;
}

bool is_reduce_path(sim::OpKind k) {
  using sim::OpKind;
  return k == OpKind::ReduceScatter || k == OpKind::AllReduce || k == OpKind::Divide || k == OpKind::Cast ||
         k == OpKind::Pad;
}

bool is_collective(sim::OpKind k) {
  return k == sim::OpKind::AllGather || k == sim::OpKind::ReduceScatter || k == sim::OpKind::AllReduce;
}

long esize(Elem e) { return e == Elem::F32 ? 4 : 2; }

Elem elem_of(Dtype d) { return d == Dtype::FP32 ? Elem::F32 : Elem::BF16; }

}  // namespace

void check_cuda_runtime_supports(const models::ModelSpec& m, const sim::Plan& plan) {
  if (plan.param_dtype != Dtype::BF16)
    throw InputError("plan.param_dtype", std::string(dtype_name(plan.param_dtype)),
                     "bf16 (the CUDA runtime computes in bf16 with fp32 accumulation)");
  if (plan.reduce_dtype != Dtype::FP32 && plan.reduce_dtype != Dtype::BF16)
    throw InputError("plan.reduce_dtype", std::string(dtype_name(plan.reduce_dtype)), "fp32 or bf16 on the CUDA runtime");
  if (plan.master_weights_dtype != Dtype::FP32)
    throw InputError("plan.master_weights_dtype", std::string(dtype_name(plan.master_weights_dtype)),
                     "fp32 on the CUDA runtime");
  if (plan.cpu_offload.params || plan.cpu_offload.optimizer)
    throw InputError("plan.cpu_offload", "true", "false: CPU offload is not implemented in the CUDA runtime");
  if (plan.fp8_all_gather) throw InputError("plan.fp8_all_gather", "true", "false on the CUDA runtime");
  if (plan.trainable_fraction < 1.0)
    throw InputError("plan.trainable_fraction", std::to_string(plan.trainable_fraction), "1 on the CUDA runtime");
  if (plan.reshard_after_forward > 1)
    throw InputError("plan.reshard_after_forward", std::to_string(plan.reshard_after_forward),
                     "true or false on the CUDA runtime (an int reshards to a sub-group not implemented here)");
  if (plan.activation_checkpointing.mode == sim::ActivationCheckpointing::Mode::SelectiveOp)
    throw InputError("plan.activation_checkpointing", "selective_op", "none, full or every_k on the CUDA runtime");
  if (plan.cross_entropy != models::LossImpl::Torch)
    throw InputError("plan.cross_entropy", "\"" + models::loss_impl_name(plan.cross_entropy) + "\"",
                     "\"torch\" on the CUDA runtime (its loss buffer holds the bf16 logits and an fp32 log-softmax)");
  const Dims d = runtime_dims(m, plan.micro_batch, plan.seq_len);
  if (d.C % 2 != 0)   // the fp32 statistics follow the bf16 block input in the activation buffer
    throw InputError("model.hidden", std::to_string(d.C), "an even number on the CUDA runtime");
  if (!attention_supports_head_dim(d.HD))
    throw InputError("model.head_dim", std::to_string(d.HD), "16, 32, 64 or 128 (the CUDA attention kernels' sizes)");
}

CudaRankRunner::CudaRankRunner(const RunConfig& cfg, DeviceCommunicator& comm) : cfg_(cfg), comm_(comm) {
  check_cuda_runtime_supports(cfg.model, cfg.plan);
  cfg_.optimizer.adamw = cfg.plan.optimizer == sim::Optimizer::AdamW;
  dims_ = runtime_dims(cfg.model, cfg.plan.micro_batch, cfg.plan.seq_len);
  graph_ = models::build_wrap_graph(cfg.model, cfg.plan.auto_wrap_policy);
  program_ = sim::lower(cfg.model, graph_, cfg.plan, sim::Topology{comm.world(), cfg.gpus_per_node});
  sim::validate_program(program_);
  fsdp2_ = cfg.plan.fsdp_version == sim::FsdpVersion::FSDP2;
  N_ = program_.shard_size;
  micro_batches_ = program_.micro_batches;
  if (comm.group_size(sim::CommGroup::Shard) != N_)
    throw std::runtime_error(internal("shard group of " + std::to_string(comm.group_size(sim::CommGroup::Shard)) +
                                      " ranks vs the program's " + std::to_string(N_)));
  for (const auto& u : graph_.units) {
    std::vector<ParamTensor> ts;
    for (const auto& t : u.tensors) ts.push_back({t.name, t.shape});
    layouts_.push_back(make_unit_layout(ts, N_, fsdp2_, cfg.plan.use_orig_params));
  }
  const int S = dims_.L + 2;
  seg_unit_.assign(S, -1);
  seg_tensors_.assign(S, {});
  for (int s = 0; s < S; ++s) {
    const auto part = s == 0 ? models::ModulePart::Embedding
                             : s == S - 1 ? models::ModulePart::FinalNormAndHead : models::ModulePart::Block;
    std::vector<std::string> names;
    for (const auto& t : part_param_tensors(dims_, part, s - 1)) names.push_back(t.name);
    if (part == models::ModulePart::FinalNormAndHead && dims_.tied) names.push_back("model.embed_tokens.weight");
    for (size_t k = 0; k < names.size(); ++k) {
      int found_u = -1, found_i = -1;
      for (size_t u = 0; u < layouts_.size() && found_u < 0; ++u)
        for (size_t i = 0; i < layouts_[u].tensors.size(); ++i)
          if (layouts_[u].tensors[i].name == names[k]) {
            found_u = static_cast<int>(u);
            found_i = static_cast<int>(i);
            break;
          }
      if (found_u < 0) throw std::runtime_error(internal("no FSDP unit holds " + names[k]));
      if (k == 0) seg_unit_[s] = found_u;
      if (found_u != seg_unit_[s])
        throw InputError("plan.auto_wrap_policy", models::wrap_policy_name(cfg.plan.auto_wrap_policy),
                         "a policy that keeps each block (and the tied embedding with the head) in one FSDP unit "
                         "(CUDA runtime); " + names[k] + " is in another unit");
      seg_tensors_[s].push_back(found_i);
    }
  }
  const int U = static_cast<int>(layouts_.size());
  shard_buf_.assign(U, -1);
  grad_shard_buf_.assign(U, -1);
  optim_buf_.assign(U, -1);
  for (const auto& b : program_.buffers) {
    if (!b.persistent || b.unit < 0 || b.unit >= U) continue;
    if (b.category == sim::MemCategory::ShardedParams) shard_buf_[b.unit] = b.id;
    if (b.category == sim::MemCategory::ShardedGrads) grad_shard_buf_[b.unit] = b.id;
    if (b.category == sim::MemCategory::OptimizerState) optim_buf_[b.unit] = b.id;
  }
  classify_buffers();
  for (int u = 0; u < U; ++u) {
    if (layouts_[u].tensors.empty()) continue;
    if (shard_buf_[u] < 0 || grad_shard_buf_[u] < 0 || optim_buf_[u] < 0)
      throw std::runtime_error(internal("unit " + std::to_string(u) + " lacks a sharded param/grad/optimizer buffer"));
    if (numel(shard_buf_[u]) != layouts_[u].shard || numel(grad_shard_buf_[u]) != layouts_[u].grad_shard)
      throw std::runtime_error(internal("unit " + std::to_string(u) + "'s sharded buffers do not match the runtime's layout"));
  }
  analyze_program();

  exec_ = std::make_unique<CudaStreamExecutor>(program_);
  gemm_ = std::make_unique<Gemm>(exec_->stream(0));
  std::vector<bool> ckpt(dims_.L, false);
  const auto& ac = cfg.plan.activation_checkpointing;
  for (int l = 0; l < dims_.L; ++l)
    ckpt[l] = ac.mode == sim::ActivationCheckpointing::Mode::Full ||
              (ac.mode == sim::ActivationCheckpointing::Mode::EveryK && l % ac.every_k == 0);
  compute_ = std::make_unique<CudaSegmentCompute>(
      dims_, 1.0f / static_cast<float>(dims_.tokens() * micro_batches_), ckpt, *gemm_);

  // The allocator's region: what is free on the device, less headroom for what the CUDA runtime and
  // libraries allocate lazily outside it (cuBLAS workspaces, NCCL buffers, kernel modules loaded on
  // first launch, the local memory of the attention kernels' register spills, sized per resident
  // thread on the first launch, and gather()'s fp32 staging of the largest unit), capped by
  // cfg.address_space. Measured on an H100: 512 MiB was not enough for llama-1b/llama3-8b shapes.
  // FSDPSIM_CUDA_HEADROOM_MIB overrides the default max(4 GiB, 10% of the device).
  size_t free_b = 0, total_b = 0;
  FSDPSIM_CU_CHECK(cudaMemGetInfo(&free_b, &total_b));
  Bytes headroom = std::max<Bytes>(4 * kGiB, static_cast<Bytes>(total_b) / 10);
  if (const char* h = std::getenv("FSDPSIM_CUDA_HEADROOM_MIB")) {
    char* end = nullptr;
    const long long mib = std::strtoll(h, &end, 10);
    if (end == h || *end != '\0' || mib < 0 || mib > (1LL << 30))
      throw InputError("FSDPSIM_CUDA_HEADROOM_MIB", "\"" + std::string(h) + "\"", "a whole number of MiB >= 0");
    headroom = static_cast<Bytes>(mib) * kMiB;
  }
  for (const UnitLayout& l : layouts_) headroom = std::max<Bytes>(headroom, l.unsharded * 4 + 512 * kMiB);
  const Bytes region = std::min<Bytes>(cfg.address_space, static_cast<Bytes>(free_b) - headroom);
  if (region <= 0) throw std::runtime_error("CUDA runtime: no device memory left for the allocator (" + error_where() + ")");
  mem_ = std::make_unique<CudaDeviceMemory>(program_, region);
  for (const auto& b : program_.buffers)
    if (b.persistent) mem_->alloc(b.id, 0);

  const int gr = comm.group_rank(sim::CommGroup::Shard);
  state_ptr_.assign(U, nullptr);
  for (int u = 0; u < U; ++u) {
    const UnitLayout& l = layouts_[u];
    if (l.tensors.empty()) continue;
    std::vector<float> host(l.shard);
    init_shard(l, gr, cfg.seed, host.data());
    FSDPSIM_CU_CHECK(cudaMemcpy(ptr(shard_buf_[u]), host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    FSDPSIM_CU_CHECK(cudaMemset(ptr(grad_shard_buf_[u]), 0, static_cast<size_t>(l.grad_shard) * 4));
    const Bytes need = l.shard * cfg_.optimizer.states() * 4;
    const Bytes have = program_.buffers[optim_buf_[u]].bytes;
    if (have >= need) {
      state_ptr_[u] = reinterpret_cast<float*>(ptr(optim_buf_[u]));
    } else {
      void* p = nullptr;
      FSDPSIM_CU_CHECK(cudaMalloc(&p, static_cast<size_t>(need)));
      side_state_.push_back(p);
      side_state_bytes_ += need;
      state_ptr_[u] = static_cast<float*>(p);
      notes_.push_back("optimizer state of unit " + std::to_string(u) + ": the program's buffer (" + std::to_string(have) +
                       " B) is smaller than the padded shard needs (" + std::to_string(need) +
                       " B); kept in a separate cudaMalloc outside the allocator");
    }
    FSDPSIM_CU_CHECK(cudaMemset(state_ptr_[u], 0, static_cast<size_t>(need)));
  }
  notes_.push_back("measured on the CUDA backend (bf16 compute, fp32 accumulation and masters, cuBLAS, NCCL); " +
                   std::to_string(untracked_bytes()) +
                   " B of device scratch (residual stream, checkpointed blocks' transient forward, backward "
                   "temporaries, final-norm activations, tokens, rotary table) are outside the caching allocator");
  notes_.push_back("the head's logits buffer is sized for PyTorch's fp32 log_softmax copy; the fused cross-entropy "
                   "uses its bf16 logits and 4 B per token of the fp32 part");
}

CudaRankRunner::~CudaRankRunner() {
  for (void* p : side_state_) cudaFree(p);
}

// Element type of every buffer: sharded state in the master dtype (fp32); unsharded params in
// param_dtype; unsharded grads in param_dtype, or reduce_dtype for FSDP2's upcast accumulation
// (told apart by size: both hold the unit's unsharded grad numel); communication buffers on the
// parameter side (cast shards, all-gather in/out) in param_dtype, on the gradient side in reduce_dtype.
void CudaRankRunner::classify_buffers() {
  const int B = static_cast<int>(program_.buffers.size());
  const Elem bp = elem_of(cfg_.plan.param_dtype), br = elem_of(cfg_.plan.reduce_dtype);
  std::vector<char> param_side(B, 0);
  auto cat = [&](int b) { return program_.buffers[b].category; };
  for (const sim::Op& op : program_.ops) {
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
  for (const auto& b : program_.buffers) {
    switch (b.category) {
      case sim::MemCategory::UnshardedParams: elem_[b.id] = bp; break;
      case sim::MemCategory::UnshardedGrads: {
        const std::int64_t n = b.unit >= 0 ? layouts_.at(b.unit).grad : 0;
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

long CudaRankRunner::numel(int b) const { return program_.buffers.at(b).bytes / esize(elem_.at(b)); }

// As rank_runner.cpp: each compute op's segment, each reduce-path op's role, from the program alone.
void CudaRankRunner::analyze_program() {
  const int S = dims_.L + 2, n = static_cast<int>(program_.ops.size());
  op_segment_.assign(n, -1);
  op_divide_.assign(n, 1);
  op_chain_end_.assign(n, {});
  std::map<int, int> fwd_next, bwd_next;
  std::map<std::pair<int, int>, int> recompute_count;
  const bool outside = cfg_.plan.activation_checkpointing.outside_fsdp;
  const auto& ac = cfg_.plan.activation_checkpointing;
  auto checkpointed = [&](int seg) {
    if (seg < 1 || seg > dims_.L) return false;
    const int l = seg - 1;
    return ac.mode == sim::ActivationCheckpointing::Mode::Full ||
           (ac.mode == sim::ActivationCheckpointing::Mode::EveryK && l % ac.every_k == 0);
  };
  std::map<std::pair<int, int>, std::vector<int>> chains;
  for (int i = 0; i < n; ++i) {
    const sim::Op& op = program_.ops[i];
    const int mb = op.micro_batch;
    if (op.kind == sim::OpKind::Forward) {
      int& k = fwd_next.try_emplace(mb, 0).first->second;
      op_segment_[i] = k++;
    } else if (op.kind == sim::OpKind::Backward) {
      int& k = bwd_next.try_emplace(mb, S - 1).first->second;
      op_segment_[i] = k--;
    } else if (op.kind == sim::OpKind::Recompute) {
      if (outside) {
        int& c = recompute_count[{mb, op.unit}];
        int seen = 0;
        for (int s = 0; s < S; ++s)
          if (seg_unit_[s] == op.unit && checkpointed(s) && seen++ == c) op_segment_[i] = s;
        ++c;
      } else {
        op_segment_[i] = bwd_next.try_emplace(mb, S - 1).first->second;
      }
    } else if (is_reduce_path(op.kind) && op.unit >= 0) {
      // FSDP2's "grad up"/"grad acc" casts on the compute stream precede the reduction: not part of it.
      const bool upcast = op.kind == sim::OpKind::Cast && !op.inputs.empty() &&
                          program_.buffers[op.inputs[0]].category == sim::MemCategory::UnshardedGrads &&
                          !op.outputs.empty() && program_.buffers[op.outputs[0]].category == sim::MemCategory::UnshardedGrads;
      if (!upcast) chains[{op.unit, mb}].push_back(i);
    }
    const int seg = op_segment_[i];
    if (seg >= 0 && (seg >= S || seg_unit_[seg] != op.unit))
      throw std::runtime_error(internal("op " + std::to_string(i) + " (" + op.name + ") maps to segment " + std::to_string(seg)));
    if ((op.kind == sim::OpKind::Forward || op.kind == sim::OpKind::Backward || op.kind == sim::OpKind::Recompute) &&
        op.stream != 0)
      throw std::runtime_error(internal(op.name + " is not on the compute stream"));
  }
  const int W = comm_.world();
  const int pre = predivide_factor(W), post = W / pre;
  for (auto& [key, ops] : chains) {
    bool after_collective = false;
    for (int i : ops) {
      if (is_collective(program_.ops[i].kind)) after_collective = true;
      if (program_.ops[i].kind == sim::OpKind::Divide) op_divide_[i] = after_collective ? post : pre;
    }
    const sim::Op& last = program_.ops[ops.back()];
    if (last.kind == sim::OpKind::Cast) continue;   // the cast accumulates into the sharded grad itself
    if (last.outputs.empty()) throw std::runtime_error(internal("reduce op " + last.name + " has no output"));
    op_chain_end_[ops.back()] = {key.first, last.outputs[0]};
  }
  act_buf_.assign(micro_batches_, std::vector<int>(S, -1));
  recomp_buf_.assign(micro_batches_, std::vector<int>(S, -1));
}

std::vector<bf16*> CudaRankRunner::segment_params(int seg, const sim::Op& op) {
  const int u = seg_unit_[seg];
  const UnitLayout& l = layouts_[u];
  bf16* base = nullptr;
  for (int b : op.inputs)
    if (program_.buffers[b].category == sim::MemCategory::UnshardedParams && program_.buffers[b].unit == u) {
      if (elem_[b] != Elem::BF16 || numel(b) != l.unsharded)
        throw std::runtime_error(internal("unsharded params \"" + program_.buffers[b].name + "\" are not bf16[" +
                                          std::to_string(l.unsharded) + "]"));
      base = reinterpret_cast<bf16*>(ptr(b));
    }
  if (!base) throw std::runtime_error(internal(op.name + " reads no bf16 unsharded parameters of unit " + std::to_string(u)));
  std::vector<bf16*> out;
  for (int i : seg_tensors_[seg]) out.push_back(base + (l.fsdp2 ? l.unsharded_offset[i] : l.flat_offset[i]));
  return out;
}

std::vector<bf16*> CudaRankRunner::segment_grads(int seg, const sim::Op& op, cudaStream_t s) {
  const int u = seg_unit_[seg];
  const UnitLayout& l = layouts_[u];
  for (int b : op.outputs) {
    if (program_.buffers[b].category != sim::MemCategory::UnshardedGrads || program_.buffers[b].unit != u) continue;
    if (elem_[b] != Elem::BF16 || numel(b) != l.grad)
      throw std::runtime_error(internal("unsharded grads \"" + program_.buffers[b].name + "\" are not bf16[" +
                                        std::to_string(l.grad) + "]"));
    bf16* base = reinterpret_cast<bf16*>(ptr(b));
    // A grad buffer this op allocates is a fresh .grad: autograd writes it; our kernels accumulate.
    if (std::find(op.allocs.begin(), op.allocs.end(), b) != op.allocs.end())
      FSDPSIM_CU_CHECK(cudaMemsetAsync(base, 0, static_cast<size_t>(l.grad) * 2, s));
    std::vector<bf16*> out;
    for (int i : seg_tensors_[seg]) out.push_back(base + l.grad_offset[i]);
    return out;
  }
  throw std::runtime_error(internal(op.name + " writes no unsharded grad of unit " + std::to_string(u)));
}

void CudaRankRunner::run_compute(const sim::Op& op) {
  const int seg = op_segment_[op.id], mb = op.micro_batch;
  auto sized = [&](int b, Bytes want, const char* what) {
    if (program_.buffers[b].bytes != want)
      throw std::runtime_error("activation memory: the program's " + std::string(what) + " buffer \"" +
                               program_.buffers[b].name + "\" has " + std::to_string(program_.buffers[b].bytes) +
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

void CudaRankRunner::accumulate_grad(int unit, int src, cudaStream_t s) {
  accumulate_f32(reinterpret_cast<float*>(ptr(grad_shard_buf_[unit])), ptr(src), elem_[src], layouts_[unit].grad_shard, s);
}

void CudaRankRunner::enqueue(const sim::Op& op, cudaStream_t s) {
  using sim::OpKind;
  const ReduceOp rop = fsdp2_ ? ReduceOp::Avg : ReduceOp::Sum;   // F2.10 AVG; FSDP1 SUM + divides (F1.12)
  auto cat = [&](int b) { return program_.buffers[b].category; };
  const int u = op.unit;
  switch (op.kind) {
    case OpKind::CopyIn: {
      const int in = op.inputs.at(0), out = op.outputs.at(0);
      const UnitLayout& l = layouts_.at(u);
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
              FSDPSIM_CU_CHECK(cudaMemsetAsync(dst + (hi - lo) * so, 0, static_cast<size_t>((chunk - (hi - lo)) * so), s));
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
      break;
    }
    case OpKind::CopyOut: {   // FSDP2 split_with_sizes_copy: all-gather output [N][shard] -> per-parameter storage
      const UnitLayout& l = layouts_.at(u);
      const int in = op.inputs.at(0), out = op.outputs.at(0);
      const long es = esize(elem_[out]);
      if (elem_[in] != elem_[out] || numel(out) != l.unsharded) throw std::runtime_error(internal("copy-out of " + op.name));
      for (size_t i = 0; i < l.tensors.size(); ++i) {
        const std::int64_t chunk = l.chunk_rows[i] * l.rest[i];
        // One strided copy per tensor: N chunks of `chunk` elements, source pitch = the shard.
        FSDPSIM_CU_CHECK(cudaMemcpy2DAsync(ptr(out) + l.unsharded_offset[i] * es, chunk * es,
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
      break;
    }
    case OpKind::AllReduce: {
      const Elem t = elem_[op.inputs.at(0)];
      comm_.all_reduce(ptr(op.inputs[0]), op.comm_bytes / esize(t), t, op.group, rop, s);
      break;
    }
    case OpKind::Divide: {
      const int b = op.inputs.at(0);
      scale(ptr(b), elem_[b], 1.0f / static_cast<float>(op_divide_[op.id]), numel(b), s);
      break;
    }
    case OpKind::Pad: {   // FSDP1 F.pad of the flat grad to N * ceil(numel / N)
      const int in = op.inputs.at(0), out = op.outputs.at(0);
      const long es = esize(elem_[out]);
      if (elem_[in] != elem_[out]) throw std::runtime_error(internal("pad changes the dtype in " + op.name));
      FSDPSIM_CU_CHECK(cudaMemcpyAsync(ptr(out), ptr(in), numel(in) * es, cudaMemcpyDeviceToDevice, s));
      FSDPSIM_CU_CHECK(cudaMemsetAsync(ptr(out) + numel(in) * es, 0, static_cast<size_t>((numel(out) - numel(in)) * es), s));
      break;
    }
    case OpKind::Cast: {
      const int in = op.inputs.at(0), out = op.outputs.at(0);
      if (u >= 0 && out == grad_shard_buf_.at(u)) {
        accumulate_grad(u, in, s);   // into .grad (fp32), which step() zeroed: assign or accumulate
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
      for (size_t k = 0; k < layouts_.size(); ++k) {
        if (layouts_[k].tensors.empty()) continue;
        float* p = reinterpret_cast<float*>(ptr(shard_buf_[k]));
        const float* g = reinterpret_cast<const float*>(ptr(grad_shard_buf_[k]));
        const long n = layouts_[k].shard;
        if (c.adamw) adamw_step(p, g, state_ptr_[k], state_ptr_[k] + n, n, c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, step_size, bc2_sqrt, s);
        else sgd_step(p, g, state_ptr_[k], n, c.lr, c.momentum, c.weight_decay, step == 1, s);
      }
      break;
    }
    default:
      throw std::runtime_error(std::string("CUDA runtime: op kind ") + sim::op_kind_name(op.kind) + " is not supported");
  }
  const ChainEnd& end = op_chain_end_[op.id];
  if (end.unit >= 0) accumulate_grad(end.unit, end.result_buffer, s);
}

StepOutcome CudaRankRunner::step() {
  for (size_t u = 0; u < layouts_.size(); ++u)
    if (!layouts_[u].tensors.empty())
      FSDPSIM_CU_CHECK(cudaMemset(ptr(grad_shard_buf_[u]), 0, static_cast<size_t>(layouts_[u].grad_shard) * 4));
  const int W = comm_.world();
  for (int mb = 0; mb < micro_batches_; ++mb) {
    std::vector<std::int64_t> idx;
    for (int j = 0; j < dims_.B; ++j) idx.push_back(sequence_index(steps_done_, comm_.rank(), W, mb, micro_batches_, dims_.B, j));
    TokenBatch b = make_batch(cfg_.seed, idx, dims_.T, dims_.V);
    compute_->set_batch(mb, b.inputs, b.targets);
  }
  mem_->reset_timeline();
  StepOutcome out;
  out.measured = exec_->execute_step(*mem_, *this);
  mem_->fill(out.measured);
  double local = 0;
  for (int mb = 0; mb < micro_batches_; ++mb) local += compute_->loss_sum(mb);
  out.loss = comm_.sum_world(local) / (static_cast<double>(W) * micro_batches_ * dims_.tokens());
  auto& r = out.measured;
  r.tokens_per_step = static_cast<double>(program_.tokens_per_rank) * W;
  r.tokens_per_s_per_gpu = r.step_time_ns > 0 ? static_cast<double>(program_.tokens_per_rank) / to_seconds(r.step_time_ns) : 0;
  r.model_flops_per_step_per_gpu = program_.model_flops_per_rank;
  r.notes = notes_;
  for (const auto& n : program_.notes) r.notes.push_back("program: " + n);
  ++steps_done_;
  return out;
}

std::vector<std::pair<std::string, std::vector<float>>> CudaRankRunner::gather_params() { return gather(shard_buf_); }
std::vector<std::pair<std::string, std::vector<float>>> CudaRankRunner::gather_grads() { return gather(grad_shard_buf_); }

std::vector<std::pair<std::string, std::vector<float>>> CudaRankRunner::gather(const std::vector<int>& bufs) {
  FSDPSIM_CU_CHECK(cudaDeviceSynchronize());
  std::map<std::string, std::vector<float>> by_name;
  for (size_t u = 0; u < layouts_.size(); ++u) {
    const UnitLayout& l = layouts_[u];
    if (l.tensors.empty()) continue;
    float* dev = nullptr;
    FSDPSIM_CU_CHECK(cudaMalloc(&dev, static_cast<size_t>(l.unsharded) * 4));
    std::vector<float> all(l.unsharded);
    try {
      comm_.all_gather(reinterpret_cast<const float*>(ptr(bufs[u])), dev, l.shard, sim::CommGroup::Shard);
      FSDPSIM_CU_CHECK(cudaMemcpy(all.data(), dev, all.size() * 4, cudaMemcpyDeviceToHost));
    } catch (...) {
      cudaFree(dev);
      throw;
    }
    cudaFree(dev);
    auto ts = tensors_from_shards(l, all.data());
    for (size_t i = 0; i < ts.size(); ++i) by_name[l.tensors[i].name] = std::move(ts[i]);
  }
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const auto& t : model_param_tensors(dims_)) out.push_back({t.name, by_name.at(t.name)});
  return out;
}

}  // namespace fsdpsim::runtime::cuda

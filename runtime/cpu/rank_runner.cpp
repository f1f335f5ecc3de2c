#include "runtime/cpu/rank_runner.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

#include "common/errors.h"
#include "runtime/cpu/stream_executor.h"
#include "runtime/train/reference_trainer.h"
#include "runtime/train/synthetic_data.h"
#include "sim/executor.h"
#include "sim/lowering.h"

namespace fsdpsim::runtime {

namespace {

std::string internal(const std::string& what) { return "CPU runtime and lowering disagree: " + what; }

// FSDP1's gradient pre-divide factor (F1.12, default_hooks._get_gradient_predivide_factor).
int predivide_factor(int n) {
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

}  // namespace

void check_runtime_supports(const models::ModelSpec& m, const sim::Plan& plan) {
  const std::string fp32 = "fp32 (the CPU runtime computes, communicates and keeps master weights in fp32)";
  if (plan.param_dtype != Dtype::FP32) throw InputError("plan.param_dtype", std::string(dtype_name(plan.param_dtype)), fp32);
  if (plan.reduce_dtype != Dtype::FP32) throw InputError("plan.reduce_dtype", std::string(dtype_name(plan.reduce_dtype)), fp32);
  if (plan.master_weights_dtype != Dtype::FP32)
    throw InputError("plan.master_weights_dtype", std::string(dtype_name(plan.master_weights_dtype)), fp32);
  if (plan.cpu_offload.params || plan.cpu_offload.optimizer)
    throw InputError("plan.cpu_offload", "true", "false: the CPU runtime has no separate device memory to offload from");
  if (plan.fp8_all_gather) throw InputError("plan.fp8_all_gather", "true", "false on the CPU runtime (fp32 only)");
  if (plan.trainable_fraction < 1.0)
    throw InputError("plan.trainable_fraction", std::to_string(plan.trainable_fraction), "1 on the CPU runtime (all parameters train)");
  if (plan.reshard_after_forward > 1)
    throw InputError("plan.reshard_after_forward", std::to_string(plan.reshard_after_forward),
                     "true or false on the CPU runtime (an int reshards to a sub-group not implemented here)");
  if (plan.activation_checkpointing.mode == sim::ActivationCheckpointing::Mode::SelectiveOp)
    throw InputError("plan.activation_checkpointing", "selective_op", "none, full or every_k on the CPU runtime");
  if (plan.cross_entropy != models::LossImpl::Torch)
    throw InputError("plan.cross_entropy", "\"" + models::loss_impl_name(plan.cross_entropy) + "\"",
                     "\"torch\" on the CPU runtime (it keeps the logits and an fp32 log-softmax, as F.cross_entropy does)");
  runtime_dims(m, plan.micro_batch, plan.seq_len);
}

RankRunner::RankRunner(const RunConfig& cfg, Communicator& comm) : cfg_(cfg), comm_(comm) {
  check_runtime_supports(cfg.model, cfg.plan);
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

  // Layouts per unit, from the wrap graph's tensors (registration order).
  for (const auto& u : graph_.units) {
    std::vector<ParamTensor> ts;
    for (const auto& t : u.tensors) ts.push_back({t.name, t.shape});
    layouts_.push_back(make_unit_layout(ts, N_, fsdp2_, cfg.plan.use_orig_params));
  }
  // Segments: which unit holds each segment's tensors (all of them in one unit).
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
                         "(CPU runtime); " + names[k] + " is in another unit");
      seg_tensors_[s].push_back(found_i);
    }
  }
  // Persistent buffers per unit.
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
  for (int u = 0; u < U; ++u) {
    if (layouts_[u].tensors.empty()) continue;
    if (shard_buf_[u] < 0 || grad_shard_buf_[u] < 0 || optim_buf_[u] < 0)
      throw std::runtime_error(internal("unit " + std::to_string(u) + " lacks a sharded param/grad/optimizer buffer"));
    check_buffer(shard_buf_[u], layouts_[u].shard, "sharded params");
    check_buffer(grad_shard_buf_[u], layouts_[u].grad_shard, "sharded grads");
  }
  analyze_program();

  std::vector<bool> ckpt(dims_.L, false);
  const auto& ac = cfg.plan.activation_checkpointing;
  for (int l = 0; l < dims_.L; ++l)
    ckpt[l] = ac.mode == sim::ActivationCheckpointing::Mode::Full ||
              (ac.mode == sim::ActivationCheckpointing::Mode::EveryK && l % ac.every_k == 0);
  compute_ = std::make_unique<SegmentCompute>(
      dims_, 1.0f / static_cast<float>(dims_.tokens() * micro_batches_), ckpt);

  // Device memory: persistent buffers first (the sharded state lives across steps), then the
  // initial values: this rank's shard of the deterministic init, zero grads and optimizer states.
  mem_ = std::make_unique<DeviceMemory>(program_, cfg.address_space);
  for (const auto& b : program_.buffers)
    if (b.persistent) mem_->alloc(b.id, 0);
  const int gr = comm.group_rank(sim::CommGroup::Shard);
  state_ptr_.assign(U, nullptr);
  side_state_.assign(U, {});
  for (int u = 0; u < U; ++u) {
    if (layouts_[u].tensors.empty()) continue;
    init_shard(layouts_[u], gr, cfg.seed, mem_->ptr(shard_buf_[u]));
    std::memset(mem_->ptr(grad_shard_buf_[u]), 0, sizeof(float) * layouts_[u].grad_shard);
    const Bytes need = layouts_[u].shard * cfg_.optimizer.states() * 4;
    const Bytes have = program_.buffers[optim_buf_[u]].bytes;
    if (have >= need) {
      state_ptr_[u] = mem_->ptr(optim_buf_[u]);
    } else {
      side_state_[u].assign(need / 4, 0.0f);
      state_ptr_[u] = side_state_[u].data();
      notes_.push_back("optimizer state of unit " + std::to_string(u) + ": the program's buffer (" + std::to_string(have) +
                       " B, from the unpadded parameter count) is smaller than the padded shard needs (" +
                       std::to_string(need) + " B); the runtime keeps these states in host memory outside the allocator");
    }
    std::memset(state_ptr_[u], 0, static_cast<size_t>(need));
  }
  notes_.push_back("measured on the CPU backend (fp32, OpenBLAS, MPI); " + std::to_string(untracked_bytes()) +
                   " B of per-rank scratch (residual-stream hand-off, transient forward intermediates of checkpointed "
                   "blocks, backward gradient temporaries, final-norm activations) are outside the caching allocator, "
                   "as the simulator's activation model leaves them out");
}

RankRunner::~RankRunner() = default;

void RankRunner::check_buffer(int buffer, std::int64_t numel, const char* what) const {
  const Bytes want = numel * 4;
  if (program_.buffers[buffer].bytes != want)
    throw std::runtime_error(internal(std::string(what) + " buffer \"" + program_.buffers[buffer].name + "\" has " +
                                      std::to_string(program_.buffers[buffer].bytes) + " B, the runtime's layout needs " +
                                      std::to_string(want) + " B"));
}

// Assigns every compute op its segment and every reduce-path op its role, from the program alone
// (the lowering's emission order, sim/lower_fsdp{1,2}.cpp): per micro-batch, forwards run segments
// 0..S-1, backwards S-1..0; a recompute under FSDP(checkpoint(block)) precedes its segment's
// backward, under checkpoint(FSDP(block)) the unit's checkpointed segments are recomputed in order.
void RankRunner::analyze_program() {
  const int S = dims_.L + 2, n = static_cast<int>(program_.ops.size());
  op_segment_.assign(n, -1);
  op_divide_.assign(n, 1);
  op_chain_end_.assign(n, {});
  std::map<int, int> fwd_next, bwd_next;
  std::map<std::pair<int, int>, int> recompute_count;   // (mb, unit) -> recomputes seen
  const bool outside = cfg_.plan.activation_checkpointing.outside_fsdp;
  const auto& ac = cfg_.plan.activation_checkpointing;
  auto checkpointed = [&](int seg) {
    if (seg < 1 || seg > dims_.L) return false;
    const int l = seg - 1;
    return ac.mode == sim::ActivationCheckpointing::Mode::Full ||
           (ac.mode == sim::ActivationCheckpointing::Mode::EveryK && l % ac.every_k == 0);
  };
  std::map<std::pair<int, int>, std::vector<int>> chains;   // (unit, mb) -> reduce-path ops in order
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
      chains[{op.unit, mb}].push_back(i);
    }
    const int seg = op_segment_[i];
    if (seg >= 0 && (seg >= S || seg_unit_[seg] != op.unit))
      throw std::runtime_error(internal("op " + std::to_string(i) + " (" + op.name + ") maps to segment " +
                                        std::to_string(seg) + " of unit " + (seg < S ? std::to_string(seg_unit_[seg]) : "?")));
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

std::vector<float*> RankRunner::segment_params(int seg, const sim::Op& op) {
  const int u = seg_unit_[seg];
  float* base = nullptr;
  for (int b : op.inputs)
    if (program_.buffers[b].category == sim::MemCategory::UnshardedParams && program_.buffers[b].unit == u) {
      check_buffer(b, layouts_[u].unsharded, "unsharded params");
      base = mem_->ptr(b);
    }
  if (!base) {
    // No unsharded buffer: the unit is replicated (shard group of 1) and computes on its shard.
    if (N_ != 1) throw std::runtime_error(internal(op.name + " has no unsharded parameters of unit " + std::to_string(u)));
    base = mem_->ptr(shard_buf_[u]);
  }
  auto all = unsharded_param_ptrs(layouts_[u], base);
  std::vector<float*> out;
  for (int i : seg_tensors_[seg]) out.push_back(all[i]);
  return out;
}

std::vector<float*> RankRunner::segment_grads(int seg, const sim::Op& op) {
  const int u = seg_unit_[seg];
  for (int b : op.outputs) {
    if (program_.buffers[b].category != sim::MemCategory::UnshardedGrads || program_.buffers[b].unit != u) continue;
    check_buffer(b, layouts_[u].grad, "unsharded grads");
    float* base = mem_->ptr(b);
    // A grad buffer this op allocates is a fresh .grad: autograd writes it; our kernels accumulate.
    if (std::find(op.allocs.begin(), op.allocs.end(), b) != op.allocs.end())
      std::memset(base, 0, sizeof(float) * layouts_[u].grad);
    auto all = unsharded_grad_ptrs(layouts_[u], base);
    std::vector<float*> out;
    for (int i : seg_tensors_[seg]) out.push_back(all[i]);
    return out;
  }
  throw std::runtime_error(internal(op.name + " writes no unsharded grad of unit " + std::to_string(u)));
}

void RankRunner::run_compute(const sim::Op& op) {
  const int seg = op_segment_[op.id], mb = op.micro_batch;
  auto sized = [&](int b, Bytes want, const char* what) {
    if (program_.buffers[b].bytes != want)
      throw std::runtime_error("activation memory: the program's " + std::string(what) + " buffer \"" +
                               program_.buffers[b].name + "\" has " + std::to_string(program_.buffers[b].bytes) +
                               " B but the CPU kernels save " + std::to_string(want) + " B (models' activation formula vs runtime)");
  };
  if (op.kind == sim::OpKind::Forward) {
    float* act = nullptr;
    if (compute_->act_bytes(seg) > 0) {
      if (op.allocs.empty()) throw std::runtime_error(internal(op.name + " allocates no activation buffer"));
      sized(op.allocs[0], compute_->act_bytes(seg), "saved-activation");
      act_buf_[mb][seg] = op.allocs[0];
      act = mem_->ptr(op.allocs[0]);
    }
    compute_->forward(seg, mb, segment_params(seg, op), act);
    return;
  }
  float* act = act_buf_[mb][seg] >= 0 ? mem_->ptr(act_buf_[mb][seg]) : nullptr;
  if (op.kind == sim::OpKind::Recompute) {
    if (op.allocs.empty()) throw std::runtime_error(internal(op.name + " allocates no recompute buffer"));
    sized(op.allocs[0], compute_->recomp_bytes(seg), "recompute");
    recomp_buf_[mb][seg] = op.allocs[0];
    compute_->recompute(seg, mb, segment_params(seg, op), act, mem_->ptr(op.allocs[0]));
    return;
  }
  float* recomp = recomp_buf_[mb][seg] >= 0 ? mem_->ptr(recomp_buf_[mb][seg]) : nullptr;
  compute_->backward(seg, mb, segment_params(seg, op), segment_grads(seg, op), act, recomp);
  act_buf_[mb][seg] = recomp_buf_[mb][seg] = -1;
}

void RankRunner::accumulate_grad(int unit, const float* src) {
  float* g = mem_->ptr(grad_shard_buf_[unit]);
  const std::int64_t n = layouts_[unit].grad_shard;
  for (std::int64_t i = 0; i < n; ++i) g[i] += src[i];
}

void RankRunner::run(const sim::Op& op) {
  using sim::OpKind;
  const ReduceOp rop = fsdp2_ ? ReduceOp::Avg : ReduceOp::Sum;   // F2.10 AVG; FSDP1 SUM + divides (F1.12)
  auto ptr = [&](int b) { return mem_->ptr(b); };
  auto cat = [&](int b) { return program_.buffers[b].category; };
  const int u = op.unit;
  switch (op.kind) {
    case OpKind::CopyIn: {
      if (cat(op.inputs.at(0)) == sim::MemCategory::ShardedParams) {   // FSDP2 all-gather copy-in (F2.2)
        check_buffer(op.outputs.at(0), layouts_[u].unsharded, "all-gather output");
        std::memcpy(ptr(op.outputs[0]) + comm_.group_rank(sim::CommGroup::Shard) * layouts_[u].shard,
                    ptr(op.inputs[0]), sizeof(float) * layouts_[u].shard);
      } else if (cat(op.inputs.at(0)) == sim::MemCategory::UnshardedGrads) {   // FSDP2 RS copy-in (F2.9)
        check_buffer(op.outputs.at(0), layouts_[u].rs_input, "reduce-scatter input");
        fsdp2_rs_copy_in(layouts_[u], ptr(op.inputs[0]), ptr(op.outputs[0]));
      } else {
        throw std::runtime_error(internal("copy-in from an unexpected buffer in " + op.name));
      }
      break;
    }
    case OpKind::AllGather: {
      const std::int64_t count = op.comm_bytes / 4 / op.group_size;
      float* out = ptr(op.outputs.at(0));
      const float* in = op.inputs.at(0) == op.outputs[0] ? out + comm_.group_rank(op.group) * count : ptr(op.inputs[0]);
      comm_.all_gather(in, out, count, op.group);
      break;
    }
    case OpKind::CopyOut:
      fsdp2_copy_out(layouts_[u], ptr(op.inputs.at(0)), ptr(op.outputs.at(0)));
      break;
    case OpKind::Forward:
    case OpKind::Backward:
    case OpKind::Recompute:
      run_compute(op);
      break;
    case OpKind::ReduceScatter:
      comm_.reduce_scatter(ptr(op.inputs.at(0)), ptr(op.outputs.at(0)), op.comm_bytes / 4 / op.group_size, op.group, rop);
      break;
    case OpKind::AllReduce:
      comm_.all_reduce(ptr(op.inputs.at(0)), op.comm_bytes / 4, op.group, rop);
      break;
    case OpKind::Divide: {
      float* x = ptr(op.inputs.at(0));
      const std::int64_t n = program_.buffers[op.inputs[0]].bytes / 4;
      const float f = static_cast<float>(op_divide_[op.id]);
      for (std::int64_t i = 0; i < n; ++i) x[i] /= f;
      break;
    }
    case OpKind::Pad: {   // FSDP1 F.pad of the flat grad to N * ceil(numel / N)
      const std::int64_t in_n = program_.buffers[op.inputs.at(0)].bytes / 4;
      const std::int64_t out_n = program_.buffers[op.outputs.at(0)].bytes / 4;
      std::memcpy(ptr(op.outputs[0]), ptr(op.inputs[0]), sizeof(float) * in_n);
      std::fill(ptr(op.outputs[0]) + in_n, ptr(op.outputs[0]) + out_n, 0.0f);
      break;
    }
    case OpKind::Cast:
      // fp32 everywhere: the only casts are _accumulate_sharded_grad / the post-reduce copy into .grad.
      if (op.outputs.empty() || op.outputs[0] != grad_shard_buf_.at(u))
        throw std::runtime_error(internal("a cast other than the sharded-grad accumulation: " + op.name));
      accumulate_grad(u, ptr(op.inputs.at(0)));
      break;
    case OpKind::OptimizerStep:
      for (size_t k = 0; k < layouts_.size(); ++k)
        if (!layouts_[k].tensors.empty())
          optimizer_step(cfg_.optimizer, ptr(shard_buf_[k]), ptr(grad_shard_buf_[k]), state_ptr_[k], layouts_[k].shard,
                         steps_done_ + 1);
      break;
    default:
      throw std::runtime_error(std::string("CPU runtime: op kind ") + sim::op_kind_name(op.kind) + " is not supported");
  }
  const ChainEnd& end = op_chain_end_[op.id];
  if (end.unit >= 0) accumulate_grad(end.unit, ptr(end.result_buffer));
}

StepOutcome RankRunner::step() {
  // zero_grad(set_to_none=True): the step's first reduction assigns, later ones accumulate.
  for (size_t u = 0; u < layouts_.size(); ++u)
    if (!layouts_[u].tensors.empty()) std::memset(mem_->ptr(grad_shard_buf_[u]), 0, sizeof(float) * layouts_[u].grad_shard);
  const int W = comm_.world();
  for (int mb = 0; mb < micro_batches_; ++mb) {
    std::vector<std::int64_t> idx;
    for (int j = 0; j < dims_.B; ++j) idx.push_back(sequence_index(steps_done_, comm_.rank(), W, mb, micro_batches_, dims_.B, j));
    TokenBatch b = make_batch(cfg_.seed, idx, dims_.T, dims_.V);
    compute_->set_batch(mb, std::move(b.inputs), std::move(b.targets));
  }
  mem_->reset_timeline();
  StepOutcome out;
  out.measured = execute_step(program_, *mem_, *this);
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

std::vector<std::pair<std::string, std::vector<float>>> RankRunner::gather_params() { return gather(shard_buf_); }
std::vector<std::pair<std::string, std::vector<float>>> RankRunner::gather_grads() { return gather(grad_shard_buf_); }

std::vector<std::pair<std::string, std::vector<float>>> RankRunner::gather(const std::vector<int>& bufs) {
  std::map<std::string, std::vector<float>> by_name;
  for (size_t u = 0; u < layouts_.size(); ++u) {
    const UnitLayout& l = layouts_[u];
    if (l.tensors.empty()) continue;
    std::vector<float> all(l.unsharded);
    comm_.all_gather(mem_->ptr(bufs[u]), all.data(), l.shard, sim::CommGroup::Shard);
    auto ts = tensors_from_shards(l, all.data());
    for (size_t i = 0; i < ts.size(); ++i) by_name[l.tensors[i].name] = std::move(ts[i]);
  }
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const auto& t : model_param_tensors(dims_)) out.push_back({t.name, by_name.at(t.name)});
  return out;
}

}  // namespace fsdpsim::runtime

#include "runtime/cpu/rank_runner.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

#include "common/errors.h"
#include "runtime/cpu/stream_executor.h"
#include "runtime/plan_support.h"
#include "runtime/train/reference_trainer.h"
#include "runtime/train/synthetic_data.h"
#include "sim/executor.h"
#include "sim/lowering.h"

namespace fsdpsim::runtime {

namespace {

std::string internal(const std::string& what) { return "CPU runtime and lowering disagree: " + what; }

}  // namespace

void check_runtime_supports(const models::ModelSpec& m, const sim::Plan& plan) {
  check_plan_supported(plan, RuntimeBackend::Cpu);
  runtime_dims(m, plan.micro_batch, plan.seq_len);
}

RankRunner::RankRunner(const RunConfig& cfg, Communicator& comm) : cfg_(cfg), comm_(comm) {
  check_runtime_supports(cfg.model, cfg.plan);
  cfg_.optimizer.adamw = cfg.plan.optimizer == sim::Optimizer::AdamW;
  rp_ = build_rank_program(cfg.model, cfg.plan, comm.world(), cfg.gpus_per_node, comm.group_size(sim::CommGroup::Shard),
                           "CPU runtime");
  const int U = static_cast<int>(rp_.layouts.size());
  for (int u = 0; u < U; ++u) {
    if (rp_.layouts[u].tensors.empty()) continue;
    check_buffer(rp_.shard_buf[u], rp_.layouts[u].shard, "sharded params");
    if (rp_.grad_shard_buf[u] < 0) throw std::runtime_error(internal("unit " + std::to_string(u) + " gets no sharded grad"));
    check_buffer(rp_.grad_shard_buf[u], rp_.layouts[u].grad_shard, "sharded grads");
  }
  const int S = rp_.dims.L + 2;
  act_buf_.assign(rp_.micro_batches, std::vector<int>(S, -1));
  recomp_buf_.assign(rp_.micro_batches, std::vector<int>(S, -1));

  compute_ = std::make_unique<SegmentCompute>(
      rp_.dims, 1.0f / static_cast<float>(rp_.dims.tokens() * rp_.micro_batches), rp_.checkpointed);
  compute_->set_recompute_early_stop(rp_.recompute_early_stop);

  // Device memory: persistent buffers first (the sharded state lives across steps), then the
  // initial values: this rank's shard of the deterministic init, zero grads and optimizer states.
  mem_ = std::make_unique<DeviceMemory>(rp_.program, cfg.address_space);
  for (const auto& b : rp_.program.buffers)
    if (b.persistent) mem_->alloc(b.id, 0);
  const int gr = comm.group_rank(sim::CommGroup::Shard);
  state_ptr_.assign(U, nullptr);
  grad_scratch_.assign(U, {});
  side_state_.assign(U, {});
  for (int u = 0; u < U; ++u) {
    if (rp_.layouts[u].tensors.empty()) continue;
    init_shard(rp_.layouts[u], gr, cfg.seed, mem_->ptr(rp_.shard_buf[u]));
    const Bytes need = rp_.layouts[u].shard * cfg_.optimizer.states() * 4;
    const Bytes have = rp_.program.buffers[rp_.optim_buf[u]].bytes;
    if (have >= need) {
      state_ptr_[u] = mem_->ptr(rp_.optim_buf[u]);
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
  if (rp_.program.buffers[buffer].bytes != want)
    throw std::runtime_error(internal(std::string(what) + " buffer \"" + rp_.program.buffers[buffer].name + "\" has " +
                                      std::to_string(rp_.program.buffers[buffer].bytes) + " B, the runtime's layout needs " +
                                      std::to_string(want) + " B"));
}

std::vector<float*> RankRunner::segment_params(int seg, const sim::Op& op) {
  const int u = rp_.seg_unit[seg];
  float* base = nullptr;
  for (int b : op.inputs)
    if (rp_.program.buffers[b].category == sim::MemCategory::UnshardedParams && rp_.program.buffers[b].unit == u) {
      check_buffer(b, rp_.layouts[u].unsharded, "unsharded params");
      base = mem_->ptr(b);
    }
  if (!base) {
    // No unsharded buffer: the unit is replicated (shard group of 1) and computes on its shard.
    if (rp_.N != 1) throw std::runtime_error(internal(op.name + " has no unsharded parameters of unit " + std::to_string(u)));
    base = mem_->ptr(rp_.shard_buf[u]);
  }
  auto all = unsharded_param_ptrs(rp_.layouts[u], base);
  std::vector<float*> out;
  for (int i : rp_.seg_tensors[seg]) out.push_back(all[i]);
  return out;
}

std::vector<float*> RankRunner::segment_grads(int seg, const sim::Op& op) {
  const int u = rp_.seg_unit[seg];
  for (int b : op.outputs) {
    if (rp_.program.buffers[b].category != sim::MemCategory::UnshardedGrads || rp_.program.buffers[b].unit != u) continue;
    float* base = nullptr;
    if (!rp_.fsdp2) {
      // FSDP1: the original parameters' gradients (views' grads) the program keeps apart until the
      // split-backward cat (a CopyOut) builds the flat grad; the kernels accumulate them in a host-side
      // flat scratch of the unit (outside the allocator), which that CopyOut moves into the flat grad.
      auto& scratch = grad_scratch_[u];
      if (scratch.empty()) scratch.assign(static_cast<size_t>(rp_.layouts[u].grad), 0.0f);
      base = scratch.data();
    } else {
      check_buffer(b, rp_.layouts[u].grad, "unsharded grads");
      base = mem_->ptr(b);
    }
    auto all_views = unsharded_grad_ptrs(rp_.layouts[u], base);
    if (base != mem_->ptr(b)) {
      std::vector<float*> out;
      for (int i : rp_.seg_tensors[seg]) out.push_back(all_views[i]);
      return out;
    }
    // A grad buffer this op allocates is a fresh .grad: autograd writes it; our kernels accumulate.
    if (std::find(op.allocs.begin(), op.allocs.end(), b) != op.allocs.end())
      std::memset(base, 0, sizeof(float) * rp_.layouts[u].grad);
    auto all = unsharded_grad_ptrs(rp_.layouts[u], base);
    std::vector<float*> out;
    for (int i : rp_.seg_tensors[seg]) out.push_back(all[i]);
    return out;
  }
  throw std::runtime_error(internal(op.name + " writes no unsharded grad of unit " + std::to_string(u)));
}

void RankRunner::run_compute(const sim::Op& op) {
  const int seg = rp_.op_segment[op.id], mb = op.micro_batch;
  auto sized = [&](int b, Bytes want, const char* what) {
    if (rp_.program.buffers[b].bytes != want)
      throw std::runtime_error("activation memory: the program's " + std::string(what) + " buffer \"" +
                               rp_.program.buffers[b].name + "\" has " + std::to_string(rp_.program.buffers[b].bytes) +
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
  float* g = mem_->ptr(rp_.grad_shard_buf[unit]);
  const std::int64_t n = rp_.layouts[unit].grad_shard;
  for (std::int64_t i = 0; i < n; ++i) g[i] += src[i];
}

void RankRunner::run(const sim::Op& op) {
  using sim::OpKind;
  const ReduceOp rop = rp_.fsdp2 ? ReduceOp::Avg : ReduceOp::Sum;   // F2.10 AVG; FSDP1 SUM + divides (F1.12)
  auto ptr = [&](int b) { return mem_->ptr(b); };
  auto cat = [&](int b) { return rp_.program.buffers[b].category; };
  const int u = op.unit;
  switch (op.kind) {
    case OpKind::CopyIn: {
      if (cat(op.inputs.at(0)) == sim::MemCategory::ShardedParams) {   // FSDP2 all-gather copy-in (F2.2)
        check_buffer(op.outputs.at(0), rp_.layouts[u].unsharded, "all-gather output");
        std::memcpy(ptr(op.outputs[0]) + comm_.group_rank(sim::CommGroup::Shard) * rp_.layouts[u].shard,
                    ptr(op.inputs[0]), sizeof(float) * rp_.layouts[u].shard);
      } else if (cat(op.inputs.at(0)) == sim::MemCategory::UnshardedGrads) {   // FSDP2 RS copy-in (F2.9)
        check_buffer(op.outputs.at(0), rp_.layouts[u].rs_input, "reduce-scatter input");
        fsdp2_rs_copy_in(rp_.layouts[u], ptr(op.inputs[0]), ptr(op.outputs[0]));
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
      if (!rp_.fsdp2 && cat(op.outputs.at(0)) == sim::MemCategory::UnshardedGrads) {
        // FSDP1 split-backward cat + AccumulateGrad: a fresh .grad takes the views' grads, a kept one adds them.
        check_buffer(op.outputs[0], rp_.layouts[u].grad, "unsharded grads");
        auto& scratch = grad_scratch_[u];
        if (scratch.empty()) scratch.assign(static_cast<size_t>(rp_.layouts[u].grad), 0.0f);
        float* g = ptr(op.outputs[0]);
        const bool fresh = std::find(op.allocs.begin(), op.allocs.end(), op.outputs[0]) != op.allocs.end();
        for (std::int64_t i = 0; i < rp_.layouts[u].grad; ++i) g[i] = (fresh ? 0.0f : g[i]) + scratch[i];
        std::fill(scratch.begin(), scratch.end(), 0.0f);
        break;
      }
      fsdp2_copy_out(rp_.layouts[u], ptr(op.inputs.at(0)), ptr(op.outputs.at(0)));
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
      const std::int64_t n = rp_.program.buffers[op.inputs[0]].bytes / 4;
      const float f = static_cast<float>(rp_.op_divide[op.id]);
      for (std::int64_t i = 0; i < n; ++i) x[i] /= f;
      break;
    }
    case OpKind::Pad: {   // FSDP1 F.pad of the flat grad to N * ceil(numel / N)
      const std::int64_t in_n = rp_.program.buffers[op.inputs.at(0)].bytes / 4;
      const std::int64_t out_n = rp_.program.buffers[op.outputs.at(0)].bytes / 4;
      std::memcpy(ptr(op.outputs[0]), ptr(op.inputs[0]), sizeof(float) * in_n);
      std::fill(ptr(op.outputs[0]) + in_n, ptr(op.outputs[0]) + out_n, 0.0f);
      break;
    }
    case OpKind::Cast:
      // fp32 everywhere: the only casts are _accumulate_sharded_grad / the post-reduce copy into .grad: a
      // copy where it creates the sharded grad, an accumulation into the existing one otherwise.
      if (op.outputs.empty() || op.outputs[0] != rp_.grad_shard_buf.at(u))
        throw std::runtime_error(internal("a cast other than the sharded-grad accumulation: " + op.name));
      if (std::find(op.allocs.begin(), op.allocs.end(), op.outputs[0]) != op.allocs.end())
        std::memset(ptr(op.outputs[0]), 0, sizeof(float) * rp_.layouts[u].grad_shard);
      accumulate_grad(u, ptr(op.inputs.at(0)));
      break;
    case OpKind::OptimizerStep:
      last_grads_.assign(rp_.layouts.size(), {});
      for (size_t k = 0; k < rp_.layouts.size(); ++k) {
        if (rp_.layouts[k].tensors.empty()) continue;
        const float* g = ptr(rp_.grad_shard_buf[k]);
        last_grads_[k].assign(g, g + rp_.layouts[k].shard);   // zero_grad frees it after this op
        optimizer_step(cfg_.optimizer, ptr(rp_.shard_buf[k]), ptr(rp_.grad_shard_buf[k]), state_ptr_[k],
                       rp_.layouts[k].shard, steps_done_ + 1);
      }
      break;
    default:
      throw std::runtime_error(std::string("CPU runtime: op kind ") + sim::op_kind_name(op.kind) + " is not supported");
  }
  // The end of a reduction: its output is the sharded grad itself (reduce dtype = the parameters') or is
  // added to the one an earlier micro-batch created.
  const ChainEnd& end = rp_.op_chain_end[op.id];
  if (end.unit >= 0 && end.result_buffer != rp_.grad_shard_buf[end.unit]) accumulate_grad(end.unit, ptr(end.result_buffer));
}

StepOutcome RankRunner::step() {
  // zero_grad(set_to_none=True): no sharded grad exists until the step's first reduction creates it.
  const int W = comm_.world();
  std::vector<TokenBatch> batches = rank_step_batches(rp_, cfg_.seed, steps_done_, comm_.rank(), W);
  for (int mb = 0; mb < rp_.micro_batches; ++mb) compute_->set_batch(mb, std::move(batches[mb].inputs), std::move(batches[mb].targets));
  mem_->reset_timeline();
  StepOutcome out;
  out.measured = execute_step(rp_.program, *mem_, *this);
  mem_->fill(out.measured);
  double local = 0;
  for (int mb = 0; mb < rp_.micro_batches; ++mb) local += compute_->loss_sum(mb);
  out.loss = global_mean_loss(rp_, comm_.sum_world(local), W);
  complete_measured(rp_, W, notes_, out.measured);
  ++steps_done_;
  return out;
}

std::vector<std::pair<std::string, std::vector<float>>> RankRunner::gather_params() {
  std::vector<const float*> shards(rp_.layouts.size(), nullptr);
  for (size_t u = 0; u < shards.size(); ++u)
    if (rp_.shard_buf[u] >= 0) shards[u] = mem_->ptr(rp_.shard_buf[u]);
  return gather(shards);
}
std::vector<std::pair<std::string, std::vector<float>>> RankRunner::gather_grads() {
  std::vector<const float*> shards(rp_.layouts.size(), nullptr);
  for (size_t u = 0; u < shards.size() && u < last_grads_.size(); ++u)
    if (!last_grads_[u].empty()) shards[u] = last_grads_[u].data();
  return gather(shards);
}

std::vector<std::pair<std::string, std::vector<float>>> RankRunner::gather(const std::vector<const float*>& shards) {
  std::map<std::string, std::vector<float>> by_name;
  for (size_t u = 0; u < rp_.layouts.size(); ++u) {
    const UnitLayout& l = rp_.layouts[u];
    if (l.tensors.empty()) continue;
    std::vector<float> all(l.unsharded);
    if (!shards[u]) throw std::runtime_error(internal("no shard of unit " + std::to_string(u) + " to gather"));
    comm_.all_gather(shards[u], all.data(), l.shard, sim::CommGroup::Shard);
    auto ts = tensors_from_shards(l, all.data());
    for (size_t i = 0; i < ts.size(); ++i) by_name[l.tensors[i].name] = std::move(ts[i]);
  }
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const auto& t : model_param_tensors(rp_.dims)) out.push_back({t.name, by_name.at(t.name)});
  return out;
}

}  // namespace fsdpsim::runtime

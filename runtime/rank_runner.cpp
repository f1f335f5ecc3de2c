#include "runtime/rank_runner.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "runtime/train/reference_trainer.h"

namespace fsdpsim::runtime {

namespace {

bool allocates(const sim::Op& op, int buffer) {
  return std::find(op.allocs.begin(), op.allocs.end(), buffer) != op.allocs.end();
}

}  // namespace

Runner::Runner(const RunConfig& cfg, Communicator& comm, std::unique_ptr<Device> device)
    : cfg_(cfg), comm_(comm), dev_(std::move(device)) {
  dev_->check_supports(cfg.model, cfg.plan);
  cfg_.optimizer.adamw = cfg.plan.optimizer == sim::Optimizer::AdamW;
  rp_ = build_rank_program(cfg.model, cfg.plan, comm.world(), cfg.gpus_per_node, comm.group_size(sim::CommGroup::Shard),
                           dev_->name() + " runtime");
  const int U = static_cast<int>(rp_.layouts.size());
  for (int u = 0; u < U; ++u) {
    if (rp_.layouts[u].tensors.empty()) continue;
    check_typed(rp_.shard_buf[u], Elem::F32, rp_.layouts[u].shard, "sharded params");
    if (rp_.grad_shard_buf[u] < 0) throw std::runtime_error(internal("unit " + std::to_string(u) + " gets no sharded grad"));
    check_typed(rp_.grad_shard_buf[u], Elem::F32, rp_.layouts[u].grad_shard, "sharded grads");
  }
  const int S = rp_.dims.L + 2;
  act_buf_.assign(rp_.micro_batches, std::vector<int>(S, -1));
  recomp_buf_.assign(rp_.micro_batches, std::vector<int>(S, -1));
  dev_->prepare(rp_, 1.0f / static_cast<float>(rp_.dims.tokens() * rp_.micro_batches), cfg.address_space);

  // Device memory: persistent buffers first (the sharded state lives across steps), then the
  // initial values: this rank's shard of the deterministic init, zero optimizer states.
  for (const auto& b : rp_.program.buffers)
    if (b.persistent) dev_->memory().alloc(b.id, 0);
  const int gr = comm.group_rank(sim::CommGroup::Shard);
  state_ptr_.assign(U, nullptr);
  for (int u = 0; u < U; ++u) {
    const UnitLayout& l = rp_.layouts[u];
    if (l.tensors.empty()) continue;
    std::vector<float> host(l.shard);
    init_shard(l, gr, cfg.seed, host.data());
    dev_->upload(ptr(rp_.shard_buf[u]), host.data(), l.shard * 4);
    const Bytes need = l.shard * cfg_.optimizer.states() * 4;
    const Bytes have = rp_.program.buffers[rp_.optim_buf[u]].bytes;
    if (have >= need) {
      state_ptr_[u] = reinterpret_cast<float*>(ptr(rp_.optim_buf[u]));
    } else {
      state_ptr_[u] = static_cast<float*>(dev_->alloc_outside(need));
      notes_.push_back(dev_->outside_state_note(u, have, need));
    }
    dev_->zero_now(state_ptr_[u], need);
  }
  for (std::string& n : dev_->finish_setup()) notes_.push_back(std::move(n));
}

Runner::~Runner() = default;

std::string Runner::internal(const std::string& what) const {
  return dev_->name() + " runtime and lowering disagree: " + what;
}

void Runner::check_typed(int buffer, Elem type, std::int64_t numel, const char* what) const {
  const sim::Buffer& b = rp_.program.buffers.at(buffer);
  if (elem(buffer) != type || rp_.numel(buffer) != numel)
    throw std::runtime_error(internal(std::string(what) + " buffer \"" + b.name + "\" has " + std::to_string(b.bytes) +
                                      " B of " + (elem(buffer) == Elem::F32 ? "fp32" : "bf16") +
                                      ", the runtime's layout needs " + std::to_string(numel * elem_size(type)) +
                                      " B of " + (type == Elem::F32 ? "fp32" : "bf16")));
}

std::vector<char*> Runner::segment_params(int seg, const sim::Op& op) {
  const int u = rp_.seg_unit[seg];
  const UnitLayout& l = rp_.layouts[u];
  const Elem ce = dev_->compute_elem();
  char* base = nullptr;
  for (int b : op.inputs)
    if (rp_.program.buffers[b].category == sim::MemCategory::UnshardedParams && rp_.program.buffers[b].unit == u) {
      check_typed(b, ce, l.unsharded, "unsharded params");
      base = ptr(b);
    }
  if (!base) {
    // No unsharded buffer: the unit is replicated (shard group of 1) and computes on its shard.
    if (rp_.N != 1 || elem(rp_.shard_buf[u]) != ce)
      throw std::runtime_error(internal(op.name + " has no unsharded parameters of unit " + std::to_string(u)));
    base = ptr(rp_.shard_buf[u]);
  }
  std::vector<char*> out;
  for (int i : rp_.seg_tensors[seg]) out.push_back(base + (l.fsdp2 ? l.unsharded_offset[i] : l.flat_offset[i]) * elem_size(ce));
  return out;
}

std::vector<char*> Runner::segment_grads(int seg, const sim::Op& op, Stream s) {
  const int u = rp_.seg_unit[seg];
  const UnitLayout& l = rp_.layouts[u];
  const Elem ce = dev_->compute_elem();
  for (int b : op.outputs) {
    if (rp_.program.buffers[b].category != sim::MemCategory::UnshardedGrads || rp_.program.buffers[b].unit != u) continue;
    char* base = nullptr;
    if (!rp_.fsdp2) {
      // FSDP1: the original parameters' gradients (views' grads) the program keeps apart until the
      // split-backward cat (GradCat) builds the flat grad; the kernels accumulate them in a per-unit
      // scratch outside the allocator, which the cat moves into the flat grad.
      base = static_cast<char*>(dev_->grad_scratch(u, l.grad * elem_size(ce)));
    } else {
      check_typed(b, ce, l.grad, "unsharded grads");
      base = ptr(b);
      // A grad buffer this op allocates is a fresh .grad: autograd writes it; our kernels accumulate.
      if (allocates(op, b)) dev_->zero(base, l.grad * elem_size(ce), s);
    }
    std::vector<char*> out;
    for (int i : rp_.seg_tensors[seg]) out.push_back(base + l.grad_offset[i] * elem_size(ce));
    return out;
  }
  throw std::runtime_error(internal(op.name + " writes no unsharded grad of unit " + std::to_string(u)));
}

void Runner::run_compute(const sim::Op& op) {
  const int seg = rp_.op_segment[op.id], mb = op.micro_batch;
  auto sized = [&](int b, Bytes want, const char* what) {
    if (rp_.program.buffers[b].bytes != want)
      throw std::runtime_error("activation memory: the program's " + std::string(what) + " buffer \"" +
                               rp_.program.buffers[b].name + "\" has " + std::to_string(rp_.program.buffers[b].bytes) +
                               " B but the " + dev_->name() + " kernels save " + std::to_string(want) +
                               " B (models' activation formula vs runtime)");
  };
  if (rp_.op_role[op.id] == OpRole::Forward) {
    char* act = nullptr;
    if (dev_->act_bytes(seg) > 0) {
      if (op.allocs.empty()) throw std::runtime_error(internal(op.name + " allocates no activation buffer"));
      sized(op.allocs[0], dev_->act_bytes(seg), "saved-activation");
      act_buf_[mb][seg] = op.allocs[0];
      act = ptr(op.allocs[0]);
    }
    dev_->forward(seg, mb, segment_params(seg, op), act);
    return;
  }
  char* act = act_buf_[mb][seg] >= 0 ? ptr(act_buf_[mb][seg]) : nullptr;
  if (rp_.op_role[op.id] == OpRole::Recompute) {
    if (op.allocs.empty()) throw std::runtime_error(internal(op.name + " allocates no recompute buffer"));
    sized(op.allocs[0], dev_->recomp_bytes(seg), "recompute");
    recomp_buf_[mb][seg] = op.allocs[0];
    dev_->recompute(seg, mb, segment_params(seg, op), act, ptr(op.allocs[0]));
    return;
  }
  char* recomp = recomp_buf_[mb][seg] >= 0 ? ptr(recomp_buf_[mb][seg]) : nullptr;
  dev_->backward(seg, mb, segment_params(seg, op), segment_grads(seg, op, dev_->compute_stream()), act, recomp);
  act_buf_[mb][seg] = recomp_buf_[mb][seg] = -1;
}

// FSDP2 reduce-scatter copy-in (F2.9, chunk_cat): per tensor and rank chunk, widened to reduce_dtype,
// zero-padded to the chunk size.
void Runner::reduce_scatter_copy_in(const sim::Op& op, Stream s) {
  const int in = op.inputs.at(0), out = op.outputs.at(0);
  const UnitLayout& l = rp_.layouts.at(op.unit);
  if (rp_.numel(out) != l.rs_input) throw std::runtime_error(internal("reduce-scatter input size of " + op.name));
  const long si = elem_size(elem(in)), so = elem_size(elem(out));
  for (size_t i = 0; i < l.tensors.size(); ++i) {
    const std::int64_t chunk = l.chunk_rows[i] * l.rest[i], n = l.tensors[i].numel();
    for (int r = 0; r < l.N; ++r) {
      char* dst = ptr(out) + (r * l.shard + l.shard_offset[i]) * so;
      const std::int64_t lo = std::min(n, r * chunk), hi = std::min(n, (r + 1) * chunk);
      dev_->copy(dst, elem(out), ptr(in) + (l.grad_offset[i] + lo) * si, elem(in), hi - lo, s);
      if (chunk > hi - lo) dev_->zero(dst + (hi - lo) * so, (chunk - (hi - lo)) * so, s);
    }
  }
}

// FSDP2 split_with_sizes_copy: all-gather output [N][shard] -> per-parameter storage, one strided copy
// per tensor (N chunks, source pitch = the shard).
void Runner::param_copy_out(const sim::Op& op, Stream s) {
  const int in = op.inputs.at(0), out = op.outputs.at(0);
  const UnitLayout& l = rp_.layouts.at(op.unit);
  if (elem(in) != elem(out) || rp_.numel(out) != l.unsharded) throw std::runtime_error(internal("copy-out of " + op.name));
  const long es = elem_size(elem(out));
  for (size_t i = 0; i < l.tensors.size(); ++i) {
    const std::int64_t chunk = l.chunk_rows[i] * l.rest[i];
    dev_->copy_rows(ptr(out) + l.unsharded_offset[i] * es, chunk * es, ptr(in) + l.shard_offset[i] * es, l.shard * es,
                    chunk * es, l.N, s);
  }
}

// FSDP1 split-backward cat + AccumulateGrad: a fresh .grad takes the views' grads, a kept one adds them;
// the scratch is zeroed for the next backward, which the compute stream orders after the zeroing.
void Runner::grad_cat(const sim::Op& op, Stream s) {
  const int out = op.outputs.at(0);
  const UnitLayout& l = rp_.layouts.at(op.unit);
  const Elem ce = dev_->compute_elem();
  check_typed(out, ce, l.grad, "unsharded grads");
  void* scratch = dev_->grad_scratch(op.unit, l.grad * elem_size(ce));
  dev_->accumulate(ptr(out), ce, scratch, ce, l.grad, allocates(op, out), s);
  dev_->zero(scratch, l.grad * elem_size(ce), s);
  dev_->compute_waits_for(s);
}

void Runner::cast(const sim::Op& op, Stream s) {
  const int in = op.inputs.at(0), out = op.outputs.at(0);
  switch (rp_.op_role[op.id]) {
    case OpRole::CastToShardedGrad:
      // _accumulate_sharded_grad / the post-reduce copy into .grad (fp32): the cast that creates it
      // assigns, a later one accumulates.
      if (allocates(op, out)) dev_->zero(ptr(out), rp_.layouts.at(op.unit).grad_shard * 4, s);
      accumulate_grad(op.unit, in, s);
      break;
    case OpRole::CastAccumulate:
      dev_->accumulate(ptr(out), elem(out), ptr(in), elem(in), rp_.numel(out), false, s);
      break;
    default:
      if (rp_.numel(in) != rp_.numel(out)) throw std::runtime_error(internal("cast between different sizes in " + op.name));
      dev_->copy(ptr(out), elem(out), ptr(in), elem(in), rp_.numel(out), s);
      break;
  }
}

void Runner::accumulate_grad(int unit, int src, Stream s) {
  dev_->accumulate(ptr(rp_.grad_shard_buf[unit]), Elem::F32, ptr(src), elem(src), rp_.layouts[unit].grad_shard, false, s);
}

void Runner::run(const sim::Op& op, Stream s) {
  const ReduceOp rop = rp_.fsdp2 ? ReduceOp::Avg : ReduceOp::Sum;   // F2.10 AVG; FSDP1 SUM + divides (F1.12)
  const int u = op.unit;
  switch (rp_.op_role[op.id]) {
    case OpRole::None:
      break;
    case OpRole::Forward:
    case OpRole::Backward:
    case OpRole::Recompute:
      if (s != dev_->compute_stream()) throw std::runtime_error(internal(op.name + " enqueued off the compute stream"));
      run_compute(op);
      break;
    case OpRole::AllGatherCopyIn: {   // FSDP2 (F2.2): this rank's slice of the all-gather output
      const int in = op.inputs.at(0), out = op.outputs.at(0);
      const UnitLayout& l = rp_.layouts.at(u);
      if (rp_.numel(in) != l.shard || rp_.numel(out) != l.unsharded)
        throw std::runtime_error(internal("all-gather copy-in sizes of " + op.name));
      const int gr = comm_.group_rank(sim::CommGroup::Shard);
      dev_->copy(ptr(out) + gr * l.shard * elem_size(elem(out)), elem(out), ptr(in), elem(in), l.shard, s);
      break;
    }
    case OpRole::ReduceScatterCopyIn:
      reduce_scatter_copy_in(op, s);
      break;
    case OpRole::ParamCopyOut:
      param_copy_out(op, s);
      break;
    case OpRole::GradCat:
      grad_cat(op, s);
      break;
    case OpRole::AllGather: {
      const int out = op.outputs.at(0);
      const Elem t = elem(out);
      const std::int64_t count = op.comm_bytes / elem_size(t) / op.group_size;
      const char* in = op.inputs.at(0) == out ? ptr(out) + comm_.group_rank(op.group) * count * elem_size(t) : ptr(op.inputs[0]);
      dev_->all_gather(in, ptr(out), count, t, op.group, s);
      dev_->after_collective(op, s);
      break;
    }
    case OpRole::ReduceScatter: {
      const Elem t = elem(op.inputs.at(0));
      dev_->reduce_scatter(ptr(op.inputs[0]), ptr(op.outputs.at(0)), op.comm_bytes / elem_size(t) / op.group_size, t,
                           op.group, rop, s);
      dev_->after_collective(op, s);
      break;
    }
    case OpRole::AllReduce: {
      const Elem t = elem(op.inputs.at(0));
      dev_->all_reduce(ptr(op.inputs[0]), op.comm_bytes / elem_size(t), t, op.group, rop, s);
      dev_->after_collective(op, s);
      break;
    }
    case OpRole::Divide: {
      const int b = op.inputs.at(0);
      dev_->divide(ptr(b), elem(b), rp_.op_divide[op.id], rp_.numel(b), s);
      break;
    }
    case OpRole::Pad: {   // FSDP1 F.pad of the flat grad to N * ceil(numel / N)
      const int in = op.inputs.at(0), out = op.outputs.at(0);
      if (elem(in) != elem(out)) throw std::runtime_error(internal("pad changes the dtype in " + op.name));
      const long es = elem_size(elem(out));
      dev_->copy(ptr(out), elem(out), ptr(in), elem(in), rp_.numel(in), s);
      dev_->zero(ptr(out) + rp_.numel(in) * es, (rp_.numel(out) - rp_.numel(in)) * es, s);
      break;
    }
    case OpRole::CastToShardedGrad:
    case OpRole::CastAccumulate:
    case OpRole::CastConvert:
      cast(op, s);
      break;
    case OpRole::OptimizerStep:
      for (size_t k = 0; k < rp_.layouts.size(); ++k) {
        if (rp_.layouts[k].tensors.empty()) continue;
        dev_->optimizer_step(cfg_.optimizer, steps_done_ + 1, reinterpret_cast<float*>(ptr(rp_.shard_buf[k])),
                             reinterpret_cast<const float*>(ptr(rp_.grad_shard_buf[k])), state_ptr_[k],
                             rp_.layouts[k].shard, s);
      }
      break;
    case OpRole::Unsupported:
      if (op.kind == sim::OpKind::CopyIn) throw std::runtime_error(internal("copy-in from an unexpected buffer in " + op.name));
      throw std::runtime_error(dev_->name() + " runtime: op kind " + sim::op_kind_name(op.kind) + " is not supported");
  }
  // The end of a reduction: its output is the sharded grad itself (reduce dtype = the parameters') or is
  // added to the one an earlier micro-batch created.
  const ChainEnd& end = rp_.op_chain_end[op.id];
  if (end.unit >= 0 && end.result_buffer != rp_.grad_shard_buf[end.unit]) accumulate_grad(end.unit, end.result_buffer, s);
}

StepOutcome Runner::step() {
  // zero_grad(set_to_none=True): no sharded grad exists until the step's first reduction creates it.
  const int W = comm_.world();
  std::vector<TokenBatch> batches = rank_step_batches(rp_, cfg_.seed, steps_done_, comm_.rank(), W);
  for (int mb = 0; mb < rp_.micro_batches; ++mb)
    dev_->set_batch(mb, std::move(batches[mb].inputs), std::move(batches[mb].targets));
  dev_->memory().reset_timeline();
  StepOutcome out;
  out.measured = dev_->execute_step(*this);
  dev_->memory().fill(out.measured);
  double local = 0;
  for (int mb = 0; mb < rp_.micro_batches; ++mb) local += dev_->loss_sum(mb);
  out.loss = global_mean_loss(rp_, comm_.sum_world(local), W);
  complete_measured(rp_, W, notes_, out.measured);
  dev_->after_step();
  ++steps_done_;
  return out;
}

std::vector<std::pair<std::string, std::vector<float>>> Runner::gather_params() { return gather(rp_.shard_buf); }
std::vector<std::pair<std::string, std::vector<float>>> Runner::gather_grads() { return gather(rp_.grad_shard_buf); }

std::vector<std::pair<std::string, std::vector<float>>> Runner::gather(const std::vector<int>& bufs) {
  dev_->synchronize();
  std::map<std::string, std::vector<float>> by_name;
  for (size_t u = 0; u < rp_.layouts.size(); ++u) {
    const UnitLayout& l = rp_.layouts[u];
    if (l.tensors.empty()) continue;
    std::vector<float> all(l.unsharded);
    dev_->gather_to_host(reinterpret_cast<const float*>(ptr(bufs[u])), l.shard, all.data());
    auto ts = tensors_from_shards(l, all.data());
    for (size_t i = 0; i < ts.size(); ++i) by_name[l.tensors[i].name] = std::move(ts[i]);
  }
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const auto& t : model_param_tensors(rp_.dims)) out.push_back({t.name, by_name.at(t.name)});
  return out;
}

}  // namespace fsdpsim::runtime

#include "runtime/rank_program.h"

#include <map>
#include <stdexcept>

#include "common/errors.h"
#include "runtime/model/param_tensors.h"
#include "program/program_check.h"
#include "program/lower_context.h"
#include "program/lowering.h"

namespace fsdpsim::runtime {

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

namespace {

class Builder {
 public:
  Builder(RankProgram& rp, const sim::Plan& plan, const std::string& backend) : rp_(rp), plan_(plan), backend_(backend) {}

  std::string internal(const std::string& what) const { return backend_ + " and lowering disagree: " + what; }

  // Segments: which unit holds each segment's tensors (all of them in one unit).
  void map_segments() {
    const Dims& d = rp_.dims;
    const int S = d.L + 2;
    rp_.seg_unit.assign(S, -1);
    rp_.seg_tensors.assign(S, {});
    for (int s = 0; s < S; ++s) {
      const auto part = s == 0 ? models::ModulePart::Embedding
                               : s == S - 1 ? models::ModulePart::FinalNormAndHead : models::ModulePart::Block;
      std::vector<std::string> names;
      for (const auto& t : part_param_tensors(d, part, s - 1)) names.push_back(t.name);
      if (part == models::ModulePart::FinalNormAndHead && d.tied) names.push_back("model.embed_tokens.weight");
      for (size_t k = 0; k < names.size(); ++k) {
        int found_u = -1, found_i = -1;
        for (size_t u = 0; u < rp_.layouts.size() && found_u < 0; ++u)
          for (size_t i = 0; i < rp_.layouts[u].tensors.size(); ++i)
            if (rp_.layouts[u].tensors[i].name == names[k]) {
              found_u = static_cast<int>(u);
              found_i = static_cast<int>(i);
              break;
            }
        if (found_u < 0) throw std::runtime_error(internal("no FSDP unit holds " + names[k]));
        if (k == 0) rp_.seg_unit[s] = found_u;
        if (found_u != rp_.seg_unit[s])
          throw InputError("plan.auto_wrap_policy", models::wrap_policy_name(plan_.auto_wrap_policy),
                           "a policy that keeps each block (and the tied embedding with the head) in one FSDP unit "
                           "(" + backend_ + "); " + names[k] + " is in another unit");
        rp_.seg_tensors[s].push_back(found_i);
      }
    }
  }

  void find_persistent_buffers() {
    const int U = static_cast<int>(rp_.layouts.size());
    rp_.shard_buf.assign(U, -1);
    rp_.grad_shard_buf.assign(U, -1);
    rp_.optim_buf.assign(U, -1);
    for (const auto& b : rp_.program.buffers) {
      if (b.unit < 0 || b.unit >= U) continue;
      if (!b.persistent) continue;
      if (b.category == sim::MemCategory::ShardedParams) rp_.shard_buf[b.unit] = b.id;
      if (b.category == sim::MemCategory::OptimizerState) rp_.optim_buf[b.unit] = b.id;
    }
    // (the gradient: the buffer the lowering names, which later micro-batches accumulate into)
    for (int u = 0; u < U && u < static_cast<int>(rp_.program.unit_grads.size()); ++u)
      rp_.grad_shard_buf[u] = rp_.program.unit_grads[u];
    for (int u = 0; u < U; ++u)
      if (!rp_.layouts[u].tensors.empty() && (rp_.shard_buf[u] < 0 || rp_.grad_shard_buf[u] < 0 || rp_.optim_buf[u] < 0))
        throw std::runtime_error(internal("unit " + std::to_string(u) + " lacks a sharded param/grad/optimizer buffer"));
  }

  // Element type of every buffer, from the plan's dtypes and the program's data flow: sharded state in
  // the master dtype (fp32); unsharded params in param_dtype; unsharded grads in param_dtype as autograd
  // writes them, in reduce_dtype where a cast writes them (FSDP2's upcast accumulation); communication
  // buffers on the parameter side (fed from the sharded params through casts and copy-ins, all-gather in
  // and out) in param_dtype, on the gradient side in reduce_dtype.
  void type_buffers() {
    const sim::StepProgram& p = rp_.program;
    const int B = static_cast<int>(p.buffers.size());
    auto elem_of = [](Dtype d) { return d == Dtype::FP32 ? Elem::F32 : Elem::BF16; };
    const Elem bp = elem_of(plan_.param_dtype), br = elem_of(plan_.reduce_dtype);
    std::vector<char>& param_side = param_side_;
    param_side.assign(B, 0);
    std::vector<char> cast_written(B, 0);
    auto cat = [&](int b) { return p.buffers[b].category; };
    for (const sim::Op& op : p.ops) {
      if (op.kind == sim::OpKind::Cast)
        for (int b : op.outputs) cast_written[b] = 1;
      if (op.kind == sim::OpKind::AllGather)
        for (int b : op.inputs) param_side[b] = 1;
      const bool fed_by_params = !op.inputs.empty() &&
                                 (cat(op.inputs[0]) == sim::MemCategory::ShardedParams || param_side[op.inputs[0]]);
      if (op.kind == sim::OpKind::AllGather ||
          ((op.kind == sim::OpKind::Cast || op.kind == sim::OpKind::CopyIn) && fed_by_params))
        for (int b : op.outputs) param_side[b] = 1;
      if (op.kind == sim::OpKind::CopyOut)
        for (int b : op.inputs) param_side[b] = 1;
    }
    rp_.buffer_elem.assign(B, Elem::F32);
    for (const auto& b : p.buffers) {
      Elem& e = rp_.buffer_elem[b.id];
      switch (b.category) {
        case sim::MemCategory::UnshardedParams: e = bp; break;
        case sim::MemCategory::UnshardedGrads: e = cast_written[b.id] ? br : bp; break;
        case sim::MemCategory::CommBuffers: e = param_side[b.id] ? bp : br; break;
        default: e = Elem::F32; break;
      }
      const bool typed = b.category != sim::MemCategory::Activations && b.category != sim::MemCategory::Logits;
      if (typed && b.bytes % elem_size(e) != 0)
        throw std::runtime_error(internal("buffer \"" + b.name + "\" of " + std::to_string(b.bytes) +
                                          " B is not a whole number of its elements"));
    }
  }

  // What every op does to data (OpRole). Copy-ins, copy-outs and casts by where their data comes from.
  void assign_roles() {
    const sim::StepProgram& p = rp_.program;
    using sim::OpKind;
    auto cat = [&](int b) { return p.buffers[b].category; };
    rp_.op_role.assign(p.ops.size(), OpRole::Unsupported);
    for (const sim::Op& op : p.ops) {
      OpRole& r = rp_.op_role[op.id];
      const int in = op.inputs.empty() ? -1 : op.inputs[0], out = op.outputs.empty() ? -1 : op.outputs[0];
      switch (op.kind) {
        case OpKind::Forward:
        case OpKind::Backward: {
          const bool no_kernels = op.shared_kernels ? op.shared_kernels->empty() : op.kernels.empty();
          r = no_kernels ? OpRole::None : op.kind == OpKind::Forward ? OpRole::Forward : OpRole::Backward;
          break;
        }
        case OpKind::Recompute: r = OpRole::Recompute; break;
        case OpKind::AllGather: r = OpRole::AllGather; break;
        case OpKind::ReduceScatter: r = OpRole::ReduceScatter; break;
        case OpKind::AllReduce: r = OpRole::AllReduce; break;
        case OpKind::Divide: r = OpRole::Divide; break;
        case OpKind::Pad: r = OpRole::Pad; break;
        case OpKind::OptimizerStep: r = OpRole::OptimizerStep; break;
        case OpKind::CopyIn:
          if (in >= 0 && (cat(in) == sim::MemCategory::ShardedParams || param_side_[in])) r = OpRole::AllGatherCopyIn;
          else if (in >= 0 && cat(in) == sim::MemCategory::UnshardedGrads) r = OpRole::ReduceScatterCopyIn;
          break;
        case OpKind::CopyOut:
          r = !rp_.fsdp2 && out >= 0 && cat(out) == sim::MemCategory::UnshardedGrads ? OpRole::GradCat : OpRole::ParamCopyOut;
          break;
        case OpKind::Cast:
          if (op.unit >= 0 && out >= 0 && out == rp_.grad_shard_buf.at(op.unit)) r = OpRole::CastToShardedGrad;
          else if (op.inputs.size() >= 2 && op.inputs[1] == out) r = OpRole::CastAccumulate;
          else r = OpRole::CastConvert;
          break;
        default: break;
      }
    }
  }

  // Assigns every compute op its segment and every reduce-path op its role, from the program alone
  // (the lowering's emission order, program/lower_fsdp{1,2}.cpp): per micro-batch, forwards run segments
  // 0..S-1, backwards S-1..0; a recompute under FSDP(checkpoint(block)) precedes its segment's
  // backward, under checkpoint(FSDP(block)) the unit's checkpointed segments are recomputed in order.
  void analyze(int world) {
    const sim::StepProgram& p = rp_.program;
    const int S = rp_.dims.L + 2, n = static_cast<int>(p.ops.size());
    rp_.op_segment.assign(n, -1);
    rp_.op_divide.assign(n, 1);
    rp_.op_chain_end.assign(n, {});
    std::map<int, int> fwd_next, bwd_next;
    std::map<std::pair<int, int>, int> recompute_count;   // (mb, unit) -> recomputes seen
    const bool outside = plan_.activation_checkpointing.outside_fsdp;
    auto checkpointed = [&](int seg) { return seg >= 1 && seg <= rp_.dims.L && rp_.checkpointed[seg - 1]; };
    std::map<std::pair<int, int>, std::vector<int>> chains;   // (unit, mb) -> reduce-path ops in order
    for (int i = 0; i < n; ++i) {
      const sim::Op& op = p.ops[i];
      const int mb = op.micro_batch;
      // A compute op that runs no kernel (the loss's memory-only ops) has no segment.
      if (rp_.op_role[i] == OpRole::None) continue;
      if (op.kind == sim::OpKind::Forward) {
        int& k = fwd_next.try_emplace(mb, 0).first->second;
        rp_.op_segment[i] = k++;
      } else if (op.kind == sim::OpKind::Backward) {
        int& k = bwd_next.try_emplace(mb, S - 1).first->second;
        rp_.op_segment[i] = k--;
      } else if (op.kind == sim::OpKind::Recompute) {
        if (outside) {
          int& c = recompute_count[{mb, op.unit}];
          int seen = 0;
          for (int s = 0; s < S; ++s)
            if (rp_.seg_unit[s] == op.unit && checkpointed(s) && seen++ == c) rp_.op_segment[i] = s;
          ++c;
        } else {
          rp_.op_segment[i] = bwd_next.try_emplace(mb, S - 1).first->second;
        }
      } else if (is_reduce_path(op.kind) && op.unit >= 0) {
        // FSDP2's "grad up"/"grad acc" casts on the compute stream precede the reduction: not part of it.
        const bool upcast = op.kind == sim::OpKind::Cast && !op.inputs.empty() && !op.outputs.empty() &&
                            p.buffers[op.inputs[0]].category == sim::MemCategory::UnshardedGrads &&
                            p.buffers[op.outputs[0]].category == sim::MemCategory::UnshardedGrads;
        if (!upcast) chains[{op.unit, mb}].push_back(i);
      }
      const int seg = rp_.op_segment[i];
      if (seg >= 0 && (seg >= S || rp_.seg_unit[seg] != op.unit))
        throw std::runtime_error(internal("op " + std::to_string(i) + " (" + op.name + ") maps to segment " +
                                          std::to_string(seg) + " of unit " +
                                          (seg < S ? std::to_string(rp_.seg_unit[seg]) : "?")));
      if ((op.kind == sim::OpKind::Forward || op.kind == sim::OpKind::Backward || op.kind == sim::OpKind::Recompute) &&
          op.stream != 0)
        throw std::runtime_error(internal(op.name + " is not on the compute stream"));
    }
    const int pre = predivide_factor(world), post = world / pre;
    for (auto& [key, ops] : chains) {
      bool after_collective = false;
      for (int i : ops) {
        if (is_collective(p.ops[i].kind)) after_collective = true;
        if (p.ops[i].kind == sim::OpKind::Divide) rp_.op_divide[i] = after_collective ? post : pre;
      }
      const sim::Op& last = p.ops[ops.back()];
      if (last.kind == sim::OpKind::Cast) continue;   // the cast accumulates into the sharded grad itself
      if (last.outputs.empty()) throw std::runtime_error(internal("reduce op " + last.name + " has no output"));
      rp_.op_chain_end[ops.back()] = {key.first, last.outputs[0]};
    }
  }

 private:
  RankProgram& rp_;
  std::vector<char> param_side_;   // per buffer: fed from the sharded parameters (type_buffers)
  const sim::Plan& plan_;
  const std::string& backend_;
};

}  // namespace

RankProgram build_rank_program(const models::ModelSpec& model, const sim::Plan& user_plan, int world,
                               int gpus_per_node, int shard_group_size, const std::string& backend) {
  const sim::Plan plan = runtime_plan(user_plan);
  RankProgram rp;
  Builder b(rp, plan, backend);
  rp.dims = runtime_dims(model, plan.micro_batch, plan.seq_len);
  rp.graph = models::build_wrap_graph(model, plan.auto_wrap_policy);
  rp.program = sim::lower(model, rp.graph, plan, sim::Topology{world, gpus_per_node});
  sim::validate_program(rp.program);
  rp.fsdp2 = plan.fsdp_version == sim::FsdpVersion::FSDP2;
  rp.N = rp.program.shard_size;
  rp.micro_batches = rp.program.micro_batches;
  if (shard_group_size != rp.N)
    throw std::runtime_error(b.internal("shard group of " + std::to_string(shard_group_size) + " ranks vs the program's " +
                                        std::to_string(rp.N)));
  // Layouts per unit, from the wrap graph's tensors (registration order).
  for (const auto& u : rp.graph.units) {
    std::vector<ParamTensor> ts;
    for (const auto& t : u.tensors) ts.push_back({t.name, t.shape});
    rp.layouts.push_back(make_unit_layout(ts, rp.N, rp.fsdp2, plan.use_orig_params));
  }
  const auto& ac = plan.activation_checkpointing;
  rp.checkpointed.assign(rp.dims.L, false);
  for (int l = 0; l < rp.dims.L; ++l)
    rp.checkpointed[l] = ac.mode == sim::ActivationCheckpointing::Mode::Full ||
                         (ac.mode == sim::ActivationCheckpointing::Mode::EveryK && l % ac.every_k == 0);
  rp.recompute_early_stop = sim::lowering::kernel_options(plan).checkpoint_early_stop;
  b.map_segments();
  b.find_persistent_buffers();
  b.type_buffers();
  b.assign_roles();
  b.analyze(world);
  return rp;
}

std::vector<TokenBatch> rank_step_batches(const RankProgram& rp, std::uint64_t seed, int step, int rank, int world) {
  std::vector<TokenBatch> out;
  for (int mb = 0; mb < rp.micro_batches; ++mb) {
    std::vector<std::int64_t> idx;
    for (int j = 0; j < rp.dims.B; ++j) idx.push_back(sequence_index(step, rank, world, mb, rp.micro_batches, rp.dims.B, j));
    out.push_back(make_batch(seed, idx, rp.dims.T, rp.dims.V));
  }
  return out;
}

double global_mean_loss(const RankProgram& rp, double loss_sum_all_ranks, int world) {
  return loss_sum_all_ranks / (static_cast<double>(world) * rp.micro_batches * rp.dims.tokens());
}

void complete_measured(const RankProgram& rp, int world, const std::vector<std::string>& runner_notes, sim::SimResult& r) {
  const double tokens = static_cast<double>(rp.program.tokens_per_rank);
  r.tokens_per_step = tokens * world;
  r.tokens_per_s_per_gpu = r.step_time_ns > 0 ? tokens / to_seconds(r.step_time_ns) : 0;
  r.model_flops_per_step_per_gpu = rp.program.model_flops_per_rank;
  r.notes = runner_notes;
  for (const auto& n : rp.program.notes) r.notes.push_back("program: " + n);
}

}  // namespace fsdpsim::runtime

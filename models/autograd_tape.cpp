// The tape's bookkeeping, its policies (eager autograd, checkpointing, SAC, inductor's partitioner)
// and the forward/backward walk that turns a policy into bytes.
#include "models/autograd_tape.h"

#include "models/min_cut.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace fsdpsim::models {
namespace {

constexpr int kForever = std::numeric_limits<int>::max();

// Ops inductor calls as a library kernel (cuBLAS, flash/flex attention, a user Triton kernel): their
// inputs and outputs are real buffers even when everything around them is fused.
bool is_extern(OpKind k) {
  return k == OpKind::Matmul || k == OpKind::MatmulBias || k == OpKind::RouterMatmul || k == OpKind::Attention ||
         k == OpKind::Kernel || k == OpKind::Topk;
}

// Whether inductor may recompute output `j` of an op in the backward instead of saving it
// (torch/_functorch/partitioners.py, get_default_op_list / ban_recomputation: pointwise, view and
// indexing ops are recomputable; mm/addmm/SDPA are compute-intensive and never recomputed; a
// reduction whose output is much smaller than its input is banned; a decomposed norm's output is
// pointwise given the input and its statistics).
bool recomputable(OpKind k, int j) {
  switch (k) {
    case OpKind::Pointwise:
    case OpKind::View:
    case OpKind::Gather: return true;
    case OpKind::Norm: return j == 0;
    default: return false;
  }
}

std::size_t at(int i) { return static_cast<std::size_t>(i); }

}  // namespace

int AutogradTape::input(const char* name, Bytes bytes, bool requires_grad) {
  if (input_ >= 0) throw std::logic_error("AutogradTape: one input per tape");
  tensors_.push_back({name, bytes, static_cast<int>(storages_.size()), -1, -1, requires_grad});
  storages_.push_back({name, bytes, static_cast<int>(tensors_.size()) - 1, -1, -1});
  input_ = static_cast<int>(tensors_.size()) - 1;
  return input_;
}

std::vector<int> AutogradTape::add(const TapeOp& op) {
  const int idx = static_cast<int>(ops_.size());
  // The op records a graph node when an input or its weight requires grad (compute_requires_grad); its
  // differentiable outputs then require grad.
  bool records = op.weight == WeightUse::Trains;
  for (const TapeIn& i : op.in) {
    if (i.tensor < 0 || i.tensor >= static_cast<int>(tensors_.size()))
      throw std::logic_error("AutogradTape: an op reads an unknown tensor");
    const TapeTensor& t = tensors_[at(i.tensor)];
    records = records || t.requires_grad;
    TapeStorage& s = storages_[at(t.storage)];
    s.last_use = std::max(s.last_use, idx);
  }
  ops_.push_back(op);
  records_.push_back(records ? 1 : 0);
  first_out_.push_back(static_cast<int>(tensors_.size()));
  std::vector<int> ids;
  ids.reserve(op.out.size());
  for (std::size_t j = 0; j < op.out.size(); ++j) {
    const TapeOut& o = op.out[j];
    const int tensor = static_cast<int>(tensors_.size());
    int storage = -1;
    if (o.view_of >= 0) {
      storage = tensors_[at(o.view_of)].storage;
    } else {
      storage = static_cast<int>(storages_.size());
      storages_.push_back({o.name, o.bytes, tensor, idx, idx});
    }
    tensors_.push_back({o.name, o.bytes, storage, idx, static_cast<int>(j), o.differentiable && records});
    ids.push_back(tensor);
  }
  return ids;
}

void AutogradTape::hold(int tensor) {
  TapeStorage& s = storages_[at(tensors_[at(tensor)].storage)];
  s.last_use = std::max(s.last_use, static_cast<int>(ops_.size()) - 1);
}

void AutogradTape::output(int tensor) {
  output_ = tensor;
  storages_[at(tensors_[at(tensor)].storage)].last_use = kForever;
}

bool AutogradTape::has_graph() const { return output_ >= 0 && tensors_[at(output_)].requires_grad; }

bool AutogradTape::saves_input(std::size_t i, std::size_t k) const {
  const TapeOp& op = ops_[i];
  const TapeIn& in = op.in[k];
  if (!records_[i] || !in.saved) return false;
  switch (in.when) {
    case SaveIf::GradFn: return true;
    case SaveIf::WeightTrains: return op.weight == WeightUse::Trains;
    case SaveIf::OtherInput:
      if (op.weight == WeightUse::Trains) return true;
      for (std::size_t j = 0; j < op.in.size(); ++j)
        if (j != k && tensors_[at(op.in[j].tensor)].requires_grad) return true;
      return false;
  }
  return false;
}

TapePolicy AutogradTape::eager_policy() const {
  const std::size_t n = storages_.size();
  TapePolicy p;
  p.needed.assign(n, 0);
  p.release_op.assign(n, kForever);
  p.bytes.resize(n);
  for (std::size_t s = 0; s < n; ++s) p.bytes[s] = storages_[s].bytes;
  p.grad_bytes.resize(tensors_.size());
  for (std::size_t t = 0; t < tensors_.size(); ++t) p.grad_bytes[t] = tensors_[t].bytes;
  auto save = [&](int tensor, int op) {
    const std::size_t s = at(tensors_[at(tensor)].storage);
    p.needed[s] = 1;
    p.release_op[s] = std::min(p.release_op[s], op);  // backward runs in reverse: the earliest saver is last
  };
  // What an op that records a graph saves (SaveIf): its weight's gradient needs the input of a linear, the
  // other operands' gradients need a mul's operand; an op that records nothing saves nothing.
  for (std::size_t i = 0; i < ops_.size(); ++i)
    for (std::size_t k = 0; k < ops_[i].in.size(); ++k)
      if (saves_input(i, k)) save(ops_[i].in[k].tensor, static_cast<int>(i));
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    const TapeTensor& tt = tensors_[t];
    if (tt.producer >= 0 && records_[at(tt.producer)] && ops_[at(tt.producer)].out[at(tt.out_index)].saved)
      save(static_cast<int>(t), tt.producer);
  }
  p.kept = p.needed;
  return p;
}

TapePolicy AutogradTape::checkpoint_input_only(const TapePolicy& inner) const {
  TapePolicy p = inner;
  p.kept.assign(storages_.size(), 0);
  p.recompute = has_graph();
  if (p.recompute) p.kept[at(tensors_[at(input_)].storage)] = 1;
  return p;
}

TapePolicy AutogradTape::checkpoint_around_compiled(const TapePolicy& inner) const {
  TapePolicy p = checkpoint_input_only(inner);
  p.needed_live_to_forward_end = p.recompute && inner.compiled;
  return p;
}

TapePolicy AutogradTape::full_checkpoint_policy(const TapePolicy& inner) const {
  TapePolicy p = checkpoint_input_only(inner);
  if (!p.recompute || !inner.compiled ||
      std::none_of(ops_.begin(), ops_.end(), [](const TapeOp& op) { return op.escapes_checkpoint; }))
    return p;
  std::vector<char> saving(ops_.size(), 0);
  for (std::size_t i = 0; i < ops_.size(); ++i) saving[i] = ops_[i].escapes_checkpoint;
  keep_what_backward_reads(p, saving);
  return p;
}

// What the backward reads (the decomposed backward reads what eager autograd saves), and everything a
// recomputed op needs to rebuild it; the sweep stops at the `saving` ops, whose outputs on that path are kept
// instead of rebuilt (and only those: AOTAutograd's partitioner saves nothing the backward does not read).
void AutogradTape::keep_what_backward_reads(TapePolicy& p, const std::vector<char>& saving) const {
  std::vector<char> feeds = eager_policy().needed;
  for (std::size_t i = ops_.size(); i-- > 0;) {
    const TapeOp& op = ops_[i];
    bool feeds_out = false;
    for (std::size_t j = 0; j < op.out.size(); ++j)
      feeds_out = feeds_out || feeds[at(tensors_[at(first_out_[i]) + j].storage)];
    if (!feeds_out) continue;
    if (saving[i]) {
      for (std::size_t j = 0; j < op.out.size(); ++j) {
        const std::size_t s = at(tensors_[at(first_out_[i]) + j].storage);
        if (feeds[s]) p.kept[s] = 1;
      }
      continue;
    }
    for (const TapeIn& in : op.in) feeds[at(tensors_[at(in.tensor)].storage)] = 1;
  }
}

// torchtitan SelectiveAC._wrap_block (2026): MUST_SAVE the outputs of the compute-intensive ops
// (get_default_op_list().compute_intensive_ops: mm, addmm, bmm, SDPA flash/efficient, _scaled_mm) and
// of SDPA/flex attention, aten.max and aten.topk, except every second aten.mm/linear counted in forward
// order; mm shapes of force_recompute_mm_shapes_by_fqns (the MoE router) are recomputed and not counted.
// Compiled, the policy function tags LinearNF4's ops like any others (the AOT forward graph of
// l1b-fsdp2-qlora-r16-qkv-sac-tt-compile saves every second aten.mm, the NF4 ones and the adapters' counted alike,
// and no dequantized weight): no op escapes it. And compiled, a MUST_SAVE output the backward does not read is not
// saved (that graph leaves out the 13th mm, the down projection's, which eager SAC's cache keeps): the partitioner
// saves only what its backward graph reads (keep_what_backward_reads).
TapePolicy AutogradTape::selective_op_policy(const TapePolicy& inner) const {
  TapePolicy p = checkpoint_input_only(inner);
  if (!p.recompute) return p;   // no graph: the SAC cache dies with the checkpoint's frame
  std::vector<char> saving(ops_.size(), 0);
  int mm_count = 0;
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    bool keep = false;
    switch (ops_[i].kind) {
      case OpKind::Matmul: keep = (++mm_count % 2) == 1; break;
      case OpKind::MatmulBias:
      case OpKind::Attention:
      case OpKind::Amax:
      case OpKind::Topk: keep = true; break;
      default: break;
    }
    if (!keep) continue;
    saving[i] = 1;
    if (inner.compiled) continue;
    for (std::size_t j = 0; j < ops_[i].out.size(); ++j)
      p.kept[at(tensors_[at(first_out_[i]) + j].storage)] = 1;
  }
  if (inner.compiled) keep_what_backward_reads(p, saving);
  return p;
}

// inductor's partitioner (torch/_functorch/partitioners.py, min_cut_rematerialization_partition /
// solve_min_cut): every storage is a node split in two by an edge weighted with its bytes; the block
// input and every tensor that cannot be recomputed (matmul / attention / kernel outputs, statistics)
// hang from the source, what the backward reads (autograd's saved set) feeds the sink, producers feed
// consumers with infinite capacity. The saved tensors are the node edges a minimum cut crosses.
// Buffers inductor materializes: non-recomputable outputs, inputs and outputs of library kernels
// (matmul, attention, Triton kernels), the block's input and output, and what is saved; every other
// intermediate (and its gradient) lives inside a fused kernel and costs nothing here.
// Approximate: the partitioner weighs a node by its size times 1.1^(distance from the backward) and
// doubles unfused nodes (get_node_weight), which only breaks ties differently; what the decomposed
// backward reads is taken to be what eager autograd saves.
TapePolicy AutogradTape::compiled_policy() const {
  const TapePolicy eager = eager_policy();
  const std::size_t ns = storages_.size();
  const std::size_t input_storage = at(tensors_[at(input_)].storage);
  const std::size_t output_storage = output_ >= 0 ? at(tensors_[at(output_)].storage) : ns;

  const int source = static_cast<int>(2 * ns), sink = source + 1;
  MinCut g(sink + 1);
  auto node_in = [](std::size_t s) { return static_cast<int>(2 * s); };
  auto node_out = [](std::size_t s) { return static_cast<int>(2 * s + 1); };
  for (std::size_t s = 0; s < ns; ++s) {
    g.edge(node_in(s), node_out(s), storages_[s].bytes);
    if (eager.needed[s]) g.edge(node_out(s), sink, MinCut::kInfinite);
  }
  g.edge(source, node_in(input_storage), MinCut::kInfinite);
  // ban_recompute_materialized_backward (functorch config, on by default; should_ban_recomputation /
  // is_materialized_backwards): a tensor that a backward op inductor cannot fuse reads (a library
  // kernel's backward: mm's weight gradient reads the linear's input, SDPA's backward q, k and v, a
  // Triton kernel's saved inputs) has to be materialized in the backward anyway, so recomputing it is
  // never free: it is never recomputed. Views share their base's storage, as the partitioner follows
  // a node's view users.
  std::vector<char> read_by_library_backward(ns, 0);
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    if (!is_extern(ops_[i].kind)) continue;
    for (std::size_t k = 0; k < ops_[i].in.size(); ++k)
      if (saves_input(i, k)) read_by_library_backward[at(tensors_[at(ops_[i].in[k].tensor)].storage)] = 1;
  }
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    const TapeOp& op = ops_[i];
    for (std::size_t j = 0; j < op.out.size(); ++j) {
      if (op.out[j].view_of >= 0) continue;
      const std::size_t v = at(tensors_[at(first_out_[i]) + j].storage);
      if (!recomputable(op.kind, static_cast<int>(j)) || read_by_library_backward[v]) {
        g.edge(source, node_in(v), MinCut::kInfinite);
        continue;
      }
      for (const TapeIn& in : op.in) {
        const std::size_t u = at(tensors_[at(in.tensor)].storage);
        if (u != v) g.edge(node_out(u), node_in(v), MinCut::kInfinite);
      }
      if (op.kind == OpKind::Norm)  // the decomposed norm's output reads its statistics
        for (std::size_t k = 1; k < op.out.size(); ++k)
          g.edge(node_out(at(tensors_[at(first_out_[i]) + k].storage)), node_in(v), MinCut::kInfinite);
    }
  }
  const std::vector<char> side = g.source_side(source, sink);
  // Only a node on a path to the backward is a saved tensor (a zero-byte node off every such path
  // can fall on either side of the cut).
  std::vector<char> feeds_backward = eager.needed;
  for (std::size_t i = ops_.size(); i-- > 0;) {
    const TapeOp& op = ops_[i];
    bool feeds = false;
    for (std::size_t j = 0; j < op.out.size(); ++j)
      feeds = feeds || (recomputable(op.kind, static_cast<int>(j)) && feeds_backward[at(tensors_[at(first_out_[i]) + j].storage)]);
    if (!feeds) continue;
    for (const TapeIn& in : op.in) feeds_backward[at(tensors_[at(in.tensor)].storage)] = 1;
    if (op.kind == OpKind::Norm)
      for (std::size_t k = 1; k < op.out.size(); ++k) feeds_backward[at(tensors_[at(first_out_[i]) + k].storage)] = 1;
  }
  std::vector<char> chosen(ns, 0);
  for (std::size_t s = 0; s < ns; ++s)
    chosen[s] = side[at(node_in(s))] && !side[at(node_out(s))] && feeds_backward[s];

  std::vector<char> materialized(ns, 0);
  std::vector<int> first_reader(ns, kForever);
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    const bool ext = is_extern(ops_[i].kind);
    for (const TapeIn& in : ops_[i].in) {
      const std::size_t s = at(tensors_[at(in.tensor)].storage);
      first_reader[s] = std::min(first_reader[s], static_cast<int>(i));
      if (ext) materialized[s] = 1;
    }
  }
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    const TapeTensor& tt = tensors_[t];
    if (tt.producer >= 0 && !recomputable(ops_[at(tt.producer)].kind, tt.out_index)) materialized[at(tt.storage)] = 1;
  }
  materialized[input_storage] = 1;
  if (output_storage < ns) materialized[output_storage] = 1;
  for (std::size_t s = 0; s < ns; ++s) materialized[s] = materialized[s] || chosen[s];

  TapePolicy p;
  p.kept = chosen;
  p.needed = chosen;
  p.release_op.assign(ns, kForever);
  p.bytes.resize(ns);
  for (std::size_t s = 0; s < ns; ++s) {
    p.bytes[s] = materialized[s] ? storages_[s].bytes : 0;
    if (chosen[s]) p.release_op[s] = std::min(eager.release_op[s], first_reader[s]);
    if (chosen[s] && p.release_op[s] == kForever) p.release_op[s] = storages_[s].producer;
  }
  // A gradient is a real buffer where its tensor is one (a fused intermediate's gradient stays in the
  // fused backward kernel) and where a library kernel produces or consumes it.
  std::vector<char> grad_real(tensors_.size(), 0);
  for (const TapeOp& op : ops_) {
    if (!is_extern(op.kind)) continue;
    for (const TapeIn& in : op.in) grad_real[at(in.tensor)] = 1;
  }
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    const TapeTensor& tt = tensors_[t];
    if (tt.producer >= 0 && is_extern(ops_[at(tt.producer)].kind)) grad_real[t] = 1;
    if (materialized[at(tt.storage)] || static_cast<int>(t) == input_ || static_cast<int>(t) == output_) grad_real[t] = 1;
  }
  p.grad_bytes.resize(tensors_.size());
  for (std::size_t t = 0; t < tensors_.size(); ++t) p.grad_bytes[t] = grad_real[t] ? tensors_[t].bytes : 0;
  p.compiled = true;
  return p;
}

namespace {

// Gradient buffers shared by aliases (a view of a gradient keeps the whole buffer).
struct GradPool {
  std::vector<Bytes> bytes;
  std::vector<int> refs;
  Bytes live = 0;
  int make(Bytes b) {
    bytes.push_back(b);
    refs.push_back(1);
    live += b;
    return static_cast<int>(bytes.size()) - 1;
  }
  void ref(int b) { ++refs[at(b)]; }
  bool unref(int b) {   // whether it dies
    if (--refs[at(b)] != 0) return false;
    live -= bytes[at(b)];
    return true;
  }
};

}  // namespace

Bytes AutogradTape::op_workspace(const TapeOp& op, const TapePolicy& p, bool forward) {
  if (p.compiled && op.kind == OpKind::Pointwise) return 0;
  return forward ? op.fwd_workspace : op.bwd_workspace;
}

std::vector<std::vector<int>> AutogradTape::forward_deaths(const TapePolicy& p) const {
  const std::size_t ns = storages_.size();
  const int n_ops = static_cast<int>(ops_.size());
  std::vector<int> last_use(ns);
  for (std::size_t s = 0; s < ns; ++s) last_use[s] = storages_[s].last_use;
  if (p.compiled) {  // a fused kernel reads its inputs until it writes its last output
    for (std::size_t i = ops_.size(); i-- > 0;) {
      const TapeOp& op = ops_[i];
      for (std::size_t j = 0; j < op.out.size(); ++j) {
        const std::size_t v = at(tensors_[at(first_out_[i]) + j].storage);
        if (op.out[j].view_of >= 0 || !recomputable(op.kind, static_cast<int>(j)) || p.bytes[v] != 0) continue;
        for (const TapeIn& in : op.in) {
          int& l = last_use[at(tensors_[at(in.tensor)].storage)];
          l = std::max(l, last_use[v]);
        }
      }
    }
  }
  if (p.needed_live_to_forward_end && n_ops > 0)   // the compiled function's outputs: alive until it returns
    for (std::size_t s = 0; s < ns; ++s)
      if (p.needed[s] && !p.kept[s]) last_use[s] = std::max(last_use[s], n_ops - 1);
  std::vector<std::vector<int>> dies(ops_.size());
  for (std::size_t s = 0; s < ns; ++s) {
    const int last = last_use[s];
    if (last >= 0 && last < n_ops) dies[at(last)].push_back(static_cast<int>(s));
  }
  return dies;
}

// One walk for both event lists. The forward: the block input first (kept, or a temporary the block holds), then
// each op's new storages, kept or temporary as the policy keeps them. The recompute: only what the policy did
// not keep is made again, kept for the backward when it needs it, and the recomputed output is dropped at once.
// Temporaries die at their last use (inductor's fused kernels extend it: forward_deaths).
std::vector<ForwardEvent> AutogradTape::events(const TapePolicy& p, bool recompute) const {
  std::vector<ForwardEvent> ev;
  if (recompute && !p.recompute) return ev;
  const std::vector<std::vector<int>> dies = forward_deaths(p);
  const std::size_t ns = storages_.size();
  const std::size_t input_storage = at(tensors_[at(input_)].storage);
  const std::size_t output_storage = output_ >= 0 ? at(tensors_[at(output_)].storage) : ns;
  std::vector<int> temp_of(ns, -1);
  std::vector<int> kept_at(ns, -1);   // forward: the Kept event of a storage
  int temps = 0;
  const auto make = [&](std::size_t s) {
    if (p.bytes[s] <= 0 || (recompute && p.kept[s])) return;
    const bool keep = recompute ? p.needed[s] && s != input_storage : p.kept[s] != 0;
    if (!keep) temp_of[s] = temps;
    if (keep && !recompute) kept_at[s] = static_cast<int>(ev.size());
    ev.push_back({keep ? ForwardEvent::Kept : ForwardEvent::Temp, static_cast<int>(s), keep ? -1 : temps++, p.bytes[s],
                  -1, storages_[s].name, !recompute && s == input_storage, !recompute && s == output_storage});
  };
  const auto drop = [&](std::size_t s) {
    if (kept_at[s] >= 0 && s != output_storage) ev[static_cast<std::size_t>(kept_at[s])].forward_end = static_cast<int>(ev.size());
    if (temp_of[s] < 0) return;
    ev.push_back({ForwardEvent::FreeTemp, static_cast<int>(s), temp_of[s], p.bytes[s], -1, storages_[s].name});
    temp_of[s] = -1;
  };
  if (!recompute) make(input_storage);
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    const std::size_t before = ev.size();
    for (std::size_t j = 0; j < ops_[i].out.size(); ++j)
      if (ops_[i].out[j].view_of < 0) make(at(tensors_[at(first_out_[i]) + j].storage));
    const OpKind k = ops_[i].kind;
    if (ev.size() > before && (k == OpKind::Matmul || k == OpKind::MatmulBias || k == OpKind::RouterMatmul))
      ev.back().gemm = true;
    if (const Bytes w = op_workspace(ops_[i], p, true); w > 0) {
      ev.push_back({ForwardEvent::Temp, -1, temps, w, -1, "workspace"});
      ev.push_back({ForwardEvent::FreeTemp, -1, temps++, w, -1, "workspace"});
    }
    for (int s : dies[i]) drop(at(s));
    if (recompute && output_storage < ns && storages_[output_storage].producer == static_cast<int>(i)) drop(output_storage);
  }
  return ev;
}

std::vector<BackwardEvent> AutogradTape::backward_events(const TapePolicy& p) const {
  std::vector<BackwardEvent> ev;
  if (!has_graph()) return ev;   // no gradient reaches the block: no backward
  const std::size_t ns = storages_.size();
  const std::size_t input_storage = at(tensors_[at(input_)].storage);
  const int n_ops = static_cast<int>(ops_.size());
  std::vector<char> saved(ns, 0);
  for (std::size_t s = 0; s < ns; ++s) saved[s] = p.needed[s] || (p.recompute && s == input_storage && p.kept[s]);
  std::vector<std::vector<int>> releases(ops_.size());
  for (std::size_t s = 0; s < ns; ++s)
    if (p.needed[s] && p.release_op[s] >= 0 && p.release_op[s] < n_ops) releases[at(p.release_op[s])].push_back(static_cast<int>(s));
  GradPool g;
  const auto make = [&](Bytes bytes, int op, int storage) {
    const int id = g.make(bytes);
    if (bytes > 0) ev.push_back({BackwardEvent::Grad, id, storage, bytes, op});
    return id;
  };
  std::vector<int> slot(tensors_.size(), -1);
  int op_now = -1;
  const auto unref = [&](int b) {
    if (g.unref(b) && g.bytes[at(b)] > 0) ev.push_back({BackwardEvent::FreeGrad, b, -1, g.bytes[at(b)], op_now});
  };
  slot[at(output_)] = make(p.grad_bytes[at(output_)], -1, -1);
  std::vector<int> to_unref;
  for (int i = n_ops - 1; i >= 0; --i) {
    op_now = i;
    const TapeOp& op = ops_[at(i)];
    const int first = first_out_[at(i)];
    const int last = first + static_cast<int>(op.out.size());
    int out_grad = -1;
    for (int t = first; t < last && out_grad < 0; ++t) out_grad = slot[at(t)];
    to_unref.clear();
    if (out_grad >= 0) {
      // the node unpacks what it saved (each storage once)
      const std::size_t unpacks = ev.size();
      const auto unpack = [&](int tensor) {
        const std::size_t s = at(tensors_[at(tensor)].storage);
        if (!saved[s] || p.bytes[s] <= 0) return;
        for (std::size_t e = unpacks; e < ev.size(); ++e)
          if (ev[e].storage == static_cast<int>(s)) return;
        ev.push_back({BackwardEvent::Unpack, -1, static_cast<int>(s), p.bytes[s], i});
      };
      for (std::size_t k = 0; k < op.in.size(); ++k)
        if (saves_input(static_cast<std::size_t>(i), k)) unpack(op.in[k].tensor);
      for (std::size_t j = 0; j < op.out.size(); ++j)
        if (op.out[j].saved) unpack(first + static_cast<int>(j));
      // the weight's gradient first (the measured order of mm's backward: AccumulateGrad keeps it as .grad)
      if (op.weight == WeightUse::Trains && op.weight_grad > 0) ev.push_back({BackwardEvent::WeightGrad, -1, -1, op.weight_grad, i});
      for (std::size_t k = 0; k < op.in.size(); ++k) {
        const TapeIn& in = op.in[k];
        const TapeTensor& tt = tensors_[at(in.tensor)];
        if (in.grad == GradRule::None || !tt.requires_grad) continue;
        int b = -1;
        switch (in.grad) {
          case GradRule::Alias:  // input k passes through to output k (or to the op's single output)
            b = first + static_cast<int>(k) < last && slot[at(first + static_cast<int>(k))] >= 0
                    ? slot[at(first + static_cast<int>(k))]
                    : out_grad;
            g.ref(b);
            break;
          case GradRule::New:
            if (p.compiled && p.grad_bytes[at(in.tensor)] == 0) {  // inside a fused backward kernel
              b = out_grad;
              g.ref(b);
            } else {
              b = make(p.grad_bytes[at(in.tensor)], i, -1);
            }
            break;
          case GradRule::IntoSaved: {
            const std::size_t s = at(tt.storage);
            // the saved storage becomes the gradient: nothing new is allocated
            b = make(p.bytes[s], i, saved[s] ? static_cast<int>(s) : -1);
            saved[s] = 0;
            break;
          }
          case GradRule::None: break;
        }
        int& sl = slot[at(in.tensor)];
        if (sl < 0) {
          sl = b;
        } else if (g.refs[at(sl)] == 1 || p.grad_bytes[at(in.tensor)] == 0) {
          // accumulate into the existing buffer in place (or inside a fused kernel)
          to_unref.push_back(b);
        } else if (g.refs[at(b)] == 1) {   // or into the new one
          to_unref.push_back(sl);
          sl = b;
        } else {                           // both shared: out of place
          to_unref.push_back(sl);
          to_unref.push_back(b);
          sl = make(p.grad_bytes[at(in.tensor)], i, -1);
        }
      }
      if (const Bytes w = op_workspace(op, p, false); w > 0) ev.push_back({BackwardEvent::Workspace, -1, -1, w, i});
      for (int b : to_unref) unref(b);
    }
    for (int t = first; t < last; ++t) {
      if (slot[at(t)] >= 0) unref(slot[at(t)]);
      slot[at(t)] = -1;
    }
    for (int s : releases[at(i)]) {
      if (!saved[at(s)]) continue;
      saved[at(s)] = 0;
      ev.push_back({BackwardEvent::Release, -1, s, p.bytes[at(s)], i});
    }
  }
  return ev;
}

TapeCost AutogradTape::cost(const TapePolicy& p) const {
  const std::size_t ns = storages_.size();
  const std::size_t input_storage = at(tensors_[at(input_)].storage);
  const std::size_t output_storage = output_ >= 0 ? at(tensors_[at(output_)].storage) : ns;
  auto workspace = [&](const TapeOp& op, bool forward) { return op_workspace(op, p, forward); };
  const std::vector<std::vector<int>> dies = forward_deaths(p);
  auto created = [&](std::size_t i, auto&& fn) {  // the storages op i allocates
    for (std::size_t j = 0; j < ops_[i].out.size(); ++j)
      if (ops_[i].out[j].view_of < 0) fn(at(tensors_[at(first_out_[i]) + j].storage));
  };

  TapeCost c;
  // Forward: temporaries are everything the policy does not keep.
  {
    Bytes live = p.kept[input_storage] ? 0 : p.bytes[input_storage];
    Bytes peak = live;
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      created(i, [&](std::size_t s) {
        if (!p.kept[s]) live += p.bytes[s];
      });
      peak = std::max(peak, live + workspace(ops_[i], true));
      for (int s : dies[i])
        if (!p.kept[at(s)]) live -= p.bytes[at(s)];
    }
    c.forward_extra = peak;
  }

  Bytes kept_bytes = 0;
  for (std::size_t s = 0; s < ns; ++s)
    if (p.kept[s]) kept_bytes += p.bytes[s];
  const bool graph = has_graph();   // no graph: no gradient reaches the block, no backward
  const Bytes incoming = graph ? p.grad_bytes[at(output_)] : 0;
  Bytes peak = kept_bytes + incoming;

  // Recompute: the forward runs again with what the mode kept; what backward needs stays, the rest
  // dies at its last use (the SAC cache is consumed, the recomputed output is dropped).
  if (p.recompute) {
    Bytes live = kept_bytes + incoming;
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      created(i, [&](std::size_t s) {
        if (!p.kept[s]) live += p.bytes[s];
      });
      peak = std::max(peak, live + workspace(ops_[i], true));
      auto drop = [&](std::size_t s) {
        if (!p.needed[s] && s != input_storage) live -= p.bytes[s];
      };
      for (int s : dies[i]) drop(at(s));
      if (output_storage < ns && storages_[output_storage].producer == static_cast<int>(i)) drop(output_storage);
    }
  }

  // Backward: the running sum over its events (backward_events), from every saved tensor and the incoming gradient.
  Bytes live = 0;
  for (std::size_t s = 0; s < ns; ++s)
    if (p.needed[s] || (p.recompute && s == input_storage && p.kept[s])) live += p.bytes[s];
  Bytes grads = 0;   // the parameters' gradients created so far (none during the recompute)
  Bytes phase_peak = live;
  Bytes phase_peak_with_grads = live;
  for (const BackwardEvent& e : backward_events(p)) {
    switch (e.kind) {
      case BackwardEvent::WeightGrad: grads += e.bytes; break;
      case BackwardEvent::Grad:
        if (e.storage < 0) live += e.bytes;   // (written into a saved tensor: its memory changes owner)
        break;
      case BackwardEvent::Workspace:   // allocated and freed around the kernel
        phase_peak = std::max(phase_peak, live + e.bytes);
        phase_peak_with_grads = std::max(phase_peak_with_grads, live + e.bytes + grads);
        break;
      case BackwardEvent::FreeGrad:
      case BackwardEvent::Release: live -= e.bytes; break;
      case BackwardEvent::Unpack: break;
    }
    phase_peak = std::max(phase_peak, live);
    phase_peak_with_grads = std::max(phase_peak_with_grads, live + grads);
  }
  peak = std::max(peak, phase_peak);
  const Bytes peak_with_grads = std::max(peak, phase_peak_with_grads);
  c.backward_extra = peak - kept_bytes;
  c.backward_extra_with_grads = peak_with_grads - kept_bytes;
  c.param_grads = grads;
  c.backward_phase_extra = phase_peak - kept_bytes;
  c.backward_phase_extra_with_grads = phase_peak_with_grads - kept_bytes;
  c.incoming_grad = incoming;
  return c;
}

}  // namespace fsdpsim::models

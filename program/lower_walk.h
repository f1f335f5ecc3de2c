// The one lowering walk (issue 22 stage 2): the module walk of a training step, written once for both
// FSDP versions. It walks the forward segments and then the backward in reverse, micro-batch by
// micro-batch, and fires PyTorch's hook points where autograd and nn.Module fire them:
//
//   root pre-forward           the side streams wait on the compute stream (F1.5, F2.5)
//   pre-forward(u)             before the unit's first forward segment (opening), root first
//   forward compute            one op per segment; saved activations / logits allocated here
//   post-forward(u)            after the unit's last forward segment (closing), root last
//   pre-backward(u)            when the gradient reaches the unit's outputs (reverse post-forward order);
//                              with checkpoint(FSDP(block)) the unit's forward is re-run first (A2)
//   backward compute           one op per segment, after its recompute (FSDP(checkpoint(block)), A1, A3);
//                              autograd allocates a unit's unsharded gradient at its first backward compute
//   post-backward(u)           after the unit's last backward segment (AccumulateGrad / the RegisterPost-
//                              BackwardFunction), the root's in the final callback
//   final callback             queued by the root's pre-backward (F1.13, F2.11)
//
// What each hook does is the FSDP version's parameter-group lowering, a subclass: FSDP1's flat-parameter
// handles (program/lower_fsdp1.cpp, `FlatParamHandle` + `_runtime_utils.py`) and FSDP2's parameter groups
// (program/lower_fsdp2.cpp, `FSDPParamGroup`). A memory or checkpointing rule of the model's compute is written
// here once; a rule of how FSDP moves parameters and gradients is written in its version's file.
#pragma once
#include <vector>

#include "program/lower_context.h"

namespace fsdpsim::sim::lowering {

enum class Phase { Forward, Backward };

class LoweringWalk {
 public:
  explicit LoweringWalk(const Context& c) : c_(c), plan_(*c.plan), b_(p_, c.recycler, c.full, c.sites) {}
  virtual ~LoweringWalk() = default;

  // The whole step: persistent state, every micro-batch's forward and backward, the optimizer step.
  StepProgram run();

 protected:
  // The parameters' own gradients, segment by segment, as autograd computes them with the original
  // parameters (FSDP1's views of the flat parameter, FSDP2's unsharded nn.Parameters): the embedding's
  // (positions only when the table is tied to the head: the tied weight's gradient is the head's) in the
  // embedding's backward, a block's in its backward (one per parameter, in the reverse of the block's module
  // order, as autograd reaches them), the final norm's and the head's in the head's. A weight used twice (a
  // tied embedding and LM head) gets a second gradient, the embedding's: `transient`; autograd sums the two
  // out of place (InputBuffer::add -> accumulate, torch/csrc/autograd/input_buffer.cpp) on the stream of the
  // node that consumes them: FSDP2's leaf, the compute stream (lower_fsdp2.cpp segment_grads); FSDP1's view of
  // the flat parameter, the unshard stream (lower_fsdp1.cpp begin). Measured on PyTorch 2.11:
  // l1b-fsdp2-every2-mb4-tt, l1b-fsdp1-offload-w8-hf and l1b-fsdp1-shard-grad-op-w8-hf.
  struct ParamGradParts {
    std::vector<std::vector<std::int64_t>> held;   // per segment: numel of each parameter's gradient held
    std::vector<std::int64_t> transient;           // per segment: numel of the tied weight's second gradient
    std::vector<std::int64_t> unit_held;           // per unit: the sum of `held` over its segments
    std::vector<std::int64_t> unit_listed;         // per unit: the numel of all its listed tensors (held or not)
    // Per parameter (FSDP2: only a parameter that requires grad gets a .grad, models/trainable.h): per segment
    // the numel of each gradient among `held` whose parameter trains, then the head segment's LoRA adapters (not
    // among `held`), and their sum per unit (-1: a block known by its count, trained in part). With every
    // parameter trained, `held` and `unit_held`.
    std::vector<std::vector<std::int64_t>> trained;
    std::vector<std::int64_t> unit_trained;
    std::int64_t tied = 0;                         // the tied weight's numel (0: no tied weight in one unit)
    int tied_head = -1;                            // its segment whose last `held` entry is the tied weight
    int tied_embedding = -1;                       // its segment whose `transient` is the second gradient
  };

  // ---- what the FSDP version does (its parameter-group lowering) ----
  virtual void add_streams() = 0;        // the streams (add_side_streams, F1.1, F2.1)
  // The version's per-unit state, before anything is lowered, and how it takes the parameters' gradients.
  virtual void begin(const ParamGradParts& g) = 0;
  virtual const char* shard_name() const = 0;   // the sharded parameter's name ("flat_shard", "shard")
  virtual void notes_before_step() {}    // notes that precede the optimizer step's
  virtual void notes_after_step() {}
  virtual void root_pre_forward() = 0;   // the side streams wait on the compute stream
  // The hooks of unit u. The walk charges each one's CPU time (an FSDP hook runs Python) to the next op
  // the CPU issues (Builder::defer_hook) before the version lowers it.
  virtual void pre_forward(int u) = 0;
  virtual void post_forward(int u) = 0;
  // checkpoint(FSDP(unit)) (A2): the recomputed forward's own pre-forward (unshard) and post-forward.
  virtual void pre_recompute(int u) = 0;
  virtual void post_recompute(int u) = 0;
  virtual void pre_backward(int u) = 0;  // unshard, wait, backward prefetch
  virtual void begin_backward() {}
  // Autograd allocates unit v's unsharded gradient (a buffer id from b_.buffer) or reuses the one it
  // accumulates into; the walk attaches the allocations to the backward compute op.
  // s: the segment whose backward compute starts unit v's backward.
  virtual void autograd_grad(int v, int s) = 0;
  virtual int unsharded_grad(int u) const = 0;    // the gradient unit u's backward writes (-1: none)
  virtual int unsharded_params(int u) const = 0;  // the parameters unit u's compute reads (-1: none)
  // Autograd's work on unit u's gradient after its last backward compute and before its post-backward
  // hook (FSDP1: the views' gradients cat into the flat gradient, AccumulateGrad).
  virtual void accumulate_grad(int /*u*/) {}
  virtual void post_backward(int u) = 0;
  virtual void final_callback() = 0;
  // After segment s's backward compute op `o` is built: gradients autograd produces in it beyond the
  // unit's unsharded gradient (FSDP1: the original parameters' gradients, before the flat one).
  virtual void segment_grads(int /*s*/, Op& /*o*/) {}
  // The bytes of the gradients segment_grads(s, o) will allocate and keep (not its transients), asked before
  // the op is built (emit_compute sizes the backward's transient with the gradients it allocates).
  virtual Bytes segment_grad_bytes(int /*s*/) const { return 0; }

  ParamGradParts param_grad_parts() const;

  // ---- what both versions' parameter-group lowerings do alike ----
  // The streams (F1.1, F2.1): the compute stream (compute_), then the side streams under the version's
  // names: the all-gather's copy-in (cast / H2D), the all-gather, the gradient reduction, and an
  // all-reduce stream (named "all_reduce") when `all_reduce` (HSDP; else -1).
  struct SideStreams {
    int copy_in = -1, all_gather = -1, reduce_scatter = -1, all_reduce = -1;
  };
  SideStreams add_side_streams(const char* copy_in, const char* all_gather, const char* reduce_scatter,
                               bool all_reduce);
  // Op `o` is a collective over `group` (the mesh's shape of it: Context::shard_group, ...) moving `bytes`.
  void collective(Op& o, CommGroup group, Bytes bytes) const;
  // An all-reduce of `buf` (`bytes`) in place over `group` on `stream`, after op `after` (-1: none).
  Op& all_reduce(int u, int stream, int buf, Bytes bytes, CommGroup group, int after);
  // An in-place divide of `buf` (`bytes`: read and written) on `stream`, after op `after` (-1: none).
  // Returns its op id.
  int divide(int u, int stream, int buf, Bytes bytes, int after = -1);
  // Unit u's reduced gradient shard itself becomes its sharded gradient (no copy: the reduce dtype is the
  // master dtype, no earlier micro-batch's gradient to add to, no CPU offload).
  bool reduced_is_grad(int u) const;
  // The post-reduce cast of unit u's reduced shard `src` (numel, reduce dtype) to the master dtype on
  // `stream` (FSDP1 _cast_grad_to_param_dtype / _accumulate_sharded_grad, F1.10; FSDP2 foreach_reduce's
  // post-reduce, F2.9): into a new sharded gradient in that stream's pool, or `+=` into an earlier
  // micro-batch's; with CPU offload into a device tensor for the D2H, returned in `staging`.
  Op& cast_to_sharded_grad(int u, int stream, int src, std::int64_t numel, int& staging);

  // ---- the walk ----
  struct BufferRange {   // buffers with consecutive ids [first, first + n), and `extra` (-1: none)
    int first = -1, n = 0;
    int extra = -1;      // a saved block input that is the previous module's output (alloc_forward's carry)
  };
  BufferRange alloc_tensors(Op& o, int unit, const std::vector<models::SavedTensor>& ts);
  void free_range(Op& o, BufferRange& r);
  void transient(Op& o, const char* what, int unit, Bytes bytes, MemCategory cat);
  // take_input: the forward's input is the previous module's output (carried_, when its size matches);
  // carry_output: this forward's output stays allocated as the next module's input.
  BufferRange alloc_forward(Op& o, int unit, const std::vector<models::SavedTensor>& saved,
                            const std::vector<models::ForwardEvent>& events, Bytes forward_extra,
                            bool take_input = false, bool carry_output = false,
                            const std::vector<char>* drop_at_last_read = nullptr);
  void drop_carried();   // a carried output nobody takes: freed after the op emitted last
  // A block's backward tensor by tensor (models::BlockMemory::backward_events; a packed block under activation offloading
  // brings its tensors back node by node): when the block has events and the op makes either no parameter gradient or
  // exactly the tape's (`grads`).
  bool backward_by_tensor(const Context::BlockActivations& a, Bytes grads) const;
  bool head_by_tensor(Bytes grads) const;   // the head's backward likewise (c_.final_norm_acts; lower_walk.cpp)
  // Lowers it into op `o` of segment s: each activation gradient and workspace allocated and freed where autograd
  // makes and drops it, each saved tensor freed after its last reader's backward, the weight gradients' places
  // noted (weight_slots_) when the op makes them (`weight_grads`).
  // `incoming_dies_with_first_node`: the incoming gradient (grad_in_[s]), which has no event of its own, is freed
  // once the first node's backward is done (the head: the loss's logits gradient after the head matmul's).
  void emit_backward_events(Op& o, int s, const Context::BlockActivations& a, bool weight_grads,
                            bool incoming_dies_with_first_node = false);
  // The parameter gradients a block's backward op made (its allocations from `first`: autograd_grad's and
  // segment_grads' buffers) moved to where the tape makes them: cut_grads' pieces each at its op, any other at the
  // first weight gradient's.
  void place_weight_grads(Op& o, std::size_t first);
  // For the version's lowering: unit u's gradient of `bytes` made by the block backward being lowered tensor by
  // tensor, as one buffer per weight gradient of the tape (autograd makes each parameter's .grad in the backward
  // of the op that reads it), when `bytes` is the tape's total; else null (the version makes its own buffer).
  const std::vector<int>* cut_grads(const char* name, int u, Bytes bytes);
  struct WeightSlot {
    std::size_t allocs = 0, inside_frees = 0;   // where the weight gradient's allocation goes
  };
  std::vector<WeightSlot> weight_slots_;
  // A block backward's input gradient (the one gradient alive at its end), kept as the next backward's incoming
  // gradient: PyTorch's is one tensor, made by this block's first op and consumed by the earlier module's backward
  // (its recompute holds it from its start). Freed after the next backward compute op that does not take it.
  int carried_grad_ = -1, carried_grad_op_ = -1;
  Bytes carried_grad_bytes_ = 0;
  int take_carried_grad(Bytes bytes);   // the carried gradient when its size is `bytes` (it is then no longer carried)
  const Context::BlockActivations* cut_ = nullptr;   // the block whose backward backward_segment lowers by tensor
  std::vector<int> cut_bufs_, grad_buf_, saved_bufs_, rec_bufs_, tail_;   // scratch of the above
  std::vector<int> node_copies_, prev_copies_;   // emit_backward_events: offloaded tensors brought back per node
  bool node_copied_ = false;                     // the block backward lowered last brought some back
  std::vector<int> pending_copies_;              // streams: its last node's copies, until the next node unpacks
  void drop_pending_copies();
  // The buffers of a range alloc_forward or alloc_tensors made for `ts`, by entry (consecutive ids for the entries
  // with bytes; entry `extra_entry` is the range's `extra`, a taken block input; -1 for an entry without bytes).
  static void range_buffers(const std::vector<models::SavedTensor>& ts, const BufferRange& r, int extra_entry,
                            std::vector<int>& out);
  std::vector<int> saved_buf_, temp_buf_;   // alloc_forward's scratch
  // A block forward's output, alive from the op that made it to the next module's forward, which takes it
  // as its input (PyTorch's block output is the next block's input tensor, not a new one): -1 when none.
  int carried_ = -1;
  Bytes carried_bytes_ = 0;
  void forward();
  void backward();
  // `grads`: for a backward op, the bytes of the parameter gradients it allocates (autograd_grad, segment_grads).
  void emit_compute(int s, OpKind kind, Bytes grads = 0);
  bool checkpointed(int s) const;
  Op& loss_op(OpKind kind, const char* what);
  int chunk_ce_backward(const LossMemory& l, int i, int saved);   // one chunk's CE backward ops
  void loss_forward();
  void loss_backward();
  void head_chunks_backward(int s);
  bool head_lora() const;                       // a LoRA adapter on the LM head (its T x V tensors here)
  void head_lora_forward(int logits, Bytes bytes);
  void head_lora_backward();

  const Context& c_;
  const Plan& plan_;
  StepProgram p_;
  Builder b_;
  int compute_ = 0;
  int mb_ = 0;
  bool sync_ = true;                    // this micro-batch reduces gradients (grad_sync or the last one)
  std::vector<BufferRange> act_, recompute_;   // per segment: saved / recomputed activations
  std::vector<int> grad_in_;                   // per segment: the incoming gradient a recompute holds (-1: none)
  int logits_ = -1;                     // the head's output, held until the head's backward or freed earlier
  std::vector<bool> pre_backward_done_;
  std::vector<char> recomputed_;        // per segment: recomputed in this backward by a unit's pre-backward (A2)
  // Per unit: the sharded parameter (persistent, -1 when offloaded) and the sharded gradient (created by the
  // unit's reduction, freed by zero_grad at the step's end; -1 until then).
  std::vector<int> param_shard_, grad_shard_;          // per unit (-1: none)
  std::vector<int> optim_;                             // the optimizer-state buffers, unit by unit
  int loss_saved_ = -1;                 // the loss's saved tensor (log-probabilities / logsumexp)
  BufferRange loss_chunks_;             // a chunked loss's saved log-probabilities, one buffer per chunk
  int loss_weight_grad_ = -1;           // a fused linear cross-entropy's head-weight gradient, from its forward
  int cublas_ws_[2] = {-1, -1};         // the cuBLAS workspaces of the forward thread and the autograd thread
  int pending_ws_ = -1;                 // a workspace made by the op being lowered, placed at its first GEMM
  int head_grad_ = -1;                  // the gradient the head's backward reads (from the loss's backward)
  // torchtune's chunked output (LossMemory::chunked_output): the head's logits chunks, each chunk's saved
  // log-probabilities, each chunk's logits gradient from the loss's backward, the chunks' input gradients.
  BufferRange logits_chunks_;
  std::vector<int> loss_chunk_ids_, head_chunk_grads_, head_in_grads_;

 private:
  void add_persistent();
  void add_loop_inputs();   // (the batch and the rotary tables; Buffer::after_construction)
  int intern_init_originals(const std::vector<Bytes>& originals);   // (StepProgram::init_originals' index)
  // Activation offloading (plan.activation_offloading; lower_walk.cpp "activation offloading").
  struct Stashed {
    int id = 0, buffer = -1, copy = -1;   // pack id, the GPU tensor, its D2H op
  };
  bool offload_streams() const { return plan_.activation_offloading == ActivationOffload::Streams; }
  void offload_pack(int s);
  void offload_after_forward(int s);
  void offload_unpack(int s);
  void offload_after_backward(int s);
  void release_stash(int up_to_id);
  bool stashed(int buffer) const;
  // An offloaded tensor of `bytes` copied back (H2D on the offload stream, in its pool; the compute stream waits for
  // it with use_streams); returns its buffer.
  // `tables` more buffers of `table_bytes` come back in the same copy (a block's rotary tables), with the next ids.
  // allocate false: the copy's time only (the block's backward allocates the tensors node by node); returns -1.
  int bring_back(int unit, Bytes bytes, MemCategory category, const char* what, int tables = 0, Bytes table_bytes = 0,
                 bool allocate = true);
  void drop_reload(int first, int n);   // frees buffers first .. first + n - 1 (none when first is -1)
  // Segments whose saved tensors themselves are packed: the final norm, and every block not checkpointed.
  bool packs_saved(int s) const;
  std::vector<char> packed_mask(int s) const;   // per saved tensor of segment s: OffloadActivations copies it
  void pack_saved(int s);
  void pack_loss();
  // by_node: the block's backward is lowered tensor by tensor and brings each node's tensors back itself
  // (unpacked_: the offloaded ones, not the stashed).
  void unpack_saved(int s, bool by_node);
  std::vector<int> unpacked_;
  // A buffer of an activation range that the offloading frees instead (free_range skips it).
  bool offload_owned(int buffer) const;
  int offload_ = -1;                  // the stream the copies run on (the compute stream with use_streams false)
  OffloadPacks packs_;                // what the offloaded forward packs beside the blocks' inputs
  int pack_id_ = 0;                   // saved tensors packed so far in this micro-batch's forward
  std::vector<Stashed> stash_;        // streams: offloaded GPU tensors still held (fwd_stash)
  std::vector<std::vector<int>> saved_off_;   // per segment: its offloaded saved tensors (pack_saved)
  std::vector<char> owned_;           // per buffer: an activation the offloading frees (see offload_owned)
  bool loss_off_ = false;             // this micro-batch's loss tensors were offloaded
  std::vector<char> saved_unpacks_;   // per segment: its backward unpacks offloaded saved tensors
  std::vector<int> offloaded_;        // per segment: the block input offloaded this micro-batch (-1: none)
  int reload_ = -1, reload_op_ = -1;  // streams: the last input brought back, and its block's recompute op
  int reload_n_ = 1;                  // its buffers (the input and the tables it came back with)
  int reload_wait_ = -1;              // streams: the op the next copy back waits on (the event before a drop)
  int rec_op_ = -1;                   // the recompute op backward_segment emitted last
  int bwd_op_ = -1;                   // the backward compute op backward_segment emitted last
  // at_first_gemm: the op lowers its tensors one by one (alloc_forward), which places the workspace after
  // its first GEMM's output (place_workspace); else it is the op's first allocation.
  void cublas_workspace(Op& o, bool autograd_thread, bool at_first_gemm);
  void place_workspace(Op& o);
  // Fires a hook of unit u (see pre_forward).
  void fire(void (LoweringWalk::*hook)(int), int u) {
    b_.defer_hook();
    (this->*hook)(u);
  }
  void walk_pre_backward(int u);
  void walk_post_backward(int u);
  void backward_segment(int s);
};

}  // namespace fsdpsim::sim::lowering

// A transformer block's forward written down op by op as PyTorch's autograd records it, and what
// that costs in memory (issue 19 item 3; fsdp-semantics.md section 9). models/implementation.cpp
// writes each framework's block on a tape; this file turns a tape into bytes:
//   * which tensors autograd keeps for backward (per the op's derivatives.yaml / autograd.Function),
//     one entry per storage: a view of a kept tensor keeps its whole base;
//   * the forward temporaries alive at once (a tensor dies after its last use, or when the Python
//     variable holding it goes out of scope: hold());
//   * the backward: ops run in reverse, each allocates its inputs' gradients (or aliases / writes
//     them in place), gradients of a tensor used twice accumulate (in place when one side is unshared,
//     as torch/csrc/autograd/input_buffer.cpp does), saved tensors are released after the last
//     backward op that needs them (Node::release_variables);
//   * checkpointing: what a mode keeps from the forward, and the recompute that re-creates the rest
//     at the start of the block's backward (torch.utils.checkpoint, non-reentrant, early_stop=False
//     as torchtitan sets it);
//   * torchtitan's op-level SAC policy and inductor's min-cut partitioner, from the op kinds.
// The tape is built for one concrete micro-batch: every size is in bytes.
#pragma once
#include <cstdint>
#include <vector>

#include "common/units.h"

namespace fsdpsim::models {

// What an op is to the two policies that decide what to keep (SAC, inductor's partitioner).
enum class OpKind : std::uint8_t {
  Pointwise,     // elementwise math, casts, copies, cat: inductor fuses and recomputes them
  View,          // view / transpose / split / slice: shares the input's storage
  Gather,        // indexing a model buffer (torchtitan's RoPE cache): recomputable, no gradient
  Reduction,     // a per-token statistic (mean, amax along a dim): never recomputed by inductor
  Matmul,        // aten.mm (nn.Linear without bias): torchtitan's SAC saves every second one
  MatmulBias,    // aten.addmm (biased linear, HF Conv1D): compute-intensive, always saved by SAC
  RouterMatmul,  // the MoE router's mm: torchtitan's SAC force-recomputes it (force_recompute_mm_shapes_by_fqns)
  Attention,     // SDPA flash / flex attention: always saved by SAC, never recomputed by inductor
  Norm,          // a fused aten norm (_fused_rms_norm, native_layer_norm): out 0 recomputable, stats not
  Kernel,        // an opaque custom autograd.Function (Liger's Triton kernels)
  Amax,          // aten.max.default (float8 tensorwise amax): SAC saves it
  Topk,          // aten.topk (MoE routing): SAC saves it
};

// What an op's backward does for one input.
enum class GradRule : std::uint8_t {
  None,       // no gradient (non-differentiable, or a parameter: FSDP's accounting, not this one)
  New,        // allocates a gradient the size of the input
  Alias,      // the input's gradient is (a view of) output k's gradient for input k, else the first output's
  IntoSaved,  // written into the input's own saved storage (Liger's in-place backward kernels)
};

// When an op that records a graph (some input, or its weight, requires grad) keeps a saved input. PyTorch's
// codegen saves a tensor that only one input's derivative formula reads only when that input's gradient
// is wanted (tools/autograd/gen_variable_type.py `emit_save_inputs` / `guard_for`:
// `if (grad_fn->should_compute_output(k))`); custom autograd.Functions (Liger's kernels, torchao's
// float8 matmul) save whatever ctx.save_for_backward is given.
enum class SaveIf : std::uint8_t {
  GradFn,        // whenever the op records a graph (formulas of several inputs read it; custom Functions)
  WeightTrains,  // only for the op's weight's gradient: mm's `self`, addmm's `mat1` (derivatives.yaml)
  OtherInput,    // only for the other operands' gradients: mul's `self` (for `other`) and `other` (for `self`)
};

struct TapeIn {
  int tensor = -1;
  GradRule grad = GradRule::New;
  bool saved = false;  // the op saves this input for backward (when `when` says so)
  SaveIf when = SaveIf::GradFn;
};

// The parameter an op reads (a linear's or a norm's weight; its bytes are FSDP's accounting, not the
// tape's): none, frozen (requires_grad false) or trainable. A trainable weight makes the op record a
// graph even when no input requires grad.
enum class WeightUse : std::uint8_t { None, Frozen, Trains };

struct TapeOut {
  const char* name = nullptr;  // static string, unique within the tape
  Bytes bytes = 0;             // the tensor's size (for a view: the view's own size)
  bool saved = false;          // the op saves its own output (tanh, rsqrt, attention out)
  bool differentiable = true;  // false: logsumexp, indices, statistics
  int view_of = -1;            // an input tensor whose storage this output shares
};

struct TapeOp {
  OpKind kind = OpKind::Pointwise;
  std::vector<TapeIn> in;
  std::vector<TapeOut> out;
  Bytes fwd_workspace = 0;  // transient during the forward op (float8 casts' fp32 intermediates)
  Bytes bwd_workspace = 0;  // transient during its backward (flash attention's fp32 dq accumulator)
  WeightUse weight = WeightUse::None;
  // The gradient of the op's parameters (its weight and bias), which its backward creates when they train
  // (WeightUse::Trains): bytes in the compute dtype, FSDP's unsharded gradient (cost(): param_grads).
  Bytes weight_grad = 0;
  // Under torch.compile, an op traced inside a custom autograd.Function's forward does not carry the enclosing
  // torch.utils.checkpoint's recompute tag (measured with torchao's LinearNF4 on PyTorch 2.11: the AOT forward graph
  // of a compiled, checkpointed block lists the Function's ops untagged and saves their outputs): what the
  // backward reads through its outputs is saved, not recomputed (full_checkpoint_policy).
  bool escapes_checkpoint = false;
};

struct TapeTensor {
  const char* name = nullptr;
  Bytes bytes = 0;
  int storage = -1;
  int producer = -1;   // op index; -1 for the block input
  int out_index = -1;  // which output of its op
  bool requires_grad = false;
};

struct TapeStorage {
  const char* name = nullptr;  // the tensor that created it
  Bytes bytes = 0;
  int tensor = -1;    // that tensor
  int producer = -1;
  int last_use = -1;  // last forward op reading it (or holding it: hold()); kForever for the output
};

// What to keep from the forward and how the backward finds its tensors (one evaluation's policy).
struct TapePolicy {
  std::vector<char> kept;        // per storage: kept from the forward to the backward (the mode's saved set)
  std::vector<char> needed;      // per storage: what the backward reads (autograd's saved set)
  std::vector<int> release_op;   // per needed storage: freed after this op's backward
  std::vector<Bytes> bytes;      // per storage: its size (0 for a tensor inductor fuses away)
  std::vector<Bytes> grad_bytes; // per tensor: its gradient's size (0 for a fused gradient)
  bool recompute = false;        // a checkpointed block: the backward starts by re-running the forward
  // Compiled: pointwise chains run as fused kernels. Their intermediates (bytes 0) hold no memory, a
  // fused kernel's inputs live until it ends, and the gradient it reads stays alive while it writes
  // the gradients of its inputs.
  bool compiled = false;
  // An eager checkpoint around a compiled block (checkpoint(compile(block))): the compiled forward returns its
  // saved set as outputs and hands it to save_for_backward, whose pack hooks drop it; until the block's forward
  // returns, every tensor of the set (`needed`) that is not kept is alive.
  bool needed_live_to_forward_end = false;
};

struct TapeCost {
  Bytes forward_extra = 0;   // peak forward temporaries beyond the kept storages created so far
  Bytes backward_extra = 0;  // peak during the backward (recompute included) minus the kept bytes
  // The same peak with the parameters' gradients the backward has created so far counted too (each trainable
  // op's weight_grad from its backward on: autograd computes a weight's gradient in the backward of the op
  // that uses it, and AccumulateGrad keeps it as .grad), minus the kept bytes; and those gradients' total.
  // backward_extra_with_grads - param_grads is what the backward needs on top of all its gradients.
  Bytes backward_extra_with_grads = 0;
  Bytes param_grads = 0;
  // The same two for the backward's own ops alone (after the recompute), and the incoming gradient (the
  // block output's, alive from before a recompute): with the recompute's tensors allocated one by one
  // (recompute_events), the backward's lumped transient covers only its own part.
  Bytes backward_phase_extra = 0;
  Bytes backward_phase_extra_with_grads = 0;
  Bytes incoming_grad = 0;
};

// One allocator event of the block's forward, in the order PyTorch makes them (issue 19 item 4: per
// tensor, in op order): a kept storage created, a temporary created, a temporary freed. AutogradTape::
// forward_events writes them; the peak of their running sum is the kept bytes so far + forward_extra.
struct ForwardEvent {
  enum Kind : std::uint8_t { Kept, Temp, FreeTemp };
  Kind kind = Temp;
  int storage = -1;   // the tape storage (Kept, Temp, FreeTemp); -1 for an op's workspace
  int temp = -1;      // Temp / FreeTemp: the temporary's number, 0, 1, ... in creation order
  Bytes bytes = 0;
  int saved = -1;     // Kept: its index among the kept storages (models::BlockMemory::saved), set by the reader
  const char* name = nullptr;   // the storage's name ("workspace" for an op's workspace)
  // The forward's block input (made first: it exists before the block, the previous module's output) and
  // the block output (a Temp never freed inside: the next module's input). Recompute events mark neither.
  bool input = false, output = false;
  // Made by a GEMM (Matmul, MatmulBias, RouterMatmul): ATen allocates the output, then the cuBLAS call
  // fetches its thread's handle, whose workspace the caching allocator makes at the thread's first GEMM
  // (aten/src/ATen/cuda/CublasHandlePool.cpp getCurrentCUDABlasHandle): right after this event.
  bool gemm = false;
  // Kept (forward events only): how many events the list holds when the forward's last read of the storage has
  // passed (the events of later ops follow); -1 while it is read to the block's end (the output, a hold).
  int forward_end = -1;
};

// One allocator event of the block's backward (after a checkpointed block's recompute), in the order autograd
// makes them (issue 19 item 4): each op's backward, last op first, creates its weight's gradient (WeightGrad:
// the parameters' .grad, FSDP's buffers), then its inputs' gradients (Grad), then runs (Workspace: allocated and
// freed around the kernel), then drops the gradients nothing reads any more (FreeGrad) and the saved tensors
// whose last reader it was (Release: Node::release_variables). Before all of them, the saved tensors the op's node
// reads (Unpack, one per storage: what a saved-tensors hook such as torchtune's OffloadActivations brings back;
// nothing for the allocator otherwise). The block output's gradient comes first (Grad, op -1: the later module
// made it). Gradients alive at the end (the block input's) are the caller's.
struct BackwardEvent {
  enum Kind : std::uint8_t { WeightGrad, Grad, FreeGrad, Workspace, Release, Unpack };
  Kind kind = Grad;
  int grad = -1;      // Grad / FreeGrad: the gradient's number, 0, 1, ... in creation order
  // Release / Unpack: the saved storage. Grad: the saved storage the gradient is written into (GradRule::IntoSaved:
  // the saved tensor's memory becomes the gradient, nothing is allocated); -1 for a new gradient.
  int storage = -1;
  Bytes bytes = 0;
  int op = -1;        // the tape op whose backward it belongs to (-1: the incoming gradient)
  // Release, Unpack, and a Grad written into a saved storage: its index among the kept storages (BlockMemory::saved) or
  // among the recomputed ones (the recompute list), set by the readers.
  int saved = -1, recomputed = -1;
};

class AutogradTape {
 public:
  // The block input, created outside. It does not require grad before the step's first trainable weight
  // (a frozen embedding's output, frozen blocks' outputs): then nothing the block does before its own first
  // trainable weight records a graph (models/trainable.h).
  int input(const char* name, Bytes bytes, bool requires_grad = true);
  std::vector<int> add(const TapeOp& op);    // returns the output tensor ids
  int add1(const TapeOp& op) { return add(op).front(); }
  void hold(int tensor);    // a Python variable keeps the tensor until the last op added so far
  void output(int tensor);  // the block output: alive until the block ends

  const std::vector<TapeOp>& ops() const { return ops_; }
  const std::vector<TapeTensor>& tensors() const { return tensors_; }
  const std::vector<TapeStorage>& storages() const { return storages_; }
  int first_output(int op) const { return first_out_[static_cast<std::size_t>(op)]; }
  // Whether op `op` records a graph node (an input or its weight requires grad): only such an op saves.
  bool records(int op) const { return records_[static_cast<std::size_t>(op)] != 0; }
  // Whether the block output requires grad: the block has a backward at all.
  bool has_graph() const;
  int input_tensor() const { return input_; }
  int output_tensor() const { return output_; }

  // Policies. eager: what autograd saves, released after the earliest saver's backward.
  TapePolicy eager_policy() const;
  // torch.utils.checkpoint around the block: keeps the input only, and nothing when the block records no
  // graph (torch/utils/checkpoint.py `_checkpoint_without_reentrant_generator`: the inputs are kept by
  // `_NoopSaveInputs` on the frame that the packed saved tensors' hooks reference; a block that packs no
  // saved tensor leaves nothing referencing the frame after its forward, and nothing to recompute).
  // Compiled (`inner` a compiled policy), it also keeps the outputs of the ops that escape the checkpoint
  // (TapeOp::escapes_checkpoint) that the backward reads, directly or through ops the recompute reruns.
  TapePolicy full_checkpoint_policy(const TapePolicy& inner) const;
  // The same without the escaping ops: the block input alone (the base of op-level SAC).
  TapePolicy checkpoint_input_only(const TapePolicy& inner) const;
  // torch.utils.checkpoint around the compiled block (`inner` the compiled policy): the block input alone
  // kept, the compiled saved set alive to the end of the forward (TapePolicy::needed_live_to_forward_end).
  TapePolicy checkpoint_around_compiled(const TapePolicy& inner) const;
  // Keeps (p.kept) the outputs of the `saving` ops (one flag per op) that the backward reads, directly or through
  // the ops the recompute reruns.
  void keep_what_backward_reads(TapePolicy& p, const std::vector<char>& saving) const;
  // torchtitan's op-level SAC (torchtitan/distributed/activation_checkpoint.py, SelectiveAC._wrap_block):
  // keeps the input and the outputs of the ops it saves.
  TapePolicy selective_op_policy(const TapePolicy& inner) const;
  // inductor's min-cut partitioner on the block (torch/_functorch/partitioners.py,
  // min_cut_rematerialization_partition): see autograd_tape.cpp.
  TapePolicy compiled_policy() const;

  TapeCost cost(const TapePolicy& p) const;
  // The forward's allocations and frees under policy p, in op order: the block input first (kept, or a
  // temporary the block holds until its last use), then each op's new storages (views share their base;
  // a zero-byte storage, fused away, is left out) and workspace, then the temporaries that die at that op.
  // Temporaries still alive at the end (the block output) are not freed here: the caller frees them when
  // the block's forward ends.
  std::vector<ForwardEvent> forward_events(const TapePolicy& p) const { return events(p, false); }
  // A checkpointed block's recompute (p.recompute), in op order: the storages the policy did not keep are
  // created again; those the backward needs (p.needed) stay (Kept events: the recomputed saved tensors), the
  // others are temporaries freed at their last use, the recomputed block output as soon as it is made.
  // Empty without a recompute.
  std::vector<ForwardEvent> recompute_events(const TapePolicy& p) const { return events(p, true); }
  // The backward's events under policy p (after the recompute, whose saved tensors it releases): cost()'s
  // backward peaks are the running sums' maxima over them. Empty when the block has no graph.
  std::vector<BackwardEvent> backward_events(const TapePolicy& p) const;

 private:
  // Per forward op, the storages whose last use it is (inductor's fused kernels extend their inputs' lives).
  std::vector<std::vector<int>> forward_deaths(const TapePolicy& p) const;
  std::vector<ForwardEvent> events(const TapePolicy& p, bool recompute) const;
  // A workspace an op needs while it runs (0 for a fused pointwise op when compiled).
  static Bytes op_workspace(const TapeOp& op, const TapePolicy& p, bool forward);
  // Whether op `op`, recording a graph, saves its input `k` (TapeIn::saved under its SaveIf condition).
  bool saves_input(std::size_t op, std::size_t k) const;

  std::vector<TapeOp> ops_;
  std::vector<int> first_out_;  // per op: its first output tensor (an op's outputs are consecutive)
  std::vector<char> records_;   // per op: records a graph node (records())
  std::vector<TapeTensor> tensors_;
  std::vector<TapeStorage> storages_;
  int input_ = -1;
  int output_ = -1;
};

}  // namespace fsdpsim::models

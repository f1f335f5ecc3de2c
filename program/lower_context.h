// Internals shared by the FSDP1 and FSDP2 lowerings (program/lower_fsdp1.cpp, program/lower_fsdp2.cpp):
// per-unit sizes (padding rules M1, M6), the forward segment order, kernel lists computed once per
// lowering, activation sizes, process-group shapes, and a small builder that appends ops in CPU
// issue order (see program/step_program.h for the program semantics).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "models/implementation.h"
#include "models/kernels.h"
#include "models/model_spec.h"
#include "models/trainable.h"
#include "models/wrap_graph.h"
#include "program/lowering.h"
#include "program/plan.h"
#include "program/step_program.h"

namespace fsdpsim::sim::lowering {

// Element counts of one FSDP unit on this rank (numel, not bytes).
struct UnitSizes {
  std::int64_t params = 0;          // P_u: parameters of the unit (unpadded)
  std::int64_t trainable = 0;       // parameters that receive gradients
  std::int64_t shard = 0;           // sharded param numel per rank, padded (FSDP1 _local_shard, FSDP2 _sharded_param_data)
  std::int64_t unsharded = 0;       // N * shard: _full_param_padded / FSDP2 all-gather output and unsharded storage
  std::int64_t grad = 0;            // unsharded gradient autograd produces (FSDP1: flat grad; FSDP2: trainable, unpadded)
  std::int64_t rs_input = 0;        // reduce-scatter input numel (padded to N * grad_shard)
  std::int64_t grad_shard = 0;      // reduce-scatter output / sharded gradient numel
  std::int64_t optim = 0;           // numel per optimizer state (trainable, sharded)
  bool needs_pad = false;           // FSDP1: grad % N != 0 -> F.pad copy before the reduce-scatter (F1.10)
  // QLoRA (lora.quantize_base nf4, FSDP2): the part of `shard` / `unsharded` (numel) stored as NF4Tensors, and
  // its bytes (models/nf4.h); every other element takes the bytes of its dtype. FSDP1 (bitsandbytes): the packed
  // codes are ordinary flat-parameter elements; their QuantState, outside FSDP, is on every rank whole.
  Bytes nf4_replicated_bytes = 0;
  std::int64_t nf4_shard = 0, nf4_unsharded = 0;
  Bytes nf4_shard_bytes = 0, nf4_unsharded_bytes = 0;
  Bytes shard_bytes(Bytes per_elem) const { return (shard - nf4_shard) * per_elem + nf4_shard_bytes; }
  Bytes unsharded_bytes(Bytes per_elem) const { return (unsharded - nf4_unsharded) * per_elem + nf4_unsharded_bytes; }
};

// FSDP1 FlatParameter layout (M1): use_orig_params aligns each tensor to 16 bytes of the flat dtype and
// pads the whole to a multiple of N; otherwise the flat param is unpadded and each shard is ceil(P/N).
// Frozen tensors (`ts`, models/trainable.h): the FlatParameter requires grad when any of its tensors does
// (`_validate_tensors_to_flatten`: "the logical OR over each tensor's value"); then its gradient is the
// whole flat one (M13), else there is none. Optimizer state: the trainable tensors' part of this rank's
// shard (use_orig_params: the optimizer steps the original parameters' sharded views; rank 0's shard holds
// the flat parameter's first elements), the whole shard of a unit that trains without use_orig_params
// (FSDP1 then needs one requires_grad per unit: a unit with a trainable tensor is taken to train whole).
// A unit described only by its count (no tensor list) takes trainable_fraction of it.
// `orig_param_shards` (use_orig_params, a listed unit): receives the numel of each trainable tensor's part of
// rank 0's shard, in flat order (the original parameters the optimizer steps), the empty ones left out.
// `flat_tensors` (a listed unit only): the tensors flattened into its FlatParameter, in flatten order, each with
// the depth of the module that registers it (dots in its name); LoRA adapters flattened inline take their weight's.
struct FlatTensor {
  std::int64_t numel = 0;
  int depth = 0;
};
UnitSizes fsdp1_unit_sizes(const models::FsdpUnit& u, int shard_size, Dtype flat_dtype, bool use_orig_params,
                           const models::TrainableSet& ts, double unit_fraction = 1.0,
                           std::vector<std::int64_t>* orig_param_shards = nullptr,
                           std::vector<FlatTensor>* flat_tensors = nullptr);
// FSDP2 per-parameter dim-0 padding (M6): each tensor's local chunk is ceil(dim0/N) rows; only trainable
// tensors get gradients, reduce-scatter inputs and optimizer state (D5). `param_shards` receives each
// trainable listed tensor's chunk, then each adapter's (the parameters the optimizer steps); `all_shards`
// every parameter's chunk in the same order (trainable or not; left empty for a unit known by its count).
UnitSizes fsdp2_unit_sizes(const models::FsdpUnit& u, int shard_size, const models::TrainableSet& ts,
                           double unit_fraction = 1.0, std::vector<std::int64_t>* param_shards = nullptr,
                           std::vector<std::int64_t>* all_shards = nullptr);
// `unit_fraction` (both): the unit's entry of unit_trainable_fractions: 0 for a unit of plan.frozen_units
// (nothing of it trains: no gradient, reduction or optimizer state); a unit known by its count alone trains
// that fraction of itself.

// What autograd sees in each part of the step under the plan's trainable set (models/trainable.h):
//  * FSDP2: each parameter's own requires_grad (the unsharded parameter is nn.Parameter(...,
//    requires_grad=sharded_param.requires_grad): torch/distributed/fsdp/_fully_shard/_fsdp_param.py
//    FSDPParam.init_unsharded_param);
//  * FSDP1: the forward computes with views of the unit's FlatParameter (_flat_param.py
//    FlatParamHandle._use_unsharded_views, as_params=False: `split.view(shape)`, no per-view detach), which
//    require grad when the FlatParameter does, i.e. when any tensor of the unit trains: every weight of such
//    a unit gets its gradient and its linears save their inputs; a unit with none is frozen whole;
//  * the first block's input requires grad when the embedding trains, or with checkpoint(FSDP(block))
//    (activation_checkpointing.outside_fsdp), whose reentrant checkpoint needs an input that requires grad
//    (Hugging Face's enable_input_require_grads; scripts/torch_memory/train.py sets it the same way); each
//    later block's when an earlier block has a trainable weight.
struct GradFlows {
  models::GradFlow embedding, final_part;      // the embedding's; the final norm's and LM head's
  std::vector<models::GradFlow> layers;        // per block
  double matmul_trained = 1.0;                 // models::trained_matmul_fraction of the effective set
};
GradFlows grad_flows(const models::ModelSpec& m, const models::WrapGraph& g, const Plan& plan,
                     const models::TrainableSet& ts);
// The trainable fraction of each unit: 0 for plan.frozen_units (InputError for a name that is no unit),
// else the plan's trainable_fraction spread over the other units (min(1, f * P / P_not_frozen)).
std::vector<double> unit_trainable_fractions(const models::WrapGraph& graph, const Plan& plan);
// The plan's LoRA adapters as models:: sees them (rank 0 without `lora`); InputError for a target the model
// has not (gate on a plain MLP, the MLP of a mixture of experts) or a rank above an adapted matrix's side.
models::LoraShape lora_shape(const models::ModelSpec& m, const Plan& plan);
// The plan's trainable set (models::trainable_set, or models::lora_trainable_set with `lora`), with the blocks of plan.frozen_units' units frozen
// (the harness freezes them after freeze_to_fraction).
models::TrainableSet plan_trainable_set(const models::ModelSpec& m, const models::WrapGraph& graph, const Plan& plan);
// Every unit's sizes under the plan and its trainable set (FSDP1 or FSDP2 layout, frozen units with no gradient).
std::vector<UnitSizes> plan_unit_sizes(const models::WrapGraph& graph, const Plan& plan, int shard_size,
                                       const models::TrainableSet& ts);

// One piece of forward compute in execution order: the embedding, each block, the final norm + head.
struct Segment {
  models::ModulePart part = models::ModulePart::Block;
  int layer = -1;
  int unit = 0;                     // the innermost FSDP unit whose params this compute uses
};

struct GroupShape {
  int size = 1;
  int nodes = 1;
};

// Where the lowering was when it created ops and buffers (Builder::site). The stretch
// (sim/stretch.h) lines up the programs of one model with different numbers of layers by it: the
// ops and buffers a transformer block's site creates repeat, block after block.
enum class SitePhase : std::int8_t { Persistent, Forward, Backward, Step };
struct Site {
  int mb = -1;                              // micro-batch (-1: outside the micro-batch loop)
  SitePhase phase = SitePhase::Persistent;
  int layer = -1;                           // the transformer block (-1: a site that is not one block)
};
// The ops [op_begin, next group's op_begin) and buffers [buf_begin, next's buf_begin) created at `site`.
struct SiteGroup {
  Site site;
  int op_begin = 0, buf_begin = 0;
};

// What the optimizer step works on (sums over the units): computed from Context::sizes, or given for
// a lowering of fewer layers than the model has (the stretch).
struct StepTotals {
  std::int64_t optim = 0;    // optimizer-state numel per state (trainable, sharded), all units
  std::int64_t shard = 0;    // sharded param numel, all units
  int groups = 0;            // units with optimizer state
  Bytes step_bytes = 0;      // what the optimizer step reads and writes (program/optimizer_state.h optimizer_step_bytes)
  int state_tensors = 0;     // the tensors it steps (a low-bit optimizer launches a kernel for each)
};

// What the LM head's output and the loss allocate (issue 19 item 1; fsdp-semantics.md §9), for one
// micro-batch of T tokens, V = vocabulary, e = compute-dtype bytes. The chain of
// cross_entropy(logits.float(), labels) as autograd runs it (tools/autograd/derivatives.yaml):
//   forward   logits [T, V] (e) -> .float() copy (4, freed when cross_entropy returns) -> _log_softmax
//             output (4, saved for backward) -> nll_loss (a scalar)
//   backward  nll_loss_backward: a dense zero-filled gradient (4) -> _log_softmax_backward_data: a new
//             gradient (4), then the nll gradient and the saved output are released -> the .float()'s
//             backward: a copy in the compute dtype (e) -> the head's matmul backward.
// Without the upcast (litgpt under bf16-true) the same chain runs at e bytes. A fused cross-entropy
// (flash-attn's, llm-foundry's default) saves the logits and a per-token logsumexp and writes the logits'
// gradient in its backward; a fused linear cross-entropy (Liger) never materializes the logits: it keeps
// the head input's gradient (T x C, e) from the forward and one fp32 chunk of logits while it runs.
// torchtune's chunked loss (Chunked, chunked_output below) runs the same chain per sequence chunk, on logits
// the head produced chunk by chunk.
struct LossMemory {
  models::LossImpl impl = models::LossImpl::Torch;
  Bytes logits = 0;              // held from the head's forward (Torch, Fused: T*V*e; FusedLinear: T*C*e + T*4)
  Bytes upcast = 0;              // Torch: the fp32 copy (0 without upcast or for fp32 logits)
  Bytes saved = 0;               // Torch: log_softmax output; Fused: the logsumexp (T*4); FusedLinear: 0
  Bytes forward_transient = 0;   // FusedLinear: one chunk of fp32 logits
  Bytes weight_grad = 0;         // FusedLinear: the head weight's gradient, computed in the forward (V*C*e)
  Bytes input_grad = 0;          // FusedLinear: the head input's gradient, computed in the forward (T*C*e, in logits)
  Bytes nll_grad = 0, lsm_grad = 0;   // Torch: the two loss-backward gradients (the saved output's size)
  Bytes logits_grad = 0;         // the gradient the head's backward reads (Torch with upcast: e; Fused: e)
  bool inside_model = false;     // computed in the model's forward (HF with labels): before the root's post-forward
  bool free_logits = false;      // the training loop frees the logits before backward (torchtitan `del pred`)
  bool in_head_op = false;       // the bundled runtime: logits and loss live inside the head's op (one buffer)
  // Torch loss over row chunks (litgpt's chunked_cross_entropy, models::loss_chunk_rows): the saved
  // log-probabilities and both loss-backward gradients come one chunk at a time (row_bytes per row, the
  // totals above are the sums), then the chunks' gradients are concatenated into logits_grad.
  std::int64_t rows = 0;         // T = micro_batch * seq_len
  std::int64_t chunk_rows = 0;   // rows per chunk (0: not chunked)
  Bytes row_bytes = 0;           // one row of log-probabilities / gradient: V * (4 with upcast, else e)
  int chunks() const { return chunk_rows > 0 ? static_cast<int>((rows + chunk_rows - 1) / chunk_rows) : 0; }
  std::int64_t rows_of(int i) const { return std::min<std::int64_t>(chunk_rows, rows - i * chunk_rows); }
  Bytes chunk_bytes(int i) const { return rows_of(i) * row_bytes; }
  // torchtune's chunked output (LossImpl::Chunked; torchtune 30b8519e): TransformerDecoder.chunked_output
  // projects each of the chunks of h.chunk(num_output_chunks, dim=1) apart, so the logits are chunks()
  // tensors of rows_of(i) rows (micro_batch x ceil(seq_len / chunks) each, the last one shorter), and
  // CEWithChunkedOutputLoss.compute_cross_entropy runs F.cross_entropy(logits.float(), ...) on each in
  // turn. Per row (bytes): the head's output chunk, the .float() copy, the head input's gradient.
  bool chunked_output = false;
  Bytes logits_row = 0;          // V * e
  Bytes upcast_row = 0;          // V * 4 (0 for fp32 logits: .float() returns the tensor itself, no node)
  Bytes head_in_grad_row = 0;    // C * e: the chunk's grad_input from the head's matmul backward
  // When the head weight trains: the first chunk's weight gradient becomes the unit's .grad (AccumulateGrad
  // steals it); every later chunk's matmul backward returns a new V x C gradient (e) that AccumulateGrad adds
  // in place (torch/csrc/autograd/functions/accumulate_grad.h, `variable_grad += new_grad`), then frees.
  Bytes head_weight_grad = 0;
};
// torchtune's activation offloading (plan.activation_offloading; program/lower_walk.cpp "activation offloading")
// packs every tensor autograd saves inside the model's forward. Beside each checkpointed block's input, the block's
// checkpoint saves the rotary tables the recipe passes every block (torch.utils.checkpoint's non-reentrant
// _NoopSaveInputs saves all tensor arguments): HF's and litgpt's cos and sin (S x rope dims, compute dtype; HF
// transformers' layers also get position_ids and cache_position, int64 per position, which the recipe here does not
// count), torchtitan's complex64 freqs_cis (S x rope dims / 2 x 8 B). A loss computed in the model's forward
// (LossMemory::inside_model, cross_entropy torch) is packed too: _log_softmax's result and nll_loss's self (the same
// fp32 log-probabilities, packed twice, two copies), its target (int64 per token) and total_weight (a scalar).
// Every tensor takes a pack id; only one of at least min_offload_size is copied (kMinOffloadBytes).
constexpr Bytes kMinOffloadBytes = 1024;   // torchtune's OffloadActivations default min_offload_size
struct OffloadPacks {
  int rope = 0;              // tensors per block beside its input (pack ids)
  int rope_copied = 0;       // of them, those copied (rope, or 0 when each is under kMinOffloadBytes)
  Bytes rope_bytes = 0;      // each of them
  bool loss = false;         // the loss's saved tensors are packed
  Bytes loss_target = 0;     // nll_loss's saved target when it is copied (0 under kMinOffloadBytes)
};
OffloadPacks offload_packs(const models::ModelSpec& m, const Plan& plan, const LossMemory& l);

// `head_trains`: the LM head's weight requires grad (a fused linear cross-entropy then computes its gradient).
LossMemory loss_memory(const models::ModelSpec& m, const Plan& plan, bool head_trains = true);
// Refuses (InputError "plan.optimizer") a plan whose optimizer is not modelled with it (optimizer_not_modelled).
void check_optimizer(const Plan& plan);

// Storage recycled from one lowering to the next, owned by the caller (a sim::Simulator keeps one).
// A lowered llama3-70b step has ~2,300 ops, each with up to seven small vectors, and ~2,000 buffers:
// building them from scratch (allocating, zeroing, formatting, then freeing) was most of the lowering.
// The Builder instead overwrites a spent program's ops and buffers in place: every field of a reused op
// is assigned (vectors cleared, keeping their capacity), so a recycled program is identical to a fresh
// one. It also keeps the Context's vectors (rebuilt for every plan: only their capacity carries over) and
// the kernel lists of the most recent (model, shape) pairs (see kernel_lists). Not thread-safe: one
// thread uses it at a time.
struct Context;
struct KernelListCache;
struct OpRecycler {
  OpRecycler();
  ~OpRecycler();
  OpRecycler(const OpRecycler&) = delete;
  OpRecycler& operator=(const OpRecycler&) = delete;
  std::vector<Op> ops;           // a spent program's ops (all constructed), reused in place
  std::vector<Buffer> buffers;   // its buffers, likewise
  std::unique_ptr<Context> spare;              // a Context's storage between lowerings
  bool spare_in_use = false;                   // (a nested lowering gets a fresh Context)
  std::unique_ptr<KernelListCache> kernels;    // kernel_lists' recent entries
};
// Hands a finished program's storage to `r` (the program is left empty).
void recycle(StepProgram& p, OpRecycler& r);

// Units grouped by forward segment, stored flat (one array and S + 1 offsets) rather than as one
// vector per segment: (*this)[s] lists segment s's units in their order.
struct UnitsBySegment {
  std::vector<int> start;   // start[s] .. start[s + 1]: segment s's slice of `units`
  std::vector<int> units;
  std::span<const int> operator[](int s) const {
    return {units.data() + start[s], static_cast<std::size_t>(start[s + 1] - start[s])};
  }
};

// Everything about the lowering that does not depend on the op sequence; computed once.
struct Context {
  const models::ModelSpec* model = nullptr;
  const models::WrapGraph* graph = nullptr;
  const Plan* plan = nullptr;
  Topology topo;
  int N = 1, R = 1, W = 1;          // shard, replicate, world sizes
  ShardingStrategy strategy = ShardingStrategy::FULL_SHARD;
  bool sharded = true;              // N > 1 (a 1-wide shard dim behaves as NO_SHARD)
  bool hybrid = false;              // R > 1 with N > 1: the HSDP all-reduce over the replicate group
  Bytes bp = 2, br = 4, bm = 4;     // param, reduce, master dtype bytes
  bool mixed = true;                // master dtype != param dtype: a cast before the all-gather (M3, D2)
  bool reduce_cast = true;          // reduce dtype != param dtype: gradient cast before reduction (F1.10, F2.9)
  int micro_batches = 1;
  std::vector<UnitSizes> sizes;     // per unit
  std::vector<std::vector<std::int64_t>> state_tensors;   // per unit: optimizer_state_tensors
  // Per unit: the sharded parameters' tensors (numel of each, in the unit's parameter order) where they are
  // tensors of their own: FSDP2's per-parameter shards (FSDPParam._sharded_param_data), outside the bundled
  // runtime; empty where the unit's shard is one tensor (FSDP1's FlatParameter) or known by its count.
  std::vector<std::vector<std::int64_t>> shard_tensors;
  // Per unit: the plan's reshard_after_forward after plan.module_overrides; the root's is unset (None)
  // unless an override names it (FSDP2's fully_shard leaves the root unsharded after forward: its backward
  // starts right away, F2.6).
  std::vector<ReshardAfterForward> reshard_after_forward;
  std::vector<Segment> segments;
  std::vector<int> first_seg, last_seg;      // per unit (root: whole forward)
  std::vector<int> forward_order;            // units in pre-forward order (root first)
  std::vector<int> backward_order;           // reverse post-forward order (root first)
  std::vector<int> forward_pos, backward_pos;  // position of a unit in the two orders
  // Per segment, the non-root units whose forward starts there (pre-forward order) and ends there
  // (post-forward order): the hooks that fire around that segment. Backward mirrors them.
  UnitsBySegment opening, closing;
  // Per segment, the units (root included) whose backward starts there, in backward order.
  UnitsBySegment backward_starts;
  // Kernel lists per part, computed once (index = static_cast<int>(ModulePart)) and shared by every
  // compute op of that part (Op::shared_kernels): no per-op copy, one cost computation per list.
  std::shared_ptr<const std::vector<models::KernelDesc>> fwd_kernels[3], bwd_kernels[3];
  // The plan's trainable set and what autograd sees in each part (grad_flows). Blocks with the same flow
  // share their lists: block_flows holds the distinct ones, layer_flow indexes them per layer, block_bwd
  // is each one's backward kernels (bwd_kernels[Block] is unused).
  models::TrainableSet trainable;
  GradFlows flows;
  std::vector<models::GradFlow> block_flows;
  std::vector<std::int16_t> layer_flow;
  std::vector<std::shared_ptr<const std::vector<models::KernelDesc>>> block_bwd;
  // A block's activation memory under one checkpointing mode (index = models::CheckpointMode), from the
  // implementation recipe (models::block_memory): the tensors it saves, the tensors a recompute re-creates
  // (the uncheckpointed block's saved tensors this mode does not keep), and the forward's and backward's
  // transients (backward_extra without the recomputed tensors, which the walk allocates one by one).
  // backward_with_grads / param_grads: the backward's transients when the op allocates the block's weight
  // gradients with it (models::BlockMemory::backward_extra_with_grads, without the recomputed tensors) and
  // those gradients' bytes as the tape counts them.
  struct BlockActivations {
    std::vector<models::SavedTensor> saved, recompute;
    std::vector<models::ForwardEvent> forward_events;   // the forward tensor by tensor (models::BlockMemory)
    // The recompute tensor by tensor (Kept events name their entry of `recompute`), and the incoming gradient
    // it holds for the backward (0 without recompute events: then backward_extra covers the recompute)
    std::vector<models::ForwardEvent> recompute_events;
    Bytes incoming_grad = 0;
    // The backward tensor by tensor (models::BlockMemory::backward_events): a Release, or a gradient written into
    // a saved storage, names its entry of `saved` or of `recompute` (BackwardEvent::recomputed).
    std::vector<models::BackwardEvent> backward_events;
    Bytes forward_extra = 0, backward_extra = 0;
    Bytes backward_with_grads = 0, param_grads = 0;
  };
  std::vector<BlockActivations> block_acts;   // [block flow * 3 + mode] (only the pairs some layer uses)
  const BlockActivations& acts(int layer) const {
    return block_acts[static_cast<std::size_t>(layer_flow[layer]) * 3 + static_cast<std::size_t>(layer_mode[layer])];
  }
  models::BlockMemory final_norm;   // the final norm's saved tensors and transients
  // The same as a block's activations (saved tensors, forward and backward tensor by tensor), for the head's
  // backward tensor by tensor (program/lower_walk.cpp, the head's backward).
  BlockActivations final_norm_acts;
  // What the embedding segment saves for its backward: the embedding dropout's 1-byte mask (GPT-2's
  // GPT2Model.drop after wte + wpe) when the model has embd_dropout and the embedding trains; else empty.
  std::vector<models::SavedTensor> embedding_saved;
  std::vector<std::int8_t> layer_mode;   // per layer: its models::CheckpointMode
  // The block's recompute under each checkpointing mode (index = static_cast<int>(models::CheckpointMode);
  // None: empty). A Recompute op of layer l runs rec_kernels[layer_checkpoint_mode(ac, l)].
  std::shared_ptr<const std::vector<models::KernelDesc>> rec_kernels[3];
  std::vector<Bytes> act_saved;     // per layer: bytes the block keeps for backward under its AC mode
  std::vector<Bytes> act_recompute; // per layer: bytes recomputation re-creates (0 if not checkpointed)
  LossMemory loss;                  // the head's output and the loss, forward and backward
  GroupShape shard_group, replicate_group, world_group, post_forward_group;
  int optimizer_states = 2;
  std::vector<const char*> notes;   // string literals (copied into StepProgram::notes by fill_facts)
  OpRecycler* recycler = nullptr;   // optional storage to reuse (see OpRecycler)
  // false: a program for the simulator alone (simulate() without a trace): ops and buffers get empty
  // names and ops no inputs/outputs. Names only label traces and error messages; inputs/outputs are
  // read by the runtimes and the tests' race checks, never by the executor.
  bool full = true;
  // If set, receives the program's site groups (Builder::site), in creation order.
  std::vector<SiteGroup>* sites = nullptr;
  // If set, the optimizer step uses these totals instead of the sums over `sizes`.
  const StepTotals* step_totals = nullptr;
};
// The checkpointing mode of transformer block `layer` under the plan's activation checkpointing
// (every_<k>: torchtitan's layer SAC, every k-th block fully checkpointed, A4).
models::CheckpointMode layer_checkpoint_mode(const ActivationCheckpointing& ac, int layer);
// How the plan's model code runs, for the kernel lists (implementation, compile, float8, the
// checkpoint's early stop): models/kernels.h KernelOptions.
models::KernelOptions kernel_options(const Plan& plan);
// The sums the optimizer step uses, over c.sizes.
StepTotals step_totals(const Context& c);
// Adds `copies` times unit u's share to `t` (the stretch adds the units of the blocks it does not lower).
void add_unit_step_totals(const Context& c, int u, std::int64_t copies, StepTotals& t);
// The optimizer-state tensors of unit u (numel of each; torch.optim keeps a state per parameter it steps):
// FSDP2's sharded parameters one by one (fsdp2_unit_sizes), FSDP1 use_orig_params' original parameters'
// parts of the shard (fsdp1_unit_sizes); FSDP1's FlatParameter shard, and the bundled runtime's, as one.
std::vector<std::int64_t> optimizer_state_tensors(const Context& c, int u);
// The same for one unit of a plan with `optim` state elements per state (UnitSizes::optim): the tensors the
// optimizer steps on a rank (per parameter under FSDP2 and FSDP1 use_orig_params, else the FlatParameter).
std::vector<std::int64_t> optimizer_state_tensors(const models::FsdpUnit& unit, const Plan& plan, int N,
                                                  const models::TrainableSet& ts, std::int64_t optim);
// FSDP2's sharded parameters of unit u, one numel per tensor (Context::shard_tensors).
std::vector<std::int64_t> fsdp2_shard_tensors(const Context& c, int u);
// FSDP1's FlatParameters of unit u in the order FSDP1 constructs them: with LoRA without use_orig_params the
// adapters' one first (a unit of its own, nested in the block's: auto-wrap wraps children first; its shard part of
// UnitSizes::shard, allocated apart), then the unit's own. Each with its shard's bytes and the original
// parameters it is flattened from (bytes in the master dtype, in the order FSDP1 materializes them; none for a unit
// known by its count): StepProgram::init_originals.
struct Fsdp1FlatParam {
  Bytes bytes = 0;
  std::vector<Bytes> originals;
};
std::vector<Fsdp1FlatParam> fsdp1_flat_params(const Context& c, int u);
// The LoRA adapter matrices unit u holds (each block's, then the head's), after its own tensors in FSDP2's
// per-parameter lists: (numel, dim 0) of each.
std::vector<std::pair<std::int64_t, std::int64_t>> unit_adapters(const Context& c, int u);
// A unit's first layer if it is not the root and holds whole transformer blocks only, else -1.
int block_unit_layer(const models::FsdpUnit& unit);
// The site layer of unit u's persistent buffers (block_unit_layer of it).
inline int unit_site_layer(const Context& c, int u) { return block_unit_layer(c.graph->units[u]); }
// The site layer of forward segment s: its block's layer, or -1 (embedding, final norm and head).
inline int segment_site_layer(const Context& c, int s) {
  return c.segments[s].part == models::ModulePart::Block ? c.segments[s].layer : -1;
}

// Fills `c`, a default-constructed Context except that its vectors may hold a previous lowering's
// elements (their storage is reused: every vector is cleared or assigned here; see lower_with).
void make_context(Context& c, const models::ModelSpec& model, const models::WrapGraph& graph, const Plan& plan,
                  const Topology& topo);
// Exchanges the vectors of two Contexts (storage recycling; the scalars stay).
void swap_storage(Context& a, Context& b);

// Short names ("AG u12": `what` cut to 10 characters, " u", the unit) stay within std::string's
// small-buffer size: no heap allocation per op. set_short_name writes one into `out` (and leaves it
// alone when it already holds that name, as a recycled op of the same program shape does).
std::string short_name(std::string_view what, int unit);
void set_short_name(std::string& out, std::string_view what, int unit);

// Appends ops in CPU issue order. Waits recorded with `defer_wait` attach to the next op issued on
// that stream (wait_stream / wait_event on a stream, then later work on it); `defer_hook` charges an
// FSDP hook to the next op the CPU issues; `defer_cpu_wait` makes the CPU block before the next op.
// With a recycler the program's vectors start with a spent program's elements, overwritten in place;
// finish() drops the ones left over, so until then use last_op()/num_buffers(), not the vectors' sizes.
class Builder {
 public:
  explicit Builder(StepProgram& p, OpRecycler* recycler = nullptr, bool full = true,
                   std::vector<SiteGroup>* sites = nullptr);
  int add_stream(StreamRole role, const char* name);
  // Every op and buffer created from now on belongs to `site` (with a `sites` vector: a new group).
  void site(int mb, SitePhase phase, int layer) {
    if (sites_) sites_->push_back(SiteGroup{Site{mb, phase, layer}, num_ops_, num_buffers_});
  }
  // buffer, op and compute_op run ~4,000 times per lowering: they are defined here, so that the common
  // case (a recycled element: a few dozen stores) costs at most one call, and only a fresh element
  // goes out of line (new_buffer, new_op).
  int buffer(std::string_view what, int unit, Bytes bytes, MemCategory cat, int pool, bool persistent = false) {
    const int id = num_buffers_++;
    Buffer& b = id < buffers_size_ ? prog_.buffers[id] : new_buffer();
    b.id = id;
    name(b.name, what, unit);
    b.bytes = bytes;
    b.category = cat;
    b.unit = unit;
    b.pool_stream = pool;
    b.persistent = persistent;
    b.first_step_lazy = false;
    b.after_construction = false;
    b.init_originals = -1;
    return id;
  }
  Op& op(OpKind kind, int stream, int unit, int micro_batch, std::string_view what) {
    Op& o = next_op(kind, stream, unit, micro_batch, what);
    if (o.shared_kernels) o.shared_kernels.reset();
    return o;
  }
  // A compute op running `kernels` (Op::shared_kernels).
  Op& compute_op(OpKind kind, int stream, int unit, int micro_batch, std::string_view what,
                 const std::shared_ptr<const std::vector<models::KernelDesc>>& kernels) {
    Op& o = next_op(kind, stream, unit, micro_batch, what);
    o.shared_kernels = kernels;   // no reference-count traffic when a recycled op already holds this list
    return o;
  }
  // The buffers an op reads and writes (Op::inputs, Op::outputs): left out of a simulator-only program.
  void read(Op& o, int buf) {
    if (full_) o.inputs.push_back(buf);
  }
  void write(Op& o, int buf) {
    if (full_) o.outputs.push_back(buf);
  }
  void wait(Op& o, int op_id) {
    if (op_id >= 0) o.waits.push_back(op_id);
  }
  // The stream `s` waits on everything issued so far on stream `on` (torch wait_stream).
  void defer_wait(int s, int op_id) {
    if (op_id >= 0) pending_waits_[s].push_back(op_id);
  }
  void defer_wait_stream(int s, int on) { defer_wait(s, last_on(on)); }
  void defer_hook(int n = 1) { pending_hooks_ += n; }
  void defer_cpu_wait(int op_id) {
    if (op_id >= 0) pending_cpu_waits_.push_back(op_id);
  }
  // Frees `buf` at the current CPU point (after the last issued op was enqueued).
  void free_now(int buf, int reuse_after_op = -1) {
    if (buf < 0 || num_ops_ == 0) return;
    prog_.ops[num_ops_ - 1].frees.push_back({buf, reuse_after_op});
  }
  int last_on(int stream) const { return last_on_stream_[stream]; }
  int buffer_pool(int buf) const { return prog_.buffers[buf].pool_stream; }
  int last_op() const { return num_ops_ - 1; }
  int num_buffers() const { return num_buffers_; }
  Op& at(int id) { return prog_.ops[id]; }
  // Marks a persistent buffer as created inside the first step (Buffer::first_step_lazy).
  void first_step_lazy(int buf) { prog_.buffers[buf].first_step_lazy = true; }
  // Marks a persistent buffer as made by the training loop after the model's construction (Buffer::after_construction).
  void after_construction(int buf) { prog_.buffers[buf].after_construction = true; }
  // Drops the recycled elements this program did not reuse. Call once, after the last op/buffer.
  void finish();

 private:
  // Every field of step_program.h's Op is assigned here (a reused op must not keep its old values):
  // update this function when Op gains a field. Forced inline into op() and compute_op() (which g++
  // keeps out of line; forcing them into their ~40 call sites too saved little for ~10 KB of code):
  // one call per op instead of two, ~2 KB more code per lowering file.
#if defined(__GLIBCXX__)
  static_assert(sizeof(void*) != 8 || sizeof(Op) == 288, "sim::Op changed: update Builder::next_op");
#endif
  [[gnu::always_inline]] Op& next_op(OpKind kind, int stream, int unit, int micro_batch, std::string_view what) {
    const int id = num_ops_;
    Op* o;
    if (id < ops_size_) {
      o = &prog_.ops[id];   // a recycled op: reset what the new one does not set below
      o->waits.clear();
      o->cpu_waits.clear();
      o->allocs.clear();
      o->frees.clear();
      o->inputs.clear();
      o->outputs.clear();
      o->kernels.clear();
      o->comm_bytes = 0;
      o->group = CommGroup::Shard;
      o->group_size = 1;
      o->nodes_spanned = 1;
      o->copy_bytes = 0;
      o->params = 0;
      o->kernel_launches = 1;
    } else {
      o = &new_op();   // default-constructed: the fields above already hold those values
    }
    ++num_ops_;
    o->id = id;
    o->kind = kind;
    o->stream = stream;
    o->unit = unit;
    o->micro_batch = micro_batch;
    name(o->name, what, unit);
    // Copied (not moved) so that both the op's recycled vector and the pending list keep their capacity;
    // element by element, as the lists hold one to three ids.
    std::vector<int>& pending = pending_waits_[stream];
    if (!pending.empty()) {
      for (int w : pending) o->waits.push_back(w);
      pending.clear();
    }
    if (!pending_cpu_waits_.empty()) {
      for (int w : pending_cpu_waits_) o->cpu_waits.push_back(w);
      pending_cpu_waits_.clear();
    }
    o->cpu_hooks = pending_hooks_;
    pending_hooks_ = 0;
    last_on_stream_[stream] = id;
    return *o;
  }
  Op& new_op();           // appends a default-constructed op
  Buffer& new_buffer();   // appends a default-constructed buffer

  void name(std::string& out, std::string_view what, int unit) {
    if (full_) set_short_name(out, what, unit);
    else out.clear();
  }

  StepProgram& prog_;
  bool full_ = true;
  std::vector<SiteGroup>* sites_ = nullptr;
  int num_ops_ = 0, num_buffers_ = 0;
  int ops_size_ = 0, buffers_size_ = 0;   // prog_.ops.size(), prog_.buffers.size() (recycled + appended)
  std::vector<int> last_on_stream_;
  std::vector<std::vector<int>> pending_waits_;
  std::vector<int> pending_cpu_waits_;
  int pending_hooks_ = 0;
};

// Shared pieces of both lowerings.
void add_optimizer_step(const Context& c, Builder& b, StepProgram& p, const std::vector<int>& optim_bufs,
                        const std::vector<int>& grad_bufs,
                        const std::vector<int>& param_bufs, int compute_stream);
void fill_facts(const Context& c, StepProgram& p);

// lower() with optional recycled storage and, with full = false, a simulator-only program (no op and
// buffer names, no inputs/outputs: see Context::full). simulate() asks for one when it records no trace.
StepProgram lower_with(const models::ModelSpec& model, const models::WrapGraph& graph, const Plan& plan,
                       const Topology& topo, OpRecycler* recycler, bool full = true);

// The source of a stretch (sim/stretch.h): lower() of `model` (the full model with fewer layers) for the
// simulator alone, recording the site groups in `sites`, with the optimizer step's totals of the model
// with `copies` more periods of the units whose layers lie in [first, first + period), and with
// `micro_batches` micro-batches (> 0; 0: the plan's grad_accum) where the plan has more.
StepProgram lower_for_stretch(const models::ModelSpec& model, const models::WrapGraph& graph, const Plan& plan,
                              const Topology& topo, OpRecycler* recycler, std::vector<SiteGroup>& sites, int first,
                              int period, int copies, int micro_batches = 0);

StepProgram lower_fsdp1(const Context& c);
StepProgram lower_fsdp2(const Context& c);

}  // namespace fsdpsim::sim::lowering

// Structural tests of the FSDP lowering on hand-built 2-4 block models: op sequences and streams per
// strategy and prefetch mode, waits, exact buffer sizes (padding), the ZeRO identity, communication
// volume, the rate limiter, activation checkpointing, no_sync, HSDP, offload and frozen params.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "common/errors.h"
#include "models/implementation.h"
#include "models/nf4.h"
#include "models/trainable.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "program/lower_context.h"
#include "program/lowering.h"
#include "program/program_check.h"
#include "test_lowering_fixtures.h"

namespace fsdpsim::sim {
namespace {

using namespace testing;

const Shapes kRoot = {{8, 4}, {4}, {8, 4}};    // 68 params
const Shapes kBlock = {{6, 4}, {3}};           // 27 params

// Structural invariants every program must satisfy: dependencies point backwards, a transient buffer
// is allocated once and freed once after it (none leaks past the step), persistent ones are never
// allocated or freed by ops, and reuse_after_op names an issued op.
void expect_well_formed(const StepProgram& p, const std::string& what) {
  std::vector<int> alloc_at(p.buffers.size(), -1), free_at(p.buffers.size(), -1);
  for (const auto& o : p.ops) {
    ASSERT_EQ(&o - p.ops.data(), o.id) << what;
    ASSERT_GE(o.stream, 0) << what;
    ASSERT_LT(o.stream, static_cast<int>(p.streams.size())) << what;
    for (int w : o.waits) ASSERT_TRUE(w >= 0 && w < o.id) << what << " op " << o.name;
    for (int w : o.cpu_waits) ASSERT_TRUE(w >= 0 && w < o.id) << what << " op " << o.name;
    // Data-moving ops read and write device buffers (a runtime executes them from these lists).
    switch (o.kind) {
      case OpKind::Cast: case OpKind::CopyIn: case OpKind::CopyOut: case OpKind::Pad: case OpKind::Divide:
      case OpKind::AllGather: case OpKind::ReduceScatter: case OpKind::AllReduce:
        EXPECT_FALSE(o.inputs.empty()) << what << " " << o.name << " (op " << o.id << ") reads no buffer";
        EXPECT_FALSE(o.outputs.empty()) << what << " " << o.name << " (op " << o.id << ") writes no buffer";
        break;
      default: break;
    }
    for (int b : o.allocs) {
      // (a persistent buffer is allocated by an op only when the first step creates it: optimizer state)
      ASSERT_TRUE(!p.buffers[b].persistent || p.buffers[b].first_step_lazy) << what << " " << p.buffers[b].name;
      ASSERT_EQ(alloc_at[b], -1) << what << " allocated twice: " << p.buffers[b].name;
      alloc_at[b] = o.id;
    }
    for (const auto& f : o.frees) {
      ASSERT_FALSE(p.buffers[f.buffer].persistent) << what;
      ASSERT_GE(alloc_at[f.buffer], 0) << what << " freed before alloc: " << p.buffers[f.buffer].name;
      ASSERT_EQ(free_at[f.buffer], -1) << what << " freed twice: " << p.buffers[f.buffer].name << " at " << o.name;
      ASSERT_LE(f.reuse_after_op, o.id) << what;
      if (is_free_inside_op(f.reuse_after_op)) {   // freed after the op's first k allocs
        const auto k = static_cast<std::ptrdiff_t>(allocs_before_free(f.reuse_after_op));
        ASSERT_TRUE(k >= 1 && k <= static_cast<std::ptrdiff_t>(o.allocs.size())) << what << " " << o.name;
        // a temporary of this op (allocated among those k), or a tensor an earlier op made (a block's input)
        if (alloc_at[f.buffer] == o.id) {
          ASSERT_NE(std::find(o.allocs.begin(), o.allocs.begin() + k, f.buffer), o.allocs.begin() + k)
              << what << " " << o.name << " frees " << p.buffers[f.buffer].name << " before allocating it";
        }
      }
      free_at[f.buffer] = o.id;
    }
  }
  for (const auto& b : p.buffers) {
    if (b.persistent) continue;
    EXPECT_GE(alloc_at[b.id], 0) << what << " never allocated: " << b.name;
    EXPECT_GE(free_at[b.id], 0) << what << " leaks past the step: " << b.name;
  }
}

TEST(LoweringFsdp2, FullShardSequenceStreamsAndBytes) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  StepProgram p = lower_hand(g, "{}", 4, 4);
  std::vector<std::string> names;
  for (const auto& s : p.streams) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"default", "all_gather_copy_in", "all_gather", "reduce_scatter"}));
  EXPECT_EQ(sequence(p, 1),
            (std::vector<std::string>{"cast@all_gather_copy_in", "copy_in@all_gather_copy_in", "all_gather@all_gather",
                                      "copy_out@default", "forward@default", "cast@all_gather_copy_in",
                                      "copy_in@all_gather_copy_in", "all_gather@all_gather", "copy_out@default",
                                      "backward@default", "copy_in@default", "reduce_scatter@reduce_scatter"}));
  // M6 dim-0 padding with N=4: [6,4] -> 2 rows x 4 = 8, [3] -> 1: shard 9, unsharded 36 elements.
  auto ags = ops_of(p, OpKind::AllGather, 1);
  ASSERT_EQ(ags.size(), 2u);
  EXPECT_EQ(ags[0]->comm_bytes, 36 * 2);
  EXPECT_EQ(ags[0]->group_size, 4);
  EXPECT_EQ(p.buffers[ags[0]->outputs[0]].bytes, 36 * 2);
  EXPECT_EQ(p.buffers[ags[0]->outputs[0]].pool_stream, 1);   // allocated on the copy-in stream
  auto rs = ops_of(p, OpKind::ReduceScatter, 1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0]->comm_bytes, 36 * 4);                       // reduce_dtype fp32, padded
  EXPECT_EQ(p.buffers[rs[0]->outputs[0]].bytes, 9 * 4);
  auto copy_out = ops_of(p, OpKind::CopyOut, 1);
  EXPECT_TRUE(waits_on(*copy_out[0], ags[0]->id));
  // The copy-out allocates each parameter's unsharded storage (FSDPParam.alloc_all_gather_outputs): [6,4]
  // padded to 2 rows x 4 ranks = 32 elements, [3] to 4: 64 and 8 bytes.
  ASSERT_EQ(copy_out[0]->allocs.size(), 2u);
  EXPECT_EQ(p.buffers[copy_out[0]->allocs[0]].bytes, 32 * 2);
  EXPECT_EQ(p.buffers[copy_out[0]->allocs[1]].bytes, 4 * 2);
  EXPECT_EQ(p.buffers[copy_out[0]->allocs[0]].category, MemCategory::UnshardedParams);
  // Root: 8+1+8 = 17 per rank; AG'd only in forward (not resharded after forward, F2.6).
  auto root_ags = ops_of(p, OpKind::AllGather, 0);
  ASSERT_EQ(root_ags.size(), 1u);
  EXPECT_EQ(root_ags[0]->comm_bytes, 68 * 2);
  // 16 bytes per sharded element: fp32 params and 2 AdamW states persistent, fp32 grads from each unit's
  // reduction to the step's end (zero_grad); the reduce-scatter output is the grad (reduce == master dtype).
  EXPECT_EQ(persistent_bytes(p, MemCategory::ShardedParams), (17 + 9 + 9) * 4);
  EXPECT_EQ(persistent_bytes(p, MemCategory::ShardedGrads), 0);
  EXPECT_EQ(category_bytes(p, MemCategory::ShardedGrads), (17 + 9 + 9) * 4);
  EXPECT_EQ(rs[0]->allocs[0], rs[0]->outputs[0]);
  EXPECT_EQ(p.buffers[rs[0]->allocs[0]].category, MemCategory::ShardedGrads);
  EXPECT_TRUE(frees(p.ops.back(), rs[0]->allocs[0]));   // freed after the optimizer step
  EXPECT_EQ(persistent_bytes(p, MemCategory::OptimizerState), (17 + 9 + 9) * 8);
  expect_well_formed(p, "fsdp2");
}

TEST(LoweringFsdp2, AllGatherOutputKeptUntilNextWaitForUnshardAndRsInputUntilNextPostBackward) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  StepProgram p = lower_hand(g, "{}", 4, 4);
  auto ag1 = ops_of(p, OpKind::AllGather, 1);
  auto co2 = ops_of(p, OpKind::CopyOut, 2);
  auto co1 = ops_of(p, OpKind::CopyOut, 1);
  int fwd_out = ag1[0]->outputs[0], bwd_out = ag1[1]->outputs[0];
  // F2.3: forward AG output of unit 1 freed at unit 2's wait_for_unshard, before unit 2's copy-out allocates
  // its params (at the CPU point after the op issued before that copy-out); the copy-in stream waits on
  // unit 1's copy-out before reusing it.
  EXPECT_TRUE(frees(p.ops[co2[0]->id - 1], fwd_out));
  EXPECT_FALSE(frees(*co2[0], fwd_out));
  EXPECT_FALSE(frees(*co1[0], fwd_out));
  // Backward: freed right after its own copy-out.
  EXPECT_TRUE(frees(*co1[1], bwd_out));
  // The copy-in of unit 2 (forward) waits on unit 0's copy-out event (the previous kept AG state).
  auto ci2 = ops_of(p, OpKind::CopyIn, 2);
  auto co0 = ops_of(p, OpKind::CopyOut, 0);
  bool waits = false;
  for (const auto& o : p.ops)
    if (o.unit == 2 && o.stream == 1 && waits_on(o, co0[0]->id)) waits = true;
  EXPECT_TRUE(waits);
  // F2.8 / M8: unit 2's RS input lives until unit 1's post-backward; unit 1's RS copy-in waits on RS(2).
  auto rs2 = ops_of(p, OpKind::ReduceScatter, 2);
  int rs_in2 = rs2[0]->inputs[0];
  const Op* rs_copy_in1 = nullptr;
  for (auto* o : ops_of(p, OpKind::CopyIn, 1))
    if (o->stream == 0) rs_copy_in1 = o;
  ASSERT_NE(rs_copy_in1, nullptr);
  EXPECT_TRUE(waits_on(*rs_copy_in1, rs2[0]->id));
  const Op& before = p.ops[rs_copy_in1->id - 1];
  EXPECT_TRUE(frees(before, rs_in2));
  // F2.10: fp32/bf16 reduce uses AVG: no divide kernels.
  EXPECT_TRUE(ops_of(p, OpKind::Divide).empty());
}

// A 1-wide shard dim (fully_shard on a (4, 1) mesh, NO_SHARD): foreach_reduce allocates the reduce output on
// the reduce-scatter stream and copies the RS input into it (one rank: no collective), the replicate
// all-reduce runs in place on that output, and the sharded gradient is it: in the RS stream's pool, where
// the measured fixture l1b-fsdp2-no-shard-w8-tt's peak snapshot has it. The bundled runtime all-reduces its
// RS input in place (compute pool).
TEST(LoweringFsdp2, NoShardGradientIsTheReduceOutputOnTheReduceScatterStream) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  auto stream_of = [](const StepProgram& p, const std::string& name) {
    for (int i = 0; i < static_cast<int>(p.streams.size()); ++i)
      if (p.streams[i].name == name) return i;
    return -1;
  };
  StepProgram p = lower_hand(g, R"({"mesh": [4, 1], "param_dtype": "bf16", "reduce_dtype": "fp32"})", 4, 4);
  const int rs_stream = stream_of(p, "reduce_scatter"), ar_stream = stream_of(p, "all_reduce");
  ASSERT_GE(rs_stream, 0);
  ASSERT_GE(ar_stream, 0);
  EXPECT_TRUE(ops_of(p, OpKind::ReduceScatter).empty());
  const Op* copy = nullptr;
  for (const Op* o : ops_of(p, OpKind::Cast, 1))
    if (o->name.find("RS copy") != std::string::npos) copy = o;
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->stream, rs_stream);
  ASSERT_EQ(copy->allocs.size(), 1u);
  const Buffer& out = p.buffers[copy->allocs[0]];
  EXPECT_EQ(out.pool_stream, rs_stream);
  EXPECT_EQ(out.category, MemCategory::ShardedGrads);
  EXPECT_EQ(copy->copy_bytes, 2 * out.bytes);   // read the RS input, write the output (fp32, same numel)
  auto ar = ops_of(p, OpKind::AllReduce, 1);
  ASSERT_EQ(ar.size(), 1u);
  EXPECT_EQ(ar[0]->stream, ar_stream);
  EXPECT_TRUE(waits_on(*ar[0], copy->id));
  EXPECT_EQ(ar[0]->inputs, std::vector<int>{copy->allocs[0]});
  EXPECT_EQ(ar[0]->group, CommGroup::World);   // the replicate group is every rank
  EXPECT_EQ(ar[0]->group_size, 4);

  StepProgram rt = lower_hand(g, R"({"mesh": [4, 1], "implementation": "runtime", "param_dtype": "fp32", "reduce_dtype": "fp32"})", 4, 4);
  for (const Op* o : ops_of(rt, OpKind::Cast)) EXPECT_EQ(o->name.find("RS copy"), std::string::npos);
  auto rt_ar = ops_of(rt, OpKind::AllReduce, 1);
  ASSERT_EQ(rt_ar.size(), 1u);
  EXPECT_EQ(rt.buffers[rt_ar[0]->inputs.at(0)].pool_stream, 0);   // the RS input, on the compute stream
}

TEST(LoweringFsdp1, FullShardSequenceAndPadding) {
  // [3],[6,4],[6] with fp32 flat params and N=4. use_orig_params: 3 -> align 4 -> 28 -> 34 -> pad to 36.
  const Shapes blk = {{3}, {6, 4}, {6}};
  auto g = block_graph(kRoot, {blk, blk});
  StepProgram p = lower_hand(g, R"({"fsdp_version": 1})", 4, 4);
  std::vector<std::string> names;
  for (const auto& s : p.streams) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"default", "pre_unshard", "unshard", "post_backward"}));
  // Pre-divide f = 2, post-divide 2 for N = 4 (F1.12); reduce fp32 == master: no accumulate cast.
  EXPECT_EQ(sequence(p, 1), (std::vector<std::string>{"cast@pre_unshard", "all_gather@unshard", "forward@default",
                                                       "cast@pre_unshard", "all_gather@unshard", "backward@default",
                                                       "copy_out@unshard", "cast@post_backward", "divide@post_backward",
                                                       "reduce_scatter@post_backward", "divide@post_backward"}));
  auto ag = ops_of(p, OpKind::AllGather, 1);
  EXPECT_EQ(ag[0]->comm_bytes, 36 * 2);
  EXPECT_EQ(p.buffers[ag[0]->allocs[0]].bytes, 36 * 2);             // _full_param_padded
  EXPECT_EQ(p.buffers[ag[0]->allocs[0]].pool_stream, 2);            // on the unshard stream
  auto cast = ops_of(p, OpKind::Cast, 1);
  EXPECT_EQ(p.buffers[cast[0]->allocs[0]].bytes, 9 * 2);            // _mp_shard
  EXPECT_EQ(persistent_bytes(p, MemCategory::ShardedParams), (17 + 9 + 9) * 4);
  EXPECT_TRUE(ops_of(p, OpKind::Pad).empty());
  // The _mp_shard is freed with record_stream on the unshard stream (reusable after the AG).
  ASSERT_EQ(ag[0]->frees.size(), 1u);
  EXPECT_EQ(ag[0]->frees[0].reuse_after_op, ag[0]->id);
  // Reshard after forward: freed after the forward op with record_stream on the compute stream.
  auto fwd = ops_of(p, OpKind::Forward, 1);
  const auto unsharded_frees = frees_of(p, *fwd[0], MemCategory::UnshardedParams);
  ASSERT_EQ(unsharded_frees.size(), 1u);
  EXPECT_EQ(unsharded_frees[0].buffer, ag[0]->allocs[0]);
  EXPECT_EQ(unsharded_frees[0].reuse_after_op, fwd[0]->id);
  expect_well_formed(p, "fsdp1");

  // use_orig_params=False: flat 33 elements unpadded, shards of ceil(33/4) = 9; the grad needs F.pad.
  StepProgram q = lower_hand(g, R"({"fsdp_version": 1, "use_orig_params": false})", 4, 4);
  auto pads = ops_of(q, OpKind::Pad, 1);
  ASSERT_EQ(pads.size(), 1u);
  EXPECT_EQ(q.buffers[pads[0]->allocs[0]].bytes, 36 * 4);
  EXPECT_EQ(pads[0]->copy_bytes, (33 + 36) * 4);
  auto bwd = ops_of(q, OpKind::Backward, 1);
  const auto grads = allocs_of(q, *bwd[0], MemCategory::UnshardedGrads);
  ASSERT_EQ(grads.size(), 1u);
  EXPECT_EQ(q.buffers[grads[0]].bytes, 33 * 2);                      // the views' grads in bf16 (33 params)
  expect_well_formed(q, "fsdp1 no orig");
}

// Hand-counted bytes of FSDP1's gradient path (kRoot 68 params = embedding [8,4] + norm [4] + head [8,4],
// kBlock 27; bf16 compute, fp32 reduce, N = 4, use_orig_params: block flat 28 -> 36 elements).
TEST(LoweringFsdp1, FlatGradIsTheSplitBackwardCatOnTheUnshardStream) {
  const Shapes blk = {{3}, {6, 4}, {6}};   // 33 params, flat 36 with use_orig_params padding
  auto g = block_graph(kRoot, {blk, blk});
  StepProgram p = lower_hand(g, R"({"fsdp_version": 1})", 4, 4);
  // The block's backward op produces its views' gradients (33 x 2 B) on the compute stream's pool ...
  auto bwd = ops_of(p, OpKind::Backward, 1);
  const auto views = allocs_of(p, *bwd[0], MemCategory::UnshardedGrads);
  ASSERT_EQ(views.size(), 1u);
  EXPECT_EQ(p.buffers[views[0]].bytes, 33 * 2);
  EXPECT_EQ(p.buffers[views[0]].pool_stream, 0);
  // ... then split_with_sizes_backward cats them into the flat grad (36 x 2 B) on the unshard stream:
  // an unshard-pool block; the views' gradients go back to the compute pool at once.
  auto cat = ops_of(p, OpKind::CopyOut, 1);
  ASSERT_EQ(cat.size(), 1u);
  EXPECT_EQ(cat[0]->stream, 2);
  ASSERT_EQ(cat[0]->allocs.size(), 1u);
  const Buffer& flat = p.buffers[cat[0]->allocs[0]];
  EXPECT_EQ(flat.bytes, 36 * 2);
  EXPECT_EQ(flat.pool_stream, 2);
  EXPECT_EQ(cat[0]->copy_bytes, 2 * 36 * 2);
  ASSERT_EQ(cat[0]->frees.size(), 2u);   // the views' grads, then (the hook) the backward reshard
  EXPECT_EQ(cat[0]->frees[0].buffer, views[0]);
  EXPECT_EQ(cat[0]->frees[0].reuse_after_op, -1);
  // The post-backward hook runs on the unshard stream: the backward reshard frees _full_param_padded
  // (an unshard-pool block) with no event; the flat grad (unshard pool) is record_stream'ed to
  // post_backward and reusable once post_backward's last op of the unit completes; the fp32 copy
  // (36 x 4 B, post_backward pool, dropped on post_backward) is back in its pool at once.
  auto ag = ops_of(p, OpKind::AllGather, 1);
  const int full_bwd = ag[1]->allocs[0];
  const int grad_rd = ops_of(p, OpKind::Cast, 1).back()->allocs[0];
  EXPECT_EQ(p.buffers[grad_rd].bytes, 36 * 4);
  EXPECT_EQ(p.buffers[grad_rd].pool_stream, 3);
  const int last_pb = ops_of(p, OpKind::Divide, 1).back()->id;
  int checked = 0;
  for (const auto& o : p.ops)
    for (const auto& f : o.frees) {
      if (f.buffer == full_bwd || f.buffer == grad_rd) {
        EXPECT_EQ(f.reuse_after_op, -1);
        ++checked;
      }
      if (f.buffer == flat.id) {
        EXPECT_EQ(f.reuse_after_op, last_pb);
        ++checked;
      }
    }
  EXPECT_EQ(checked, 3);
  // The post_backward stream waits on the unshard stream (the hook's current stream).
  const Op* first_pb = ops_of(p, OpKind::Cast, 1).back();
  EXPECT_TRUE(waits_on(*first_pb, cat[0]->id));
  // The root (tied embedding): the head's backward holds the final norm's gradient (4 x 2 B) and the tied
  // weight's (8x4 = 32 x 2 B); the embedding's backward makes its own (32 x 2 B, freed in the op) and the sum of
  // the two, out of place in the unshard stream's pool (the tied view's backward node was made under the
  // unshard stream), which replaces the head's (LoweringGradients.TiedWeightGradientsSummedOutOfPlace...).
  models::ModelSpec tied = tiny_spec(2);
  tied.vocab_size = 8;
  tied.hidden = 4;
  tied.tied_embeddings = true;
  auto tg = block_graph({{8, 4}, {4}}, {blk, blk});
  StepProgram t = lower(tied, tg, resolved(R"({"fsdp_version": 1})", 4, 4), Topology{4, 4});
  auto rbwd = ops_of(t, OpKind::Backward, 0);
  ASSERT_GE(rbwd.size(), 2u);   // (the loss's ops,) the head, then the embedding
  rbwd = {rbwd[rbwd.size() - 2], rbwd.back()};
  const auto head_grads = allocs_of(t, *rbwd[0], MemCategory::UnshardedGrads);
  ASSERT_EQ(head_grads.size(), 2u);
  EXPECT_EQ(t.buffers[head_grads[0]].bytes, 4 * 2);
  EXPECT_EQ(t.buffers[head_grads[1]].bytes, 32 * 2);
  const auto emb_grads = allocs_of(t, *rbwd[1], MemCategory::UnshardedGrads);
  ASSERT_EQ(emb_grads.size(), 2u);
  EXPECT_EQ(t.buffers[emb_grads[0]].bytes, 32 * 2);
  EXPECT_EQ(t.buffers[emb_grads[1]].bytes, 32 * 2);
  EXPECT_EQ(t.buffers[emb_grads[1]].pool_stream, 2);   // unshard
  EXPECT_TRUE(frees(*rbwd[1], emb_grads[0]));
  EXPECT_TRUE(frees(*rbwd[1], head_grads[1]));
  expect_well_formed(p, "fsdp1 cat");
  expect_well_formed(t, "fsdp1 tied");
}

TEST(LoweringZero, PersistentStateIs16BytesPerParamOverN) {
  // Shapes divisible by N=8 and 16-byte aligned: no padding, so the identity is exact.
  const Shapes emb = {{64, 16}}, blk = {{16, 16}, {16}}, head = {{64, 16}, {16}};
  auto g = all_wrapped_graph(emb, {blk, blk}, head);
  const std::int64_t P = g.total_params;
  ASSERT_EQ(P % 8, 0);
  for (const char* plan : {R"({})", R"({"fsdp_version": 1})"}) {
    StepProgram p = lower_hand(g, plan, 8, 8);
    // (the sharded gradients are not persistent: they exist from each unit's reduction to zero_grad)
    Bytes total = persistent_bytes(p, MemCategory::ShardedParams) + category_bytes(p, MemCategory::ShardedGrads) +
                  persistent_bytes(p, MemCategory::OptimizerState);
    EXPECT_EQ(total, 16 * P / 8) << plan;
  }
  // Pure bf16 (master = param) with SGD: 2 + 2 + 2 bytes.
  StepProgram b = lower_hand(g, R"({"master_weights_dtype": "bf16", "optimizer": "sgd"})", 8, 8);
  EXPECT_EQ(persistent_bytes(b, MemCategory::ShardedParams) + category_bytes(b, MemCategory::ShardedGrads) +
                persistent_bytes(b, MemCategory::OptimizerState),
            6 * P / 8);
  for (auto* o : ops_of(b, OpKind::Cast)) EXPECT_NE(o->stream, 1) << "no copy-in cast with master == param dtype";
}

Bytes sum_comm(const StepProgram& p, OpKind k) {
  Bytes s = 0;
  for (auto* o : ops_of(p, k)) s += o->comm_bytes;
  return s;
}

TEST(LoweringComm, VolumePerRankMatchesDdpAndZero3Identities) {
  const Shapes emb = {{64, 16}}, blk = {{16, 16}, {16}}, head = {{64, 16}, {16}};
  auto g = all_wrapped_graph(emb, {blk, blk}, head);
  const std::int64_t P = g.total_params;
  const int n = 8;
  const Bytes b = 2;   // bf16 all-gather and bf16 reduce
  for (const char* plan : {R"({"reduce_dtype": "bf16"})", R"({"fsdp_version": 1, "reduce_dtype": "bf16"})"}) {
    StepProgram p = lower_hand(g, plan, n, n);
    // Per rank, a ring AG/RS sends (n-1)/n of S; FULL_SHARD: AG(fwd) + AG(bwd) + RS = 3(n-1)/n P b (K2).
    double per_rank = (n - 1.0) / n * static_cast<double>(sum_comm(p, OpKind::AllGather) + sum_comm(p, OpKind::ReduceScatter));
    EXPECT_DOUBLE_EQ(per_rank, 3.0 * (n - 1) / n * P * b) << plan;
    EXPECT_EQ(sum_comm(p, OpKind::AllReduce), 0);
  }
  StepProgram ns = lower_hand(g, R"({"fsdp_version": 1, "sharding_strategy": "NO_SHARD", "reduce_dtype": "bf16"})", n, n);
  EXPECT_EQ(sum_comm(ns, OpKind::AllGather), 0);
  EXPECT_EQ(sum_comm(ns, OpKind::ReduceScatter), 0);
  double ar = 2.0 * (n - 1) / n * static_cast<double>(sum_comm(ns, OpKind::AllReduce));   // AR sends 2(n-1)/n S
  EXPECT_DOUBLE_EQ(ar, 2.0 * (n - 1) / n * P * b);
  for (auto* o : ops_of(ns, OpKind::AllReduce)) {
    EXPECT_EQ(o->group, CommGroup::World);
    EXPECT_EQ(o->group_size, n);
  }
  expect_well_formed(ns, "no_shard");
}

TEST(LoweringFsdp1, RateLimiterWaitsOnTheFreeEventTwoReshardsBack) {
  auto g = block_graph(kRoot, {kBlock, kBlock, kBlock, kBlock});
  StepProgram p = lower_hand(g, R"({"fsdp_version": 1})", 4, 4, 4);
  auto fwd1 = ops_of(p, OpKind::Forward, 1), fwd2 = ops_of(p, OpKind::Forward, 2);
  auto ag3 = ops_of(p, OpKind::AllGather, 3), ag4 = ops_of(p, OpKind::AllGather, 4);
  auto ag1 = ops_of(p, OpKind::AllGather, 1), ag2 = ops_of(p, OpKind::AllGather, 2);
  // Forward: reshard(1) and reshard(2) queue events at fwd(1), fwd(2); AG(3) then AG(4) block on them.
  EXPECT_TRUE(ag1[0]->cpu_waits.empty());
  EXPECT_TRUE(ag2[0]->cpu_waits.empty());
  EXPECT_EQ(ag3[0]->cpu_waits, std::vector<int>{fwd1[0]->id});
  EXPECT_EQ(ag4[0]->cpu_waits, std::vector<int>{fwd2[0]->id});
  // Every AG that waits, waits on the compute op that freed a unit two reshards before it.
  std::vector<int> events;
  std::size_t next = 0;
  for (const auto& o : p.ops) {
    if (o.kind == OpKind::AllGather) {
      if (events.size() - next >= 2) {
        EXPECT_EQ(o.cpu_waits, std::vector<int>{events[next]}) << o.name;
        ++next;
      } else {
        EXPECT_TRUE(o.cpu_waits.empty()) << o.name;
      }
    }
    // (forward: record_stream on the compute stream; backward: the post-backward hook runs on the unshard
    // stream, where the block is freed at once and the event recorded after the flat grad's cat)
    for (const auto& f : o.frees)
      if (p.buffers[f.buffer].category == MemCategory::UnshardedParams &&
          (o.stream == 0 ? f.reuse_after_op == o.id : o.stream == 2 && f.reuse_after_op == -1 && o.kind == OpKind::CopyOut))
        events.push_back(o.id);
  }
  StepProgram q = lower_hand(g, R"({"fsdp_version": 1, "limit_all_gathers": false})", 4, 4, 4);
  for (const auto& o : q.ops) EXPECT_TRUE(o.cpu_waits.empty()) << o.name;
}

int index_of(const StepProgram& p, OpKind k, int unit, int nth = 0) {
  auto v = ops_of(p, k, unit);
  return nth < static_cast<int>(v.size()) ? v[nth]->id : -1;
}

TEST(LoweringFsdp1, BackwardPrefetchModesOrderTheAllGather) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  auto order = [&](const char* prefetch) {
    std::string plan = std::string(R"({"fsdp_version": 1, "backward_prefetch": )") + prefetch + "}";
    StepProgram p = lower_hand(g, plan, 4, 4);
    expect_well_formed(p, plan);
    return std::vector<int>{index_of(p, OpKind::AllGather, 1, 1), index_of(p, OpKind::Backward, 2),
                            index_of(p, OpKind::ReduceScatter, 2)};
  };
  auto pre = order("\"BACKWARD_PRE\"");    // P1: AG(1) before grad(2)
  EXPECT_LT(pre[0], pre[1]);
  auto post = order("\"BACKWARD_POST\"");  // P2: after grad(2), before RS(2)
  EXPECT_GT(post[0], post[1]);
  EXPECT_LT(post[0], post[2]);
  auto none = order("null");               // no prefetch: at unit 1's pre-backward, after RS(2)
  EXPECT_GT(none[0], none[2]);
}

// FSDP2 with a shard group of 1 (one GPU, or NO_SHARD's replicate mesh) and mixed precision: the
// parameters are not gathered, but cast to bf16 from the fp32 shard, which the cast must read (found
// on an H100: the CUDA runtime had no input to cast from). Per parameter wait_for_unshard makes the cast
// (all_gather_inputs[0], a new tensor) and then the parameter's own output, and drops each cast once the next
// one exists, the last after the op (PyTorch's allocator history of l1b-fsdp2-w1-hf: the root's 501 MiB cast,
// its 501 MiB output, the cast freed).
TEST(LoweringFsdp2, ReplicatedMixedPrecisionCastReadsTheShard) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  for (int world : {1, 4}) {
    StepProgram p = lower_hand(g, world == 1 ? "{}" : R"({"sharding_strategy": "NO_SHARD"})", world, world);
    const auto casts = ops_of(p, OpKind::Cast);
    int param_casts = 0;
    for (const Op* o : casts) {
      const auto is_param = [&](int b) {
        return p.buffers[static_cast<std::size_t>(b)].category == MemCategory::UnshardedParams;
      };
      if (std::none_of(o->outputs.begin(), o->outputs.end(), is_param)) continue;
      ++param_casts;
      ASSERT_EQ(o->inputs.size(), 1u) << o->name;
      EXPECT_EQ(p.buffers[o->inputs[0]].category, MemCategory::ShardedParams) << o->name;
      EXPECT_EQ(p.buffers[o->inputs[0]].unit, o->unit) << o->name;
      // allocs: cast 0, param 0, cast 1, param 1, ...; cast k-1 freed after cast k (2k + 1 allocs), the last after
      // the op
      const std::size_t n = o->allocs.size() / 2;
      ASSERT_GE(n, 1u) << o->name;
      ASSERT_EQ(o->allocs.size(), 2 * n) << o->name;
      ASSERT_EQ(o->frees.size(), n) << o->name;
      for (std::size_t k = 0; k < n; ++k) {
        const Buffer& c = p.buffers[static_cast<std::size_t>(o->allocs[2 * k])];
        const Buffer& q = p.buffers[static_cast<std::size_t>(o->allocs[2 * k + 1])];
        EXPECT_EQ(c.category, MemCategory::CommBuffers) << o->name << " " << k;
        EXPECT_TRUE(is_param(q.id)) << o->name << " " << k;
        EXPECT_EQ(c.bytes, q.bytes) << o->name << " " << k;
        EXPECT_EQ(o->frees[k].buffer, o->allocs[2 * k]) << o->name << " " << k;
        EXPECT_EQ(o->frees[k].reuse_after_op, k + 1 < n ? free_inside_op(static_cast<int>(2 * k + 3)) : -1)
            << o->name << " " << k;
      }
    }
    // Forward: root and both blocks; backward: the two blocks again (resharded after forward; the root is not).
    EXPECT_EQ(param_casts, 5) << "world " << world;
    expect_well_formed(p, "replicated world " + std::to_string(world));
  }
}

TEST(LoweringStrategies, ShardGradOpGathersOncePerUnit) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  for (const char* plan : {R"({"fsdp_version": 1, "sharding_strategy": "SHARD_GRAD_OP"})",
                           R"({"reshard_after_forward": false})"}) {
    StepProgram p = lower_hand(g, plan, 4, 4);
    EXPECT_EQ(ops_of(p, OpKind::AllGather, 1).size(), 1u) << plan;
    EXPECT_EQ(ops_of(p, OpKind::AllGather, 2).size(), 1u) << plan;
    EXPECT_EQ(ops_of(p, OpKind::ReduceScatter).size(), 3u) << plan;
    expect_well_formed(p, plan);
  }
}

std::vector<Bytes> saved(const StepProgram& p, int unit);   // (below, with the frozen-weight tests)

TEST(LoweringCheckpointing, OutsideFsdpAddsOneAllGatherPerUnit) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  for (int version : {1, 2}) {
    std::string v = std::to_string(version);
    StepProgram inside = lower_hand(g, R"({"fsdp_version": )" + v + R"(, "activation_checkpointing": "full"})", 4, 4);
    StepProgram outside = lower_hand(
        g, R"({"fsdp_version": )" + v + R"(, "activation_checkpointing": {"mode": "full", "outside_fsdp": true}})", 4, 4);
    StepProgram none = lower_hand(g, R"({"fsdp_version": )" + v + "}", 4, 4);
    for (int u : {1, 2}) {
      EXPECT_EQ(ops_of(none, OpKind::AllGather, u).size(), 2u);
      EXPECT_EQ(ops_of(inside, OpKind::AllGather, u).size(), 2u);    // A1/A3
      EXPECT_EQ(ops_of(outside, OpKind::AllGather, u).size(), 3u);   // A2
      EXPECT_EQ(ops_of(inside, OpKind::Recompute, u).size(), 1u);
      EXPECT_EQ(ops_of(none, OpKind::Recompute, u).size(), 0u);
    }
    // Recompute runs before the block's backward and re-creates what checkpointing dropped.
    auto rc = ops_of(inside, OpKind::Recompute, 1);
    EXPECT_LT(rc[0]->id, index_of(inside, OpKind::Backward, 1));
    // Per tensor, as the default implementation (hf) saves them (models/implementation.h): full
    // checkpointing keeps the block input; the recompute re-creates every tensor the uncheckpointed block
    // saves that is not kept (hf's norm saves an fp32 copy of the input, not the input itself: all of them).
    const auto mem = [](models::CheckpointMode m) {
      return models::block_memory(tiny_spec(2), 1, 2048, Dtype::BF16, m, models::ImplOptions{});
    };
    const models::BlockMemory full = mem(models::CheckpointMode::Full), all = mem(models::CheckpointMode::None);
    Bytes recomputed = 0;
    for (const auto& t : all.saved) {
      bool kept = false;
      for (const auto& k : full.saved) kept = kept || std::string(k.name) == t.name;
      if (!kept) recomputed += t.bytes;
    }
    // (the forward's temporaries: the buffers the op frees itself, inside it or after enqueueing)
    const auto saved_allocs = [](const StepProgram& p, const Op& o) {
      std::vector<Bytes> s;
      for (int b : o.allocs) {
        const bool temporary =
            std::any_of(o.frees.begin(), o.frees.end(), [&](const FreeSpec& f) { return f.buffer == b; });
        if (p.buffers[b].category == MemCategory::Activations && !temporary) s.push_back(p.buffers[b].bytes);
      }
      return s;
    };
    const auto bytes_of = [](const models::BlockMemory& bm) {
      std::vector<Bytes> v;
      for (const auto& t : bm.saved) v.push_back(t.bytes);
      return v;
    };
    // The recompute: the incoming gradient (held from its start, freed by the block's backward), then the
    // recomputed tensors one by one, its temporaries freed inside it (models::AutogradTape::recompute_events).
    ASSERT_FALSE(full.recompute_events.empty());
    const auto kept_by_recompute = saved_allocs(inside, *rc[0]);
    ASSERT_FALSE(kept_by_recompute.empty());
    EXPECT_EQ(kept_by_recompute.front(), full.incoming_grad);   // grad_in
    EXPECT_EQ(std::accumulate(kept_by_recompute.begin() + 1, kept_by_recompute.end(), Bytes{0}), recomputed);
    EXPECT_GT(rc[0]->frees.size(), 0u);
    for (const FreeSpec& f : rc[0]->frees) EXPECT_TRUE(is_free_inside_op(f.reuse_after_op));
    EXPECT_EQ(saved(inside, 1), bytes_of(full));
    EXPECT_EQ(saved(none, 1), bytes_of(all));
    expect_well_formed(inside, "inside");
    expect_well_formed(outside, "outside");
  }
  // every_2 checkpoints blocks 0, 2, ...: only unit 1 (block 0) recomputes.
  StepProgram k = lower_hand(g, R"({"activation_checkpointing": "every_2"})", 4, 4);
  EXPECT_EQ(ops_of(k, OpKind::Recompute, 1).size(), 1u);
  EXPECT_EQ(ops_of(k, OpKind::Recompute, 2).size(), 0u);
}

// checkpoint(FSDP(block)) when the FSDP units do not line up with the blocks (HF gradient checkpointing under a size
// or no wrap policy): each block recomputes once, at its own backward; with the hooks (an extra all-gather) of the
// unit inside it (a size policy's MLP units), without for a unit spanning more than the block (the model's, the
// root). Before, a spanning unit's pre-backward recomputed every block at once and the blocks' own units again (a
// buffer allocated twice: "already live").
TEST(LoweringCheckpointing, OutsideFsdpRecomputesEachBlockOnceWhateverTheUnits) {
  const models::ModelSpec m = models::load_model("llama-1b");
  for (const char* wrap : {R"({"min_num_params": 50000000})", R"("none")"}) {
    SCOPED_TRACE(wrap);
    const Plan plan = resolved(std::string(R"({"activation_checkpointing": {"mode": "full", "outside_fsdp": true}, )") +
                                   R"("grad_accum": 2, "auto_wrap_policy": )" + wrap + "}",
                               8, 8);
    const auto g = models::build_wrap_graph(m, plan.auto_wrap_policy);
    const StepProgram p = lower(m, g, plan, Topology{8, 8});
    expect_well_formed(p, wrap);
    const auto rc = ops_of(p, OpKind::Recompute);
    ASSERT_EQ(rc.size(), static_cast<std::size_t>(2 * m.n_layers));
    // each recompute is followed on the compute stream by a backward before the next recompute: one block at a time
    for (const Op* r : rc) {
      const Op* next = nullptr;
      for (std::size_t i = static_cast<std::size_t>(r->id) + 1; i < p.ops.size() && !next; ++i)
        if (p.ops[i].stream == r->stream && (p.ops[i].kind == OpKind::Backward || p.ops[i].kind == OpKind::Recompute))
          next = &p.ops[i];
      ASSERT_NE(next, nullptr);
      EXPECT_EQ(next->kind, OpKind::Backward) << r->name << " (op " << r->id << ")";
    }
    // the size policy's MLP units (inside the blocks) gather three times per micro-batch: forward, recompute, backward
    for (const auto& u : g.units)
      if (u.name.find(".mlp") != std::string::npos) {
        EXPECT_EQ(ops_of(p, OpKind::AllGather, u.id).size(), 6u) << u.name;
      }
  }
}

TEST(LoweringAccumulation, NoSyncKeepsUnshardedGradsUntilTheLastMicroBatch) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  // FSDP1: the bf16 flat grad (36 elements with use_orig padding) persists from micro-batch 0 to 1 (M12).
  StepProgram p = lower_hand(g, R"({"fsdp_version": 1, "grad_accum": 2})", 4, 4);
  EXPECT_EQ(p.micro_batches, 2);
  for (auto* rs : ops_of(p, OpKind::ReduceScatter)) EXPECT_EQ(rs->micro_batch, 1);
  EXPECT_EQ(ops_of(p, OpKind::ReduceScatter).size(), 3u);
  auto cats = ops_of(p, OpKind::CopyOut, 1);
  ASSERT_EQ(cats.size(), 2u);
  ASSERT_EQ(cats[0]->allocs.size(), 1u);
  int grad = cats[0]->allocs[0];
  EXPECT_EQ(p.buffers[grad].bytes, 28 * 2);   // 27 params, 28 with use_orig padding, bf16
  // micro-batch 1: AccumulateGrad adds the new flat grad (a transient) into the same .grad in place
  ASSERT_EQ(cats[1]->allocs.size(), 1u);
  EXPECT_TRUE(frees(*cats[1], cats[1]->allocs[0]));
  EXPECT_EQ(cats[1]->outputs, std::vector<int>{grad});
  // No sharded gradient exists before the last micro-batch's reduction (zero_grad set them to None).
  for (const auto& b : p.buffers) {
    if (b.category == MemCategory::ShardedGrads) {
      EXPECT_FALSE(b.persistent) << b.name;
    }
  }
  for (const auto& o : p.ops)
    if (frees(o, grad)) {
      EXPECT_EQ(o.micro_batch, 1);
    }
  expect_well_formed(p, "no_sync fsdp1");
  // grad_sync=true reduces every micro-batch.
  StepProgram s = lower_hand(g, R"({"fsdp_version": 1, "grad_accum": 2, "grad_sync": true})", 4, 4);
  EXPECT_EQ(ops_of(s, OpKind::ReduceScatter).size(), 6u);
  // SHARD_GRAD_OP inside no_sync keeps params: micro-batch 1 needs no all-gather.
  StepProgram z = lower_hand(g, R"({"fsdp_version": 1, "grad_accum": 2, "sharding_strategy": "SHARD_GRAD_OP"})", 4, 4);
  EXPECT_EQ(ops_of(z, OpKind::AllGather, 1).size(), 1u);
  expect_well_formed(z, "no_sync sgo");
  // FSDP2 upcasts the unsharded grad to reduce_dtype (fp32) while accumulating (F2.13, M12).
  StepProgram f2 = lower_hand(g, R"({"grad_accum": 3})", 4, 4);
  const Buffer* acc = buffer_named(f2, "grad_acc u1");
  ASSERT_NE(acc, nullptr);
  EXPECT_EQ(acc->bytes, 27 * 4);
  EXPECT_EQ(acc->category, MemCategory::UnshardedGrads);
  EXPECT_EQ(ops_of(f2, OpKind::ReduceScatter).size(), 3u);
  expect_well_formed(f2, "no_sync fsdp2");
}

TEST(LoweringHsdp, AllReduceOnTheReplicateGroupOnItsOwnStream) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  for (const char* plan : {R"({"fsdp_version": 1, "sharding_strategy": "HYBRID_SHARD"})", R"({"mesh": [2, 4]})"}) {
    StepProgram p = lower_hand(g, plan, 8, 4);
    ASSERT_EQ(p.streams.size(), 5u) << plan;
    EXPECT_EQ(p.streams[4].name, "all_reduce");
    EXPECT_EQ(p.shard_size, 4);
    EXPECT_EQ(p.replicate_size, 2);
    auto ars = ops_of(p, OpKind::AllReduce);
    EXPECT_EQ(ars.size(), 3u);
    for (auto* ar : ars) {
      EXPECT_EQ(ar->stream, 4);
      EXPECT_EQ(ar->group, CommGroup::Replicate);
      EXPECT_EQ(ar->group_size, 2);
      EXPECT_EQ(ar->nodes_spanned, 2);
      auto rs = ops_of(p, OpKind::ReduceScatter, ar->unit);
      EXPECT_TRUE(waits_on(*ar, rs[0]->id));
      EXPECT_EQ(ar->comm_bytes, p.buffers[rs[0]->outputs[0]].bytes);
      EXPECT_EQ(rs[0]->group_size, 4);
      EXPECT_EQ(rs[0]->nodes_spanned, 1);
    }
    expect_well_formed(p, plan);
  }
  // FULL_SHARD across 2 nodes: one shard group of 8 spanning both nodes; no all_reduce stream.
  StepProgram f = lower_hand(g, "{}", 8, 4);
  EXPECT_EQ(f.streams.size(), 4u);
  EXPECT_EQ(ops_of(f, OpKind::AllGather)[0]->nodes_spanned, 2);
}

TEST(LoweringFsdp2, ReshardAfterForwardIntGathersOverThePostForwardGroup) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  StepProgram p = lower_hand(g, R"({"reshard_after_forward": 2})", 8, 8);
  // N=8: [6,4] -> 1 row x 4, [3] -> 1: shard 5, unsharded 40.
  auto ag = ops_of(p, OpKind::AllGather, 1);
  ASSERT_EQ(ag.size(), 2u);
  EXPECT_EQ(ag[0]->group, CommGroup::Shard);
  EXPECT_EQ(ag[0]->group_size, 8);
  EXPECT_EQ(ag[1]->group, CommGroup::PostForward);
  EXPECT_EQ(ag[1]->group_size, 2);
  EXPECT_EQ(ag[1]->comm_bytes, 40 * 2);
  const Buffer* clone = buffer_named(p, "post_fwd u1");
  ASSERT_NE(clone, nullptr);
  EXPECT_EQ(clone->bytes, 20 * 2);
  expect_well_formed(p, "rAF=2");
}

TEST(LoweringFsdp2, Fp8AllGatherHalvesBlockBytes) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  StepProgram p = lower_hand(g, R"({"fp8_all_gather": true})", 4, 4);
  EXPECT_EQ(ops_of(p, OpKind::AllGather, 1)[0]->comm_bytes, 36);
  EXPECT_EQ(ops_of(p, OpKind::AllGather, 0)[0]->comm_bytes, 68 * 2);
}

TEST(LoweringOffload, ShardsOnCpuH2DBeforeEachAllGatherAndCpuStep) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  for (const char* plan : {R"({"fsdp_version": 1, "cpu_offload": true})", R"({"cpu_offload": true})"}) {
    StepProgram p = lower_hand(g, plan, 4, 4);
    EXPECT_EQ(persistent_bytes(p, MemCategory::ShardedParams), 0) << plan;
    EXPECT_EQ(persistent_bytes(p, MemCategory::ShardedGrads), 0);
    EXPECT_EQ(persistent_bytes(p, MemCategory::OptimizerState), 0);
    EXPECT_EQ(ops_of(p, OpKind::H2D).size(), ops_of(p, OpKind::AllGather).size());
    EXPECT_EQ(ops_of(p, OpKind::D2H).size(), 3u);
    const Op& last = p.ops.back();
    EXPECT_EQ(last.kind, OpKind::CpuOptimizerStep);
    EXPECT_FALSE(last.cpu_waits.empty());
    EXPECT_TRUE(ops_of(p, OpKind::OptimizerStep).empty());
    expect_well_formed(p, plan);
  }
}

// FSDP2 CPU offload: foreach_reduce copies each group's reduced gradient to the CPU. With an fp32 reduction into
// fp32 parameters _to_dtype_if_needed returns the reduce-scatter output as it is and the D2H reads it (then drops
// it): no cast, nothing more on the GPU (PyTorch's allocator history of l1b-fsdp2-offload-w8-tt: one reduce-scatter
// segment per block). With a bf16 reduction the output is cast to fp32 first, a new tensor the D2H reads.
TEST(LoweringOffload, Fsdp2GradD2HReadsTheReduceOutputWhenItIsFp32) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  for (const char* rd : {"fp32", "bf16"}) {
    const std::string plan = std::string(R"({"cpu_offload": true, "reduce_dtype": ")") + rd + "\"}";
    StepProgram p = lower_hand(g, plan, 4, 4);
    expect_well_formed(p, plan);
    const bool fp32 = std::string(rd) == "fp32";
    for (const Op* d : ops_of(p, OpKind::D2H)) {
      ASSERT_EQ(d->inputs.size(), 1u) << plan;
      const Buffer& src = p.buffers[static_cast<std::size_t>(d->inputs[0])];
      EXPECT_EQ(std::string(src.name).rfind(fp32 ? "rs_out" : "grad_dev", 0), 0u) << src.name << " " << plan;
      EXPECT_TRUE(std::any_of(d->frees.begin(), d->frees.end(),
                              [&](const FreeSpec& f) { return f.buffer == d->inputs[0]; }))
          << plan;
      EXPECT_EQ(d->copy_bytes, src.bytes) << plan;   // the fp32 shard of the group's gradient
    }
    int casts = 0;
    for (const Op* c : ops_of(p, OpKind::Cast))
      if (std::string(c->name).rfind("grad fp32", 0) == 0) ++casts;
    EXPECT_EQ(casts, fp32 ? 0 : 3) << plan;
  }
}

// FSDP1 CPU offload with mixed precision (FlatParamHandle._use_low_precision_shard): the H2D op allocates
// _mp_shard (bf16) and then the fp32 staging copy of the CPU shard (`_local_shard.to(device)`), both on the
// pre-unshard stream, and frees the staging copy in the same op. The padded block [3],[6,4],[6] over N = 4:
// shards of 9 elements: _mp_shard 9 x 2 B, staging 9 x 4 B. Without mixed precision the fp32 shard itself is
// the compute copy: no staging.
TEST(LoweringOffload, Fsdp1MixedPrecisionH2DStagesTheFp32Shard) {
  const Shapes blk = {{3}, {6, 4}, {6}};
  auto g = block_graph(kRoot, {blk, blk});
  StepProgram p = lower_hand(g, R"({"fsdp_version": 1, "cpu_offload": true})", 4, 4);
  const auto h2d = ops_of(p, OpKind::H2D, 1);
  ASSERT_FALSE(h2d.empty());
  ASSERT_EQ(h2d[0]->allocs.size(), 2u);
  const Buffer& mp = p.buffers[h2d[0]->allocs[0]];
  const Buffer& staging = p.buffers[h2d[0]->allocs[1]];
  EXPECT_EQ(mp.bytes, 9 * 2);
  EXPECT_EQ(staging.bytes, 9 * 4);
  EXPECT_EQ(mp.pool_stream, 1);        // pre_unshard
  EXPECT_EQ(staging.pool_stream, 1);
  ASSERT_EQ(h2d[0]->frees.size(), 1u);
  EXPECT_EQ(h2d[0]->frees[0].buffer, h2d[0]->allocs[1]);
  expect_well_formed(p, "fsdp1 offload");
  StepProgram q = lower_hand(g, R"({"fsdp_version": 1, "cpu_offload": true, "param_dtype": "fp32"})", 4, 4);
  const auto h2d32 = ops_of(q, OpKind::H2D, 1);
  ASSERT_FALSE(h2d32.empty());
  EXPECT_EQ(h2d32[0]->allocs.size(), 1u);
  EXPECT_TRUE(h2d32[0]->frees.empty());
}

// The tensors a unit's forward ops save (their Activations buffers the op does not free itself: not the
// forward's temporaries, nor the cuBLAS workspace), and the weight-gradient kernels its backward ops run: the
// LoRA tests count both by hand.
// What unit `unit`'s forward leaves for its backward: the activations forward ops made (in allocation order)
// that the unit's own backward-side ops free. A block's input is the previous module's output, made by that
// module's forward op (LoweringWalk's carry): it counts for the block that saves it, not for its producer.
std::vector<Bytes> saved(const StepProgram& p, int unit) {
  std::vector<char> freed_by_unit(p.buffers.size(), 0);
  for (const Op& o : p.ops)
    if (o.kind != OpKind::Forward && o.unit == unit)
      for (const FreeSpec& f : o.frees) freed_by_unit[static_cast<std::size_t>(f.buffer)] = 1;
  std::vector<Bytes> v;
  for (const Op& o : p.ops) {
    if (o.kind != OpKind::Forward) continue;
    for (int b : allocs_of(p, o, MemCategory::Activations))
      if (freed_by_unit[static_cast<std::size_t>(b)] && p.buffers[b].name.rfind("cublas_ws", 0) != 0)
        v.push_back(p.buffers[b].bytes);
  }
  return v;
}

std::vector<std::string> wgrads(const StepProgram& p, int unit) {
  std::vector<std::string> v;
  for (const Op* o : ops_of(p, OpKind::Backward, unit))
    for (const auto& k : o->kernel_list())
      if (k.name.size() > 6 && k.name.compare(k.name.size() - 6, 6, "_wgrad") == 0) v.push_back(k.name);
  return v;
}

// Frozen weights (models/trainable.h) by hand: the tiny llama of tests/models/test_trainable.cpp (h 8,
// 2 heads, 1 kv head, head_dim 4, ffn 16, vocab 32) with 2 blocks, Hugging Face's code, micro-batch 1 x 4
// tokens, bf16, on 2 GPUs. 1704 parameters (embedding 256, 592 per block: q 64, k 32, v 32, o 64, gate /
// up / down 128, two norms 8; final norm 8, head 256); trainable_fraction 0.047 (80 of 1704) trains
// q_proj of block 0 alone (64 parameters: v_proj's 32 no longer fit).
//   FSDP2 (requires_grad per parameter): block 0 = {q_proj trains, input (frozen embedding) without grad},
//     block 1 = {nothing trains, input with grad}.
//   FSDP1 (use_orig_params): block 0's FlatParameter requires grad, so all its views do (the whole block
//     trains in autograd); the root (embedding, final norm, head) and block 1 are frozen whole.
// Saved tensors per block (bytes; T*h*e = 64, q 64, k/v 32, ffn-wide 128, fp32 h-wide 128, stats 16,
// logsumexp 32):
//   FSDP2 block 0: q_proj's input 64; SDPA's v 32, q 64, k 32, out 64, lse 32; the MLP norm's fp32 input
//     128 and rstd 16 (its frozen weight keeps no `normed`, its frozen gate/up no output); silu's input
//     128, mul's operands 128 + 128 (the frozen down_proj keeps no `prod`) = 816
//   FSDP1 block 0: everything but the input norm's fp32 chain, which records no graph until `weight *
//     normed` (1280 - 128 - 16) = 1136
//   block 1 (both): the input norm's fp32 input 128 and rstd 16, SDPA's 224, the MLP norm's 144, silu /
//     mul 384 = 896
TEST(LoweringFrozen, SavedActivationsGradientsAndStateByHandFsdp1AndFsdp2) {
  models::ModelSpec m = tiny_spec(2);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  ASSERT_EQ(models::count_params(m).total, 1704);
  const std::string base = R"("implementation": "hf", "micro_batch": 1, "seq_len": 4, "trainable_fraction": 0.047)";
  // The saved tensors each block's forward allocates, in order (not its transients or the cuBLAS workspace).
  const auto lower_plan = [&](const std::string& extra) {
    const Plan plan = resolved("{" + base + extra + "}", 2, 2);
    return lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
  };
  const std::vector<Bytes> block1 = {128, 16, 32, 64, 32, 64, 32, 128, 16, 128, 128, 128};

  // FSDP2 (units: root 0, blocks 1 and 2)
  const StepProgram f2 = lower_plan("");
  expect_well_formed(f2, "fsdp2");
  EXPECT_EQ(saved(f2, 1), (std::vector<Bytes>{64, 32, 64, 32, 64, 32, 128, 16, 128, 128, 128}));
  EXPECT_EQ(saved(f2, 2), block1);
  EXPECT_EQ(wgrads(f2, 1), (std::vector<std::string>{"q_proj_wgrad"}));
  EXPECT_TRUE(wgrads(f2, 2).empty());
  EXPECT_TRUE(wgrads(f2, 0).empty());   // no lm_head or embedding weight gradient
  // D5: only q_proj has a gradient: its dim-0 chunk, 4 of 8 rows x 8 = 32 numel, fp32 (the reduced
  // output is .grad), and AdamW's two states of it; one reduce-scatter in the step.
  EXPECT_EQ(category_bytes(f2, MemCategory::ShardedGrads), 32 * 4);
  EXPECT_EQ(persistent_bytes(f2, MemCategory::OptimizerState), 32 * 2 * 4);
  EXPECT_EQ(ops_of(f2, OpKind::ReduceScatter).size(), 1u);

  // FSDP1, use_orig_params (fp32 flat parameter: 16-byte alignment = 4 elements, all tensors aligned)
  const StepProgram f1 = lower_plan(R"(, "fsdp_version": 1)");
  expect_well_formed(f1, "fsdp1");
  EXPECT_EQ(saved(f1, 1), (std::vector<Bytes>{64, 64, 32, 64, 32, 64, 32, 128, 16, 64, 64, 128, 128, 128, 128}));
  EXPECT_EQ(saved(f1, 2), block1);
  EXPECT_EQ(wgrads(f1, 1).size(), 7u);   // every linear of block 0
  EXPECT_TRUE(wgrads(f1, 2).empty());
  EXPECT_TRUE(wgrads(f1, 0).empty());
  // M13: block 0's flat gradient is whole (592, shard 296, fp32); frozen units have none. Optimizer state:
  // q_proj is the flat parameter's first tensor (self_attn registers first), all 64 elements in rank 0's
  // shard [0, 296): 64 x 2 states x 4 B.
  EXPECT_EQ(category_bytes(f1, MemCategory::ShardedGrads), 296 * 4);
  EXPECT_EQ(persistent_bytes(f1, MemCategory::OptimizerState), 64 * 2 * 4);
  EXPECT_EQ(ops_of(f1, OpKind::ReduceScatter).size(), 1u);

  // Full checkpointing: each block with a graph keeps its input alone (block 0's though it needs no grad).
  for (const char* v : {"", R"(, "fsdp_version": 1)"}) {
    const StepProgram ac = lower_plan(std::string(R"(, "activation_checkpointing": "full")") + v);
    expect_well_formed(ac, v);
    EXPECT_EQ(saved(ac, 1), (std::vector<Bytes>{64})) << v;
    EXPECT_EQ(saved(ac, 2), (std::vector<Bytes>{64})) << v;
  }
}

// plan.frozen_units: a unit whose parameters are all frozen has no gradient. FSDP1's FlatParameter
// requires grad only if one of its tensors does (the OR in FlatParamHandle._validate_tensors_to_flatten),
// so even with use_orig_params (M13: full-size flat grads for the units that train) the frozen units get
// no flat grad, no reduce-scatter and no optimizer state; FSDP2 likewise (per-parameter, D5). By hand,
// 8 ranks, fp32 reduce/master (the defaults): embedding u1 (64x16 = 1024) and head u4 (64x16 + 16 = 1040)
// frozen, blocks u2, u3 (16x16 + 16 = 272 each, divisible by 8, no alignment padding) train. The plan's
// trainable fraction 272/2608 of the whole model is spread over the blocks' 544 parameters: 0.5 each.
//   FSDP1: sharded grads = 2 blocks x 272/8 x 4 B = 272 B (full flat, M13); optimizer = 2 x ceil(136/8)
//          x 2 states x 4 B = 272 B.
//   FSDP2: sharded grads = 2 x llround(34 x 0.5) x 4 B = 136 B (each block's shard: ceil(16/8) x 16 + 2 = 34).
// A block's forward as PyTorch's allocator sees it (issue 19 item 4): its saved tensors and temporaries one
// by one, in the order of models::AutogradTape::forward_events, each temporary freed inside the op right after
// the alloc its last reader made (FreeSpec free_inside_op). The block's input is the previous module's output
// tensor (made by that module's op, not again here) and its output stays allocated as the next module's
// input. The tiny llama of the frozen-weight test, everything trainable, Hugging Face's code, no checkpointing.
TEST(LoweringActivations, BlockForwardAllocatesTensorByTensorInOpOrder) {
  models::ModelSpec m = tiny_spec(2);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  const Plan plan = resolved(R"({"implementation": "hf", "micro_batch": 1, "seq_len": 4, "fsdp_version": 2})", 2, 2);
  const StepProgram p = lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
  expect_well_formed(p, "tensor by tensor");
  const models::BlockMemory bm = models::block_memory(m, 1, 4, Dtype::BF16, models::CheckpointMode::None,
                                                      {models::ModelImpl::HF}, models::GradFlow{});
  ASSERT_FALSE(bm.forward_events.empty());
  ASSERT_TRUE(bm.forward_events.front().input);
  ASSERT_EQ(bm.forward_events.front().kind, models::ForwardEvent::Temp);   // (no checkpoint: x is not saved)
  const Bytes x_bytes = bm.forward_events.front().bytes;
  EXPECT_EQ(x_bytes, 4 * 8 * 2);   // T x hidden, bf16
  const auto fwd = ops_of(p, OpKind::Forward, 2);
  ASSERT_EQ(fwd.size(), 1u);
  const Op& o = *fwd[0];
  // the op's allocations after the cuBLAS workspace (none on this second block), in the events' order, its
  // input excepted
  std::vector<Bytes> want, got;
  for (const auto& e : bm.forward_events)
    if (e.kind != models::ForwardEvent::FreeTemp && !e.input) want.push_back(e.bytes);
  for (int b : o.allocs)
    if (p.buffers[b].name.rfind("cublas_ws", 0) != 0) got.push_back(p.buffers[b].bytes);
  EXPECT_EQ(got, want);

  // The hand-off: the embedding's op makes the first block's input; each block's op leaves its output
  // allocated, and the next module's forward op frees it (here every input dies inside the next forward, at
  // its last reader: the residual add of a block, the final norm's upcast).
  std::vector<char> freed_in_forward(p.buffers.size(), 0);
  for (const Op& op : p.ops)
    if (op.kind == OpKind::Forward)
      for (const FreeSpec& f : op.frees) freed_in_forward[static_cast<std::size_t>(f.buffer)] = 1;
  const auto made_by = [&](const Op& op) {   // what op leaves for a later forward op to free
    std::vector<int> v;
    for (int b : op.allocs)
      if (freed_in_forward[static_cast<std::size_t>(b)] &&
          std::none_of(op.frees.begin(), op.frees.end(), [&](const FreeSpec& f) { return f.buffer == b; }))
        v.push_back(b);
    return v;
  };
  const auto frees_inside = [&](const Op& op, int b) {
    return std::any_of(op.frees.begin(), op.frees.end(),
                       [&](const FreeSpec& f) { return f.buffer == b && is_free_inside_op(f.reuse_after_op); });
  };
  const auto emb = ops_of(p, OpKind::Forward, 0);
  ASSERT_GE(emb.size(), 2u);   // the embedding, then the final norm and head (root unit; then the loss)
  const Op& b1 = *ops_of(p, OpKind::Forward, 1)[0];
  for (const auto& [producer, consumer] :
       {std::pair<const Op*, const Op*>{emb[0], &b1}, {&b1, &o}, {&o, emb[1]}}) {
    const std::vector<int> out = made_by(*producer);
    ASSERT_EQ(out.size(), 1u) << producer->name;
    EXPECT_TRUE(frees_inside(*consumer, out[0])) << consumer->name << " takes " << p.buffers[out[0]].name;
    EXPECT_EQ(std::count(consumer->allocs.begin(), consumer->allocs.end(), out[0]), 0) << consumer->name;
  }

  // Replayed in the executors' order from the input on, the bytes not saved for the backward peak at the
  // block's forward_extra (its input, temporaries and output), and what the backward frees is bm's saved bytes.
  std::vector<char> kept(p.buffers.size(), 0);
  for (const Op& op : p.ops)
    if (op.kind != OpKind::Forward && op.unit == 2)
      for (const FreeSpec& f : op.frees) kept[static_cast<std::size_t>(f.buffer)] = 1;
  Bytes live = x_bytes, peak = x_bytes;
  const std::size_t after = issue_memory(
      o,
      [&](int b) {
        if (kept[static_cast<std::size_t>(b)] || p.buffers[b].name.rfind("cublas_ws", 0) == 0) return;
        live += p.buffers[b].bytes;
        peak = std::max(peak, live);
      },
      [&](const FreeSpec& f) { live -= p.buffers[f.buffer].bytes; });
  EXPECT_EQ(peak, bm.forward_extra);
  EXPECT_EQ(live, x_bytes);   // the output, left for the final norm
  int inside = 0;
  for (const auto& f : o.frees) inside += is_free_inside_op(f.reuse_after_op) ? 1 : 0;
  EXPECT_EQ(static_cast<int>(after), inside);
  EXPECT_GT(inside, 5);   // the norms' fp32 pieces, rotary's halves, ... die inside the block
  Bytes saved_total = 0;
  for (Bytes b : saved(p, 2)) saved_total += b;
  EXPECT_EQ(saved_total, bm.saved_bytes());
}

TEST(LoweringFrozen, FrozenUnitsHaveNoGradientNoReductionNoOptimizerState) {
  const Shapes blk = {{16, 16}, {16}};
  auto g = all_wrapped_graph({{64, 16}}, {blk, blk}, {{64, 16}, {16}});
  ASSERT_EQ(g.total_params, 2608);
  const std::string f = std::to_string(272.0 / 2608.0);
  const std::string frozen = R"(, "frozen_units": ["u1", "u4"]})";
  StepProgram f1 = lower_hand(g, R"({"fsdp_version": 1, "trainable_fraction": )" + f + frozen, 8, 8);
  EXPECT_EQ(category_bytes(f1, MemCategory::ShardedGrads), 272);
  EXPECT_EQ(persistent_bytes(f1, MemCategory::OptimizerState), 272);
  StepProgram f2 = lower_hand(g, R"({"trainable_fraction": )" + f + frozen, 8, 8);
  EXPECT_EQ(category_bytes(f2, MemCategory::ShardedGrads), 136);
  for (const StepProgram* p : {&f1, &f2}) {
    for (int u : {1, 4}) {
      EXPECT_TRUE(ops_of(*p, OpKind::ReduceScatter, u).empty()) << u;
      for (const Buffer& b : p->buffers) {
        if (b.unit != u) continue;
        EXPECT_TRUE(b.category != MemCategory::UnshardedGrads && b.category != MemCategory::ShardedGrads &&
                    b.category != MemCategory::OptimizerState)
            << b.name;
      }
    }
    for (int u : {2, 3}) EXPECT_EQ(ops_of(*p, OpKind::ReduceScatter, u).size(), 1u) << u;
    expect_well_formed(*p, "frozen_units");
  }
  // Without frozen_units the same fraction trains in every unit: FSDP1 then keeps every unit's full flat grad.
  StepProgram all = lower_hand(g, R"({"fsdp_version": 1, "trainable_fraction": )" + f + "}", 8, 8);
  EXPECT_EQ(category_bytes(all, MemCategory::ShardedGrads), 2608 / 8 * 4);
  // A name that is no unit of the graph, or a frozen unit with nothing else trainable: input errors.
  EXPECT_THROW(lower_hand(g, R"({"trainable_fraction": 0.5, "frozen_units": ["lm_head"]})", 8, 8), InputError);
  EXPECT_THROW(lower_hand(g, R"({"trainable_fraction": 0.5, "frozen_units": ["u1", "u2", "u3", "u4"]})", 8, 8),
               InputError);
}

// plan.lora (issue 19), bytes by hand on the tiny model of the test above (2 blocks, hidden 8, 2 heads of 4, one
// kv head, ffn 16; bf16 activations, fp32 flat parameters, gradients and optimizer state; T = 4 tokens, 2 ranks), rank-2 adapters on q and v, HF recipe (separate
// q, k, v). Per block: q: A 2x8 (16), B 8x2 (16); v: A 2x8 (16), B 4x2 (8): 56 adapter parameters, 112 in all.
//  * FSDP2 (per parameter, dim-0 chunks over 2 ranks): sharded grads = 2 blocks x (1x8 + 4x2 + 1x8 + 2x2 = 28)
//    x 4 B = 224 B; AdamW 2 states = 448 B; one reduce-scatter per block, none for the frozen root; weight
//    gradients for the four adapter matrices of each block alone.
//  * FSDP1 use_orig_params: each block's FlatParameter holds 592 base + 56 adapter elements (every tensor a
//    multiple of the 4-element alignment; 648 is even): it requires grad, so its whole flat gradient is kept
//    (M13): 2 x 324 x 4 B = 2592 B; optimizer: the adapters sit before q_proj, at the start of rank 0's shard:
//    2 x 56 x 2 states x 4 B = 896 B; every view requires grad: 7 base + 4 adapter weight gradients per block.
//  * FSDP1 without use_orig_params: the adapters in a FlatParameter of their own, the base one frozen:
//    sharded grads 2 x 28 x 4 B = 224 B, optimizer 448 B, 4 adapter weight gradients per block.
//  * Saved tensors of block 1 (its input requires grad; the base weights frozen): the frozen block's (the
//    test above: 896 B) plus what the adapters save: the attention norm's output for both A's (one tensor,
//    4 x 8 x 2 = 64 B) and each A's 2-wide output for B (4 x 2 x 2 = 16 B, twice): 992 B (v's projection,
//    saved by the attention, is now the sum base + adapter, of the same size). With dropout > 0, each A
//    saves its own dropout output (64 B) and the dropout its bool mask (4 x 8 x 1 = 32 B) instead of the
//    norm output: 992 - 64 + 2 x (64 + 32) = 1120 B.
TEST(LoweringLora, AdapterBytesSavedTensorsAndGradientsByHand) {
  models::ModelSpec m = tiny_spec(2);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  const std::string base = R"("implementation": "hf", "micro_batch": 1, "seq_len": 4, "frozen_units": ["root"], )";
  const std::string lora = R"("lora": {"rank": 2, "targets": ["q", "v"]})";
  const auto saved_sum = [](const StepProgram& p, int unit) {
    Bytes s = 0;
    for (Bytes b : saved(p, unit)) s += b;
    return s;
  };
  const auto lower_plan = [&](const std::string& body) {
    const Plan plan = resolved("{" + base + body + "}", 2, 2);
    return lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
  };
  const std::vector<std::string> adapters = {"q_proj.lora_b_wgrad", "q_proj.lora_a_wgrad", "v_proj.lora_b_wgrad",
                                             "v_proj.lora_a_wgrad"};

  const StepProgram f2 = lower_plan(lora);
  expect_well_formed(f2, "fsdp2 lora");
  EXPECT_EQ(category_bytes(f2, MemCategory::ShardedGrads), 224);
  EXPECT_EQ(persistent_bytes(f2, MemCategory::OptimizerState), 448);
  EXPECT_EQ(ops_of(f2, OpKind::ReduceScatter).size(), 2u);
  EXPECT_TRUE(ops_of(f2, OpKind::ReduceScatter, 0).empty());
  EXPECT_EQ(wgrads(f2, 1), adapters);
  EXPECT_EQ(wgrads(f2, 2), adapters);
  EXPECT_TRUE(wgrads(f2, 0).empty());
  EXPECT_EQ(saved_sum(f2, 2), 992);
  const StepProgram f2d = lower_plan(R"("lora": {"rank": 2, "targets": ["q", "v"], "dropout": 0.1})");
  EXPECT_EQ(saved_sum(f2d, 2), 1120);

  const StepProgram f1 = lower_plan(R"("fsdp_version": 1, )" + lora);
  expect_well_formed(f1, "fsdp1 lora");
  EXPECT_EQ(category_bytes(f1, MemCategory::ShardedGrads), 2 * 324 * 4);
  EXPECT_EQ(persistent_bytes(f1, MemCategory::OptimizerState), 2 * 56 * 2 * 4);
  EXPECT_EQ(wgrads(f1, 1).size(), 11u);
  EXPECT_EQ(wgrads(f1, 2).size(), 11u);
  EXPECT_TRUE(wgrads(f1, 0).empty());

  const StepProgram f1n = lower_plan(R"("fsdp_version": 1, "use_orig_params": false, )" + lora);
  expect_well_formed(f1n, "fsdp1 lora no use_orig_params");
  EXPECT_EQ(category_bytes(f1n, MemCategory::ShardedGrads), 2 * 28 * 4);
  EXPECT_EQ(persistent_bytes(f1n, MemCategory::OptimizerState), 2 * 28 * 2 * 4);
  EXPECT_EQ(wgrads(f1n, 1), adapters);
  // The gradients autograd holds for the flat parameters' views until their split backward: with use_orig_params
  // every view of the block's FlatParameter (its 592 base elements, bf16: 1184 B); without it the base
  // FlatParameter does not require grad and neither do its views: only the adapters' 56 (112 B). (Before
  // 2026-11-27 the base's 1184 B were held here too.) Each is made where the block's backward computes it, in
  // backward order (the tape's weight gradients, since 2026-11-28): without use_orig_params v's B (4 x 2: 16 B),
  // v's A (2 x 8: 32 B), q's B (8 x 2), q's A. With it every view's, base and adapter (592 + 56 elements: 1296 B),
  // also one by one: the MLP's three (16 x 8: 256 B each), the second norm (8: 16 B), o (128 B), v's B, v's A, v
  // (4 x 8: 64 B), k (64 B), q's B, q's A, q (128 B), the first norm. (Until 2026-11-29 the adapters were missing
  // from the views the lowering counted, so the sum differed from the tape's and the block's backward kept one
  // lumped buffer of the base views' 1184 B.)
  const auto view_grads = [](const StepProgram& p, int unit) {
    std::vector<Bytes> v;
    for (const Buffer& b : p.buffers)
      if (b.unit == unit && std::string(b.name).rfind("param_grad", 0) == 0) v.push_back(b.bytes);
    return v;
  };
  EXPECT_EQ(view_grads(f1n, 1), (std::vector<Bytes>{16, 32, 32, 32}));
  EXPECT_EQ(view_grads(f1, 1), (std::vector<Bytes>{256, 256, 256, 16, 128, 16, 32, 64, 64, 32, 32, 128, 16}));

  // litgpt's LoRAQKVLinear (lit_gpt/lora.py at 8641822): one A of (2 x 2 parts, 8) = 32 and one B of (8 + 4, 2)
  // = 24 on the fused qkv: FSDP2 chunks A 2 x 8 + B 6 x 2 = 28 per block, 224 B in all; one pair of adapter
  // weight gradients per block; B's output (12 wide) is zero-padded to the fused width 16 (q 8, k 4, v 4).
  const StepProgram lit = lower_plan(R"("implementation": "litgpt", )" + lora);
  expect_well_formed(lit, "litgpt lora");
  EXPECT_EQ(category_bytes(lit, MemCategory::ShardedGrads), 224);
  EXPECT_EQ(wgrads(lit, 2), (std::vector<std::string>{"qkv.lora_b_wgrad", "qkv.lora_a_wgrad"}));
  bool padded = false;
  for (const Op* o : ops_of(lit, OpKind::Forward, 2))
    for (const auto& k : o->kernel_list()) padded = padded || k.name == "qkv.lora_pad";
  EXPECT_TRUE(padded);

  // A rank above an adapted matrix's smaller side (v: 4 x 8), a gate on this gated MLP is fine, "mlp" too.
  EXPECT_THROW(lower_plan(R"("lora": {"rank": 5, "targets": ["v"]})"), InputError);
  EXPECT_NO_THROW(lower_plan(R"("lora": {"rank": 2, "targets": ["mlp", "o", "k"]})"));
}

// QLoRA (plan.lora.quantize_base "nf4", models/nf4.h), bytes by hand on a 2-block model with hidden 256, 4 heads of
// 64 (4 kv heads), ffn 512, vocabulary 64, over 2 ranks, pure bf16, rank-2 adapters on q and v, HF recipe.
//  * An NF4Tensor of N elements holds N / 2 code bytes, N / 64 int8 scalers and N / 16384 2-byte factors. Each rank's
//    shard of a weight is an NF4Tensor of its rows: q, k, v, o (256 x 256) 32768 elements -> 16384 + 512 + 4 =
//    16900 B; gate, up, down (512 x 256, 256 x 512) 65536 -> 32768 + 1024 + 8 = 33800 B: 4 x 16900 + 3 x 33800 =
//    169000 B of NF4 per block and rank. The two norms (chunks of 128) and the adapters (q and v: A 2 x 256 ->
//    chunk 1 x 256, B 256 x 2 -> chunk 128 x 2: 1024 elements) stay bf16: 2 x (256 + 1024) = 2560 B. A block's
//    shard: 171560 B. The root (embedding 64 x 256, final norm, LM head 64 x 256): 16512 elements, 33024 B, no NF4.
//  * The all-gather moves and its output holds 2 x 171560 = 343120 B per block, and so do the unsharded parameters
//    the copy-out makes (q's NF4Tensor 33800 B, gate's 67600 B among them).
//  * The block's forward: each linear's dequantized weight, 2 B per element (q: 131072 B, gate 262144 B), made and
//    dropped around its matmul; eager, get_original_weight's temporaries on top (12 B per element: 786432 B for q),
//    compiled none. The kernels: 11 eager ones per weight, or one fused one reading the NF4 bytes and writing bf16
//    (q: 33800 + 131072 = 164872 B).
//  * A weight whose shard does not hold whole scaler blocks cannot be split (nf4_split asserts): an input error,
//    as are float8, CPU offload under FSDP2, fp32 master weights and the bundled runtime.
//  * FSDP1 (bitsandbytes, use_orig_params): the packed codes are bf16 elements of the flat parameter, N / 4 of them
//    (q: 16384, gate: 32768), after the 2048 adapter elements placed before q_proj, with the norms' 512:
//    2048 + 4 x 16384 + 3 x 32768 + 512 = 166400 elements, 83200 per rank (166400 B); the QuantState, whole on each
//    rank: per weight N / 64 uint8 absmax, 4 B per 256 of those and 1088 B of codes: q 1024 + 16 + 1088 = 2128 B,
//    gate 2048 + 32 + 1088 = 3168 B, 18016 B per block. Sharded params 2 x (166400 + 18016) + 33024 (the root's
//    33024 elements over 2 ranks) = 401856 B; a block's all-gather 332800 B. Each dequantization makes the fp32
//    absmax (q: 4096 B) beside the 131072 B copy, in two kernels (the codes' one moves 32768 + 4096 + 131072 B).
TEST(LoweringQlora, Nf4ShardsGathersAndDequantizationByHand) {
  models::ModelSpec m = tiny_spec(2);
  m.hidden = 256, m.n_heads = 4, m.n_kv_heads = 4, m.head_dim = 64, m.ffn_hidden = 512, m.vocab_size = 64;
  const std::string base = R"("implementation": "hf", "micro_batch": 1, "seq_len": 4, "frozen_units": ["root"],
      "param_dtype": "bf16", "reduce_dtype": "bf16", "master_weights_dtype": "bf16", )";
  const auto lower_plan = [&](const std::string& more, int gpus = 2) {
    const Plan plan = resolved("{" + base + more + R"("lora": {"rank": 2, "targets": ["q", "v"], "quantize_base": "nf4"}})",
                               gpus, gpus);
    return lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{gpus, gpus});
  };
  EXPECT_EQ(models::nf4_bytes(32768), 16900);
  EXPECT_EQ(models::nf4_bytes(65536), 33800);
  const StepProgram p = lower_plan("");
  expect_well_formed(p, "qlora");
  EXPECT_EQ(persistent_bytes(p, MemCategory::ShardedParams), 2 * 171560 + 33024);
  for (int u : {1, 2}) {
    const auto ag = ops_of(p, OpKind::AllGather, u);
    ASSERT_FALSE(ag.empty());
    EXPECT_EQ(ag[0]->comm_bytes, 343120) << u;
  }
  // One unsharded tensor per parameter at each copy-out, in forward and in backward: the two norms (256 bf16: 512 B),
  // the four adapter matrices (2 x 256 and 256 x 2: 1024 B each), q, k, v, o as NF4 (33800 B) and the MLP's three
  // (67600 B), 343120 B in all. (Until 2026-11-29 the adapters were left out of the list, which then did not add up to
  // the unit's parameters: one 343120 B buffer per copy-out.)
  std::multiset<Bytes> unsharded;
  for (const Op* o : ops_of(p, OpKind::CopyOut, 1))
    for (int b : o->allocs) unsharded.insert(p.buffers[b].bytes);
  std::multiset<Bytes> one{512, 512, 1024, 1024, 1024, 1024, 33800, 33800, 33800, 33800, 67600, 67600, 67600};
  std::multiset<Bytes> both = one;
  both.insert(one.begin(), one.end());
  EXPECT_EQ(unsharded, both);
  bool fused = false, eager = false;
  for (const Op* o : ops_of(p, OpKind::Forward, 1))
    for (const auto& k : o->kernel_list()) {
      eager = eager || k.name == "q_proj.nf4_hi_to_long";
      fused = fused || k.name == "q_proj.nf4_dequant";
    }
  EXPECT_TRUE(eager);
  EXPECT_FALSE(fused);
  const StepProgram pc = lower_plan(R"("compile": true, )");
  for (const Op* o : ops_of(pc, OpKind::Forward, 1))
    for (const auto& k : o->kernel_list())
      if (k.name == "q_proj.nf4_dequant") {
        fused = true;
        EXPECT_EQ(k.bytes, 164872);
      }
  EXPECT_TRUE(fused);

  // Compiled, the backward reads the forward's saved copy: no dequantization kernel in a block's backward (eager:
  // the chain again, for the input gradient; the second block's, whose input requires grad: the first block's
  // input is the frozen embedding's output, so its q needs no input gradient).
  for (const auto& [program, name, want] : {std::tuple{&pc, "q_proj.nf4_dequant", false},
                                            std::tuple{&p, "q_proj.nf4_hi_to_long", true}}) {
    bool in_backward = false;
    for (const Op* o : ops_of(*program, OpKind::Backward, 2))
      for (const auto& k : o->kernel_list()) in_backward = in_backward || k.name == name;
    EXPECT_EQ(in_backward, want) << name;
  }

  // The tape's forward events of a block (its input requires grad under LoRA): q's dequantized weight, then
  // (eager) its 12 B-per-element temporaries as a workspace; compiled, the copy (256 x 256 x 2 B) is kept for
  // the backward, with no workspace (the measured PyTorch 2.11 behaviour, models/block_recipes.cpp linear).
  const Plan plan = resolved("{" + base + R"("lora": {"rank": 2, "targets": ["q", "v"], "quantize_base": "nf4"}})", 2, 2);
  const models::LoraShape shape = lowering::lora_shape(m, plan);
  EXPECT_FALSE(shape.nf4_bnb);
  EXPECT_TRUE(shape.nf4);
  for (bool compile : {false, true}) {
    const models::ImplOptions o{models::ModelImpl::HF, compile, models::Float8Recipe::None, shape, 132};
    const models::BlockMemory bm =
        models::block_memory(m, 1, 4, Dtype::BF16, models::CheckpointMode::None, o, models::GradFlow{});
    std::vector<Bytes> after_q;
    const auto want_kind = compile ? models::ForwardEvent::Kept : models::ForwardEvent::Temp;
    for (std::size_t i = 0; i < bm.forward_events.size(); ++i)
      if (bm.forward_events[i].kind == want_kind && std::string(bm.forward_events[i].name) == "attn.q.weight_dequant") {
        after_q.push_back(bm.forward_events[i].bytes);
        if (i + 1 < bm.forward_events.size() && std::string(bm.forward_events[i + 1].name) == "workspace")
          after_q.push_back(bm.forward_events[i + 1].bytes);
      }
    const std::vector<Bytes> want = compile ? std::vector<Bytes>{131072} : std::vector<Bytes>{131072, 786432};
    EXPECT_EQ(after_q, want) << compile;
    // kept: q's and v's copies (v: 256 x 256 too, 4 kv heads of 64), and k, o, gate, up, down (all NF4)
    Bytes kept_dequant = 0;
    for (const auto& e : bm.forward_events)
      if (e.kind == models::ForwardEvent::Kept && std::string(e.name).ends_with(".weight_dequant")) kept_dequant += e.bytes;
    EXPECT_EQ(kept_dequant, compile ? 4 * 131072 + 3 * 262144 : 0) << compile;
  }

  // Full checkpointing: eager keeps the block input alone (4 tokens x 256 x 2 B); compiled, LinearNF4's ops escape
  // the checkpoint (PyTorch 2.11's AOT graph) and the block also keeps what the backward reads through them:
  // every NF4 linear's dequantized copy (q, k, v, o: 256 x 256 x 2 B; gate, up, down: 256 x 512 x 2 B) and every
  // NF4 GEMM's output the recompute needs (q, k, v, o: 4 x 256 x 2 B; gate, up: 4 x 512 x 2 B; not down's, which
  // only feeds the residual add).
  for (bool compile : {false, true}) {
    const models::ImplOptions o{models::ModelImpl::HF, compile, models::Float8Recipe::None, shape, 132};
    const models::BlockMemory bm =
        models::block_memory(m, 1, 4, Dtype::BF16, models::CheckpointMode::Full, o, models::GradFlow{});
    Bytes kept = 0;
    for (const auto& e : bm.forward_events)
      if (e.kind == models::ForwardEvent::Kept) kept += e.bytes;
    const Bytes input = 4 * 256 * 2;
    EXPECT_EQ(kept, compile ? input + (4 * 131072 + 3 * 262144) + (4 * 2048 + 2 * 4096) : input) << compile;
  }

  // ... and its recompute reruns neither the NF4 GEMMs nor their dequantization (the adapters' GEMMs, tagged, rerun).
  for (bool compile : {false, true}) {
    const StepProgram ac = lower_plan(compile ? R"("compile": true, "activation_checkpointing": "full", )"
                                              : R"("activation_checkpointing": "full", )");
    bool nf4_gemm = false, adapter = false;
    for (const Op* o : ops_of(ac, OpKind::Recompute, 2))
      for (const auto& k : o->kernel_list()) {
        nf4_gemm = nf4_gemm || k.name == "q_proj";
        adapter = adapter || k.name == "q_proj.lora_a";
      }
    EXPECT_EQ(nf4_gemm, !compile) << compile;
    EXPECT_TRUE(adapter) << compile;
  }
  // Under op-level SAC, compiled or not, the NF4 ops are tagged like the others: k's GEMM (the 4th mm, after q's
  // and its adapter's two) is not saved, so the recompute reruns it.
  for (bool compile : {false, true}) {
    const StepProgram sac = lower_plan(compile ? R"("compile": true, "activation_checkpointing": "selective_op", )"
                                               : R"("activation_checkpointing": "selective_op", )");
    bool k_gemm = false;
    for (const Op* o : ops_of(sac, OpKind::Recompute, 2))
      for (const auto& k : o->kernel_list()) k_gemm = k_gemm || k.name == "k_proj";
    EXPECT_TRUE(k_gemm) << compile;
  }

  // checkpoint(compile(block)) (torchtune's order, activation_checkpointing.outside_compile): the eager checkpoint's
  // hooks drop every tensor the compiled block saves, escaping or not: the block keeps its input alone (4 x 256 x
  // 2 B). Its recompute remakes the compiled saved set for the backward, the 7 dequantized copies among them
  // (4 x 131072 + 3 x 262144 B), and reruns the whole compiled forward, the NF4 GEMMs and their fused dequantization
  // included: the same kernels, in the same order, as the block's forward.
  {
    models::ImplOptions o{models::ModelImpl::HF, true, models::Float8Recipe::None, shape, 132};
    o.checkpoint_outside_compile = true;
    const models::BlockMemory bm =
        models::block_memory(m, 1, 4, Dtype::BF16, models::CheckpointMode::Full, o, models::GradFlow{});
    Bytes kept = 0, remade_dequant = 0;
    for (const auto& e : bm.forward_events)
      if (e.kind == models::ForwardEvent::Kept) kept += e.bytes;
    for (const auto& e : bm.recompute_events)
      if (e.kind == models::ForwardEvent::Kept && std::string(e.name).ends_with(".weight_dequant")) remade_dequant += e.bytes;
    EXPECT_EQ(kept, 4 * 256 * 2);
    EXPECT_EQ(remade_dequant, 4 * 131072 + 3 * 262144);
    // In the forward the compiled function returns that set and save_for_backward's pack hooks drop it: the 7
    // dequantized copies live together until the block's forward ends (freed after down's copy was made).
    Bytes live = 0, most = 0;
    std::size_t q_freed = 0, down_made = 0;
    for (std::size_t i = 0; i < bm.forward_events.size(); ++i) {
      const auto& e = bm.forward_events[i];
      if (!std::string(e.name).ends_with(".weight_dequant")) continue;
      if (e.kind == models::ForwardEvent::Temp) live += e.bytes;
      if (e.kind == models::ForwardEvent::FreeTemp) live -= e.bytes;
      most = std::max(most, live);
      if (e.kind == models::ForwardEvent::FreeTemp && std::string(e.name) == "attn.q.weight_dequant") q_freed = i;
      if (e.kind == models::ForwardEvent::Temp && std::string(e.name) == "mlp.down.weight_dequant") down_made = i;
    }
    EXPECT_EQ(most, 4 * 131072 + 3 * 262144);
    EXPECT_GT(q_freed, down_made);
    EXPECT_EQ(live, 0);
    const StepProgram around = lower_plan(
        R"("compile": true, "activation_checkpointing": {"mode": "full", "outside_compile": true}, )");
    std::vector<std::string> forward, rerun;
    for (const Op* op : ops_of(around, OpKind::Forward, 2))
      for (const auto& k : op->kernel_list()) forward.push_back(k.name);
    for (const Op* op : ops_of(around, OpKind::Recompute, 2))
      for (const auto& k : op->kernel_list()) rerun.push_back(k.name);
    EXPECT_EQ(rerun, forward);
    EXPECT_NE(std::find(rerun.begin(), rerun.end(), "q_proj.nf4_dequant"), rerun.end());
    EXPECT_NE(std::find(rerun.begin(), rerun.end(), "down_proj"), rerun.end());   // no early stop inside it
  }

  // FSDP1: bitsandbytes' layout
  const StepProgram f1 = lower_plan(R"("fsdp_version": 1, )");
  expect_well_formed(f1, "qlora fsdp1");
  EXPECT_EQ(models::bnb4_quant_state_bytes(65536), 2128);
  EXPECT_EQ(persistent_bytes(f1, MemCategory::ShardedParams), 2 * (166400 + 18016) + 33024);
  EXPECT_EQ(ops_of(f1, OpKind::AllGather, 1)[0]->comm_bytes, 332800);
  bool bnb_kernel = false;
  for (const Op* o : ops_of(f1, OpKind::Forward, 1))
    for (const auto& k : o->kernel_list())
      if (k.name == "q_proj.bnb4_dequant") {
        bnb_kernel = true;
        EXPECT_EQ(k.bytes, 32768 + 4096 + 131072);
      }
  EXPECT_TRUE(bnb_kernel);
  // use_orig_params: the block's FlatParameter requires grad (its adapters), so its norms' views get weight
  // gradients (M13), but MatMul4Bit returns none for a packed weight: no base linear's weight-gradient GEMM, and
  // the gradients held for the split backward are the norms' (256 bf16: 512 B each) and the four adapters' (512
  // elements: 1024 B each), in backward order: the second norm, v's B and A, q's B and A, the first norm.
  const std::vector<std::string> adapters_wgrad = {"q_proj.lora_b_wgrad", "q_proj.lora_a_wgrad", "v_proj.lora_b_wgrad",
                                                   "v_proj.lora_a_wgrad"};
  for (const std::string& w : wgrads(f1, 1))
    EXPECT_TRUE(std::find(adapters_wgrad.begin(), adapters_wgrad.end(), w) != adapters_wgrad.end() ||
                w.find("norm") != std::string::npos)
        << w;
  std::vector<Bytes> held;
  for (const Buffer& b : f1.buffers)
    if (b.unit == 1 && std::string(b.name).rfind("param_grad", 0) == 0) held.push_back(b.bytes);
  EXPECT_EQ(held, (std::vector<Bytes>{512, 1024, 1024, 1024, 1024, 512}));
  {
    const Plan p1 = resolved("{" + base + R"("fsdp_version": 1, "lora": {"rank": 2, "targets": ["q", "v"], "quantize_base": "nf4"}})", 2, 2);
    const models::LoraShape s1 = lowering::lora_shape(m, p1);
    EXPECT_TRUE(s1.nf4_bnb);
    const models::ImplOptions o{models::ModelImpl::HF, false, models::Float8Recipe::None, s1, 132};
    const models::BlockMemory bm =
        models::block_memory(m, 1, 4, Dtype::BF16, models::CheckpointMode::None, o, models::GradFlow{});
    std::vector<Bytes> after_q;
    for (std::size_t i = 0; i + 1 < bm.forward_events.size(); ++i)
      if (bm.forward_events[i].kind == models::ForwardEvent::Temp &&
          std::string(bm.forward_events[i].name) == "attn.q.weight_dequant")
        after_q = {bm.forward_events[i].bytes, bm.forward_events[i + 1].bytes};
    EXPECT_EQ(after_q, (std::vector<Bytes>{131072, 4096}));
  }

  // Refused: a shard without whole scaler blocks (4 ranks: q's 64-row shards hold 16384 elements, fine; 8 ranks: 8192),
  // and what is not modelled with NF4 weights.
  EXPECT_NO_THROW(lower_plan("", 4));
  EXPECT_THROW(lower_plan("", 8), InputError);
  // CPU offload: bitsandbytes' FSDP1 layout offloads its flat parameter (the QuantState stays on the GPU: still
  // 2 x 18016 B of sharded_params category there); torchao's under FSDP2 is refused (below).
  const StepProgram off = lower_plan(R"("fsdp_version": 1, "cpu_offload": true, )");
  expect_well_formed(off, "qlora fsdp1 offload");
  EXPECT_EQ(persistent_bytes(off, MemCategory::ShardedParams), 2 * 18016);
  const std::string mixed = R"("implementation": "hf", "micro_batch": 1, "seq_len": 4, "param_dtype": "bf16", )";
  for (const std::string& bad : {base + R"("float8": "tensorwise", )",
                                 base + R"("cpu_offload": true, )", mixed + R"("master_weights_dtype": "fp32", )"}) {
    try {
      const Plan bp = resolved("{" + bad + R"("lora": {"rank": 2, "targets": ["q", "v"], "quantize_base": "nf4"}})", 2, 2);
      lower(m, models::build_wrap_graph(m, bp.auto_wrap_policy), bp, Topology{2, 2});
      ADD_FAILURE() << bad;
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), "plan.lora.quantize_base") << bad << e.what();
    }
  }
}

// A LoRA adapter on the LM head (plan.lora.targets "head"), by hand on the tiny model of the test above (hidden 8,
// vocabulary 32, T = 4 tokens, bf16: a T x V tensor is 4 x 32 x 2 = 256 B; rank 2: A 2 x 8, B 32 x 2). The head
// computes base(x) + B(A(drop(x))) * scaling out of place (PEFT, torchtune and litgpt LoRALinear.forward), so the
// caching allocator sees three T x V tensors at once, then the sum: after the head's forward op, a memory-only op
// "head lora" allocates the base output, B's output and the scaled product (256 B each) and frees B's output; the
// next, "lora sum", allocates the logits (256 B, the buffer the loss reads) and frees the product and the
// base output; the head's op itself allocates no logits. (A llama-1b head at 4096 tokens: three 1002 MiB
// segments, as the measured l1b-fsdp2-lora-r8-all-head-fused history cudaMallocs them.) Backward: "lora bwd",
// before the head's backward op, holds MulBackward's grad * scaling (256 B) as a transient.
// Saved by the head (the base weight frozen, so its linear saves nothing): A's input, the final norm's output
// (4 x 8 x 2 = 64 B), and A's 2-wide output for B (4 x 2 x 2 = 16 B): 80 B more than without the head target;
// with dropout > 0, A saves the dropout's output (64 B) and the dropout its bool mask (32 B) instead of the norm
// output: 64 + 32 + 16 = 112 B. (Before 2026-11-26 the final part's GradFlow dropped the Adapter bit, so the
// head's A saved nothing and its adapter's weight-gradient kernels were missing.)
TEST(LoweringLora, HeadAdapterVocabularyTensorsOneByOne) {
  models::ModelSpec m = tiny_spec(2);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  const auto lower_plan = [&](const std::string& lora, const std::string& more = "") {
    const Plan plan = resolved(R"({"implementation": "hf", "micro_batch": 1, "seq_len": 4, )" + more + R"("lora": )" +
                                   lora + "}", 2, 2);
    return lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
  };
  const auto saved_sum = [](const StepProgram& p) {
    Bytes s = 0;
    for (Bytes b : saved(p, 0)) s += b;
    return s;
  };
  const auto op_named = [](const StepProgram& p, const std::string& name) -> const Op* {
    for (const Op& o : p.ops)
      if (o.name.rfind(name, 0) == 0 && (o.name.size() == name.size() || o.name[name.size()] == ' ')) return &o;
    return nullptr;
  };
  const StepProgram none = lower_plan(R"({"rank": 2, "targets": ["q"]})");
  EXPECT_EQ(op_named(none, "head lora"), nullptr);
  const Bytes tv = 4 * 32 * 2;
  for (const bool fsdp1 : {false, true}) {
    const std::string v = fsdp1 ? R"("fsdp_version": 1, )" : "";
    const StepProgram base = lower_plan(R"({"rank": 2, "targets": ["q"]})", v);
    const StepProgram p = lower_plan(R"({"rank": 2, "targets": ["q", "head"]})", v);
    expect_well_formed(p, fsdp1 ? "fsdp1 head lora" : "fsdp2 head lora");
    const Op* a = op_named(p, "head lora");
    const Op* sum = op_named(p, "lora sum");
    const Op* bwd = op_named(p, "lora bwd");
    ASSERT_TRUE(a && sum && bwd);
    EXPECT_EQ(a->kind, OpKind::Forward);
    EXPECT_EQ(a->unit, 0);
    EXPECT_EQ(sum->id, a->id + 1);
    ASSERT_EQ(a->allocs.size(), 3u);
    std::vector<std::string> names;
    for (int b : a->allocs) {
      names.push_back(p.buffers[b].name.substr(0, p.buffers[b].name.find(' ')));
      EXPECT_EQ(p.buffers[b].bytes, tv);
      EXPECT_EQ(p.buffers[b].category, MemCategory::Logits);
    }
    EXPECT_EQ(names, (std::vector<std::string>{"head_out", "lora_b_out", "lora_scale"}));
    ASSERT_EQ(a->frees.size(), 1u);
    EXPECT_EQ(a->frees[0].buffer, a->allocs[1]);   // B's output
    ASSERT_EQ(sum->allocs.size(), 1u);
    EXPECT_EQ(p.buffers[sum->allocs[0]].name.rfind("logits", 0), 0u);
    EXPECT_EQ(p.buffers[sum->allocs[0]].bytes, tv);
    ASSERT_EQ(sum->frees.size(), 2u);
    EXPECT_EQ(sum->frees[0].buffer, a->allocs[2]);   // the product, then the base output
    EXPECT_EQ(sum->frees[1].buffer, a->allocs[0]);
    // the head's own forward op (the op before) allocates no logits
    const Op& head = p.ops[static_cast<std::size_t>(a->id - 1)];
    EXPECT_EQ(head.kind, OpKind::Forward);
    for (int b : head.allocs) EXPECT_NE(p.buffers[b].category, MemCategory::Logits) << p.buffers[b].name;
    // backward: the scaled gradient, a transient, right before the head's backward op
    EXPECT_EQ(bwd->kind, OpKind::Backward);
    ASSERT_EQ(bwd->allocs.size(), 1u);
    EXPECT_EQ(p.buffers[bwd->allocs[0]].bytes, tv);
    ASSERT_EQ(bwd->frees.size(), 1u);
    EXPECT_EQ(bwd->frees[0].buffer, bwd->allocs[0]);
    const Op& head_bwd = p.ops[static_cast<std::size_t>(bwd->id + 1)];
    EXPECT_EQ(head_bwd.kind, OpKind::Backward);
    EXPECT_EQ(head_bwd.unit, 0);
    // FSDP1 (use_orig_params): the head's adapters make the root's FlatParameter require grad, and every view of
    // it (M13): the final norm's weight then trains and its mul saves the normalized input, 4 x 8 x 2 = 64 B more.
    EXPECT_EQ(saved_sum(p) - saved_sum(base), fsdp1 ? 80 + 64 : 80) << (fsdp1 ? "fsdp1" : "fsdp2");
  }
  const StepProgram d = lower_plan(R"({"rank": 2, "targets": ["q", "head"], "dropout": 0.1})");
  const StepProgram dq = lower_plan(R"({"rank": 2, "targets": ["q"], "dropout": 0.1})");
  expect_well_formed(d, "head lora dropout");
  EXPECT_EQ(saved_sum(d) - saved_sum(dq), 112);
}

// cuBLAS workspaces (aten/src/ATen/cuda/CublasHandlePool.cpp): one per (handle, stream), handles per
// thread: the forward's GEMMs (Python thread) and the backward's (autograd engine thread) each create one
// on the compute stream at their first GEMM, kept for the process. By hand, a 2-block model with full
// checkpointing and a 32 MiB workspace, one FSDP version each: exactly two persistent, first-step-lazy
// buffers of 32 MiB (64 MiB after the first step), the first allocated by block 0's forward (the
// embedding runs no GEMM), the second by the head's backward (its GEMMs run before any block's recompute);
// none with a 0-byte workspace (the CPU runtime) or for the bundled runtime, which is not PyTorch.
TEST(LoweringWorkspace, TwoCublasWorkspacesForwardThreadAndAutogradThread) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  const Bytes ws = 32 * kMiB;
  for (const char* plan : {R"({"activation_checkpointing": "full"})", R"({"fsdp_version": 1, "activation_checkpointing": "full"})"}) {
    StepProgram p = lower(tiny_spec(2), g, resolved(plan, 8, 8), Topology{8, 8, ws});
    expect_well_formed(p, plan);
    std::vector<const Op*> by;
    std::vector<int> ids;
    for (const Buffer& b : p.buffers) {
      if (b.name.find("cublas_ws") == std::string::npos) continue;
      EXPECT_EQ(b.bytes, ws);
      EXPECT_TRUE(b.persistent && b.first_step_lazy);
      for (const Op& o : p.ops)
        if (std::find(o.allocs.begin(), o.allocs.end(), b.id) != o.allocs.end()) by.push_back(&o), ids.push_back(b.id);
    }
    ASSERT_EQ(by.size(), 2u) << plan;
    // The forward's comes right after the block's first GEMM output (the q projection's: ATen allocates the output,
    // then the call fetches the thread's handle and its workspace), after the norm's tensors: not the op's first.
    const std::vector<int>& fa = by[0]->allocs;
    const auto at = std::find(fa.begin(), fa.end(), ids[0]) - fa.begin();
    ASSERT_GT(at, 1) << plan;
    EXPECT_EQ(p.buffers[static_cast<std::size_t>(fa[static_cast<std::size_t>(at - 1)])].name, "attn.q u1") << plan;
    EXPECT_EQ(by[0]->kind, OpKind::Forward) << plan;
    EXPECT_EQ(by[0]->unit, 1) << plan;   // block 0 (the root holds the embedding, which runs no GEMM)
    EXPECT_EQ(by[1]->kind, OpKind::Backward) << plan;
    EXPECT_EQ(by[1]->unit, 0) << plan;   // the head's backward
    EXPECT_EQ(by[0]->stream, by[1]->stream);   // the compute stream
    for (const Buffer& b : p.buffers) {
      if (b.name.find("cublas_ws") != std::string::npos) {
        EXPECT_EQ(b.pool_stream, by[0]->stream);
      }
    }
    const StepProgram none = lower(tiny_spec(2), g, resolved(plan, 8, 8), Topology{8, 8, 0});
    EXPECT_EQ(none.buffers.size() + 2, p.buffers.size()) << plan;
  }
  StepProgram rt = lower(tiny_spec(2), g, resolved(R"({"implementation": "runtime"})", 8, 8), Topology{8, 8, ws});
  for (const Buffer& b : rt.buffers) EXPECT_EQ(b.name.find("cublas_ws"), std::string::npos);
}

// GPT-2's embedding dropout (GPT2Model.drop after wte + wpe): its 1-byte mask, T x h bytes, is allocated
// by the embedding's forward (the step's first compute op) and freed by the embedding's backward (the
// step's last); with a frozen embedding (trainable_fraction < 1) autograd records nothing and saves no mask.
TEST(LoweringDropout, EmbeddingMaskLivesFromTheFirstForwardToTheLastBackward) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  models::ModelSpec m = tiny_spec(2);
  m.embd_dropout = 0.1;
  for (const char* plan : {R"({"micro_batch": 2, "seq_len": 64})", R"({"fsdp_version": 1, "micro_batch": 2, "seq_len": 64})"}) {
    const StepProgram p = lower(m, g, resolved(plan, 8, 8), Topology{8, 8, 0});
    expect_well_formed(p, plan);
    int mask = -1;
    for (const Buffer& b : p.buffers)
      if (b.name.find("embd_mask") != std::string::npos) mask = b.id;
    ASSERT_GE(mask, 0) << plan;
    EXPECT_EQ(p.buffers[mask].bytes, 2 * 64 * m.hidden) << plan;
    const Op *first_fwd = nullptr, *last_bwd = nullptr, *alloc = nullptr, *freer = nullptr;
    for (const Op& o : p.ops) {
      if (o.kind == OpKind::Forward && !first_fwd) first_fwd = &o;
      if (o.kind == OpKind::Backward) last_bwd = &o;
      if (std::find(o.allocs.begin(), o.allocs.end(), mask) != o.allocs.end()) alloc = &o;
      for (const auto& f : o.frees)
        if (f.buffer == mask) freer = &o;
    }
    EXPECT_EQ(alloc, first_fwd) << plan;
    EXPECT_EQ(freer, last_bwd) << plan;
  }
  const StepProgram frozen = lower(m, g, resolved(R"({"trainable_fraction": 0.5})", 8, 8), Topology{8, 8, 0});
  for (const Buffer& b : frozen.buffers) EXPECT_EQ(b.name.find("embd_mask"), std::string::npos);
}

// Liger's fused linear cross-entropy computes the head weight's gradient in its forward and saves it
// (liger_kernel/ops/fused_linear_cross_entropy.py): by hand, V = 64, C = 16, bf16: one 64 x 16 x 2 =
// 2048-byte buffer allocated by the head's forward and freed by a loss op before the head's backward
// (AccumulateGrad takes it as the .grad, the unit's gradient is allocated there); none when frozen.
TEST(LoweringLoss, FusedLinearKeepsTheHeadWeightGradientFromItsForward) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  StepProgram p = lower_hand(g, R"({"cross_entropy": "fused_linear"})", 8, 8);
  expect_well_formed(p, "fused_linear");
  int found = 0;
  for (const Buffer& b : p.buffers) {
    if (b.name.find("flce_wgrad") == std::string::npos) continue;
    ++found;
    EXPECT_EQ(b.bytes, 64 * 16 * 2);
    int alloc = -1, freed = -1, head_bwd = -1;
    for (const Op& o : p.ops) {
      if (std::find(o.allocs.begin(), o.allocs.end(), b.id) != o.allocs.end()) alloc = o.id;
      for (const auto& f : o.frees)
        if (f.buffer == b.id) freed = o.id;
      if (o.kind == OpKind::Backward && o.unit == 0 && head_bwd < 0 && !o.kernel_list().empty()) head_bwd = o.id;
    }
    ASSERT_GE(alloc, 0);
    EXPECT_EQ(p.ops[alloc].kind, OpKind::Forward);
    EXPECT_EQ(p.ops[alloc].unit, 0);
    EXPECT_GT(freed, alloc);
    EXPECT_LT(freed, head_bwd);
  }
  EXPECT_EQ(found, 1);
  StepProgram frozen = lower_hand(g, R"({"cross_entropy": "fused_linear", "trainable_fraction": 0.5})", 8, 8);
  for (const Buffer& b : frozen.buffers) EXPECT_EQ(b.name.find("flce_wgrad"), std::string::npos);
}

// What the fused linear cross-entropy keeps besides the head weight's gradient, the head input's gradient
// (T x C: 2048 tokens x 16 x 2 B, with a T x 4 B row statistic: LossMemory::logits), is the gradient the final
// norm's backward starts from: the head's backward op frees it, and its transient leaves out that gradient
// (2048 x 16 x 2 B, in the final norm's backward_extra as the head matmul's input gradient), which this buffer
// already holds. It is not held to the end of the backward (PyTorch 2.11, l3-8b-fsdp2-ac-mb2-s8192-fused:
// freed at the final norm's backward).
TEST(LoweringLoss, FusedLinearHeadInputGradientIsFreedByTheHeadBackward) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  StepProgram p = lower_hand(g, R"({"cross_entropy": "fused_linear"})", 8, 8);
  expect_well_formed(p, "fused_linear");
  const Buffer* kept = nullptr;
  for (const Buffer& b : p.buffers)
    if (b.name.rfind("logits", 0) == 0) kept = &b;
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ(kept->bytes, 2048 * 16 * 2 + 2048 * 4);
  const Op* head_bwd = nullptr;
  for (const Op* o : ops_of(p, OpKind::Backward, 0))
    if (!o->kernel_list().empty()) {
      head_bwd = o;
      break;
    }
  ASSERT_NE(head_bwd, nullptr);
  EXPECT_TRUE(frees(*head_bwd, kept->id));
  const models::BlockMemory fn = models::final_norm_memory(tiny_spec(2), 1, 2048, Dtype::BF16, models::ImplOptions{});
  Bytes tmp = 0;
  for (int b : allocs_of(p, *head_bwd, MemCategory::Activations))
    if (p.buffers[b].name.rfind("bwd_tmp", 0) == 0) tmp += p.buffers[b].bytes;
  EXPECT_EQ(tmp, fn.backward_extra - 2048 * 16 * 2);
}

// The Logits bytes alive at each op, in issue order (allocations count before the op's frees: the op's peak),
// with the op's name and kind.
struct LiveAt {
  std::string name;
  OpKind kind;
  Bytes peak, after;
};
std::vector<LiveAt> logits_live(const StepProgram& p) {
  std::vector<LiveAt> r;
  Bytes live = 0;
  for (const Op& o : p.ops) {
    live += alloc_bytes(p, o, MemCategory::Logits);
    const Bytes peak = live;
    for (const FreeSpec& f : frees_of(p, o, MemCategory::Logits)) live -= p.buffers[f.buffer].bytes;
    r.push_back({o.name, o.kind, peak, live});
  }
  return r;
}

// torchtune's chunked output and CEWithChunkedOutputLoss (cross_entropy "chunked", LossMemory::chunked_output),
// counted by hand on the 2-block hand model: V = 64, C = 16, bf16, micro_batch 2 x seq_len 16 = 32 tokens
// (T x V = 2048 logits), 8 chunks of 2 positions = 4 rows each. Per chunk: the bf16 logits 4 x 64 x 2 = 512 B;
// the fp32 copy, the saved log-probabilities and both loss-backward gradients 4 x 64 x 4 = 1024 B each; the
// chunk input's gradient 4 x 16 x 2 = 128 B; the head weight's gradient 64 x 16 x 2 = 2048 B. Logits bytes:
//   head forward          the 8 logits chunks: 4096
//   loss forward, chunk i + copy + log-probs, the copy freed: at chunk 7 4096 + 7 x 1024 + 2 x 1024 = 13312;
//                         `del logits` leaves the 8 log-probs: 8192
//   loss backward         chunk 7 first: + nll grad + log_softmax grad = 10240 (5 bytes per logit), then - nll
//                         grad - its log-probs, + its bf16 gradient - the fp32 one = 7680; chunk 6 peaks at
//                         7680 + 2048 = 9728, each next chunk 512 lower (one more bf16 gradient, one fewer
//                         log-probs): 10240, 9728, ..., 6656; at the end the 8 bf16 gradients: 4096
//   head backward         chunk 7 first, each frees its 512: 0; chunks 6..0 each add the weight gradient
//                         (2048, freed at once) to the unit's .grad; the split's cat frees the 8 input gradients.
// F.cross_entropy over the whole fp32 logits (cross_entropy "torch") holds 12 bytes per logit at the start of
// its backward (log-probs + nll grad + log_softmax grad): 24576.
TEST(LoweringLoss, ChunkedOutputLossByHand) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  const std::string base = R"({"micro_batch": 2, "seq_len": 16, "free_logits_before_backward": true, )";
  StepProgram p = lower_hand(g, base + R"("cross_entropy": "chunked"})", 8, 8);
  expect_well_formed(p, "chunked");
  const std::vector<LiveAt> live = logits_live(p);
  Bytes fwd_peak = 0, fwd_end = 0, end_of_loss_bwd = -1;
  std::vector<Bytes> ce_bwd;
  int head_chunks = 0, splits = 0;
  for (std::size_t i = 0; i < live.size(); ++i) {
    const LiveAt& l = live[i];
    const Op& o = p.ops[i];
    if (o.micro_batch != 0) continue;
    if (l.kind == OpKind::Forward) {
      fwd_peak = std::max(fwd_peak, l.peak);
      fwd_end = l.after;
    }
    if (l.name.find("ce bwd") != std::string::npos) ce_bwd.push_back(l.peak);
    if (l.name.find("upcast bwd") != std::string::npos) end_of_loss_bwd = l.after;
    if (l.name.find("head bwd") != std::string::npos) {
      ++head_chunks;
      EXPECT_EQ(alloc_bytes(p, o, MemCategory::Activations), 128);   // the chunk input's gradient
      EXPECT_EQ(alloc_bytes(p, o, MemCategory::UnshardedGrads), head_chunks == 1 ? 0 : 2048) << head_chunks;
      EXPECT_EQ(l.peak - l.after, 512);                              // its bf16 logits gradient dies
    }
    if (l.name.find("split bwd") != std::string::npos) {
      ++splits;
      Bytes freed = 0;
      for (const FreeSpec& f : frees_of(p, o, MemCategory::Activations))
        if (p.buffers[f.buffer].name.find("in_grad") != std::string::npos) freed += p.buffers[f.buffer].bytes;
      EXPECT_EQ(freed, 8 * 128);
      EXPECT_EQ(l.after, 0);
    }
  }
  EXPECT_EQ(fwd_peak, 13312);
  EXPECT_EQ(fwd_end, 8192);
  EXPECT_EQ(ce_bwd, (std::vector<Bytes>{10240, 9728, 9216, 8704, 8192, 7680, 7168, 6656}));
  EXPECT_EQ(end_of_loss_bwd, 4096);
  EXPECT_EQ(head_chunks, 8);
  EXPECT_EQ(splits, 1);

  // The loop keeps the logits (no `del logits`): 4096 more until the head's backward op frees them.
  StepProgram kept = lower_hand(g, R"({"micro_batch": 2, "seq_len": 16, "cross_entropy": "chunked"})", 8, 8);
  expect_well_formed(kept, "chunked, logits kept");
  Bytes kept_bwd = 0;
  for (const LiveAt& l : logits_live(kept))
    if (l.name.find("ce bwd") != std::string::npos) kept_bwd = std::max(kept_bwd, l.peak);
  EXPECT_EQ(kept_bwd, 10240 + 4096);

  // A frozen head (LoRA: the root frozen) adds no weight gradient.
  const auto wgrad_tmps = [](const StepProgram& q) {
    int n = 0;
    for (const Buffer& b : q.buffers) n += b.name.find("wgrad_tmp") != std::string::npos;
    return n;
  };
  EXPECT_EQ(wgrad_tmps(p), 7);
  StepProgram lora = lower_hand(
      g, base + R"("cross_entropy": "chunked", "trainable_fraction": 0.5, "frozen_units": ["root"]})", 8, 8);
  expect_well_formed(lora, "chunked, frozen head");
  EXPECT_EQ(wgrad_tmps(lora), 0);

  // seq_len 13: torch.chunk(8) gives ceil(13 / 8) = 2 positions per chunk, 7 chunks (the last of 1 position:
  // 2 rows). Forward peak: 6 x 512 + 256 + 6 x 1024 (log-probs 0..5) + 2 x 512 (chunk 6's copy and log-probs)
  // = 3328 + 6144 + 1024 = 10496.
  StepProgram odd = lower_hand(g, R"({"micro_batch": 2, "seq_len": 13, "free_logits_before_backward": true, )"
                                  R"("cross_entropy": "chunked"})", 8, 8);
  expect_well_formed(odd, "chunked, seq 13");
  Bytes odd_peak = 0;
  int odd_chunks = 0;
  for (const LiveAt& l : logits_live(odd)) {
    if (l.kind == OpKind::Forward) odd_peak = std::max(odd_peak, l.peak);
    if (l.name.find("ce chunk") != std::string::npos) ++odd_chunks;
  }
  EXPECT_EQ(odd_peak, 10496);
  EXPECT_EQ(odd_chunks, 7);

  // The same step with F.cross_entropy over the whole logits.
  StepProgram torch = lower_hand(g, base + R"("cross_entropy": "torch"})", 8, 8);
  Bytes torch_bwd = 0;
  for (const LiveAt& l : logits_live(torch))
    if (l.kind == OpKind::Backward) torch_bwd = std::max(torch_bwd, l.peak);
  EXPECT_EQ(torch_bwd, 24576);
}

TEST(LoweringFacts, StepFactsAndNotes) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  StepProgram p = lower_hand(g, R"({"micro_batch": 2, "seq_len": 64, "grad_accum": 3})", 16, 8);
  EXPECT_EQ(p.world, 16);
  EXPECT_EQ(p.shard_size, 16);
  EXPECT_EQ(p.replicate_size, 1);
  EXPECT_EQ(p.gpus_per_node, 8);
  EXPECT_EQ(p.micro_batches, 3);
  EXPECT_EQ(p.tokens_per_rank, 2 * 64 * 3);
  EXPECT_DOUBLE_EQ(p.model_flops_per_rank, models::flops_per_token(tiny_spec(2), 64).forward_backward * 384);
  EXPECT_EQ(p.ops.back().kind, OpKind::OptimizerStep);
  // AdamW over the fp32 shards: 7 accesses of 4 bytes per trainable sharded element.
  // N=16 dim-0 chunks: root [8,4] -> 4, [4] -> 1, [8,4] -> 4 = 9; block [6,4] -> 4, [3] -> 1 = 5.
  EXPECT_EQ(p.ops.back().copy_bytes, (9 + 5 + 5) * 4 * 7);
}

void expect_same(const StepProgram& a, const StepProgram& b) {
  ASSERT_EQ(a.ops.size(), b.ops.size());
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    const Op &x = a.ops[i], &y = b.ops[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.stream, y.stream);
    EXPECT_EQ(x.waits, y.waits);
    EXPECT_EQ(x.cpu_waits, y.cpu_waits);
    EXPECT_EQ(x.allocs, y.allocs);
    EXPECT_EQ(x.comm_bytes, y.comm_bytes);
    EXPECT_EQ(x.copy_bytes, y.copy_bytes);
    EXPECT_EQ(x.kernel_list().size(), y.kernel_list().size());
  }
  for (std::size_t i = 0; i < a.buffers.size(); ++i) EXPECT_EQ(a.buffers[i].bytes, b.buffers[i].bytes);
}

// Every version x strategy x prefetch x AC x accumulation on the zoo's tiny-llama lowers to a
// well-formed, deterministic program.
TEST(LoweringMatrix, TinyLlamaEveryCombinationIsWellFormed) {
  models::ModelSpec m = models::load_model("tiny-llama");
  const char* plans[] = {
      R"({"fsdp_version": 1})",
      R"({"fsdp_version": 1, "sharding_strategy": "SHARD_GRAD_OP", "backward_prefetch": "BACKWARD_POST"})",
      R"({"fsdp_version": 1, "sharding_strategy": "NO_SHARD"})",
      R"({"fsdp_version": 1, "sharding_strategy": "HYBRID_SHARD", "forward_prefetch": true, "grad_accum": 2})",
      R"({"fsdp_version": 1, "sharding_strategy": "_HYBRID_SHARD_ZERO2", "grad_accum": 2, "grad_sync": true})",
      R"({"fsdp_version": 1, "activation_checkpointing": {"mode": "full", "outside_fsdp": true}, "backward_prefetch": null})",
      R"({"fsdp_version": 1, "cpu_offload": true, "grad_accum": 2, "param_dtype": "fp32"})",
      R"({"fsdp_version": 1, "use_orig_params": false, "reduce_dtype": "bf16", "limit_all_gathers": false})",
      R"({"fsdp_version": 1, "auto_wrap_policy": "none"})",
      R"({"fsdp_version": 1, "auto_wrap_policy": {"min_num_params": 1000000}})",
      R"({})",
      R"({"reshard_after_forward": false, "grad_accum": 2})",
      R"({"mesh": [8, 1]})",
      R"({"mesh": [2, 4], "grad_accum": 2, "grad_sync": true})",
      R"({"reshard_after_forward": 2, "prefetch_depth": 2, "forward_prefetch": true})",
      R"({"activation_checkpointing": "selective_op", "reduce_dtype": "fp16"})",
      R"({"activation_checkpointing": {"mode": "every_k", "every_k": 2, "outside_fsdp": true}})",
      R"({"fp8_all_gather": true, "cpu_offload": true, "grad_accum": 2})",
      R"({"cpu_offload": {"optimizer": true}, "optimizer": "sgd"})",
      R"({"master_weights_dtype": "bf16", "reduce_dtype": "bf16", "trainable_fraction": 0.1})",
      R"({"auto_wrap_policy": {"modules": ["model.layers.*", "model.embed_tokens", "lm_head"]}})",
      R"({"backward_prefetch": "NONE", "grad_accum": 4})",
  };
  for (const char* text : plans) {
    Plan plan = resolved(text, 8, 4);
    auto g = models::build_wrap_graph(m, plan.auto_wrap_policy);
    StepProgram a = lower(m, g, plan, Topology{8, 4});
    expect_well_formed(a, text);
    StepProgram b = lower(m, g, plan, Topology{8, 4});
    expect_same(a, b);
    EXPECT_FALSE(a.ops.empty());
    // Every unit with params is reduced in the last micro-batch exactly once.
    std::map<int, int> reduced;
    for (const auto& o : a.ops)
      if ((o.kind == OpKind::ReduceScatter || (o.kind == OpKind::AllReduce && o.group == CommGroup::World)) &&
          o.micro_batch == a.micro_batches - 1)
        ++reduced[o.unit];
    // (frozen units, under trainable_fraction < 1, have no gradient and are never reduced)
    const models::TrainableSet ts = models::trainable_set(m, plan.implementation, plan.trainable_fraction);
    for (const auto& u : g.units) {
      bool trains = false;
      for (const auto& t : u.tensors) trains = trains || models::tensor_trains(ts, t.name);
      if (u.params > 0) {
        EXPECT_EQ(reduced[u.id], trains ? 1 : 0) << text << " unit " << u.id;
      }
    }
  }
}

TEST(LoweringErrors, UnresolvedPlanIsAnInputError) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  Plan p = parse_plan(nlohmann::json::parse("{}"));
  EXPECT_THROW(lower(tiny_spec(2), g, p, Topology{8, 8}), InputError);
  Plan r = resolve_plan(p, 8, 8);
  EXPECT_THROW(lower(tiny_spec(2), g, r, Topology{4, 4}), InputError);
}

// make_context indexes per-unit arrays with forward_order's entries: a hand-built graph whose order is
// not a permutation of the unit ids (a repeat, an id out of range) is rejected, naming the entry.
TEST(LoweringErrors, ForwardOrderMustBeAPermutation) {
  Plan r = resolve_plan(parse_plan(nlohmann::json::parse("{}")), 8, 8);
  const struct {
    std::vector<int> order;
    const char* field;
  } cases[] = {{{0, 1, 1}, "wrap_graph.forward_order[2] = 1"},
               {{0, 1, 3}, "wrap_graph.forward_order[2] = 3"},
               {{0, -1, 2}, "wrap_graph.forward_order[1] = -1"}};
  for (const auto& c : cases) {
    auto g = block_graph(kRoot, {kBlock, kBlock});
    g.forward_order = c.order;
    try {
      lower(tiny_spec(2), g, r, Topology{8, 8});
      ADD_FAILURE() << "accepted " << c.field;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(c.field), std::string::npos) << e.what();
    }
  }

}

// Gradients and optimizer state per parameter, by hand, on the tiny llama above (2 blocks, untied head,
// 1704 parameters: embedding 32 x 8 = 256; per block q 8x8, k 4x8, v 4x8, o 8x8, gate 16x8, up 16x8,
// down 8x16, two norms of 8 = 592; final norm 8; head 32 x 8 = 256), full training on 2 GPUs, bf16
// compute (2 B gradients), fp32 master and AdamW state (4 B).
//   FSDP2: autograd makes each parameter's gradient in the backward op that uses it: the head's op the
//     final norm's (8 x 2 = 16 B) and the head's (256 x 2 = 512 B), the embedding's op the embedding's
//     (512 B, at the end of the backward, not with the head's); a block's op its own 592 x 2 = 1184 B, one
//     tensor per parameter.
//     torch.optim's state per sharded parameter (dim-0 chunks of 2 ranks: q 4 rows x 8 = 32, k 16, v 16,
//     o 32, gate 64, up 64, down 4 x 16 = 64, norms 4 and 4), exp_avg then exp_avg_sq, x 4 B.
//   FSDP1 use_orig_params (fp32 flat parameter, every tensor 16-byte aligned already): a block's flat
//     parameter is 592, rank 0's shard [0, 296) holds q 64, k 32, v 32, o 64 and 104 of gate's 128:
//     one state pair per part.
TEST(LoweringGradients, PerParameterGradientsAndOptimizerStateByHand) {
  models::ModelSpec m = tiny_spec(2);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  ASSERT_EQ(models::count_params(m).total, 1704);
  const auto lower_plan = [&](const std::string& extra) {
    const Plan plan = resolved(R"({"implementation": "hf", "micro_batch": 1, "seq_len": 4)" + extra + "}", 2, 2);
    return lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
  };
  // The unsharded gradients each backward op of a unit allocates, op by op.
  const auto grads = [](const StepProgram& p, int unit) {
    std::vector<std::vector<Bytes>> v;
    for (const Op* o : ops_of(p, OpKind::Backward, unit)) {
      std::vector<Bytes> g;
      for (int b : allocs_of(p, *o, MemCategory::UnshardedGrads))
        if (p.buffers[b].name.find("grad_tmp") == std::string::npos) g.push_back(p.buffers[b].bytes);
      if (!g.empty()) v.push_back(g);
    }
    return v;
  };
  const auto state = [](const StepProgram& p, int unit) {
    std::vector<Bytes> v;
    for (const Buffer& b : p.buffers)
      if (b.persistent && b.category == MemCategory::OptimizerState && b.unit == unit) v.push_back(b.bytes);
    return v;
  };
  const StepProgram f2 = lower_plan("");
  expect_well_formed(f2, "fsdp2");
  EXPECT_EQ(grads(f2, 0), (std::vector<std::vector<Bytes>>{{16, 512}, {512}}));   // head's op, then the embedding's
  // a block's op its parameters' one by one, the reverse of the forward's module calls: down, up, gate,
  // post-attention norm, o, v, k, q, input norm (x 2 B)
  EXPECT_EQ(grads(f2, 1), (std::vector<std::vector<Bytes>>{{256, 256, 256, 16, 128, 64, 64, 128, 16}}));
  EXPECT_EQ(state(f2, 1), (std::vector<Bytes>{128, 128, 64, 64, 64, 64, 128, 128, 256, 256, 256, 256, 256, 256, 16, 16, 16, 16}));
  EXPECT_EQ(state(f2, 0), (std::vector<Bytes>{512, 512, 16, 16, 512, 512}));   // embedding, final norm, head
  // The copy-in of the root's reduce-scatter reads and frees all three of its gradients.
  const auto copy_in = ops_of(f2, OpKind::CopyIn, 0);
  ASSERT_FALSE(copy_in.empty());
  EXPECT_EQ(copy_in.back()->frees.size(), 3u);

  // A tied head (the embedding's weight, 256 parameters, used twice): FSDP2's leaf gets the head's gradient
  // (512 B) at the head's op and the embedding's (512 B, transient) at the embedding's, which autograd's
  // input buffer sums out of place into a third tensor (512 B): three of them live at that op, the two
  // addends freed by it; the reduce-scatter copy-in reads and frees the final norm's and the sum.
  models::ModelSpec tied = m;
  tied.tied_embeddings = true;
  ASSERT_EQ(models::count_params(tied).total, 1448);
  {
    const Plan plan = resolved(R"({"implementation": "hf", "micro_batch": 1, "seq_len": 4})", 2, 2);
    const StepProgram t = lower(tied, models::build_wrap_graph(tied, plan.auto_wrap_policy), plan, Topology{2, 2});
    expect_well_formed(t, "fsdp2 tied");
    EXPECT_EQ(grads(t, 0), (std::vector<std::vector<Bytes>>{{16, 512}, {512}}));
    std::vector<const Op*> bwd;   // the root's backward ops that allocate gradients: the head's, the embedding's
    for (const Op* o : ops_of(t, OpKind::Backward, 0))
      if (!allocs_of(t, *o, MemCategory::UnshardedGrads).empty()) bwd.push_back(o);
    ASSERT_EQ(bwd.size(), 2u);
    std::vector<Bytes> emb_allocs;
    for (int b : allocs_of(t, *bwd[1], MemCategory::UnshardedGrads)) emb_allocs.push_back(t.buffers[b].bytes);
    EXPECT_EQ(emb_allocs, (std::vector<Bytes>{512, 512}));   // the embedding's gradient, then the sum
    int head_tied = -1;
    for (int b : allocs_of(t, *bwd[0], MemCategory::UnshardedGrads))
      if (t.buffers[b].bytes == 512) head_tied = b;
    ASSERT_GE(head_tied, 0);
    int freed_here = 0;
    for (const FreeSpec& f : bwd[1]->frees)
      if (t.buffers[f.buffer].category == MemCategory::UnshardedGrads) {
        ++freed_here;
        EXPECT_TRUE(f.buffer == head_tied || t.buffers[f.buffer].name.find("grad_tmp") != std::string::npos);
      }
    EXPECT_EQ(freed_here, 2);
    const auto ci = ops_of(t, OpKind::CopyIn, 0);
    ASSERT_FALSE(ci.empty());
    EXPECT_EQ(ci.back()->frees.size(), 2u);
  }

  const StepProgram f1 = lower_plan(R"(, "fsdp_version": 1)");
  expect_well_formed(f1, "fsdp1");
  EXPECT_EQ(state(f1, 1), (std::vector<Bytes>{256, 256, 128, 128, 128, 128, 256, 256, 416, 416}));
  // Without use_orig_params the FlatParameter is one parameter: its shard's exp_avg and exp_avg_sq, each its own
  // tensor (adamw.py _init_group: torch.zeros_like(p) for each), 296 x 4 B.
  const StepProgram f1flat = lower_plan(R"(, "fsdp_version": 1, "use_orig_params": false)");
  EXPECT_EQ(state(f1flat, 1), (std::vector<Bytes>{296 * 4, 296 * 4}));
}

// FSDP2 on a one-rank shard group (one GPU, or HSDP with shard size 1) runs no all-gather: FSDPParamGroup.unshard
// returns an empty result and wait_for_unshard copies each parameter's shard into its own storage on the
// current (default) stream. The lowering: one cast op per group on the compute stream, one buffer per
// parameter (the tiny block: q 64, k 32, v 32, o 64, gate 128, up 128, down 128 and two norms of 8, x 2 B),
// all freed when the group reshards; no all-gather op.
TEST(LoweringFsdp2, OneRankGroupUnshardsParameterByParameterOnTheDefaultStream) {
  models::ModelSpec m = tiny_spec(2);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  const Plan plan = resolved(R"({"implementation": "hf", "micro_batch": 1, "seq_len": 4})", 1, 1);
  const StepProgram p = lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{1, 1});
  expect_well_formed(p, "one rank");
  EXPECT_TRUE(ops_of(p, OpKind::AllGather).empty());
  const auto casts = ops_of(p, OpKind::Cast, 1);
  ASSERT_FALSE(casts.empty());
  EXPECT_EQ(casts.front()->stream, 0);   // the default stream
  std::vector<Bytes> parts;
  for (int b : allocs_of(p, *casts.front(), MemCategory::UnshardedParams)) {
    parts.push_back(p.buffers[b].bytes);
    EXPECT_EQ(p.buffers[b].pool_stream, 0);
  }
  std::vector<Bytes> sorted = parts;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<Bytes>{16, 16, 64, 64, 128, 128, 256, 256, 256}));
  // every one of them is freed again before the step ends (reshard)
  int freed = 0;
  for (const Op& o : p.ops)
    for (const FreeSpec& f : o.frees)
      for (int b : allocs_of(p, *casts.front(), MemCategory::UnshardedParams)) freed += f.buffer == b;
  EXPECT_EQ(freed, static_cast<int>(parts.size()));
  // The bundled runtime keeps one buffer per group on the copy-in stream.
  const Plan rt = resolved(R"({"implementation": "runtime", "micro_batch": 1, "seq_len": 4})", 1, 1);
  const StepProgram q = lower(m, models::build_wrap_graph(m, rt.auto_wrap_policy), rt, Topology{1, 1});
  const auto rcasts = ops_of(q, OpKind::Cast, 1);
  ASSERT_FALSE(rcasts.empty());
  EXPECT_EQ(allocs_of(q, *rcasts.front(), MemCategory::UnshardedParams).size(), 1u);
}

// A block whose linears and norms have biases, trained in part (trainable_fraction: its rule never trains a bias,
// models/trainable.h tensor_weight) under FSDP2, which keeps a .grad per trainable parameter only: the block's
// backward makes its gradients where its ops do (the tape's weight gradients, without the biases': GradFlow::
// biases_train), as a fully trained block's, not one lumped transient plus every gradient at once. (Until
// 2026-11-29 the tape counted the frozen biases' gradients too, the sums differed and every gpt2, phi, mpt and
// qwen2 block trained in part fell back to that transient.) The tiny GPT-2 shape of models_test (h 8, f 32): 2% of
// the parameters is one 8 x 8 matrix (the attention's c_proj weight, without its bias) in one block: 128 B.
TEST(LoweringGradients, BiasedBlocksTrainedInPartMakeTheirGradientsByTensor) {
  models::ModelSpec m = models::load_model("gpt2");
  m.n_layers = 2, m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 2, m.head_dim = 4, m.ffn_hidden = 32, m.vocab_size = 32;
  m.max_positions = 64;
  const Plan plan = resolved(R"({"implementation": "hf", "micro_batch": 1, "seq_len": 4, "trainable_fraction": 0.02})", 2, 2);
  const StepProgram p = lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
  expect_well_formed(p, "gpt2 in part");
  int grads = 0;
  for (const Buffer& b : p.buffers) {
    if (b.unit < 1) continue;   // (unit 0, the root: the head's backward is one transient)
    EXPECT_NE(b.name.rfind("bwd_tmp", 0), 0u) << b.name;
    if (b.category == MemCategory::UnshardedGrads) {
      EXPECT_EQ(b.bytes, 128) << b.name;
      ++grads;
    }
  }
  EXPECT_EQ(grads, 1);
}

// The sharded parameters, by hand, on the tiny llama of PerParameterGradientsAndOptimizerStateByHand (2
// GPUs, fp32 master weights): FSDP2 keeps each parameter's dim-0 chunk as a tensor of its own
// (FSDPParam._sharded_param_data), so the allocator places each: a block's q 4 rows x 8 = 32, k 16, v 16,
// o 32, gate 64, up 64, down 4 x 16 = 64, norms 4 and 4 (x 4 B); the root's embedding 16 x 8 = 128, final
// norm 4, head 128. FSDP1's FlatParameter shard is one tensor (a block's 592 / 2 = 296 x 4 B), and so is the
// bundled runtime's unit.
TEST(LoweringGradients, Fsdp2ShardsEachParameterIntoATensorOfItsOwn) {
  models::ModelSpec m = tiny_spec(2);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  ASSERT_EQ(models::count_params(m).total, 1704);
  const auto shards = [&](const std::string& extra, int unit) {
    const Plan plan = resolved(R"({"implementation": "hf", "micro_batch": 1, "seq_len": 4)" + extra + "}", 2, 2);
    const StepProgram p = lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
    expect_well_formed(p, extra);
    std::vector<Bytes> v;
    for (const Buffer& b : p.buffers)
      if (b.persistent && b.category == MemCategory::ShardedParams && b.unit == unit) v.push_back(b.bytes);
    return v;
  };
  EXPECT_EQ(shards("", 1), (std::vector<Bytes>{128, 64, 64, 128, 256, 256, 256, 16, 16}));
  EXPECT_EQ(shards("", 2), (std::vector<Bytes>{128, 64, 64, 128, 256, 256, 256, 16, 16}));
  EXPECT_EQ(shards("", 0), (std::vector<Bytes>{512, 16, 512}));   // embedding, final norm, head
  EXPECT_EQ(shards(R"(, "fsdp_version": 1)", 1), (std::vector<Bytes>{1184}));
  // LoRA (r 2 on q and v): the frozen base weights keep their shards, the adapters' follow (A 2 x 8 -> 1 row
  // x 8; q's B 8 x 2 -> 4 x 2, v's 4 x 2 -> 2 x 2: 32, 32, 32, 16 B).
  EXPECT_EQ(shards(R"(, "lora": {"rank": 2, "targets": ["q", "v"]})", 1),
            (std::vector<Bytes>{128, 64, 64, 128, 256, 256, 256, 16, 16, 32, 32, 32, 16}));
}

// FSDP2 with one parameter group for several blocks (here the whole model: auto_wrap_policy "none", as
// fully_shard(model) alone) trained in part: each trainable parameter gets its .grad in the backward op that
// makes it (param_grad_parts' `trained`), not the group's whole gradient as one buffer at the group's first
// backward (the head's, before any block's: until 2026-11-28, which also kept every block's backward from
// placing its weight gradients). The tiny llama (h 8, 2 heads of 4, 1 KV head, ffn 16) by hand:
//  - LoRA r2 on q and v: per block q's A 2 x 8 and B 8 x 2, v's A 2 x 8 and B 4 x 2: 32, 32, 32, 16 B in bf16;
//    with the head too, the head's A 2 x 8 and B 32 x 2 (32 and 128 B) in the head's backward;
//  - trainable_fraction 0.1 of 1,704 parameters (embedding and head 32 x 8 each, the final norm 8, per block q 64,
//    k 32, v 32, o 64, gate, up and down 128 each, two norms of 8): 170.4; the rule (models/trainable.h) trains q
//    in every block (128), then v (32) where it still fits, in one block (i * L / count for count 1: block 0):
//    160 parameters; q's gradient 128 B in each block, v's 64 B in block 0's.
// Nothing is lumped: no block backward takes the transient `bwd_tmp`, the head's backward makes no gradient.
TEST(LoweringGradients, OneGroupForSeveralBlocksTrainedInPartMakesEachGradientInItsBlock) {
  models::ModelSpec m = tiny_spec(2);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  for (const char* part : {R"("lora": {"rank": 2, "targets": ["q", "v"]})", R"("trainable_fraction": 0.1)",
                           R"("lora": {"rank": 2, "targets": ["q", "v", "head"]})"}) {
    SCOPED_TRACE(part);
    const Plan plan = resolved(std::string(R"({"implementation": "hf", "micro_batch": 1, "seq_len": 16, "auto_wrap_policy": "none", )") +
                                   part + "}",
                               2, 2);
    const models::WrapGraph g = models::build_wrap_graph(m, plan.auto_wrap_policy);
    ASSERT_EQ(g.units.size(), 1u);
    const StepProgram p = lower(m, g, plan, Topology{2, 2});
    expect_well_formed(p, part);
    const bool lora = plan.lora.on();
    std::vector<const Op*> bwd;   // the modules' backward ops (not the loss's: "nll bwd", ...)
    for (const Op* o : ops_of(p, OpKind::Backward, 0))
      if (o->name.rfind("bwd", 0) == 0) bwd.push_back(o);
    ASSERT_EQ(bwd.size(), 4u);   // head, block 1, block 0, embedding
    std::vector<std::vector<Bytes>> grads;
    for (const Op* o : bwd) {
      std::vector<Bytes> v;
      for (int b : allocs_of(p, *o, MemCategory::UnshardedGrads)) v.push_back(p.buffers[static_cast<std::size_t>(b)].bytes);
      std::sort(v.begin(), v.end());
      grads.push_back(v);
    }
    const std::vector<Bytes> block1 = lora ? std::vector<Bytes>{16, 32, 32, 32} : std::vector<Bytes>{128};
    const std::vector<Bytes> block0 = lora ? std::vector<Bytes>{16, 32, 32, 32} : std::vector<Bytes>{64, 128};
    // LoRA on the head: its A (2 x 8) and B (32 x 2), each its own .grad, in the head's backward
    const bool head = part == std::string(R"("lora": {"rank": 2, "targets": ["q", "v", "head"]})");
    const std::vector<Bytes> at_head = head ? std::vector<Bytes>{32, 128} : std::vector<Bytes>{};
    EXPECT_EQ(grads, (std::vector<std::vector<Bytes>>{at_head, block1, block0, {}}));
    for (const Op* o : {bwd[1], bwd[2]})
      for (int b : o->allocs) EXPECT_NE(p.buffers[static_cast<std::size_t>(b)].name.rfind("bwd_tmp", 0), 0u);
  }
}

// GPT-NeoX's parameter names (gpt_neox.layers.N..., gpt_neox.embed_in, embed_out) are placed by the trainable rule
// like every other module tree's (until 2026-11-28 its units counted as known by their count alone: a fraction of
// each unit trained, and FSDP2's block backward took the lumped transient). The tiny NeoX (h 8, 2 heads of 4, ffn
// 32, vocab 32, untied) by hand: 2,272 parameters (embed_in and embed_out 256 each, the final LayerNorm 16, per
// block query_key_value 192 + 24, dense 64 + 8, dense_h_to_4h 256 + 32, dense_4h_to_h 256 + 8, two LayerNorms
// 16 each); trainable_fraction 0.2 is 454.4: the rule trains the fused QKV matrix in both blocks (384) and the
// attention's dense in block 0 only (64 more fit, 128 do not): FSDP2's .grad per trained weight, 384 B and 128 B.
// FSDP1 without use_orig_params: a FlatParameter with any trained tensor has its whole gradient (every block's
// unit, 872 parameters: 1,744 B; the root's none).
TEST(LoweringGradients, GptNeoxBlocksTrainedInPartArePlacedByName) {
  models::ModelSpec m = models::load_model("stablelm-alpha-3b");
  m.n_layers = 2, m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 2, m.head_dim = 4, m.ffn_hidden = 32, m.vocab_size = 32;
  m.rotary_dim = 2;
  ASSERT_EQ(models::count_params(m).total, 2272);
  const auto lower_plan = [&](const std::string& extra) {
    const Plan plan =
        resolved(R"({"implementation": "hf", "micro_batch": 1, "seq_len": 16, "trainable_fraction": 0.2)" + extra + "}", 2, 2);
    return lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
  };
  const auto block_grads = [](const StepProgram& p, int unit) {
    std::vector<Bytes> v;
    for (const Op* o : ops_of(p, OpKind::Backward, unit))
      for (int b : allocs_of(p, *o, MemCategory::UnshardedGrads)) v.push_back(p.buffers[static_cast<std::size_t>(b)].bytes);
    std::sort(v.begin(), v.end());
    return v;
  };
  const StepProgram f2 = lower_plan("");
  expect_well_formed(f2, "fsdp2");
  EXPECT_EQ(block_grads(f2, 1), (std::vector<Bytes>{128, 384}));   // block 0
  EXPECT_EQ(block_grads(f2, 2), (std::vector<Bytes>{384}));        // block 1
  for (int unit : {1, 2})
    for (const Op* o : ops_of(f2, OpKind::Backward, unit))
      for (int b : o->allocs) EXPECT_NE(f2.buffers[static_cast<std::size_t>(b)].name.rfind("bwd_tmp", 0), 0u);
  const StepProgram f1 = lower_plan(R"(, "fsdp_version": 1, "use_orig_params": false)");
  expect_well_formed(f1, "fsdp1");
  for (int unit : {1, 2}) {
    Bytes sum = 0;
    for (Bytes b : block_grads(f1, unit)) sum += b;
    EXPECT_EQ(sum, 872 * 2) << unit;
  }
  EXPECT_TRUE(block_grads(f1, 0).empty());
}

// The block backward's transient leaves room for the weight gradients the op allocates with it
// (models::BlockMemory::backward_extra_with_grads, counted by hand in AutogradTape.WeightGradientsCountFrom-
// TheOpThatMakesThemByHand): on the tiny llama of the test above (592 parameters per block, 1184 B of bf16
// gradients; micro-batch 1 x 256 tokens, so that the activations outweigh them; Hugging Face's code) each
// block's backward op allocates its gradients (FSDP2: the parameters' .grad; FSDP1: the views' gradients) tensor
// by tensor with its activations' gradients (models::AutogradTape::backward_events), each weight's where its op's
// backward makes it: the op's own peak is the tape's peak with the gradients made so far
// (backward_extra_with_grads), not backward_extra + all of them.
// FSDP2 under no_sync without an upcast accumulates into the .grad the first micro-batch made: the second
// micro-batch's backward allocates no gradient, and its peak is backward_extra.
// The head's backward tensor by tensor (program/lower_walk.cpp head_by_tensor): the loss's logits gradient dies
// once the head matmul's backward has made its gradients, inside the op and before the final norm's backward
// allocates anything (autograd releases a node's incoming gradient after the node); the norm's input gradient is
// the one buffer the op keeps. Hand count, HF recipe, T = 256, h = 8, V = 32, bf16: logits gradient 256 x 32 x 2 =
// 16,384 B; the head matmul makes the weight's gradient (32 x 8 x 2 = 512 B; the unit's other, the norm weight's
// 16 B, with it) and the input's, 256 x 8 x 2 = 4,096 B; then LlamaRMSNorm's backward (weight * h: 4,096 B first).
TEST(LoweringGradients, HeadBackwardFreesTheLogitsGradientBeforeTheFinalNorms) {
  models::ModelSpec m = tiny_spec(2);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  for (const char* extra : {"", R"(, "fsdp_version": 1)"}) {
    const Plan plan = resolved(std::string(R"({"implementation": "hf", "micro_batch": 1, "seq_len": 256)") + extra + "}", 2, 2);
    const StepProgram p = lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
    expect_well_formed(p, extra);
    const Op& last = *ops_of(p, OpKind::Backward, 2)[0];
    const Op* head = nullptr;   // the root's backward op just before the last block's (the loss's come first)
    for (const Op* o : ops_of(p, OpKind::Backward, 0))
      if (o->id < last.id) head = o;
    ASSERT_NE(head, nullptr) << extra;
    std::vector<Bytes> allocs;
    for (int b : head->allocs) allocs.push_back(p.buffers[static_cast<std::size_t>(b)].bytes);
    bool freed = false;
    for (const FreeSpec& f : head->frees)
      if (f.buffer >= 0 && p.buffers[static_cast<std::size_t>(f.buffer)].name.rfind("logits_gra", 0) == 0) {
        freed = true;
        EXPECT_EQ(p.buffers[static_cast<std::size_t>(f.buffer)].bytes, 256 * 32 * 2) << extra;
        ASSERT_TRUE(is_free_inside_op(f.reuse_after_op)) << extra;
        // before it: the weights' gradients (FSDP2 the parameters' .grad, 16 and 512 B; FSDP1 the flat one, 528 B)
        // and the input's (4,096 B); after it the norm's backward, whose first gradient is weight * h's (4,096 B)
        const std::size_t k = static_cast<std::size_t>(allocs_before_free(f.reuse_after_op));
        ASSERT_GE(k, 2u) << extra;
        ASSERT_LT(k, allocs.size()) << extra;
        Bytes weights = 0;
        for (std::size_t i = 0; i + 1 < k; ++i) weights += allocs[i];
        EXPECT_EQ(weights, 16 + 512) << extra;
        EXPECT_EQ(allocs[k - 1], 4096) << extra;
        EXPECT_EQ(allocs[k], 4096) << extra;
      }
    EXPECT_TRUE(freed) << extra;
  }
}

TEST(LoweringGradients, BlockBackwardLeavesRoomForTheWeightGradientsItMakes) {
  models::ModelSpec m = tiny_spec(2);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  const auto lower_plan = [&](const std::string& extra) {
    const Plan plan = resolved(R"({"implementation": "hf", "micro_batch": 1, "seq_len": 256)" + extra + "}", 2, 2);
    return lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
  };
  const models::BlockMemory bm = models::block_memory(m, 1, 256, Dtype::BF16, models::CheckpointMode::None,
                                                      models::ImplOptions{models::ModelImpl::HF});
  ASSERT_EQ(bm.param_grads, 592 * 2);
  ASSERT_LT(bm.backward_extra_with_grads, bm.backward_extra + bm.param_grads);   // the rule changes something
  ASSERT_GT(bm.backward_extra_with_grads, bm.param_grads);
  // The most bytes the op holds at once beyond what was alive before it: its allocations in order with the frees
  // it makes while it issues (free_inside_op) between them, a free of a saved tensor counting as negative.
  const auto op_peak = [](const StepProgram& p, const Op& o) {
    Bytes live = 0, peak = 0;
    std::size_t a = 0;
    const auto alloc_to = [&](std::size_t n) {
      for (; a < n; ++a) peak = std::max(peak, live += p.buffers[static_cast<std::size_t>(o.allocs[a])].bytes);
    };
    for (const FreeSpec& f : o.frees) {
      if (!is_free_inside_op(f.reuse_after_op)) break;
      alloc_to(static_cast<std::size_t>(allocs_before_free(f.reuse_after_op)));
      live -= p.buffers[static_cast<std::size_t>(f.buffer)].bytes;
    }
    alloc_to(o.allocs.size());
    return peak;
  };
  for (const char* extra : {"", R"(, "fsdp_version": 1)"}) {
    const StepProgram p = lower_plan(extra);
    expect_well_formed(p, extra);
    for (int unit : {1, 2}) {
      const auto ops = ops_of(p, OpKind::Backward, unit);
      ASSERT_EQ(ops.size(), 1u) << extra;
      EXPECT_EQ(alloc_bytes(p, *ops[0], MemCategory::UnshardedGrads), 592 * 2) << extra;
      // each takes its incoming gradient: the last block the one the head's backward left (the final norm's input
      // gradient, since 2026-11-29 the head's backward is lowered tensor by tensor too), the first the one the last
      // block's backward left (its input's gradient, held through the post-backward hook)
      EXPECT_EQ(op_peak(p, *ops[0]), bm.backward_extra_with_grads - bm.incoming_grad) << extra;
    }
    // that gradient: the one activation buffer the head's backward makes and keeps; neither block makes an incoming
    // gradient of its own (here the residual stream's gradient, accumulated in place, is that buffer through both
    // blocks: the embedding's backward frees it)
    const Op& last = *ops_of(p, OpKind::Backward, 2)[0];
    const Op* head_op = nullptr;   // the root's backward op just before the last block's (the loss's come first)
    for (const Op* o : ops_of(p, OpKind::Backward, 0))
      if (o->id < last.id) head_op = o;
    ASSERT_NE(head_op, nullptr) << extra;
    const Op& head = *head_op;
    const Op& first = *ops_of(p, OpKind::Backward, 1)[0];
    int kept = 0;
    for (int b : head.allocs)
      if (p.buffers[static_cast<std::size_t>(b)].category == MemCategory::Activations && !frees(head, b)) {
        ++kept;
        EXPECT_EQ(p.buffers[static_cast<std::size_t>(b)].bytes, bm.incoming_grad) << extra;
        EXPECT_FALSE(frees(last, b)) << extra;
        EXPECT_FALSE(frees(first, b)) << extra;
      }
    EXPECT_EQ(kept, 1) << extra;
    for (const Op* o : {&last, &first})
      for (int b : o->allocs) EXPECT_NE(p.buffers[static_cast<std::size_t>(b)].name.rfind("grad_in", 0), 0u) << extra;
  }
  const StepProgram acc = lower_plan(R"(, "grad_accum": 2, "reduce_dtype": "bf16")");
  expect_well_formed(acc, "no_sync");
  const auto ops = ops_of(acc, OpKind::Backward, 1);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(alloc_bytes(acc, *ops[0], MemCategory::UnshardedGrads), 592 * 2);
  EXPECT_EQ(op_peak(acc, *ops[0]), bm.backward_extra_with_grads - bm.incoming_grad);
  EXPECT_EQ(alloc_bytes(acc, *ops[1], MemCategory::UnshardedGrads), 0);
  EXPECT_EQ(op_peak(acc, *ops[1]), bm.backward_extra - bm.incoming_grad);

  // A checkpointed block whose gradients outweigh what its backward holds: the recompute op holds the
  // recomputed tensors and the incoming gradient; the backward op adds its own peak with the weight gradients made
  // so far, the tape's phase peak beyond those. (Before 2026-11-28 the backward op allocated every weight gradient
  // with a transient of max(0, that - param_grads): all the gradients at once, too high whenever the difference
  // was negative, as for llama3-70b at 4,096 tokens with full checkpointing: 0.77 GB.) 4 tokens here.
  const models::BlockMemory ac = models::block_memory(m, 1, 4, Dtype::BF16, models::CheckpointMode::Full,
                                                      models::ImplOptions{models::ModelImpl::HF});
  Bytes recomputed = 0;
  for (const models::ForwardEvent& e : ac.recompute_events)
    if (e.kind == models::ForwardEvent::Kept) recomputed += e.bytes;
  const Bytes own = ac.backward_phase_extra_with_grads - recomputed - ac.incoming_grad;
  ASSERT_LT(own, ac.param_grads);   // the case the clamped transient got wrong
  for (const char* extra : {"", R"(, "fsdp_version": 1)"}) {
    const Plan plan = resolved(R"({"implementation": "hf", "micro_batch": 1, "seq_len": 4, "activation_checkpointing": "full")" +
                                   std::string(extra) + "}", 2, 2);
    const StepProgram p = lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
    expect_well_formed(p, extra);
    const auto bwd = ops_of(p, OpKind::Backward, 1);
    ASSERT_EQ(bwd.size(), 1u) << extra;
    EXPECT_EQ(alloc_bytes(p, *bwd[0], MemCategory::UnshardedGrads), 592 * 2) << extra;
    EXPECT_EQ(op_peak(p, *bwd[0]), own) << extra;
  }
}

// A tied embedding and LM head (models: tied_embeddings), FSDP2 and FSDP1, counted by hand on the tiny llama
// above (V 32 x h 8 = 256 tied parameters, 512 B of bf16 gradient): the head's backward allocates the final
// norm's gradient (16 B) and the tied weight's (512 B); the embedding's backward allocates its own gradient of
// the tied weight (512 B, freed in the op) and their sum (512 B, kept), and frees the head's: PyTorch sums the
// two out of place (InputBuffer::accumulate) on the consumer node's stream, the compute stream for FSDP2's
// AccumulateGrad, the unshard stream for FSDP1's view of the flat parameter (PyTorch 2.11: allocator
// histories of l1b-fsdp2-every2-mb4-tt, l1b-fsdp1-offload-w8-hf). The reduction reads the sum.
TEST(LoweringGradients, TiedWeightGradientsSummedOutOfPlaceOnTheConsumersStream) {
  models::ModelSpec m = tiny_spec(2);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  m.tied_embeddings = true;
  const auto lower_plan = [&](const std::string& extra) {
    const Plan plan = resolved(R"({"implementation": "hf", "micro_batch": 1, "seq_len": 4)" + extra + "}", 2, 2);
    return lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
  };
  for (const bool fsdp1 : {false, true}) {
    const StepProgram p = lower_plan(fsdp1 ? R"(, "fsdp_version": 1)" : "");
    const std::string what = fsdp1 ? "fsdp1" : "fsdp2";
    expect_well_formed(p, what);
    std::vector<const Op*> bwd;   // the root's backward ops that make gradients: the head's, then the embedding's
    for (const Op* o : ops_of(p, OpKind::Backward, 0))
      if (!allocs_of(p, *o, MemCategory::UnshardedGrads).empty()) bwd.push_back(o);
    ASSERT_EQ(bwd.size(), 2u) << what;
    std::vector<Bytes> head;
    for (int b : allocs_of(p, *bwd[0], MemCategory::UnshardedGrads)) head.push_back(p.buffers[b].bytes);
    EXPECT_EQ(head, (std::vector<Bytes>{16, 512})) << what;
    const int head_tied = allocs_of(p, *bwd[0], MemCategory::UnshardedGrads).back();
    const auto emb = allocs_of(p, *bwd[1], MemCategory::UnshardedGrads);
    ASSERT_EQ(emb.size(), 2u) << what;
    const Buffer& dense = p.buffers[emb[0]];
    const Buffer& sum = p.buffers[emb[1]];
    EXPECT_EQ(dense.bytes, 512) << what;
    EXPECT_EQ(sum.bytes, 512) << what;
    EXPECT_EQ(p.streams[dense.pool_stream].name, "default") << what;
    EXPECT_EQ(p.streams[sum.pool_stream].name, fsdp1 ? "unshard" : "default") << what;
    EXPECT_TRUE(frees(*bwd[1], emb[0])) << what;
    EXPECT_TRUE(frees(*bwd[1], head_tied)) << what;
    EXPECT_FALSE(frees(*bwd[1], emb[1])) << what;
    // the sum goes on to the reduction: FSDP2's reduce-scatter copy-in, FSDP1's split-backward cat
    const auto reader = fsdp1 ? ops_of(p, OpKind::CopyOut, 0) : ops_of(p, OpKind::CopyIn, 0);
    ASSERT_FALSE(reader.empty()) << what;
    EXPECT_TRUE(frees(*reader.back(), emb[1])) << what;
  }
}

// A plan lowered on the tiny model over 2 GPUs (checked well formed), and the op that frees each buffer (-1: none).
struct OffloadLowered {
  StepProgram p;
  std::vector<int> free_at;
};
// The final norm's packed tensors on the hand models below (HF's LlamaRMSNorm, 4 x 32 tokens x 8 hidden): its saved
// tensors are the head forward's first buffers, in the order the forward makes them: the fp32 input (4 KiB), rstd
// (512 B: under min_offload_size), the normalized bf16 tensor (2 KiB) and the output the head saves (2 KiB, not
// packed: NoOpManager). Returns the two packed ones, checked against the copy: with streams it reads them; without,
// it reads nothing (they died inside the head's forward at their last read: the fp32 input once the normalized fp32
// tensor exists, the bf16 one once the weight has multiplied it, both before the op's later allocations).
std::vector<int> final_norm_packs(const StepProgram& p, const Op& head_fwd, const Op& fn_copy, bool streams) {
  std::vector<int> ids = head_fwd.allocs;
  std::sort(ids.begin(), ids.end());
  EXPECT_GE(ids.size(), 4u);
  if (ids.size() < 4) return {};
  const std::vector<Bytes> want{4 * 32 * 8 * 4, 4 * 32 * 4, 4 * 32 * 8 * 2, 4 * 32 * 8 * 2};
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(p.buffers[static_cast<std::size_t>(ids[i])].bytes, want[i]) << i;
  const std::vector<int> packs{ids[0], ids[2]};
  if (streams) {
    EXPECT_EQ(fn_copy.inputs, packs);
    return packs;
  }
  EXPECT_TRUE(fn_copy.inputs.empty());
  const auto alloc_index = [&](int b) {
    return static_cast<int>(std::find(head_fwd.allocs.begin(), head_fwd.allocs.end(), b) - head_fwd.allocs.begin());
  };
  for (std::size_t k = 0; k < 2; ++k) {
    const int b = packs[k];
    const auto f = std::find_if(head_fwd.frees.begin(), head_fwd.frees.end(), [&](const FreeSpec& x) { return x.buffer == b; });
    EXPECT_NE(f, head_fwd.frees.end()) << k;
    if (f == head_fwd.frees.end()) continue;
    EXPECT_TRUE(is_free_inside_op(f->reuse_after_op)) << k;
    const int after = allocs_before_free(f->reuse_after_op);
    if (k == 0) {   // the fp32 input: right after the normalized fp32 tensor, the first fp32 alloc after rstd
      EXPECT_GT(after, alloc_index(ids[1]) + 1);
      EXPECT_EQ(p.buffers[static_cast<std::size_t>(head_fwd.allocs.at(static_cast<std::size_t>(after - 1)))].bytes,
                4 * 32 * 8 * 4);
    } else {        // the bf16 one: right after the output
      EXPECT_EQ(after, alloc_index(ids[3]) + 1);
    }
    EXPECT_LT(after, static_cast<int>(head_fwd.allocs.size())) << k;   // before the op's last allocations
  }
  return packs;
}

OffloadLowered lower_offload(const models::ModelSpec& m, const Plan& plan, const char* what) {
  OffloadLowered r;
  r.p = lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
  expect_well_formed(r.p, what);
  r.free_at.assign(r.p.buffers.size(), -1);
  for (const Op& o : r.p.ops)
    for (const FreeSpec& f : o.frees) r.free_at[static_cast<std::size_t>(f.buffer)] = o.id;
  return r;
}

// FSDP1 with CPU offload (reduce dtype fp32): the reduce-scatter output is `_saved_grad_shard` itself (no cast:
// the flat parameter is the fp32 CPU shard), copied to the CPU by the grad D2H and dropped only by the final
// callback (prepare_gradient_for_optim), so every unit's shard is alive at the end of the backward: on the
// 2-block hand model over 4 GPUs, the blocks' shards of 28 padded elements (27 over 4, rounded up to 7 each) x
// 4 B and the root's 68 / 4 = 17 x 4 B, all in the post-backward stream's pool. With a bf16 reduce dtype the
// fp32 cast is the one kept and the reduce-scatter output is freed at once.
// torchtune's activation offloading (plan.activation_offloading; program/lower_walk.cpp "activation offloading") on
// 8 checkpointed blocks, by hand: each block input (4 x 32 tokens x 8 hidden x 2 B = 2 KiB >= min_offload_size)
// gets a D2H right before its block's forward; with use_streams the GPU tensor stays in the stash until the pack 5
// later (the compute stream then waits on its copy), the rest until the final norm's backward; the backward copies
// each input back before its block's recompute and drops it after the previous block's backward. Without streams
// the copies run on the compute stream, the input dies with its block's forward and the copy back with the recompute.
TEST(LoweringOffload, ActivationOffloadingStashCopiesAndDropsByHand) {
  constexpr int L = 8;
  models::ModelSpec m = tiny_spec(L);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  const Bytes x_bytes = 4 * 32 * 8 * 2;
  // The loop computes the loss on the model's output here (torchtune's recipes): only the blocks and the final norm
  // are packed (OffloadActivationsLossInsideTheForwardByHand below has HF's loss inside the forward).
  for (const char* mode : {"streams", "sync"}) {
    SCOPED_TRACE(mode);
    const bool streams = std::string(mode) == "streams";
    const Plan plan = resolved(std::string(R"({"implementation": "hf", "micro_batch": 4, "seq_len": 32, )") +
                                   R"("loss_in_model_forward": false, "activation_checkpointing": "full", )" +
                                   R"("activation_offloading": ")" + mode + "\"}",
                               2, 2);
    const auto g = models::build_wrap_graph(m, plan.auto_wrap_policy);
    const StepProgram p = lower(m, g, plan, Topology{2, 2});
    expect_well_formed(p, mode);
    int side = -1;
    for (const Stream& st : p.streams)
      if (st.role == StreamRole::Offload) side = st.id;
    EXPECT_EQ(side >= 0, streams);
    const int copy_stream = streams ? side : 0;
    std::vector<int> alloc_at(p.buffers.size(), -1), free_at(p.buffers.size(), -1);
    for (const Op& o : p.ops) {
      for (int b : o.allocs) alloc_at[static_cast<std::size_t>(b)] = o.id;
      for (const FreeSpec& f : o.frees) free_at[static_cast<std::size_t>(f.buffer)] = o.id;
    }
    // One copy per block, then one of the final norm's tensors; back: one per block, and the final norm's unless they
    // are still stashed when its backward unpacks them (streams).
    const auto d2h = ops_of(p, OpKind::D2H), h2d = ops_of(p, OpKind::H2D);
    ASSERT_EQ(d2h.size(), static_cast<std::size_t>(L + 1));
    ASSERT_EQ(h2d.size(), static_cast<std::size_t>(streams ? L : L + 1));
    const auto fwd_of = [&](int j) { return ops_of(p, OpKind::Forward, j + 1).at(0); };
    const auto rec_of = [&](int j) { return ops_of(p, OpKind::Recompute, j + 1).at(0); };
    const auto bwd_of = [&](int j) { return ops_of(p, OpKind::Backward, j + 1).at(0); };
    const Op* head_fwd = ops_of(p, OpKind::Forward, 0).at(1);   // the final norm and head (root unit)
    const Op* head_bwd = nullptr;                                // (after the loss's backward ops)
    for (const Op* o : ops_of(p, OpKind::Backward, 0))
      if (o->name.rfind("bwd", 0) == 0 && !head_bwd) head_bwd = o;
    ASSERT_NE(head_bwd, nullptr);
    // HF's LlamaRMSNorm keeps its fp32 input (4 KiB), rsqrt's output (512 B: too small to copy) and the normalized
    // bf16 tensor (2 KiB) the weight multiplies; the head keeps the norm's output (2 KiB, not packed: NoOpManager).
    const Op& fn_copy = *d2h[L];
    EXPECT_EQ(fn_copy.id, head_fwd->id + 1);
    EXPECT_EQ(fn_copy.stream, copy_stream);
    EXPECT_EQ(fn_copy.copy_bytes, 4 * 32 * 8 * 4 + x_bytes);
    const std::vector<int> fn_packs = final_norm_packs(p, *head_fwd, fn_copy, streams);
    ASSERT_EQ(fn_packs.size(), 2u);
    for (int b : fn_packs) {
      // sync: they die inside the head's forward (final_norm_packs); streams: still stashed at the head's backward,
      // which uses them as they are and whose hook drops them
      EXPECT_EQ(free_at[static_cast<std::size_t>(b)], streams ? head_bwd->id : head_fwd->id) << b;
    }
    if (!streams) {   // back before the head's backward, dropped after it
      const Op& back = *h2d[0];
      EXPECT_EQ(back.id + 1, head_bwd->id);
      EXPECT_EQ(back.copy_bytes, fn_copy.copy_bytes);
      EXPECT_EQ(free_at[static_cast<std::size_t>(back.allocs.at(0))], head_bwd->id);
    }
    const std::size_t blocks_back = streams ? 0 : 1;   // (the block copies back come after the final norm's)
    // Pack ids: block j's input 3j + 1, then its rotary tables cos and sin (32 x 4 x 2 B = 256 B each: ids, no
    // copy), then the final norm's two. With streams a pack drops the stashed tensors 5 ids older: block j's input
    // leaves at block j + 1's sin (3j + 6); the last block's at none (the norm's packs reach 3L + 2 only).
    for (int j = 0; j < L; ++j) {
      SCOPED_TRACE("block " + std::to_string(j));
      const Op& c = *d2h[static_cast<std::size_t>(j)];
      EXPECT_EQ(c.unit, j + 1);
      EXPECT_EQ(c.stream, copy_stream);
      EXPECT_EQ(c.copy_bytes, x_bytes);
      ASSERT_EQ(c.inputs.size(), 1u);
      const int x = c.inputs[0];   // the block's input: the previous module's output
      EXPECT_EQ(p.buffers[static_cast<std::size_t>(x)].bytes, x_bytes);
      EXPECT_LT(alloc_at[static_cast<std::size_t>(x)], c.id);
      const Op& f = *fwd_of(j);
      EXPECT_EQ(f.id, c.id + 1);   // packed as the checkpoint starts, before the block's kernels
      if (streams) {
        // the side stream waits on the compute stream's work so far
        int last_compute = -1;
        for (int i = 0; i < c.id; ++i)
          if (p.ops[static_cast<std::size_t>(i)].stream == 0) last_compute = i;
        EXPECT_NE(std::find(c.waits.begin(), c.waits.end(), last_compute), c.waits.end());
        if (j + 1 < L) {
          const Op& later = *d2h[static_cast<std::size_t>(j + 1)];
          EXPECT_EQ(free_at[static_cast<std::size_t>(x)], later.id);   // dropped at the next block's packs
          const Op& lf = *fwd_of(j + 1);
          EXPECT_NE(std::find(lf.waits.begin(), lf.waits.end(), c.id), lf.waits.end());
        } else {
          EXPECT_EQ(free_at[static_cast<std::size_t>(x)], head_bwd->id);   // the first unpacking node's hook
        }
      } else {
        EXPECT_EQ(free_at[static_cast<std::size_t>(x)], f.id);   // its last use, the block's residual
      }
      // The copy back.
      const Op& r = *h2d[blocks_back + static_cast<std::size_t>(L - 1 - j)];
      EXPECT_EQ(r.unit, j + 1);
      EXPECT_EQ(r.stream, copy_stream);
      EXPECT_EQ(r.copy_bytes, x_bytes);
      ASSERT_EQ(r.allocs.size(), 1u);
      const int back = r.allocs[0];
      EXPECT_EQ(p.buffers[static_cast<std::size_t>(back)].bytes, x_bytes);
      EXPECT_EQ(p.buffers[static_cast<std::size_t>(back)].pool_stream, copy_stream);
      const Op& rc = *rec_of(j);
      EXPECT_EQ(rc.id, r.id + 1);
      if (streams) {
        EXPECT_NE(std::find(rc.waits.begin(), rc.waits.end(), r.id), rc.waits.end());   // s0.wait_stream(s1)
        if (j > 0) {
          EXPECT_EQ(free_at[static_cast<std::size_t>(back)], bwd_of(j - 1)->id);
        } else {
          EXPECT_GT(free_at[static_cast<std::size_t>(back)], bwd_of(0)->id);   // the end-of-backward callback
        }
        if (j + 2 < L) {
          EXPECT_NE(std::find(r.waits.begin(), r.waits.end(), rec_of(j + 2)->id), r.waits.end());
        }
      } else {
        EXPECT_EQ(free_at[static_cast<std::size_t>(back)], rc.id);
      }
    }
  }
  // Modelled with every block checkpointed (FSDP(checkpoint(block))), and not on fsdpsim's own runtime.
  // (any other checkpointing mode is modelled: OffloadActivationsWithoutCheckpointingByHand)
  for (const char* bad : {R"({"activation_offloading": "streams", "activation_checkpointing": {"mode": "full", "outside_fsdp": true}})",
                          R"({"activation_offloading": "streams", "activation_checkpointing": "full", "implementation": "runtime"})",
                          R"({"activation_offloading": true})"}) {
    try {
      resolved(bad, 2, 2);
      ADD_FAILURE() << bad;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("plan.activation_offloading"), std::string::npos) << e.what();
    }
  }
}

// Offloading without checkpointing (torchtune allows it): every tensor a block saves goes through the hooks. On the
// same model, the loss outside the forward: each block's saved tensors of at least 1 KiB leave in one copy after its
// forward (sync: they die with it; streams: stashed, the compute stream waiting on the copy when a pack 5 ids later
// drops them) and come back node by node in the block's backward (one copy op before it for the time), each node
// dropping what the one before brought back (sync: before its own copies, its node having run); the last node's
// copies go when the block's backward is enqueued (sync) or with the next node that unpacks (streams). Before 2026-11-28 the whole
// set came back in one buffer (+3.5% reserved against PyTorch, and +6.8% before it was dropped after its own
// block's backward). With every_2, only the blocks that are not
// checkpointed do so; the others offload their input as with full checkpointing.
TEST(LoweringOffload, OffloadActivationsWithoutCheckpointingByHand) {
  constexpr int L = 8;
  models::ModelSpec m = tiny_spec(L);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  for (const char* mode : {"streams", "sync"}) {
    SCOPED_TRACE(mode);
    const bool streams = std::string(mode) == "streams";
    const std::string base = std::string(R"({"implementation": "hf", "micro_batch": 4, "seq_len": 32, )") +
                             R"("loss_in_model_forward": false, "activation_offloading": ")" + mode + "\"";
    const Plan plan = resolved(base + "}", 2, 2);
    const auto g = models::build_wrap_graph(m, plan.auto_wrap_policy);
    const auto [p, free_at] = lower_offload(m, plan, mode);
    const auto flows = lowering::grad_flows(m, g, plan, models::trainable_set(m, plan.implementation, 1.0));
    const models::BlockMemory bm = models::block_memory(m, 4, 32, Dtype::BF16, models::CheckpointMode::None,
                                                        {models::ModelImpl::HF}, flows.layers.at(0));
    Bytes packed = 0;
    for (const auto& t : bm.saved) packed += !t.is_input && t.bytes >= 1024 ? t.bytes : 0;
    ASSERT_GT(packed, 0);
    const auto d2h = ops_of(p, OpKind::D2H), h2d = ops_of(p, OpKind::H2D);
    ASSERT_EQ(d2h.size(), static_cast<std::size_t>(L + 1));   // the blocks', then the final norm's
    for (int j = 0; j < L; ++j) {
      SCOPED_TRACE("block " + std::to_string(j));
      const Op& c = *d2h[static_cast<std::size_t>(j)];
      const Op& f = *ops_of(p, OpKind::Forward, j + 1).at(0);
      EXPECT_EQ(c.id, f.id + 1);   // after the block's forward
      EXPECT_GE(c.copy_bytes, packed);
      // sync: all die with the copy; streams: the last 5 packs stay stashed (freed later), the older ones leave once
      // their copy is done (the compute stream waits on it)
      const std::size_t stay = streams ? std::min<std::size_t>(5, c.inputs.size()) : 0;
      for (std::size_t i = 0; i < c.inputs.size(); ++i) {
        const int b = c.inputs[i];
        if (i + stay < c.inputs.size()) {
          EXPECT_EQ(free_at[static_cast<std::size_t>(b)], c.id) << b;
        } else {
          EXPECT_GT(free_at[static_cast<std::size_t>(b)], c.id) << b;
        }
      }
      if (streams && c.inputs.size() > 5) {   // the compute stream's next op waits on the copy
        std::size_t k = static_cast<std::size_t>(c.id) + 1;
        while (k < p.ops.size() && p.ops[k].stream != 0) ++k;
        ASSERT_LT(k, p.ops.size());
        EXPECT_NE(std::find(p.ops[k].waits.begin(), p.ops[k].waits.end(), c.id), p.ops[k].waits.end());
      }
      // the copy back, right before the block's backward
      const Op& bwd = *ops_of(p, OpKind::Backward, j + 1).at(0);
      const Op& r = p.ops[static_cast<std::size_t>(bwd.id - 1)];
      if (streams && j == L - 1) continue;   // (its last tensors may still be stashed: used as they are)
      ASSERT_EQ(r.kind, OpKind::H2D);
      EXPECT_TRUE(r.allocs.empty());   // (its time; the backward allocates node by node)
      if (!streams) {
        EXPECT_EQ(r.copy_bytes, c.copy_bytes);
      }
      // node by node: each node's offloaded tensors come back as it unpacks them (the side stream's pool with
      // streams) and are dropped by the block's backward; never the whole set at once
      Bytes live = 0, most = 0;
      std::size_t a = 0, copies = 0;
      const auto reload = [&](int b) { return p.buffers[static_cast<std::size_t>(b)].name.rfind("act_reload", 0) == 0; };
      const auto alloc_to = [&](std::size_t n) {
        for (; a < n; ++a)
          if (const int b = bwd.allocs[a]; reload(b)) {
            ++copies;
            EXPECT_EQ(p.buffers[static_cast<std::size_t>(b)].pool_stream != 0, streams);
            // dropped in this backward, or (streams: the last node's) by the next node that unpacks, the earlier
            // block's backward, or at the end of the backward for the first block
            const int at = free_at[static_cast<std::size_t>(b)];
            if (at != bwd.id) {
              EXPECT_TRUE(streams) << b;
              if (j > 0) EXPECT_EQ(at, ops_of(p, OpKind::Backward, j).at(0)->id) << b;
              else EXPECT_GT(at, bwd.id) << b;
            }
            most = std::max(most, live += p.buffers[static_cast<std::size_t>(b)].bytes);
          }
      };
      for (const FreeSpec& fr : bwd.frees) {
        if (!is_free_inside_op(fr.reuse_after_op)) break;
        alloc_to(static_cast<std::size_t>(allocs_before_free(fr.reuse_after_op)));
        const bool own = std::find(bwd.allocs.begin(), bwd.allocs.end(), fr.buffer) != bwd.allocs.end();
        if (reload(fr.buffer) && own) live -= p.buffers[static_cast<std::size_t>(fr.buffer)].bytes;
      }
      alloc_to(bwd.allocs.size());
      EXPECT_GT(copies, 1u);
      EXPECT_GT(most, 0);
      EXPECT_LT(most, packed);
      if (streams && j > 0) {   // the next copy back waits on the event after this block's backward
        const Op& next = p.ops[static_cast<std::size_t>(ops_of(p, OpKind::Backward, j).at(0)->id - 1)];
        ASSERT_EQ(next.kind, OpKind::H2D);
        EXPECT_NE(std::find(next.waits.begin(), next.waits.end(), bwd.id), next.waits.end());
      }
    }
    EXPECT_GE(h2d.size(), static_cast<std::size_t>(L - 1));
    // every_2: blocks 1, 3, 5, 7 checkpointed (their input leaves before their forward), 0, 2, 4, 6 not.
    const Plan every = resolved(base + R"(, "activation_checkpointing": "every_2"})", 2, 2);
    const StepProgram q = lower_offload(m, every, "every_2").p;
    int before = 0, after = 0;
    for (const Op* c : ops_of(q, OpKind::D2H)) {
      if (c->unit == 0) continue;   // (the final norm's, in the root unit)
      const Op& next = q.ops[static_cast<std::size_t>(c->id + 1)];
      if (next.kind == OpKind::Forward && next.unit == c->unit) ++before;
      else ++after;
    }
    EXPECT_EQ(before, L / 2);
    EXPECT_EQ(after, L / 2);
  }
}

// The same model with HF's loss inside the model's forward (the default for implementation hf): OffloadActivations
// also packs _log_softmax's fp32 result (128 tokens x 32 x 4 B = 16 KiB) and nll_loss's self (the same tensor: a
// second copy) and target (128 x 8 B = 1 KiB), so one more copy of 2 x 16 + 1 KiB. Without streams the log-
// probabilities die with it, nll_loss_backward brings self and target back for its node, _log_softmax_backward_data
// the result for its own. With streams the first backward node (nll's) uses the stashed tensor, its hook drops the
// whole stash (the final norm's tensors too, which then come back for the head's backward), and the result comes
// back from the CPU for the second node and stays until the next node that unpacks (the head's backward) has run.
TEST(LoweringOffload, OffloadActivationsLossInsideTheForwardByHand) {
  constexpr int L = 8;
  models::ModelSpec m = tiny_spec(L);
  m.hidden = 8, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4, m.ffn_hidden = 16, m.vocab_size = 32;
  const Bytes lp = 128 * 32 * 4, target = 128 * 8;
  for (const char* mode : {"streams", "sync"}) {
    SCOPED_TRACE(mode);
    const bool streams = std::string(mode) == "streams";
    const Plan plan = resolved(std::string(R"({"implementation": "hf", "micro_batch": 4, "seq_len": 32, )") +
                                   R"("activation_checkpointing": "full", "activation_offloading": ")" + mode + "\"}",
                               2, 2);
    const auto [p, free_at] = lower_offload(m, plan, mode);
    const auto named = [&](const char* what) {
      const Op* hit = nullptr;
      for (const Op& o : p.ops)
        if (o.name.find(what) != std::string::npos && !hit) hit = &o;
      return hit;
    };
    const auto d2h = ops_of(p, OpKind::D2H), h2d = ops_of(p, OpKind::H2D);
    ASSERT_EQ(d2h.size(), static_cast<std::size_t>(L + 2));
    ASSERT_EQ(h2d.size(), static_cast<std::size_t>(streams ? L + 2 : L + 3));
    const Op* loss = named("loss u");
    const Op* nll = named("nll bwd");
    const Op* lsm = named("lsm bwd");
    ASSERT_TRUE(loss && nll && lsm);
    const Op& copy = *d2h[L + 1];
    EXPECT_EQ(copy.id, loss->id + 1);
    EXPECT_EQ(copy.copy_bytes, 2 * lp + target);
    ASSERT_EQ(copy.inputs.size(), 1u);
    const int log_probs = copy.inputs[0];
    EXPECT_EQ(p.buffers[static_cast<std::size_t>(log_probs)].bytes, lp);
    EXPECT_EQ(free_at[static_cast<std::size_t>(log_probs)], streams ? nll->id : copy.id);
    // The final norm's tensors (pack ids 3L + 1, 3L + 2): with streams the loss's last pack (3L + 6) drops the first
    // from the stash (after the loss's copy), nll's hook the second.
    const Op& fn_copy = *d2h[L];
    const Op* head_fwd = ops_of(p, OpKind::Forward, 0).at(1);   // the final norm and head (root unit)
    EXPECT_EQ(fn_copy.id, head_fwd->id + 1);
    const std::vector<int> fn_packs = final_norm_packs(p, *head_fwd, fn_copy, streams);
    ASSERT_EQ(fn_packs.size(), 2u);
    EXPECT_EQ(free_at[static_cast<std::size_t>(fn_packs[0])], streams ? copy.id : head_fwd->id);
    EXPECT_EQ(free_at[static_cast<std::size_t>(fn_packs[1])], streams ? nll->id : head_fwd->id);
    // The copies back, in order: [nll's self and target (sync)], the result, the final norm's, the blocks'.
    std::size_t k = 0;
    if (!streams) {
      const Op& self = *h2d[k++];
      EXPECT_EQ(self.id + 1, nll->id);
      EXPECT_EQ(self.copy_bytes, lp + target);
      ASSERT_EQ(self.allocs.size(), 2u);
      for (int b : self.allocs) EXPECT_EQ(free_at[static_cast<std::size_t>(b)], nll->id);
    }
    const Op& result = *h2d[k++];
    EXPECT_EQ(result.id + 1, lsm->id);
    EXPECT_EQ(result.copy_bytes, lp);
    const Op& fn_back = *h2d[k++];
    EXPECT_EQ(fn_back.copy_bytes, fn_copy.copy_bytes);
    const Op* head_bwd = nullptr;   // (after the loss's backward ops)
    for (const Op* o : ops_of(p, OpKind::Backward, 0))
      if (o->name.rfind("bwd", 0) == 0 && !head_bwd) head_bwd = o;
    ASSERT_NE(head_bwd, nullptr);
    EXPECT_EQ(fn_back.id + 1, head_bwd->id);
    EXPECT_EQ(free_at[static_cast<std::size_t>(result.allocs.at(0))], streams ? head_bwd->id : lsm->id);
    if (streams) {
      EXPECT_NE(std::find(lsm->waits.begin(), lsm->waits.end(), result.id), lsm->waits.end());
    }
  }
}

// FSDP1's lazy init (program/lower_fsdp1.cpp lazy_init_scratch, init_flat_param_attributes): per handle, root first,
// _mp_shard (bf16 shard), _full_param_padded (bf16) and _full_prec_full_param_padded (fp32) on the compute stream,
// a request equal to an earlier one left out. On the 2-block hand model over 4 GPUs: the root's 68 elements (shard
// 17), each block's 27 padded to 28 (shard 7): 34, 136, 272, then 14, 56, 112 (the second block's are the first's).
// Without mixed precision only _full_param_padded, in the flat parameter's dtype; FSDP2 and the bundled runtime: none.
TEST(LoweringFsdp1, LazyInitScratchByHand) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  const auto sizes = [](const StepProgram& p) {
    std::vector<Bytes> v;
    for (const InitRequest& q : p.init_scratch) {
      EXPECT_EQ(q.pool_stream, 0);
      v.push_back(q.bytes);
    }
    return v;
  };
  const StepProgram mixed = lower_hand(g, R"({"fsdp_version": 1})", 4, 4);
  EXPECT_EQ(sizes(mixed), (std::vector<Bytes>{34, 136, 272, 14, 56, 112}));
  const StepProgram fp32 = lower_hand(g, R"({"fsdp_version": 1, "param_dtype": "fp32"})", 4, 4);
  EXPECT_EQ(sizes(fp32), (std::vector<Bytes>{272, 112}));
  EXPECT_TRUE(lower_hand(g, R"({"fsdp_version": 2})", 4, 4).init_scratch.empty());
  EXPECT_TRUE(lower_hand(g, R"({"fsdp_version": 1, "implementation": "runtime"})", 4, 4).init_scratch.empty());
}

// FSDP1's construction holds each unit's original parameters (Buffer::init_originals, fp32 bytes) while its
// FlatParameter is flattened and sharded, in the order FSDP1 materializes them: module by module, breadth first
// (_get_modules_to_materialize); with NO_SHARD too (its FlatParameter the flattened whole). tiny_spec(2) as
// transformers names it: a block's norms (16 elements, 64 B; modules
// one level above the projections) before q, k, v, o (16 x 16: 1,024 B) and gate, up, down (16 x 32: 2,048 B); the
// root's lm_head (64 x 16: 4,096 B, a module of the top level) before the embedding and the final norm. With LoRA
// without use_orig_params (r 2 on q and v) the block's adapters are a FlatParameter of their own, constructed first:
// q's A (2 x 16) and B (16 x 2), then v's, 128 B each; its shard 4 x 32 / 2 ranks x 4 B = 256 B, the block's own
// (2 x 16 + 4 x 256 + 3 x 512) / 2 x 4 B = 5,184 B. Every block shares one list; none with FSDP2. With the
// parameters offloaded to the CPU the same FlatParameters are made, none kept on the device.
TEST(LoweringFsdp1, ConstructionHoldsTheOriginalsBreadthFirst) {
  const models::ModelSpec m = tiny_spec(2);
  const auto lower_plan = [&](const std::string& json) {
    const Plan plan = resolved(json, 2, 2);
    return lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
  };
  // Per unit: (shard bytes, originals) of each persistent ShardedParams buffer, in buffer order.
  const auto shards = [](const StepProgram& p, int unit) {
    std::vector<std::pair<Bytes, std::vector<Bytes>>> out;
    for (const Buffer& b : p.buffers)
      if (b.persistent && b.category == MemCategory::ShardedParams && b.unit == unit)
        out.emplace_back(b.bytes, b.init_originals >= 0
                                      ? p.init_originals.at(static_cast<std::size_t>(b.init_originals))
                                      : std::vector<Bytes>{});
    return out;
  };
  const std::vector<Bytes> block = {64, 64, 1024, 1024, 1024, 1024, 2048, 2048, 2048};
  const StepProgram full = lower_plan(R"({"fsdp_version": 1, "implementation": "hf"})");
  expect_well_formed(full, "full");
  EXPECT_EQ(full.init_flatten_world, 2);
  using Shards = std::vector<std::pair<Bytes, std::vector<Bytes>>>;
  EXPECT_EQ(shards(full, 0), (Shards{{(2 * 1024 + 16) / 2 * 4, {4096, 4096, 64}}}));
  EXPECT_EQ(shards(full, 1), (Shards{{(2 * 16 + 4 * 256 + 3 * 512) / 2 * 4, block}}));
  EXPECT_EQ(shards(full, 2), shards(full, 1));
  EXPECT_EQ(full.init_originals.size(), 2u);   // the root's list and the blocks' one
  const StepProgram lora = lower_plan(R"({"fsdp_version": 1, "implementation": "hf", "use_orig_params": false,
                                          "lora": {"rank": 2, "targets": ["q", "v"]}})");
  expect_well_formed(lora, "lora");
  EXPECT_EQ(shards(lora, 1), (Shards{{256, {128, 128, 128, 128}}, {5184, block}}));
  // NO_SHARD: the same originals, its FlatParameter the flattened whole (init_flatten_world 1).
  const StepProgram whole =
      lower_plan(R"({"fsdp_version": 1, "implementation": "hf", "sharding_strategy": "NO_SHARD"})");
  EXPECT_EQ(whole.init_flatten_world, 1);
  EXPECT_EQ(shards(whole, 1), (Shards{{(2 * 16 + 4 * 256 + 3 * 512) * 4, block}}));
  // Offloaded to the CPU: the same FlatParameters with the same originals (StepProgram::init_offloaded), the
  // blocks' (the adapters' first) before the root's.
  for (const bool with_lora : {false, true}) {
    const StepProgram& ref = with_lora ? lora : full;
    const StepProgram off = lower_plan(with_lora ? R"({"fsdp_version": 1, "implementation": "hf", "use_orig_params": false,
                                                       "cpu_offload": {"params": true},
                                                       "lora": {"rank": 2, "targets": ["q", "v"]}})"
                                                 : R"({"fsdp_version": 1, "implementation": "hf",
                                                       "cpu_offload": {"params": true}})");
    expect_well_formed(off, "offload");
    Shards made, expected;
    for (const InitOffloaded& o : off.init_offloaded)
      made.emplace_back(o.bytes, o.originals >= 0 ? off.init_originals.at(static_cast<std::size_t>(o.originals))
                                                  : std::vector<Bytes>{});
    for (int u : {1, 2, 0})
      for (auto& s : shards(ref, u)) expected.push_back(s);
    EXPECT_EQ(made, expected) << with_lora;
    EXPECT_TRUE(shards(off, 0).empty() && shards(off, 1).empty()) << with_lora;
  }
  const StepProgram f2 = lower_plan(R"({"fsdp_version": 2})");
  EXPECT_TRUE(f2.init_originals.empty());
  EXPECT_TRUE(f2.init_offloaded.empty());
  for (const Buffer& b : f2.buffers) EXPECT_EQ(b.init_originals, -1) << b.name;
}

// A lowering that reuses a spent program's buffers (lowering::OpRecycler, as simulate() does) leaves none of the
// earlier program's construction originals on them: an FSDP2 program lowered after an FSDP1 one is well formed
// and names no list.
TEST(LoweringFsdp1, RecycledBuffersDropTheOriginals) {
  const models::ModelSpec m = tiny_spec(2);
  lowering::OpRecycler recycler;
  for (const char* json : {R"({"fsdp_version": 1, "implementation": "hf"})", R"({"fsdp_version": 2})"}) {
    const Plan plan = resolved(json, 2, 2);
    StepProgram p = lowering::lower_with(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2},
                                         &recycler);
    EXPECT_NO_THROW(validate_program(p)) << json;
    EXPECT_EQ(p.init_originals.empty(), plan.fsdp_version == FsdpVersion::FSDP2) << json;
    lowering::recycle(p, recycler);
  }
}

// FSDP1's construction (StepProgram::init_flatten_world): every FlatParameter flattened over the shard group, then
// sharded; the root's (unit 0, 17 fp32 elements per rank on the hand model over 4 GPUs: 68 B) last. NO_SHARD: a
// world of 1 (flattened, not sharded). Not with FSDP2, parameters offloaded to the CPU or the bundled runtime. The
// shard group of HYBRID_SHARD: its width.
TEST(LoweringFsdp1, ConstructionFlattensThenShardsTheRootLast) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  const StepProgram p = lower_hand(g, R"({"fsdp_version": 1})", 4, 4);
  EXPECT_EQ(p.init_flatten_world, 4);
  ASSERT_GE(p.init_flatten_last, 0);
  const Buffer& root = p.buffers[static_cast<std::size_t>(p.init_flatten_last)];
  EXPECT_TRUE(root.persistent);
  EXPECT_EQ(root.category, MemCategory::ShardedParams);
  EXPECT_EQ(root.unit, 0);
  EXPECT_EQ(root.bytes, 17 * 4);
  EXPECT_EQ(lower_hand(g, R"({"fsdp_version": 1, "sharding_strategy": "HYBRID_SHARD", "mesh": {"replicate": 2, "shard": 2}})",
                       4, 2).init_flatten_world, 2);
  EXPECT_EQ(lower_hand(g, R"({"fsdp_version": 1, "sharding_strategy": "NO_SHARD"})", 4, 4).init_flatten_world, 1);
  for (const char* plan : {R"({"fsdp_version": 2})", R"({"fsdp_version": 1, "implementation": "runtime"})"}) {
    const StepProgram q = lower_hand(g, plan, 4, 4);
    EXPECT_EQ(q.init_flatten_world, 0) << plan;
    EXPECT_EQ(q.init_flatten_last, -1) << plan;
    EXPECT_TRUE(q.init_offloaded.empty()) << plan;
  }
  EXPECT_TRUE(p.init_offloaded.empty());
  // Parameters offloaded to the CPU: the same construction, each shard then moved off the device
  // (StepProgram::init_offloaded): no persistent sharded parameter, the blocks' FlatParameters, then the root's.
  const StepProgram off = lower_hand(g, R"({"fsdp_version": 1, "cpu_offload": {"params": true}})", 4, 4);
  expect_well_formed(off, "offload");
  EXPECT_EQ(off.init_flatten_world, 4);
  EXPECT_EQ(off.init_flatten_last, -1);
  for (const Buffer& b : off.buffers) EXPECT_FALSE(b.persistent && b.category == MemCategory::ShardedParams) << b.name;
  ASSERT_EQ(off.init_offloaded.size(), 3u);
  EXPECT_EQ(off.init_offloaded.back().bytes, 17 * 4);
  // The blocks' as the shards the plan without offload keeps (units 1 and 2, in buffer order).
  std::vector<Bytes> block_shards;
  for (const Buffer& b : p.buffers)
    if (b.persistent && b.category == MemCategory::ShardedParams && b.unit > 0) block_shards.push_back(b.bytes);
  ASSERT_EQ(block_shards.size(), 2u);
  for (std::size_t k = 0; k < 2; ++k) EXPECT_EQ(off.init_offloaded[k].bytes, block_shards[k]) << k;
}

TEST(LoweringOffload, Fsdp1KeepsTheSavedGradShardUntilTheFinalCallback) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  for (const char* rd : {"fp32", "bf16"}) {
    const std::string plan = std::string(R"({"fsdp_version": 1, "cpu_offload": true, "reduce_dtype": ")") + rd + "\"}";
    StepProgram p = lower_hand(g, plan, 4, 4);
    expect_well_formed(p, plan);
    const auto d2h = ops_of(p, OpKind::D2H);
    ASSERT_EQ(d2h.size(), 3u) << plan;
    // the buffer each D2H reads stays allocated past every D2H
    int last_d2h = d2h.back()->id;
    std::vector<Bytes> held;
    for (const Op* d : d2h) {
      ASSERT_EQ(d->inputs.size(), 1u);
      const int buf = d->inputs[0];
      int freed = -1;
      for (const Op& o : p.ops)
        if (frees(o, buf)) freed = o.id;
      EXPECT_GE(freed, last_d2h) << plan << " " << p.buffers[buf].name;
      EXPECT_EQ(p.streams[p.buffers[buf].pool_stream].name, "post_backward") << plan;
      EXPECT_EQ(p.buffers[buf].name.rfind(std::string(rd) == "fp32" ? "rs_out" : "grad_dev", 0), 0u) << plan;
      held.push_back(p.buffers[buf].bytes);
    }
    EXPECT_EQ(held, (std::vector<Bytes>{7 * 4, 7 * 4, 17 * 4})) << plan;
  }
}

}  // namespace
}  // namespace fsdpsim::sim

namespace fsdpsim::sim {
namespace {

// The training loop's batch and the recipe's rotary tables (LoweringWalk::add_loop_inputs), counted by hand for the
// tiny spec (head_dim 8, no partial rotary: 8 rope dims) at micro-batch 3 x 32 tokens: input ids and labels int64
// 3 x 32 x 8 = 768 B each; torchtitan's freqs_cis complex64 32 x 4 x 8 = 1,024 B; litgpt's cos and sin in the
// parameters' dtype (bf16 here) 32 x 8 x 2 = 512 B each; transformers' inv_freq fp32 4 x 4 = 16 B. Each a persistent
// buffer made after construction, in this order, none for the bundled runtime's program.
TEST(LoweringLoopInputs, BatchAndRotaryTablesByHand) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  const std::map<std::string, std::vector<std::pair<std::string, Bytes>>> want = {
      {"torchtitan", {{"freqs_cis", 1024}, {"input_ids", 768}, {"labels", 768}}},
      {"litgpt", {{"rope_cos", 512}, {"rope_sin", 512}, {"input_ids", 768}, {"labels", 768}}},
      {"hf", {{"inv_freq", 16}, {"input_ids", 768}, {"labels", 768}}},
      {"fused", {{"inv_freq", 16}, {"input_ids", 768}, {"labels", 768}}},
      {"runtime", {}},
  };
  for (const auto& [impl, bufs] : want) {
    for (int fsdp : {1, 2}) {
      const std::string plan = R"({"micro_batch": 3, "seq_len": 32, "implementation": ")" + impl +
                               R"(", "fsdp_version": )" + std::to_string(fsdp) + "}";
      const StepProgram p = lower_hand(g, plan, 4, 4);
      std::vector<std::pair<std::string, Bytes>> got;
      for (const Buffer& b : p.buffers) {
        if (!b.after_construction) continue;
        EXPECT_TRUE(b.persistent && !b.first_step_lazy) << impl << " " << b.name;
        EXPECT_EQ(b.category, MemCategory::Activations) << impl << " " << b.name;
        EXPECT_EQ(b.pool_stream, 0) << impl << " " << b.name;
        got.emplace_back(b.name, b.bytes);
      }
      ASSERT_EQ(got.size(), bufs.size()) << impl << " FSDP" << fsdp;
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_NE(got[i].first.find(bufs[i].first), std::string::npos) << impl << " " << got[i].first;
        EXPECT_EQ(got[i].second, bufs[i].second) << impl << " " << got[i].first;
      }
      expect_well_formed(p, impl + " FSDP" + std::to_string(fsdp));
    }
  }
}

// The same setups call by call (StepProgram::loop_setup), with the temporaries the tables' code makes: inv_freq
// fp32 4 x 4 = 16 B, the positions fp32 32 x 4 = 128 B, the angles fp32 32 x 4 x 4 = 512 B; torchtitan's
// ones_like(angles) 512 B; litgpt's emb = cat(angles, angles) 32 x 8 x 4 = 1,024 B and emb.cos() / emb.sin() in
// fp32 (1,024 B each) before their bf16 copies. B: a buffer of that many bytes, T: a temporary, F k: temporary k freed.
TEST(LoweringLoopInputs, SetupCallsByHand) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  const std::map<std::string, std::string> want = {
      {"torchtitan", "T16 T128 T512 T512 B1024 F3 F2 F1 F0 B768 B768"},
      {"litgpt", "T16 T128 T512 T1024 T1024 B512 F4 T1024 B512 F5 F3 F2 F1 F0 B768 B768"},
      {"hf", "B16 T128 T512 F1 F0 B768 B768"},
      {"fused", "B16 T128 T512 F1 F0 B768 B768"},
      {"runtime", ""},
  };
  for (const auto& [impl, calls] : want) {
    const StepProgram p =
        lower_hand(g, R"({"micro_batch": 3, "seq_len": 32, "implementation": ")" + impl + R"("})", 4, 4);
    std::string got;
    for (const LoopSetupCall& c : p.loop_setup) {
      if (!got.empty()) got += ' ';
      got += c.kind == LoopSetupCall::Buffer      ? "B" + std::to_string(c.bytes)
             : c.kind == LoopSetupCall::Temporary ? "T" + std::to_string(c.bytes)
                                                  : "F" + std::to_string(c.temporary);
    }
    EXPECT_EQ(got, calls) << impl;
  }
  // fp32 parameters: litgpt's cos and sin are emb.cos() and emb.sin() themselves (.to(fp32) returns its input).
  const StepProgram fp32 = lower_hand(
      g, R"({"seq_len": 32, "implementation": "litgpt", "param_dtype": "fp32", "reduce_dtype": "fp32"})", 4, 4);
  ASSERT_FALSE(fp32.loop_setup.empty());
  int temporaries = 0;
  for (const LoopSetupCall& c : fp32.loop_setup) temporaries += c.kind == LoopSetupCall::Temporary ? 1 : 0;
  EXPECT_EQ(temporaries, 4);
}

// A malformed setup is refused, naming the field.
TEST(LoweringLoopInputs, MalformedSetupIsRefused) {
  auto g = block_graph(kRoot, {kBlock, kBlock});
  const StepProgram good = lower_hand(g, R"({"seq_len": 32, "implementation": "torchtitan"})", 4, 4);
  EXPECT_NO_THROW(validate_program(good));
  const auto refused = [&](StepProgram p, const std::string& field) {
    try {
      validate_program(p);
      ADD_FAILURE() << "accepted; expected an error on " << field;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  StepProgram twice = good;   // a temporary freed twice
  twice.loop_setup.insert(twice.loop_setup.begin() + 5, twice.loop_setup[5]);
  refused(twice, "program.loop_setup[6].temporary");
  StepProgram missing = good;   // one Buffer call short
  missing.loop_setup.pop_back();
  refused(missing, "program.loop_setup");
  StepProgram kept = good;   // a temporary never freed
  kept.loop_setup.erase(kept.loop_setup.begin() + 5);
  refused(kept, "program.loop_setup");
  StepProgram negative = good;
  negative.loop_setup[0].bytes = -1;
  refused(negative, "program.loop_setup[0].bytes");
  // FSDP1's construction originals (Buffer::init_originals): an index past the lists, on a buffer that is not a
  // persistent sharded parameter, a negative size.
  const models::ModelSpec m = tiny_spec(2);
  const Plan plan = resolved(R"({"fsdp_version": 1, "implementation": "hf"})", 2, 2);
  const StepProgram fsdp1 = lower(m, models::build_wrap_graph(m, plan.auto_wrap_policy), plan, Topology{2, 2});
  EXPECT_NO_THROW(validate_program(fsdp1));
  int shard = -1, other = -1;
  for (const Buffer& b : fsdp1.buffers) {
    if (b.init_originals >= 0 && shard < 0) shard = b.id;
    if (!b.persistent && other < 0) other = b.id;
  }
  ASSERT_GE(shard, 0);
  ASSERT_GE(other, 0);
  StepProgram past = fsdp1;
  past.buffers[static_cast<std::size_t>(shard)].init_originals = static_cast<int>(past.init_originals.size());
  refused(past, "program.buffers[" + std::to_string(shard) + "].init_originals");
  StepProgram transient = fsdp1;
  transient.buffers[static_cast<std::size_t>(other)].init_originals = 0;
  refused(transient, "program.buffers[" + std::to_string(other) + "].init_originals");
  StepProgram below = fsdp1;
  below.init_originals[0][0] = -4;
  refused(below, "program.init_originals[0][0]");
}

}  // namespace
}  // namespace fsdpsim::sim

// The autograd tape's bookkeeping on hand-built tapes: what is kept, forward temporaries, the
// backward walk (gradient allocation, aliasing, accumulation, release of saved tensors), the
// recompute of a checkpointed block, torchtitan's SAC policy and the min-cut partitioner.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "models/autograd_tape.h"

using namespace fsdpsim;
using namespace fsdpsim::models;

namespace {

std::vector<std::string> kept_names(const AutogradTape& t, const TapePolicy& p) {
  std::vector<std::string> v;
  for (std::size_t s = 0; s < t.storages().size(); ++s)
    if (p.kept[s]) v.emplace_back(t.storages()[s].name);
  return v;
}

// x (100 B) -> a = f(x) (200 B, f saves x, like silu) -> b = cast(a) (50 B, saves nothing)
// -> y = mm(b) (100 B, saves b): the block output.
AutogradTape chain() {
  AutogradTape t;
  const int x = t.input("x", 100);
  const int a = t.add1({OpKind::Pointwise, {{x, GradRule::New, true}}, {{"a", 200}}});
  const int b = t.add1({OpKind::Pointwise, {{a, GradRule::New}}, {{"b", 50}}});
  t.output(t.add1({OpKind::Matmul, {{b, GradRule::New, true}}, {{"y", 100}}}));
  return t;
}

}  // namespace

TEST(AutogradTape, EagerChainByHand) {
  const AutogradTape t = chain();
  const TapePolicy p = t.eager_policy();
  EXPECT_EQ(kept_names(t, p), (std::vector<std::string>{"x", "b"}));
  const TapeCost c = t.cost(p);
  // forward: a (200) is the only temporary while b is created (b is kept); then y (100) alone
  EXPECT_EQ(c.forward_extra, 200);
  // backward from saved 150 + incoming dy 100:
  //   mm:   db 50 -> 300, then dy and b freed -> 100 (x) + 50
  //   cast: da 200 -> 100 + 50 + 200 = 350, then db freed
  //   f:    dx 100 -> 100 + 200 + 100 = 400 (peak), then da and x freed
  EXPECT_EQ(c.backward_extra, 400 - 150);
}

TEST(AutogradTape, FullCheckpointRecomputesByHand) {
  const AutogradTape t = chain();
  const TapePolicy p = t.full_checkpoint_policy(t.eager_policy());
  EXPECT_EQ(kept_names(t, p), (std::vector<std::string>{"x"}));
  const TapeCost c = t.cost(p);
  EXPECT_EQ(c.forward_extra, 250);  // a 200 + b 50 while the cast runs
  // recompute from x 100 + dy 100: a -> 400, b -> 450 (peak), a dies -> 250, y 100 -> 350, dropped;
  // then the eager backward above (peak 400)
  EXPECT_EQ(c.backward_extra, 450 - 100);
}

// The forward's allocator events in op order (issue 19 item 4): each tensor when its op creates it, each
// temporary freed at its last use, the output left alive; the temporaries' running peak is forward_extra.
std::string events_text(const std::vector<ForwardEvent>& ev) {
  std::string s;
  for (const ForwardEvent& e : ev) {
    s += e.kind == ForwardEvent::Kept ? "+K " : e.kind == ForwardEvent::Temp ? "+T " : "-T ";
    s += std::string(e.name) + " " + std::to_string(e.bytes) + (e.kind == ForwardEvent::Kept ? "" : " #" + std::to_string(e.temp)) + "; ";
  }
  return s;
}
Bytes temp_peak(const std::vector<ForwardEvent>& ev) {
  Bytes live = 0, peak = 0;
  for (const ForwardEvent& e : ev) {
    if (e.kind == ForwardEvent::Temp) live += e.bytes;
    if (e.kind == ForwardEvent::FreeTemp) live -= e.bytes;
    peak = std::max(peak, live);
  }
  return peak;
}

TEST(AutogradTape, ForwardAndRecomputeEventsInOpOrderByHand) {
  const AutogradTape t = chain();
  // eager: x kept; f makes a (a temporary: the cast's input, nothing saves it); the cast makes b (kept by mm)
  // and is a's last use; mm makes y, the block output, alive past the block
  const TapePolicy eager = t.eager_policy();
  const auto ev = t.forward_events(eager);
  EXPECT_EQ(events_text(ev), "+K x 100; +T a 200 #0; +K b 50; -T a 200 #0; +T y 100 #1; ");
  EXPECT_EQ(temp_peak(ev), t.cost(eager).forward_extra);
  // full checkpointing keeps x alone: a and b are temporaries, each freed after its last reader
  const TapePolicy full = t.full_checkpoint_policy(eager);
  const auto fev = t.forward_events(full);
  EXPECT_EQ(events_text(fev), "+K x 100; +T a 200 #0; +T b 50 #1; -T a 200 #0; +T y 100 #2; -T b 50 #1; ");
  EXPECT_EQ(temp_peak(fev), t.cost(full).forward_extra);   // 250: a and b while the cast runs
  // the recompute of the checkpointed chain: x is kept (not made again); a, which the backward does not read,
  // is a temporary again; b, which mm's backward reads, is kept for the backward; the recomputed output y
  // is dropped as soon as it is made. Nothing without a recompute.
  EXPECT_EQ(events_text(t.recompute_events(full)), "+T a 200 #0; +K b 50; -T a 200 #0; +T y 100 #1; -T y 100 #1; ");
  EXPECT_TRUE(t.recompute_events(eager).empty());
  // the backward's own peak (400, above) without the recompute's (450), with the incoming dy (100)
  EXPECT_EQ(t.cost(full).backward_phase_extra, 400 - 100);
  EXPECT_EQ(t.cost(full).incoming_grad, 100);
  // a workspace is made and dropped around its op
  AutogradTape w;
  const int x = w.input("x", 100);
  TapeOp op{OpKind::Matmul, {{x, GradRule::New, true}}, {{"y", 100}}};
  op.fwd_workspace = 30;
  w.output(w.add1(op));
  EXPECT_EQ(events_text(w.forward_events(w.eager_policy())), "+K x 100; +T y 100 #0; +T workspace 30 #1; -T workspace 30 #1; ");
}

// The backward's allocator events (issue 19 item 4): the incoming dy first; each op's weight gradient, its inputs'
// gradients, the gradients it consumed freed, then the saved tensors whose last reader it was; the block input's
// gradient left alive. Their running sum's peak is cost()'s backward peak.
std::string backward_text(const std::vector<BackwardEvent>& ev) {
  std::string s;
  for (const BackwardEvent& e : ev) {
    switch (e.kind) {
      case BackwardEvent::WeightGrad: s += "+W "; break;
      case BackwardEvent::Grad: s += e.storage >= 0 ? "=G " : "+G "; break;
      case BackwardEvent::FreeGrad: s += "-G "; break;
      case BackwardEvent::Workspace: s += "ws "; break;
      case BackwardEvent::Release: s += "-S "; break;
      case BackwardEvent::Unpack: s += "U "; break;
    }
    s += std::to_string(e.bytes) + (e.grad >= 0 ? " #" + std::to_string(e.grad) : "") + " @" + std::to_string(e.op) + "; ";
  }
  return s;
}

TEST(AutogradTape, BackwardEventsInOpOrderByHand) {
  AutogradTape t = chain();
  // eager (saved x 100, b 50): dy #0; mm (op 2) unpacks b, makes db #1, drops dy and releases b; the cast (op 1)
  // makes da #2 and drops db; f (op 0) unpacks x, makes dx #3, drops da and releases x. dx is the caller's.
  const TapePolicy eager = t.eager_policy();
  EXPECT_EQ(backward_text(t.backward_events(eager)),
            "+G 100 #0 @-1; U 50 @2; +G 50 #1 @2; -G 100 #0 @2; -S 50 @2; +G 200 #2 @1; -G 50 #1 @1; U 100 @0; "
            "+G 100 #3 @0; -G 200 #2 @0; -S 100 @0; ");
  // the running sum from the saved 150 peaks at 400 (as EagerChainByHand counts)
  Bytes live = 150, peak = 150;
  for (const BackwardEvent& e : t.backward_events(eager)) {
    if (e.kind == BackwardEvent::WeightGrad || e.kind == BackwardEvent::Unpack) continue;
    live += e.kind == BackwardEvent::Grad ? e.bytes : -e.bytes;
    peak = std::max(peak, live);
  }
  EXPECT_EQ(peak, 400);
  EXPECT_EQ(peak - 150, t.cost(eager).backward_extra);
  // a weight gradient comes first in its op's backward, a workspace after the op's gradients
  AutogradTape w;
  const int x = w.input("x", 100);
  TapeOp op{OpKind::Matmul, {{x, GradRule::New, true}}, {{"y", 100}}};
  op.bwd_workspace = 30;
  op.weight = WeightUse::Trains;
  op.weight_grad = 70;
  w.output(w.add1(op));
  EXPECT_EQ(backward_text(w.backward_events(w.eager_policy())), "+G 100 #0 @-1; U 100 @0; +W 70 @0; +G 100 #1 @0; ws 30 @0; -G 100 #0 @0; -S 100 @0; ");
  EXPECT_EQ(w.cost(w.eager_policy()).backward_extra_with_grads, 100 + 100 + 30 + 70);
  // written into a saved tensor (Liger's in-place kernels): the gradient takes the saved storage over
  AutogradTape l;
  const int lx = l.input("x", 100);
  l.output(l.add1({OpKind::Kernel, {{lx, GradRule::IntoSaved, true}}, {{"y", 100}}}));
  EXPECT_EQ(backward_text(l.backward_events(l.eager_policy())), "+G 100 #0 @-1; U 100 @0; =G 100 #1 @0; -G 100 #0 @0; ");
}

TEST(AutogradTape, SelectiveOpKeepsOddMatmulsByHand) {
  AutogradTape t;
  const int x = t.input("x", 10);
  const int m1 = t.add1({OpKind::Matmul, {{x, GradRule::New, true}}, {{"mm1", 20}}});
  const int m2 = t.add1({OpKind::Matmul, {{m1, GradRule::New, true}}, {{"mm2", 30}}});
  const int b = t.add1({OpKind::MatmulBias, {{m2, GradRule::New, true}}, {{"addmm", 40}}});
  const auto at = t.add({OpKind::Attention, {{b, GradRule::New, true}}, {{"out", 50, true}, {"lse", 5, true, false}}});
  const int r = t.add1({OpKind::RouterMatmul, {{at[0], GradRule::New, true}}, {{"router", 60}}});
  const int m3 = t.add1({OpKind::Matmul, {{r, GradRule::New, true}}, {{"mm3", 70}}});
  t.output(t.add1({OpKind::Pointwise, {{m3, GradRule::New, true}}, {{"y", 80}}}));
  // mm1 (1st mm) kept, mm2 (2nd) recomputed, addmm and attention always kept, the router neither
  // kept nor counted, mm3 is the 3rd mm: kept
  EXPECT_EQ(kept_names(t, t.selective_op_policy(t.eager_policy())),
            (std::vector<std::string>{"x", "mm1", "addmm", "out", "lse", "mm3"}));
}

TEST(AutogradTape, ResidualGradientAliasesAndAccumulates) {
  AutogradTape t;
  const int x = t.input("x", 64);
  const int a = t.add1({OpKind::Pointwise, {{x, GradRule::New, true}}, {{"a", 64}}});
  t.output(t.add1({OpKind::Pointwise, {{x, GradRule::Alias}, {a, GradRule::Alias}}, {{"y", 64}}}));
  // backward: saved x 64, dy 64 passed to both x and a (one buffer); f allocates its dx 64 while dy
  // is still referenced: 64 + 64 + 64 = 192; it accumulates into the new buffer, dy is freed.
  EXPECT_EQ(t.cost(t.eager_policy()).backward_extra, 192 - 64);
}

// Weight gradients as the backward makes them (TapeCost::backward_extra_with_grads): x (100 B) -> mm1
// (weight gradient 30 B, saves x) -> a (200) -> f (saves a) -> b (50) -> mm2 (weight gradient 70 B, saves b)
// -> y (100). Saved x + a + b = 350, incoming dy 100: live 450 at the start.
//   mm2:  its weight's gradient (70) and db 50 -> 500 + 70 = 570; dy and b freed -> 350
//   f:    da 200 -> 550 (the activation peak, backward_extra 550 - 350 = 200) + 70 = 620; db and a freed -> 300
//   mm1:  its weight's gradient (100 in all) and dx 100 -> 400 + 100 = 500; da and x freed -> 100 + 100
// backward_extra_with_grads = 620 - 350 = 270, param_grads 100: the backward needs 170 on top of both
// gradients, not 200. A frozen mm1 counts no gradient of its own.
TEST(AutogradTape, WeightGradientsCountFromTheOpThatMakesThemByHand) {
  for (const bool frozen : {false, true}) {
    AutogradTape t;
    const int x = t.input("x", 100);
    TapeOp m1{OpKind::Matmul, {{x, GradRule::New, true}}, {{"a", 200}}};
    m1.weight = frozen ? WeightUse::Frozen : WeightUse::Trains;
    m1.weight_grad = 30;
    const int a = t.add1(m1);
    const int b = t.add1({OpKind::Pointwise, {{a, GradRule::New, true}}, {{"b", 50}}});
    TapeOp m2{OpKind::Matmul, {{b, GradRule::New, true}}, {{"y", 100}}};
    m2.weight = WeightUse::Trains;
    m2.weight_grad = 70;
    t.output(t.add1(m2));
    const TapeCost c = t.cost(t.eager_policy());
    EXPECT_EQ(c.backward_extra, 550 - 350) << frozen;
    EXPECT_EQ(c.backward_extra_with_grads, 620 - 350) << frozen;
    EXPECT_EQ(c.param_grads, frozen ? 70 : 100);
  }
}

TEST(AutogradTape, InPlaceBackwardIntoSavedStorage) {
  AutogradTape t;
  const int x = t.input("x", 100);
  t.output(t.add1({OpKind::Kernel, {{x, GradRule::IntoSaved, true}}, {{"y", 100}}}));
  // the kernel writes dx into x's saved storage: nothing new beyond the incoming dy
  EXPECT_EQ(t.cost(t.eager_policy()).backward_extra, 100);
}

TEST(AutogradTape, CompiledPolicySavesTheMinimumCut) {
  AutogradTape t;
  const int x = t.input("x", 10);
  const int m = t.add1({OpKind::Matmul, {{x, GradRule::New, true}}, {{"mm", 100}}});
  const int p1 = t.add1({OpKind::Pointwise, {{m, GradRule::New, true}}, {{"silu", 100}}});
  const int p2 = t.add1({OpKind::Pointwise, {{p1, GradRule::New, true}}, {{"square", 100}}});
  const int c = t.add1({OpKind::Pointwise, {{x, GradRule::New}}, {{"x_fp32", 40}}});
  const int y = t.add1({OpKind::Matmul, {{p2, GradRule::New, true}, {c, GradRule::New, true}}, {{"y", 10}}});
  t.output(y);
  // eager keeps x, mm, silu, square and x_fp32 (10 + 100 + 100 + 100 + 40);
  EXPECT_EQ(kept_names(t, t.eager_policy()), (std::vector<std::string>{"x", "mm", "silu", "square", "x_fp32"}));
  // inductor recomputes silu from mm (kept anyway: the mm output cannot be recomputed); square and
  // x_fp32 are read in the backward by y's matmul, a library kernel inductor cannot fuse them into, so
  // they are banned from recomputation (ban_recompute_materialized_backward) and saved: 250 bytes, not 350
  EXPECT_EQ(kept_names(t, t.compiled_policy()), (std::vector<std::string>{"x", "mm", "square", "x_fp32"}));
}

TEST(AutogradTape, CompiledPolicyRecomputesWhatOnlyFusibleBackwardsRead) {
  // x -> a = mm(x) (100) -> b = pointwise(a) (100, saves a) -> c = pointwise(b) (100, saves b) -> y = mm(c)
  // (10, saves c) and, off the matmul's path, z = pointwise(b) (30, saves b): the output is y + z.
  AutogradTape t;
  const int x = t.input("x", 10);
  const int a = t.add1({OpKind::Matmul, {{x, GradRule::New, true}}, {{"a", 100}}});
  const int b = t.add1({OpKind::Pointwise, {{a, GradRule::New, true}}, {{"b", 100}}});
  const int c = t.add1({OpKind::Pointwise, {{b, GradRule::New, true}}, {{"c", 100}}});
  const int y = t.add1({OpKind::Matmul, {{c, GradRule::New, true}}, {{"y", 10}}});
  const int z = t.add1({OpKind::Pointwise, {{b, GradRule::New, true}}, {{"z", 10}}});
  t.output(t.add1({OpKind::Pointwise, {{y, GradRule::Alias}, {z, GradRule::Alias}}, {{"out", 10}}}));
  // eager saves x, a, b, c (310 bytes); compiled: c feeds the second mm's backward (saved), b is read
  // only by fusible backwards and is recomputed from a (saved: the mm output is needed by b's backward)
  EXPECT_EQ(kept_names(t, t.eager_policy()), (std::vector<std::string>{"x", "a", "b", "c"}));
  EXPECT_EQ(kept_names(t, t.compiled_policy()), (std::vector<std::string>{"x", "a", "c"}));
}

// The candidate space: valid meshes, exact counts on small clusters, constraints, batch targets.
#include <gtest/gtest.h>

#include <set>

#include "common/errors.h"
#include "planner/search_space.h"

using namespace fsdpsim;
using namespace fsdpsim::planner;

TEST(Meshes, ExactlyTheNodeAlignedFactorizations) {
  using V = std::vector<std::pair<int, int>>;
  EXPECT_EQ(valid_meshes(1, 8), (V{{8, 1}, {4, 2}, {2, 4}, {1, 8}}));
  // 2 nodes x 8: shard inside a node (1, 2, 4, 8) or across nodes (16).
  EXPECT_EQ(valid_meshes(2, 8), (V{{16, 1}, {8, 2}, {4, 4}, {2, 8}, {1, 16}}));
  // 3 nodes x 4 = 12: shard 3 and 6 divide 12 but are not node-aligned; 12 spans all nodes.
  EXPECT_EQ(valid_meshes(3, 4), (V{{12, 1}, {6, 2}, {3, 4}, {1, 12}}));
  EXPECT_EQ(valid_meshes(1, 1), (V{{1, 1}}));
  // 4 nodes x 2: shard 1, 2 inside; 4, 8 across.
  EXPECT_EQ(valid_meshes(4, 2), (V{{8, 1}, {4, 2}, {2, 4}, {1, 8}}));
  for (auto [r, s] : valid_meshes(16, 8)) EXPECT_EQ(r * s, 128);
}

static SpaceOptions small_space(std::int64_t seqs, int world) {
  SpaceOptions o;
  o.batch = resolve_batch_target(1024, 0, seqs, world);
  return o;
}

TEST(Enumerate, ExactCountOneNodeOfTwo) {
  // 1 node x 2 GPUs, per-GPU batch 2 -> (mb, ga) in {(1,2), (2,1)}; sync only with ga 2.
  // mb/ga/sync combos = 3. AC = 4, offload 2, precision 1.
  // FSDP1: mesh (2,1) NO_SHARD: 1 knob set; mesh (1,2): FULL_SHARD + SHARD_GRAD_OP x 4 knob sets = 8.
  //   FSDP1 offload excludes sync -> per sharding config: AC 4 x [(mb1 ga2 no_sync) x2 offload + (mb1 sync) x1 +
  //   (mb2) x2] = 4 x 5 = 20.  FSDP1 total = 9 x 20 = 180.
  // FSDP2: mesh (2,1): rAF true, depth 1 -> 1; mesh (1,2): rAF {true,false} x depth {1,2} = 4. 5 x AC 4 x 6 = 120.
  auto c = enumerate_candidates(small_space(4, 2), 1, 2);
  EXPECT_EQ(c.size(), 300u);
  std::set<std::string> ids;
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i].index, static_cast<int>(i));
    ids.insert(c[i].id);
    EXPECT_EQ(c[i].plan.mesh_replicate * c[i].plan.mesh_shard, 2);
    EXPECT_EQ(c[i].plan.micro_batch * c[i].plan.grad_accum, 2);
    EXPECT_EQ(c[i].plan.seq_len, 1024);
  }
  EXPECT_EQ(ids.size(), c.size());
  EXPECT_EQ(c[0].id, "c0000");
}

// LoRA: FSDP1 candidates with use_orig_params true and false (unless fixed), FSDP2's unchanged (the 180 FSDP1 and 120
// FSDP2 candidates of the space above become 360 + 120). QLoRA: only pure low precision (bf16-true replaces the
// default list's bf16), no FSDP2 offload: FSDP1 keeps its 180 per use_orig_params value, FSDP2 loses the 60 with
// offload (mb 1 ga 2 sync, mb 1 ga 2 no_sync and mb 2, each x 4 AC x 5 FSDP2 layouts): 360 + 60.
TEST(Enumerate, LoraSearchesUseOrigParamsAndQloraStaysModelled) {
  SpaceOptions o = small_space(4, 2);
  o.base.lora.rank = 8;
  o.base.lora.targets = {"q", "v"};
  auto c = enumerate_candidates(o, 1, 2);
  EXPECT_EQ(c.size(), 480u);
  int without = 0;
  for (const auto& x : c) without += x.plan.fsdp_version == sim::FsdpVersion::FSDP1 && !x.plan.use_orig_params;
  EXPECT_EQ(without, 180);
  SpaceOptions fixed = o;
  fixed.fixed.push_back(parse_constraint("use_orig_params=true", "--fix"));
  apply_base_constraint(fixed.base, fixed.fixed.back());
  EXPECT_EQ(enumerate_candidates(fixed, 1, 2).size(), 300u);
  o.base.lora.quantize_nf4 = true;
  c = enumerate_candidates(o, 1, 2);
  EXPECT_EQ(c.size(), 420u);
  for (const auto& x : c) {
    EXPECT_EQ(x.plan.master_weights_dtype, x.plan.param_dtype) << x.label;
    EXPECT_FALSE(x.plan.cpu_offload.params && x.plan.fsdp_version == sim::FsdpVersion::FSDP2) << x.label;
  }
  // Compiled QLoRA: full and every_2 checkpointing in both orders (the checkpoint traced inside compile, or eager
  // around the compiled block): the two whole-block modes' candidates twice, 420 / 4 modes x 2 more; every
  // candidate valid, and the label says the order.
  o.base.compile = true;
  c = enumerate_candidates(o, 1, 2);
  EXPECT_EQ(c.size(), 420u + 2 * 420u / 4);
  int around = 0;
  for (const auto& x : c) {
    const auto& ac = x.plan.activation_checkpointing;
    if (!ac.outside_compile) continue;
    ++around;
    EXPECT_TRUE(ac.mode == sim::ActivationCheckpointing::Mode::Full || ac.mode == sim::ActivationCheckpointing::Mode::EveryK);
    EXPECT_NE(x.label.find("(around compile)"), std::string::npos) << x.label;
    EXPECT_NO_THROW(sim::resolve_plan(x.plan, 2, 2)) << x.label;
  }
  EXPECT_EQ(around, 2 * 420 / 4);
  o.base.lora.quantize_nf4 = false;   // bf16 LoRA: the default order alone
  for (const auto& x : enumerate_candidates(o, 1, 2)) EXPECT_FALSE(x.plan.activation_checkpointing.outside_compile);
}

// A low-bit optimizer: no CPU offload (not modelled with one); bitsandbytes' under FSDP1 only.
TEST(Enumerate, LowBitOptimizersStayModelled) {
  SpaceOptions o = small_space(4, 2);
  const auto all = enumerate_candidates(o, 1, 2);
  std::size_t offload = 0, fsdp1_no_offload = 0;
  for (const auto& x : all) {
    offload += x.plan.cpu_offload.params;
    fsdp1_no_offload += x.plan.fsdp_version == sim::FsdpVersion::FSDP1 && !x.plan.cpu_offload.params;
  }
  ASSERT_GT(offload, 0u);
  o.base.optimizer = sim::Optimizer::TorchaoAdamW8bit;
  EXPECT_EQ(enumerate_candidates(o, 1, 2).size(), all.size() - offload);
  o.base.optimizer = sim::Optimizer::BnbPagedAdamW8bit;
  const auto bnb = enumerate_candidates(o, 1, 2);
  EXPECT_EQ(bnb.size(), fsdp1_no_offload);
  for (const auto& x : bnb) EXPECT_EQ(x.plan.fsdp_version, sim::FsdpVersion::FSDP1) << x.label;
}

TEST(Enumerate, EveryValidMeshAppearsForBothVersions) {
  auto c = enumerate_candidates(small_space(16, 16), 2, 8);
  std::set<std::pair<int, int>> v1, v2;
  std::set<std::string> families;
  for (const auto& x : c) {
    (x.plan.fsdp_version == sim::FsdpVersion::FSDP1 ? v1 : v2).insert({x.plan.mesh_replicate, x.plan.mesh_shard});
    families.insert(x.family);
  }
  auto want = valid_meshes(2, 8);
  using MeshSet = std::set<std::pair<int, int>>;
  EXPECT_EQ(v1, MeshSet(want.begin(), want.end()));
  EXPECT_EQ(v2, MeshSet(want.begin(), want.end()));
  EXPECT_TRUE(families.count("FULL_SHARD across nodes"));
  EXPECT_TRUE(families.count("HYBRID_SHARD"));
  EXPECT_TRUE(families.count("FULL_SHARD (hpZ) across nodes"));  // FSDP2 rAF=8 on a 16-GPU shard group
  EXPECT_TRUE(families.count("DDP (NO_SHARD) + CPU offload"));   // NO_SHARD named for what it is: DDP
}

TEST(Enumerate, FixAndExclude) {
  auto o = small_space(16, 8);
  o.fixed = {parse_constraint("fsdp_version=2", "--fix"), parse_constraint("activation_checkpointing=full", "--fix")};
  o.excluded = {parse_constraint("cpu_offload=true", "--exclude")};
  auto c = enumerate_candidates(o, 1, 8);
  ASSERT_FALSE(c.empty());
  for (const auto& x : c) {
    EXPECT_EQ(x.plan.fsdp_version, sim::FsdpVersion::FSDP2);
    EXPECT_EQ(x.plan.activation_checkpointing.mode, sim::ActivationCheckpointing::Mode::Full);
    EXPECT_FALSE(x.plan.cpu_offload.params);
  }
  // A fixed value outside the default space extends it (every_4, micro_batch 2, mesh given as text).
  o = small_space(16, 8);
  o.fixed = {parse_constraint("activation_checkpointing=every_4", "--fix"), parse_constraint("mesh=(2, 4)", "--fix"),
             parse_constraint("micro_batch=2", "--fix")};
  c = enumerate_candidates(o, 1, 8);
  ASSERT_FALSE(c.empty());
  for (const auto& x : c) {
    EXPECT_EQ(x.plan.activation_checkpointing.every_k, 4);
    EXPECT_EQ(x.plan.mesh_replicate, 2);
    EXPECT_EQ(x.plan.micro_batch, 2);
    EXPECT_EQ(x.plan.grad_accum, 1);
  }
  // FSDP1-only knobs restrict to FSDP1.
  o = small_space(16, 8);
  o.fixed = {parse_constraint("limit_all_gathers=false", "--fix")};
  for (const auto& x : enumerate_candidates(o, 1, 8)) {
    EXPECT_EQ(x.plan.fsdp_version, sim::FsdpVersion::FSDP1);
    EXPECT_FALSE(x.plan.limit_all_gathers);
  }
}

TEST(Enumerate, BadConstraintsNameTheKey) {
  try {
    parse_constraint("fsdp_versoin=2", "--fix");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--fix");
    EXPECT_NE(std::string(e.allowed()).find("fsdp_version"), std::string::npos);
  }
  EXPECT_THROW(parse_constraint("activation_checkpointing=sometimes", "--fix"), InputError);
  EXPECT_THROW(parse_constraint("mesh=2x", "--fix"), InputError);
  EXPECT_THROW(parse_constraint("micro_batch=0", "--fix"), InputError);
  EXPECT_THROW(parse_constraint("noequals", "--fix"), InputError);
  auto o = small_space(16, 8);
  o.fixed = {parse_constraint("mesh=3x3", "--fix")};
  EXPECT_THROW(enumerate_candidates(o, 1, 8), InputError);
  o.fixed = {parse_constraint("micro_batch=3", "--fix")};
  EXPECT_THROW(enumerate_candidates(o, 1, 8), InputError);
  // Contradictory constraints leave nothing: an error, not an empty plan.
  o.fixed = {parse_constraint("fsdp_version=2", "--fix"), parse_constraint("limit_all_gathers=false", "--fix")};
  EXPECT_THROW(enumerate_candidates(o, 1, 8), InputError);
}

TEST(Batch, DefaultsAndRounding) {
  auto b = resolve_batch_target(8192, 0, 0, 8);
  EXPECT_EQ(b.global_batch_sequences, 512);  // 4M tokens / 8192
  EXPECT_FALSE(b.note.empty());
  b = resolve_batch_target(8192, 0, 0, 1024);
  EXPECT_EQ(b.global_batch_sequences, 1024);  // raised to one sequence per GPU
  b = resolve_batch_target(4096, 1000000, 0, 8);
  EXPECT_EQ(b.global_batch_sequences, 248);   // ceil(1e6/4096)=245 -> 248
  EXPECT_NE(b.note.find("rounded"), std::string::npos);
  b = resolve_batch_target(2048, 0, 64, 8);
  EXPECT_EQ(b.global_batch_sequences, 64);
  EXPECT_TRUE(b.note.empty());
  EXPECT_THROW(resolve_batch_target(2048, 0, 60, 8), InputError);
  EXPECT_THROW(resolve_batch_target(0, 0, 64, 8), InputError);
  EXPECT_THROW(resolve_batch_target(2048, 1 << 20, 64, 8), InputError);
}

TEST(Labels, ReadableAndCanonical) {
  sim::Plan p;
  p.fsdp_version = sim::FsdpVersion::FSDP2;
  p.mesh_replicate = 2;
  p.mesh_shard = 8;
  p.reshard_after_forward = sim::ReshardAfterForward::yes();
  p.micro_batch = 2;
  p.grad_accum = 4;
  EXPECT_EQ(label_of(p), "FSDP2 HYBRID_SHARD mesh(2,8) rAF=true AC=none mb=2 ga=4 no_sync bf16");
  EXPECT_EQ(canonical_value(p, "mesh"), "[2,8]");
  EXPECT_EQ(canonical_value(p, "sharding_strategy"), "HYBRID_SHARD");
  EXPECT_EQ(canonical_value(p, "limit_all_gathers"), "n/a");
  EXPECT_EQ(family_of(p, 8), "HYBRID_SHARD");
  p.mesh_replicate = 1;
  p.mesh_shard = 16;
  EXPECT_EQ(family_of(p, 8), "FULL_SHARD across nodes");
}

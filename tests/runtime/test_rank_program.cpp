// The rank program's derived tables that both backends execute by: each op's role and each buffer's
// element type, on the mixed-precision programs the CUDA backend runs (checked here without a GPU).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "runtime/rank_program.h"
#include "runtime_fixtures.h"

using namespace fsdpsim;
using namespace fsdpsim::runtime;
using namespace fsdpsim::runtime::testing;

namespace {

RankProgram program_of(const std::string& plan_json, int world) {
  const sim::Plan plan = plan_from(plan_json, world);
  return build_rank_program(tiny_llama(), plan, world, world, plan.mesh_shard, "test runtime");
}

// Roles seen per op name without its unit ("copy-in" for "copy-in u3"), over the whole program.
std::map<std::string, std::map<OpRole, int>> roles_by_name(const RankProgram& rp) {
  std::map<std::string, std::map<OpRole, int>> out;
  for (const sim::Op& op : rp.program.ops) ++out[op.name.substr(0, op.name.rfind(" u"))][rp.op_role[op.id]];
  return out;
}

}  // namespace

TEST(RankProgram, Fsdp2MixedPrecisionRolesAndTypes) {
  // bf16 params, fp32 reduction, accumulation without sync: the all-gather side in bf16, the
  // upcast accumulation and the reduce-scatter in fp32.
  const RankProgram rp = program_of(R"({"fsdp_version": 2, "param_dtype": "bf16", "reduce_dtype": "fp32",
      "seq_len": 16, "micro_batch": 1, "grad_accum": 3, "grad_sync": false})", 2);
  auto roles = roles_by_name(rp);
  EXPECT_EQ(roles.at("copy-in").size(), 1u);
  EXPECT_GT(roles.at("copy-in")[OpRole::AllGatherCopyIn], 0);
  EXPECT_GT(roles.at("RS copy-in")[OpRole::ReduceScatterCopyIn], 0);
  EXPECT_GT(roles.at("copy-out")[OpRole::ParamCopyOut], 0);
  EXPECT_GT(roles.at("cast")[OpRole::CastConvert], 0);
  EXPECT_GT(roles.at("grad up")[OpRole::CastConvert], 0);
  EXPECT_GT(roles.at("grad acc")[OpRole::CastAccumulate], 0);
  for (const sim::Buffer& b : rp.program.buffers) {
    const Elem e = rp.buffer_elem[b.id];
    if (b.name.find("ag_in") != std::string::npos || b.name.find("ag_out") != std::string::npos ||
        b.category == sim::MemCategory::UnshardedParams)
      EXPECT_EQ(e, Elem::BF16) << b.name;
    if (b.name.find("grad_acc") != std::string::npos || b.name.find("rs_") != std::string::npos ||
        b.category == sim::MemCategory::ShardedParams || b.category == sim::MemCategory::ShardedGrads)
      EXPECT_EQ(e, Elem::F32) << b.name;
  }
}

TEST(RankProgram, Fsdp1RolesAndTypes) {
  const RankProgram rp = program_of(R"({"fsdp_version": 1, "param_dtype": "bf16", "reduce_dtype": "bf16",
      "seq_len": 16, "micro_batch": 1, "grad_accum": 2, "grad_sync": true})", 2);
  auto roles = roles_by_name(rp);
  EXPECT_GT(roles.at("grad cat")[OpRole::GradCat], 0);
  EXPECT_EQ(roles.at("grad cat").size(), 1u);
  int to_grad = 0;
  for (const sim::Op& op : rp.program.ops)
    if (rp.op_role[op.id] == OpRole::CastToShardedGrad) {
      ++to_grad;
      EXPECT_EQ(op.outputs.at(0), rp.grad_shard_buf.at(op.unit)) << op.name;
    }
  EXPECT_GT(to_grad, 0);
  for (const sim::Buffer& b : rp.program.buffers)
    if (b.category == sim::MemCategory::UnshardedGrads) EXPECT_EQ(rp.buffer_elem[b.id], Elem::BF16) << b.name;
}

TEST(RankProgram, Fp32ProgramIsFp32Throughout) {
  // What the CPU backend runs: every typed buffer fp32; no op the runtime does not execute.
  const RankProgram rp = program_of(R"({"fsdp_version": 2, "param_dtype": "fp32", "reduce_dtype": "fp32",
      "seq_len": 16, "micro_batch": 1, "grad_accum": 2})", 2);
  for (const sim::Buffer& b : rp.program.buffers) EXPECT_EQ(rp.buffer_elem[b.id], Elem::F32) << b.name;
  for (const sim::Op& op : rp.program.ops) EXPECT_NE(rp.op_role[op.id], OpRole::Unsupported) << op.name;
}

// `fsdpsim run` and `fsdpsim validate` end to end on the tiny Llama: a 1-rank run needs no mpirun,
// bad input exits 2 naming the field, and validation on 2 ranks reports the memory prediction within
// 2% of the measured allocator peaks (the runtime drives the very allocator model the simulator replays).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "common/json_reader.h"

using namespace fsdpsim;

namespace {
std::string dir() { return FSDPSIM_BINARY_DIR; }
std::string tiny() {
  const std::string path = dir() + "/test_runtime_cli_tiny.json";
  std::ofstream(path) << R"({"model_type": "llama", "_name_or_path": "test-tiny-llama", "hidden_size": 64,
    "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 96, "max_position_embeddings": 64, "tie_word_embeddings": false})";
  return path;
}
int run(const std::string& args) {
  const int rc = std::system((dir() + "/fsdpsim " + args + " > " + dir() + "/test_runtime_cli.log 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}
const std::string kPlan = R"('{"param_dtype": "fp32", "reduce_dtype": "fp32", "seq_len": 16, "micro_batch": 2}')";
}  // namespace

TEST(CliRuntime, RunOneRankWithoutMpi) {
  const std::string out = dir() + "/test_runtime_cli_run.json";
  ASSERT_EQ(run("run --model " + tiny() + " --plan " + kPlan + " --steps 2 --json " + out), 0);
  Json j = read_json_file(out, "out");
  EXPECT_TRUE(j.contains("context"));
  EXPECT_EQ(j["losses"].size(), 2u);
  EXPECT_GT(j["measured"]["peak_memory_bytes"]["allocated"].get<long>(), 0);
  EXPECT_GT(j["measured"]["step_time_s"].get<double>(), 0.0);
}

TEST(CliRuntime, BadInputExitsTwo) {
  EXPECT_EQ(run("run --model " + tiny() + " --plan '{\"seq_len\": 16}'"), 2);   // bf16 default: fp32 only
  EXPECT_EQ(run("run --model no-such-model --plan " + kPlan), 2);
  EXPECT_EQ(run("run --model " + tiny() + " --plan " + kPlan + " --ranks 0"), 2);
  EXPECT_EQ(run("validate --model " + tiny()), 2);   // --plan missing
  // Collective padding only exists in an emulated world (cuda, one rank).
  EXPECT_EQ(run("run --model " + tiny() + " --plan " + kPlan + " --pad-collectives"), 2);
  EXPECT_EQ(run("validate --backend cuda --model " + tiny() + " --plan '{\"seq_len\": 16}' --pad-collectives"), 2);
  EXPECT_EQ(run("run --help"), 0);
  EXPECT_EQ(run("validate --help"), 0);
}

std::string log() {
  std::ifstream in(dir() + "/test_runtime_cli.log");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Plan keys the runtime's eager kernels do not execute are refused with the key, not measured as
// something else (runtime/plan_support.cpp): before, `compile: true` ran eager and compared with a
// compiled prediction.
TEST(CliRuntime, KeysTheRuntimeDoesNotExecuteExitTwoNamingTheKey) {
  const std::string base = R"("param_dtype": "fp32", "reduce_dtype": "fp32", "seq_len": 16, "micro_batch": 2)";
  for (const auto& [extra, key] : std::vector<std::pair<std::string, std::string>>{
           {R"("compile": true)", "plan.compile"},
           {R"("cross_entropy": "chunked")", "plan.cross_entropy"},
           {R"("activation_checkpointing": "selective_op")", "plan.activation_checkpointing"},
           {R"("trainable_fraction": 0.5)", "plan.trainable_fraction"},
           {R"("lora": {"rank": 4, "targets": ["q", "v"]})", "plan.lora"}}) {
    SCOPED_TRACE(extra);
    EXPECT_EQ(run("run --model " + tiny() + " --plan '{" + base + ", " + extra + "}' --steps 1"), 2);
    EXPECT_NE(log().find(key), std::string::npos) << log();
  }
}

TEST(CliRuntime, ValidateTwoRanksMemoryWithinTwoPercent) {
  const std::string out = dir() + "/test_runtime_cli_validate.json";
  ASSERT_EQ(run("validate --model " + tiny() + " --plan " + kPlan + " --ranks 2 --steps 2 --json " + out), 0);
  Json j = read_json_file(out, "out");
  const auto& c = j["comparison"];
  EXPECT_LE(std::fabs(c["peak_allocated_error"].get<double>()), 0.02);
  EXPECT_LE(std::fabs(c["peak_reserved_error"].get<double>()), 0.02);
  EXPECT_TRUE(c["step_time_error"].is_number());
  EXPECT_GT(c["per_op"].size(), 10u);
  EXPECT_EQ(c["unmatched_ops"].size(), 0u);
}

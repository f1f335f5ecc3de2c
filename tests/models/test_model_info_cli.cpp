// `fsdpsim model-info` end to end: runs the built program, checks exit codes and the JSON output.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "fixture.h"

namespace {

struct CliRun {
  int code = -1;
  std::string out;
};

// Runs `fsdpsim ARGS` (stdout captured, stderr dropped) and returns its exit code.
CliRun fsdpsim(const std::string& args) {
  const std::string cmd = std::string(FSDPSIM_BINARY_DIR) + "/fsdpsim --deterministic " + args + " 2>/dev/null";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace

TEST(ModelInfoCli, JsonForLlama3_8b) {
  const CliRun r = fsdpsim("model-info --model llama3-8b --json --seq-len 8192");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("context").at("tool"), "fsdpsim");
  EXPECT_EQ(j.at("context").at("host"), "<fixed>");
  EXPECT_EQ(j.at("params_total").get<std::int64_t>(), 8'030'261'248);
  EXPECT_EQ(j.at("params_per_block").get<std::int64_t>(), 218'112'000);
  EXPECT_EQ(j.at("params_embedding").get<std::int64_t>(), 525'336'576);
  EXPECT_EQ(j.at("params_lm_head").get<std::int64_t>(), 525'336'576);
  EXPECT_DOUBLE_EQ(j.at("flops_per_token_fwd").get<double>(), 19'304'284'160.0);
  EXPECT_DOUBLE_EQ(j.at("flops_per_token_fwdbwd").get<double>(), 57'912'852'480.0);
  ASSERT_EQ(j.at("units").size(), 33u);
  EXPECT_EQ(j.at("units")[0].at("name"), "root");
  EXPECT_EQ(j.at("units")[1].at("params").get<std::int64_t>(), 218'112'000);
  EXPECT_EQ(j.at("model").at("block_class"), "LlamaDecoderLayer");
  // per token, bf16, no checkpointing: 168,072 B (see test_activations.cpp)
  EXPECT_DOUBLE_EQ(j.at("activation_bytes_per_block_per_token").at("none").get<double>(), 168'072.0);
}

TEST(ModelInfoCli, ConfigFileAndPolicies) {
  const CliRun r = fsdpsim("model-info --model " + fixture("gpt2_xl.json") + " --json --wrap-policy none");
  ASSERT_EQ(r.code, 0);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("params_total").get<std::int64_t>(), 1'557'611'200);
  EXPECT_EQ(j.at("units").size(), 1u);
  const CliRun t = fsdpsim("model-info --model mixtral-8x7b --wrap-policy modules:layers.*,embed_tokens");
  ASSERT_EQ(t.code, 0);
  EXPECT_NE(t.out.find("46,702,792,704"), std::string::npos) << t.out;
}

TEST(ModelInfoCli, HelpAndBadInputExitCodes) {
  const CliRun h = fsdpsim("model-info --help");
  EXPECT_EQ(h.code, 0);
  EXPECT_NE(h.out.find("--wrap-policy"), std::string::npos);
  EXPECT_EQ(fsdpsim("model-info").code, 2);                                   // --model missing
  EXPECT_EQ(fsdpsim("model-info --model nosuch-model").code, 2);
  EXPECT_EQ(fsdpsim("model-info --model " + fixture("bad_unknown_type.json")).code, 2);
  EXPECT_EQ(fsdpsim("model-info --model " + fixture("bad_malformed.json")).code, 2);
  EXPECT_EQ(fsdpsim("model-info --model " + fixture("missing.json")).code, 2);
  EXPECT_EQ(fsdpsim("model-info --model " + fixture("bad_heads_not_divisible.json")).code, 2);
  EXPECT_EQ(fsdpsim("model-info --model llama3-8b --wrap-policy size:x").code, 2);
  EXPECT_EQ(fsdpsim("model-info --model llama3-8b --wrap-policy modules:nothing_like_this").code, 2);
  EXPECT_EQ(fsdpsim("model-info --model llama3-8b --seq-len 0").code, 2);
  EXPECT_EQ(fsdpsim("model-info --model gpt2 --seq-len 2048").code, 2);  // > n_positions 1024
  EXPECT_EQ(fsdpsim("model-info --model llama3-8b --bogus").code, 2);
}

// cli/cmd_model_info.cpp in-process (no dependency on the other modules linking): output, --out,
// and InputError for each bad option (main() maps those to exit code 2; models_cli_test checks that).
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/errors.h"
#include "fixture.h"

namespace {

// Runs the command with std::cout captured.
std::string run(const std::vector<std::string>& args) {
  std::ostringstream captured;
  std::streambuf* old = std::cout.rdbuf(captured.rdbuf());
  try {
    fsdpsim::cli::cmd_model_info(args);
  } catch (...) {
    std::cout.rdbuf(old);
    throw;
  }
  std::cout.rdbuf(old);
  return captured.str();
}

std::string error_field(const std::vector<std::string>& args) {
  try {
    run(args);
  } catch (const fsdpsim::InputError& e) {
    return e.field();
  }
  return "<none>";
}

}  // namespace

TEST(ModelInfoCmd, JsonOpensWithContextAndWritesOut) {
  const std::string path = std::string(FSDPSIM_BINARY_DIR) + "/model_info_cmd_test.json";
  const std::string out = run({"--model", "gpt2", "--json", "--out", path});
  const auto j = nlohmann::ordered_json::parse(out);
  EXPECT_EQ(j.begin().key(), "context");
  EXPECT_EQ(j.at("params_total").get<std::int64_t>(), 124'439'808);
  EXPECT_EQ(j.at("units").size(), 13u);
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), out);
}

TEST(ModelInfoCmd, TextForEveryZooModel) {
  for (const char* name : {"llama3-70b", "gemma-2b", "mpt-30b", "tiny-llama"}) {
    const std::string t = run({"--model", name});
    EXPECT_EQ(t.rfind("# fsdpsim ", 0), 0u) << name;  // context line first
    EXPECT_NE(t.find("Parameters (exact)"), std::string::npos) << name;
  }
  EXPECT_NE(run({"--model", fixture("hf_dir")}).find("70,553,706,496"), std::string::npos);
}

TEST(ModelInfoCmd, BadOptionsNameTheOption) {
  EXPECT_EQ(error_field({}), "--model");
  EXPECT_EQ(error_field({"--model", "nosuch"}), "--model");
  EXPECT_EQ(error_field({"--model", "gpt2", "--seq-len", "2048"}), "--seq-len");  // > n_positions
  EXPECT_EQ(error_field({"--model", "gpt2", "--seq-len", "-1"}), "--seq-len");
  EXPECT_EQ(error_field({"--model", "gpt2", "--micro-batch", "0"}), "--micro-batch");
  EXPECT_EQ(error_field({"--model", "gpt2", "--dtype", "int4"}), "--dtype");
  EXPECT_EQ(error_field({"--model", "gpt2", "--wrap-policy", "size:"}), "--wrap-policy");
  EXPECT_EQ(error_field({"--model", "gpt2", "--wrap-policy", "modules:embed_tokens"}), "--wrap-policy");
  EXPECT_EQ(error_field({"--model", "gpt2", "extra"}), "model-info");
  EXPECT_EQ(error_field({"--model", "gpt2", "--out", "/nonexistent-dir/x.json"}), "--out");
  EXPECT_EQ(error_field({"--model", fixture("bad_negative_layers.json")}),
            fixture("bad_negative_layers.json") + ":num_hidden_layers");
}

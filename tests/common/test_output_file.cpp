#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/context.h"
#include "common/errors.h"
#include "common/output_file.h"

using namespace fsdpsim;
namespace fs = std::filesystem;

TEST(OutputFile, WritesAtomicallyAndReplaces) {
  fs::path dir = fs::temp_directory_path() / "fsdpsim_test_out";
  fs::remove_all(dir);
  ensure_directory(dir.string(), "--out");
  std::string p = (dir / "a.json").string();
  write_file_atomic(p, "one", "--out");
  write_file_atomic(p, "two", "--out");
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "two");
  int files = 0;
  for (auto& e : fs::directory_iterator(dir)) { (void)e; ++files; }
  EXPECT_EQ(files, 1);  // no temp file left behind
  fs::remove_all(dir);
}

TEST(OutputFile, MissingDirectoryIsInputError) {
  EXPECT_THROW(write_file_atomic("/nonexistent_dir_x/a.json", "x", "--json"), InputError);
}

TEST(Context, DeterministicBlockHasVersionShaAndArgs) {
  RunContext c;
  c.argv = {"fsdpsim", "plan"};
  c.profile = "H100-SXM";
  c.deterministic = true;
  auto j = context_block(c);
  EXPECT_EQ(j["date"], "<fixed>");
  EXPECT_EQ(j["command"], "fsdpsim plan");
  EXPECT_EQ(j["profile"], "H100-SXM");
  EXPECT_FALSE(j["git_sha"].get<std::string>().empty());
  EXPECT_EQ(j["version"], tool_version());
}

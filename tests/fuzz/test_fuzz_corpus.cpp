// Corpus replay of the fuzz targets in the normal (gcc) test suite: every file of
// tests/fuzz/corpus/<target>/ — the seeds from the repository's real inputs and the regression
// inputs of fixed findings — goes through the target's entry point. Accepted or InputError are both
// fine; any other exception fails the test naming the file (a crash or a sanitizer report under
// scripts/sanitize.sh fails it too).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <typeinfo>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "tests/fuzz/fuzz_targets.h"

namespace fs = std::filesystem;
using fsdpsim::fuzz::Target;

namespace {

std::vector<fs::path> corpus_files(const std::string& target) {
  std::vector<fs::path> out;
  const fs::path dir = fs::path(FSDPSIM_SOURCE_DIR) / "tests/fuzz/corpus" / target;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class FuzzCorpus : public testing::TestWithParam<Target> {};

TEST_P(FuzzCorpus, EveryFileIsAcceptedOrRejectedWithInputError) {
  const Target& t = GetParam();
  const auto files = corpus_files(t.name);
  ASSERT_GE(files.size(), 3u) << "tests/fuzz/corpus/" << t.name << "/ needs seed inputs";
  int accepted = 0, rejected = 0;
  for (const auto& f : files) {
    try {
      t.run(slurp(f));
      ++accepted;
    } catch (const fsdpsim::InputError& e) {
      ++rejected;
      EXPECT_FALSE(e.field().empty()) << f << ": an InputError names no field";
    } catch (const std::exception& e) {
      ADD_FAILURE() << f << ": " << t.what << " threw " << typeid(e).name() << " (not InputError): " << e.what();
    }
  }
  // The seeds include real, valid inputs: a target that rejects everything has lost its coverage.
  EXPECT_GT(accepted, 0) << t.name << ": no corpus file was accepted";
  RecordProperty("accepted", accepted);
  RecordProperty("rejected", rejected);
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzCorpus, testing::ValuesIn(fsdpsim::fuzz::targets()),
                         [](const testing::TestParamInfo<Target>& i) { return std::string(i.param.name); });

TEST(FuzzCorpus, HarnessReportsForeignExceptions) {
  // The harness's contract: an unknown target is absent, known ones are found.
  EXPECT_EQ(fsdpsim::fuzz::find_target("no-such-target"), nullptr);
  ASSERT_NE(fsdpsim::fuzz::find_target("plan"), nullptr);
  // Malformed bytes are InputError (not a foreign exception) for every target.
  for (const auto& t : fsdpsim::fuzz::targets()) {
    if (std::string(t.name) == "cluster") continue;   // "" is a (bad) cluster name: InputError too, checked below
    EXPECT_THROW(t.run("{\"a\": [1, 2"), fsdpsim::InputError) << t.name;
  }
  EXPECT_THROW(fsdpsim::fuzz::find_target("cluster")->run(""), fsdpsim::InputError);
}

}  // namespace

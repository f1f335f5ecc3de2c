// Fuzz targets of the input boundary (issue 9): each feeds raw bytes to one reader's in-memory entry
// point, the way the CLI would after reading the file, and then uses what was accepted the way the
// tool does next (derived quantities, a round trip, cost queries). InputError is the expected outcome
// for bad bytes; any other exception, a crash, a sanitizer report or a hang is a finding.
// The same functions back two drivers: the libFuzzer programs (libfuzzer_main.cpp, CMake option
// FSDPSIM_FUZZ, clang) and the corpus replay that the normal test suite runs (test_fuzz_corpus.cpp).
#pragma once
#include <string>
#include <vector>

namespace fsdpsim::fuzz {

struct Target {
  const char* name;       // also the corpus folder: tests/fuzz/corpus/<name>/
  const char* what;       // the entry point it exercises
  void (*run)(const std::string& data);
};

// hf_config, plan, profile, cluster, user_yaml, user_toml, user_lightning.
const std::vector<Target>& targets();
const Target* find_target(const std::string& name);

}  // namespace fsdpsim::fuzz

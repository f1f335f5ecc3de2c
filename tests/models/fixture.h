// Paths of the test fixtures (tests/models/fixtures/).
#pragma once
#include <string>

inline std::string fixture(const std::string& name) {
  return std::string(FSDPSIM_SOURCE_DIR) + "/tests/models/fixtures/" + name;
}

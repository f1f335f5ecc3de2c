// Running the fsdpsim program from the planner's end-to-end tests: paths, output capture, exit code.
#pragma once
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace fsdpsim::test_cli {

inline std::string bin() { return std::string(FSDPSIM_BINARY_DIR) + "/fsdpsim"; }
inline std::string tmp(const std::string& n) { return std::string(FSDPSIM_BINARY_DIR) + "/planner_cli_" + n; }
inline std::string fixture(const std::string& f) { return std::string(FSDPSIM_SOURCE_DIR) + "/tests/planner/fixtures/" + f; }
inline std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
// Runs `fsdpsim ARGS`, stdout and stderr to `out`; the exit code (-1 when killed).
inline int run(const std::string& args, const std::string& out) {
  int rc = std::system((bin() + " " + args + " > " + out + " 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace fsdpsim::test_cli

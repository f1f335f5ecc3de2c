// The CUDA calibration program is built when nvcc is present; on a machine without a GPU (or
// driver) it must exit non-zero with a clear message rather than crash or hang.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <array>
#include <cstdio>

#include "calibrate/launcher.h"
#include "common/errors.h"

using namespace fsdpsim::calibrate;

TEST(CudaCalibration, WithoutAGpuExitsNonZeroWithAClearMessage) {
  LaunchRequest r;
  r.backend = "cuda";
  r.ranks = 1;
  r.exe_dir = FSDPSIM_BINARY_DIR;
  struct stat st {};
  std::string exe = std::string(FSDPSIM_BINARY_DIR) + "/fsdpsim-calibrate-cuda";
  if (stat(exe.c_str(), &st) != 0) {
    // Built without CUDA: `fsdpsim calibrate --backend cuda` says so (InputError -> exit 2).
    EXPECT_THROW(calibration_command(r), fsdpsim::InputError);
    GTEST_SKIP() << "fsdpsim-calibrate-cuda not built (FSDPSIM_CUDA=OFF)";
  }
  r.args = {"--quick", "--out", std::string(FSDPSIM_BINARY_DIR) + "/never-cuda-profile.json"};
  auto cmd = calibration_command(r);
  ASSERT_EQ(cmd.front(), exe);   // one process drives all local GPUs: no mpirun for one rank
  std::string line;
  for (const auto& c : cmd) line += c + " ";
  FILE* p = popen((line + "2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  std::array<char, 512> buf{};
  while (fgets(buf.data(), buf.size(), p)) out += buf.data();
  int status = pclose(p);
  if (out.find("wrote") != std::string::npos) GTEST_SKIP() << "this machine has a GPU: the calibration ran";
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("no CUDA device available"), std::string::npos) << out;
  EXPECT_NE(out.find("--backend cpu"), std::string::npos) << out;
  EXPECT_NE(run_command(cmd), 0);
}

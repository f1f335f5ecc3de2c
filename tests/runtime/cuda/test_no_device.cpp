// fsdpsim-run-cuda without a usable GPU: a clean refusal (exit 1, a message that says so), never a
// crash; bad input is still exit 2 (checked before any GPU is touched). Skipped where a device works.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "runtime/cuda/cuda_check.h"

namespace {

struct Ran {
  int rc = -1;
  std::string out;
};
Ran run(const std::string& args) {
  const std::string cmd = std::string(FSDPSIM_BINARY_DIR) + "/fsdpsim-run-cuda " + args + " 2>&1";
  Ran r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(CudaWorkerNoDevice, RefusesCleanlyAndSaysWhy) {
  if (fsdpsim::runtime::cuda::no_device_reason().empty()) GTEST_SKIP() << "a CUDA device is usable here";
  const Ran r = run("--model tiny-llama --plan '{\"seq_len\": 64}' --steps 1 --out /tmp/fsdpsim-no-device.json");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("no CUDA device/driver usable"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0"), std::string::npos) << r.out;
}

TEST(CudaWorkerNoDevice, BadInputIsExit2BeforeTheDeviceCheck) {
  const Ran r = run("--model tiny-llama --plan '{\"param_dtype\": \"fp32\", \"seq_len\": 64}' --out /tmp/x.json");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("plan.param_dtype"), std::string::npos) << r.out;
}

// --pad-cluster/--pad-profile are checked before the device check, naming the option.
TEST(CudaWorkerNoDevice, BadPaddingOptionsAreExit2) {
  const std::string base = "--model tiny-llama --plan '{\"seq_len\": 64}' --steps 1 --out /tmp/fsdpsim-pad.json ";
  struct Case {
    std::string args, expect;
  };
  for (const Case& c : {Case{"--pad-cluster 8xH100-SXM", "only with --emulate-world"},
                        Case{"--emulate-world 8 --pad-cluster 4xH100-SXM", "a cluster of 8 GPUs"},
                        Case{"--emulate-world 8 --pad-cluster no-such-cluster", "--pad-cluster"},
                        Case{"--emulate-world 8 --pad-profile /tmp/none.json", "only with --pad-cluster"},
                        Case{"--emulate-world 8 --pad-cluster 8xH100-SXM --pad-profile /nonexistent/p.json", "--pad-profile"}}) {
    const Ran r = run(base + c.args);
    EXPECT_EQ(r.rc, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << "\n" << r.out;
  }
}

TEST(CudaWorkerNoDevice, HelpNeedsNoDevice) {
  const Ran r = run("--help");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("CUDA + NCCL"), std::string::npos) << r.out;
}

}  // namespace

// Rank faults in the CPU + MPI runtime (issue 9), each injected with FSDPSIM_FAULT into one rank of
// `mpirun -np 2 fsdpsim-run-cpu` on a tiny Llama: a rank that throws, exits, aborts, hangs or runs
// out of device memory must end the whole job within a bound, non-zero, with a message naming the
// failed rank (or, for a hang, the collective and group that timed out on the other rank). Every run
// is under a watchdog: a hang fails the test instead of blocking the suite.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

namespace {

constexpr double kBoundS = 60;       // every faulty run must end within this
constexpr double kWatchdogS = 150;   // past this the run is killed and the test fails

std::string dir() { return FSDPSIM_BINARY_DIR; }

std::string tiny() {
  const std::string path = dir() + "/test_runtime_faults_tiny.json";
  std::ofstream(path) << R"({"model_type": "llama", "_name_or_path": "test-tiny-llama", "hidden_size": 64,
    "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 96, "max_position_embeddings": 64, "tie_word_embeddings": false})";
  return path;
}

struct Outcome {
  int exit_code = -1;      // the shell's status: mpirun's exit code, or 128 + signal
  bool timed_out = false;  // the watchdog had to kill it
  double seconds = 0;
  std::string log;         // stdout + stderr of mpirun and the ranks
};

// Runs `sh -c cmd` in its own process group; kills the group past kWatchdogS.
Outcome run_with_watchdog(const std::string& cmd, const std::string& tag) {
  const std::string log_path = dir() + "/test_runtime_faults_" + tag + ".log";
  Outcome o;
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const std::string full = "exec > '" + log_path + "' 2>&1; " + cmd;
    execl("/bin/sh", "sh", "-c", full.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  EXPECT_GT(pid, 0) << "fork failed";
  setpgid(pid, pid);
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (elapsed > kWatchdogS && !o.timed_out) {
      o.timed_out = true;
      kill(-pid, SIGTERM);   // mpirun forwards it to its ranks
      std::this_thread::sleep_for(std::chrono::seconds(5));
      kill(-pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(log_path);
  std::stringstream ss;
  ss << in.rdbuf();
  o.log = ss.str();
  return o;
}

// Two ranks, FULL_SHARD over both (shard group = world), two steps.
Outcome run_faulty(const std::string& env, const std::string& tag) {
  const std::string plan = R"('{"param_dtype": "fp32", "reduce_dtype": "fp32", "seq_len": 16, "micro_batch": 2}')";
  const std::string cmd = env + " mpirun --allow-run-as-root --oversubscribe -np 2 " + dir() + "/fsdpsim-run-cpu --model " +
                          tiny() + " --plan " + plan + " --steps 2 --out " + dir() + "/test_runtime_faults_" + tag + ".json";
  return run_with_watchdog(cmd, tag);
}

#define EXPECT_BOUNDED_FAILURE(o)                                                             \
  do {                                                                                        \
    EXPECT_FALSE((o).timed_out) << "the run hung (killed by the watchdog)\n" << (o).log;     \
    EXPECT_LT((o).seconds, kBoundS) << (o).log;                                               \
    EXPECT_NE((o).exit_code, 0) << (o).log;                                                   \
  } while (0)

bool has(const Outcome& o, const std::string& pattern) { return std::regex_search(o.log, std::regex(pattern)); }

}  // namespace

TEST(RankFaults, NoFaultRunsToTheEnd) {
  const Outcome o = run_faulty("", "none");
  EXPECT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 0) << o.log;
}

TEST(RankFaults, ThrowingRankAbortsEveryRank) {
  const Outcome o = run_faulty("FSDPSIM_FAULT=rank=1,op=5,kind=throw", "throw");
  EXPECT_BOUNDED_FAILURE(o);
  EXPECT_TRUE(has(o, R"(rank 1 of 2 \(host [^,]+, pid [0-9]+\): injected fault \(FSDPSIM_FAULT kind=throw\) at communicator call #5)")) << o.log;
  EXPECT_TRUE(has(o, "rank 1 of 2 .*aborting all ranks \\(MPI_Abort\\)")) << o.log;
}

TEST(RankFaults, ThrowOnTheMainThreadOfRankZero) {
  // call #0 is the first step's barrier, issued by the worker's main thread, not a stream thread
  const Outcome o = run_faulty("FSDPSIM_FAULT=rank=0,op=0,kind=throw", "throw0");
  EXPECT_BOUNDED_FAILURE(o);
  EXPECT_TRUE(has(o, "rank 0 of 2 .*injected fault .* call #0 \\(barrier\\)")) << o.log;
}

TEST(RankFaults, ExitingRankEndsTheJobAndIsNamed) {
  const Outcome o = run_faulty("FSDPSIM_FAULT=rank=1,op=7,kind=exit,code=17", "exit");
  EXPECT_BOUNDED_FAILURE(o);
  // mpirun names the process that died: [[jobid,1],1] is world rank 1; its status is ours
  EXPECT_TRUE(has(o, R"(Process name: \[\[[0-9]+,[0-9]+\],1\])")) << o.log;
  EXPECT_TRUE(has(o, "Exit code: +17")) << o.log;
}

TEST(RankFaults, CrashingRankEndsTheJobAndIsNamed) {
  const Outcome o = run_faulty("FSDPSIM_FAULT=rank=1,op=9,kind=abort", "abort");
  EXPECT_BOUNDED_FAILURE(o);
  EXPECT_TRUE(has(o, "process rank 1 .*exited on signal 6")) << o.log;
}

TEST(RankFaults, HangingRankMakesTheOtherTimeOut) {
  const Outcome o = run_faulty("FSDPSIM_COLLECTIVE_TIMEOUT_S=5 FSDPSIM_FAULT=rank=1,op=5,kind=hang", "hang");
  EXPECT_BOUNDED_FAILURE(o);
  // rank 0 reports which collective, on which group, timed out, then aborts the job
  EXPECT_TRUE(has(o, R"(rank 0 of 2 \(host [^)]+\): collective [a-z_]+ #[0-9]+ on the shard group \(world ranks 0, 1\) did not complete within 5 s)"))
      << o.log;
  EXPECT_TRUE(has(o, "rank 0 of 2 .*aborting all ranks")) << o.log;
}

TEST(RankFaults, OutOfDeviceMemoryReportsSizeAllocatorAndPrediction) {
  const Outcome o = run_faulty("FSDPSIM_FAULT=rank=1,kind=oom,bytes=3000000", "oom");
  EXPECT_BOUNDED_FAILURE(o);
  EXPECT_TRUE(has(o, R"(rank 1 of 2 .*out of device memory: buffer "[^"]+" \([0-9]+ B)")) << o.log;
  EXPECT_TRUE(has(o, "beyond the 3000000 B of device memory")) << o.log;
  EXPECT_TRUE(has(o, "allocator before it: allocated [0-9]+ B, reserved [0-9]+ B in [0-9]+ segments")) << o.log;
  EXPECT_TRUE(has(o, "the simulator predicts for this program: peak allocated [0-9]+ B, peak reserved [0-9]+ B")) << o.log;
}

TEST(RankFaults, MalformedFaultOrTimeoutIsBadInput) {
  Outcome o = run_faulty("FSDPSIM_FAULT=rank=1,kind=melt", "bad_fault");
  EXPECT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 2) << o.log;
  EXPECT_TRUE(has(o, "FSDPSIM_FAULT = \"rank=1,kind=melt\": kind \"melt\" is unknown")) << o.log;
  o = run_faulty("FSDPSIM_COLLECTIVE_TIMEOUT_S=-1", "bad_timeout");
  EXPECT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 2) << o.log;
  EXPECT_TRUE(has(o, "FSDPSIM_COLLECTIVE_TIMEOUT_S = \"-1\"")) << o.log;
}

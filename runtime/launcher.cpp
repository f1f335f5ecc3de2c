#include "runtime/launcher.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "common/errors.h"
#include "common/json_reader.h"
#include "runtime/measured_result.h"

extern char** environ;

namespace fsdpsim::runtime {

std::vector<OptionSpec> launch_option_specs() {
  return {
      {"model", true, false, "zoo name or Hugging Face config.json", "M"},
      {"plan", true, false, "plan JSON file or inline object; cpu backend: fp32 dtypes, cuda: param_dtype bf16", "P"},
      {"backend", true, false, "cpu (OpenBLAS + MPI, fp32; default) or cuda (CUDA + NCCL, bf16, one GPU per rank)", "B"},
      {"ranks", true, false, "MPI ranks (processes); 1 runs without mpirun (default 1)", "N"},
      {"emulate-world", true, false,
       "cuda, 1 rank: run as rank 0 of W ranks on one GPU (true shard sizes; collectives replaced by local copies)", "W"},
      {"pad-collectives", false, false,
       "with --emulate-world: each collective's stand-in also takes its predicted duration (the cluster's profile) "
       "on its stream, so communication overlaps compute as on the real fabric"},
      {"steps", true, false, "optimizer steps; the median one after the first is measured (default 3)", "K"},
      {"gpus-per-node", true, false, "ranks per node for the mesh's group shapes (default: all on one node)", "G"},
      {"seed", true, false, "seed of the parameter init and the synthetic data (default 1234)", "S"},
      {"lr", true, false, "AdamW/SGD learning rate (default 1e-3)", "LR"},
  };
}

LaunchOptions launch_options_from_args(const Args& a) {
  LaunchOptions o;
  o.model = a.require("model");
  o.plan = a.require("plan");
  o.backend = a.get("backend", "cpu");
  if (o.backend != "cpu" && o.backend != "cuda") throw InputError("--backend", o.backend, "cpu or cuda");
  o.ranks = static_cast<int>(a.get_int("ranks", 1, 1, 1024));
  o.steps = static_cast<int>(a.get_int("steps", 3, 1, 100000));
  o.emulate_world = static_cast<int>(a.get_int("emulate-world", 0, 1, 1 << 20));
  if (o.emulate_world > 0 && o.backend != "cuda")
    throw InputError("--emulate-world", std::to_string(o.emulate_world), "only with --backend cuda");
  if (o.emulate_world > 0 && o.ranks != 1)
    throw InputError("--emulate-world", std::to_string(o.emulate_world), "only with --ranks 1 (one process emulates rank 0)");
  if (a.has("pad-collectives")) {
    if (o.emulate_world <= 0) throw InputError("--pad-collectives", "(set)", "only with --emulate-world");
    o.pad_cluster = std::to_string(o.emulate_world) + "xH100-SXM";   // `validate` passes its --cluster/--profile
  }
  o.gpus_per_node = static_cast<int>(a.get_int("gpus-per-node", 0, 0, 1024));
  o.seed = static_cast<std::uint64_t>(a.get_int("seed", 1234, 0, INT64_MAX));
  o.lr = a.get_double("lr", 1e-3, 1e-8, 1.0);
  return o;
}

std::string worker_path(const std::string& backend) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string self = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("./fsdpsim");
  const auto slash = self.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : self.substr(0, slash);
  return dir + (backend == "cuda" ? "/fsdpsim-run-cuda" : "/fsdpsim-run-cpu");
}

std::vector<std::string> launch_command(const LaunchOptions& o, const std::string& worker, const std::string& out) {
  std::vector<std::string> c;
  if (o.ranks > 1) c = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(o.ranks)};
  c.insert(c.end(), {worker, "--model", o.model, "--plan", o.plan, "--steps", std::to_string(o.steps), "--seed",
                     std::to_string(o.seed), "--lr", std::to_string(o.lr), "--out", out});
  if (o.gpus_per_node > 0) c.insert(c.end(), {"--gpus-per-node", std::to_string(o.gpus_per_node)});
  if (o.emulate_world > 0) c.insert(c.end(), {"--emulate-world", std::to_string(o.emulate_world)});
  if (!o.pad_cluster.empty()) c.insert(c.end(), {"--pad-cluster", o.pad_cluster});
  if (!o.pad_profile.empty()) c.insert(c.end(), {"--pad-profile", o.pad_profile});
  return c;
}

LaunchResult launch_run(const LaunchOptions& o) {
  const bool cuda = o.backend == "cuda";
  const std::string worker = worker_path(o.backend);
  const std::string what = cuda ? "CUDA runtime" : "CPU runtime";
  if (access(worker.c_str(), X_OK) != 0)
    throw std::runtime_error("the " + what + " worker " + worker + " is not built: build the target " +
                             (cuda ? std::string("fsdpsim-run-cuda") : std::string("fsdpsim-run-cpu")) +
                             " (./fsdpsim.sh " + (cuda ? "run --backend cuda" : "run") + " builds it; CMake configures it when " +
                             (cuda ? std::string("nvcc, NCCL, OpenMPI and OpenBLAS are found") : std::string("OpenMPI and OpenBLAS are found")) + ")");
  char tmpl[] = "/tmp/fsdpsim-run-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) throw std::runtime_error("cannot create a temporary file in /tmp");
  close(fd);
  const std::string out = tmpl;
  LaunchResult r;
  r.command = launch_command(o, worker, out);
  std::vector<char*> argv;
  for (auto& s : r.command) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    std::remove(out.c_str());
    throw std::runtime_error(std::string("cannot start ") + argv[0] + (o.ranks > 1 ? " (is OpenMPI installed?)" : ""));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  if (WIFSIGNALED(status)) {
    std::remove(out.c_str());
    throw std::runtime_error("the " + what + " was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                             strsignal(WTERMSIG(status)) + ")");
  }
  if (rc != 0) {
    std::remove(out.c_str());
    if (rc == kExitBadInput)
      throw InputError("--plan", o.plan, "a plan and model the " + what + " executes (the worker's message is above)");
    throw std::runtime_error("the " + what + " failed (exit " + std::to_string(rc) + "; the worker's message is above)");
  }
  r.worker = read_json_file(out, "worker output");
  std::remove(out.c_str());
  r.measured = sim_result_from_json(r.worker.at("measured"), "worker output.measured");
  return r;
}

}  // namespace fsdpsim::runtime

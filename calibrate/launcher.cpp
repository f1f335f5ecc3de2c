#include "calibrate/launcher.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "common/errors.h"

namespace fsdpsim::calibrate {

std::string self_executable_dir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

bool running_under_mpi() { return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE"); }

std::vector<std::string> calibration_command(const LaunchRequest& r) {
  if (r.backend != "cpu" && r.backend != "cuda")
    throw InputError("--backend", "\"" + r.backend + "\"", "expected cpu or cuda");
  std::string exe = r.exe_dir + "/fsdpsim-calibrate-" + r.backend;
  struct stat st {};
  if (stat(exe.c_str(), &st) != 0 || !(st.st_mode & S_IXUSR))
    throw InputError("--backend", r.backend,
                     r.backend == "cuda"
                         ? "this fsdpsim was built without CUDA (FSDPSIM_CUDA=OFF or no nvcc): " + exe + " does not exist"
                         : "this fsdpsim was built without MPI (FSDPSIM_MPI=OFF): " + exe + " does not exist");
  std::vector<std::string> argv;
  bool need_mpirun = r.backend == "cpu" ? !running_under_mpi() : (r.ranks > 1 && !running_under_mpi());
  if (need_mpirun) argv = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(r.ranks)};
  argv.push_back(exe);
  argv.insert(argv.end(), r.args.begin(), r.args.end());
  return argv;
}

int run_command(const std::vector<std::string>& argv) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    execvp(cargv[0], cargv.data());
    // Only reached when exec failed (e.g. mpirun not installed).
    std::fprintf(stderr, "fsdpsim: cannot run %s: %s\n", cargv[0], std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error(std::string("waitpid failed: ") + std::strerror(errno));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace fsdpsim::calibrate

#include "common/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>

#include "common/errors.h"

namespace fsdpsim {

namespace fs = std::filesystem;

namespace {
std::atomic<bool> g_interrupted{false};
std::atomic<bool> g_cooperative{true};
extern "C" void on_sigint(int sig) {
  if (g_cooperative.load() && !g_interrupted.exchange(true)) return;   // the loops stop at their next poll
  static const char msg[] = "fsdpsim: interrupted\n";
  const ssize_t n = ::write(2, msg, sizeof msg - 1);
  (void)n;
  _exit(128 + sig);
}
}  // namespace

bool interrupted() { return g_interrupted.load(); }

void install_interrupt_handler(bool cooperative) {
  g_cooperative.store(cooperative);
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

void ensure_directory(const std::string& dir, const std::string& field) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) throw InputError(field, "\"" + dir + "\"", "exists and is not a directory");
    return;
  }
  fs::create_directories(dir, ec);
  if (ec) throw InputError(field, "\"" + dir + "\"", "cannot create directory: " + ec.message());
}

void write_file_atomic(const std::string& path, const std::string& content, const std::string& field) {
  fs::path target(path);
  fs::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InputError(field, "\"" + path + "\"", "directory " + dir.string() + " does not exist");
  std::string tmpl = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  int fd = mkstemp(tmpl.data());
  if (fd < 0) throw InputError(field, "\"" + path + "\"", std::string("cannot write: ") + std::strerror(errno));
  size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      ::unlink(tmpl.c_str());
      throw InputError(field, "\"" + path + "\"", std::string("write failed: ") + std::strerror(e));
    }
    off += static_cast<size_t>(n);
  }
  ::fchmod(fd, 0644);
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmpl.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmpl.c_str());
    throw InputError(field, "\"" + path + "\"", std::string("rename failed: ") + std::strerror(e));
  }
}

}  // namespace fsdpsim

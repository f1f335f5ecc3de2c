#include "common/check.h"

#include <unistd.h>

#include <atomic>
#include <stdexcept>

namespace fsdpsim {

namespace {
std::atomic<int> g_rank{-1};
}

void set_check_rank(int rank) { g_rank = rank; }
int check_rank() { return g_rank.load(); }

std::string check_where() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '?';
  return std::string("host ") + host + ", rank " + std::to_string(g_rank.load());
}

void check_failed(const char* call, const char* file, int line, const std::string& what) {
  throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + " on " +
                           check_where() + ": " + what);
}

}  // namespace fsdpsim

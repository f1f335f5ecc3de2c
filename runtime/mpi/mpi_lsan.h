// LeakSanitizer and OpenMPI (scripts/sanitize.sh): OpenMPI allocates process-lifetime state in
// MPI_Init / communicator creation / MPI_Finalize that it never frees, much of it from MCA plugins
// it dlclose()s again, so the leak reports cannot even be symbolized (and suppressed by library name).
// ScopedLeakCheckOff wraps exactly those MPI calls: allocations made by this thread inside the scope
// are not leak-checked, and everything else in the process (our code included) still is.
// A no-op without AddressSanitizer/LeakSanitizer.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define FSDPSIM_HAVE_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)
#define FSDPSIM_HAVE_LSAN 1
#endif
#endif

#ifdef FSDPSIM_HAVE_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace fsdpsim::runtime {

struct ScopedLeakCheckOff {
#ifdef FSDPSIM_HAVE_LSAN
  ScopedLeakCheckOff() { __lsan_disable(); }
  ~ScopedLeakCheckOff() { __lsan_enable(); }
#else
  ScopedLeakCheckOff() {}
#endif
  ScopedLeakCheckOff(const ScopedLeakCheckOff&) = delete;
  ScopedLeakCheckOff& operator=(const ScopedLeakCheckOff&) = delete;
};

}  // namespace fsdpsim::runtime

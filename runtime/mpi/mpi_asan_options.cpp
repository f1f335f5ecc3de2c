// AddressSanitizer defaults for the MPI programs (fsdpsim-run-cpu, fsdpsim-calibrate-cpu) in the
// sanitizer build (scripts/sanitize.sh); compiled to nothing otherwise. OpenMPI's progress threads
// allocate from plugins built without frame pointers, so the fast unwinder records one frame and
// LeakSanitizer can neither name nor suppress them: the slow unwinder gives the full stacks, through
// libmpi / libopen-pal / libevent, that tests/sanitizers/lsan.supp suppresses. Only these processes
// pay for it; ASAN_OPTIONS from the environment still overrides.
#include "runtime/mpi/mpi_lsan.h"

#ifdef FSDPSIM_HAVE_LSAN
extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }
#endif

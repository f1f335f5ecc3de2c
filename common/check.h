// One way to check every CUDA, cuBLAS, NCCL and MPI call (style.md lesson 7; issue 22 stage 6): a failure
// throws std::runtime_error "CALL failed at FILE:LINE on host H, rank R: WHAT", which main() reports
// before it aborts the job. The rank is what set_check_rank() was told (-1 until the process knows it);
// the host is gethostname()'s. The macros are in common/check_cuda.h and common/check_mpi.h (they need
// those libraries' headers); this file needs neither.
#pragma once
#include <string>

namespace fsdpsim {

void set_check_rank(int rank);
int check_rank();
std::string check_where();   // "host H, rank R"
[[noreturn]] void check_failed(const char* call, const char* file, int line, const std::string& what);

}  // namespace fsdpsim

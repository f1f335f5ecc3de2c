// Every MPI call is checked (style.md lesson 7): a failure becomes an exception naming the call,
// file:line, the host and the rank; main() reports it and aborts the job.
#pragma once
#include <mpi.h>

#include <stdexcept>
#include <string>

namespace fsdpsim::calibrate::cpu {

std::string mpi_where();   // "host:rank N"

#define FSDPSIM_MPI_CHECK(call)                                                                              \
  do {                                                                                                       \
    int fsdpsim_rc_ = (call);                                                                                \
    if (fsdpsim_rc_ != MPI_SUCCESS) {                                                                        \
      char fsdpsim_msg_[MPI_MAX_ERROR_STRING];                                                               \
      int fsdpsim_len_ = 0;                                                                                  \
      MPI_Error_string(fsdpsim_rc_, fsdpsim_msg_, &fsdpsim_len_);                                            \
      throw std::runtime_error(std::string(#call) + " failed at " + __FILE__ + ":" + std::to_string(__LINE__) + \
                               " on " + ::fsdpsim::calibrate::cpu::mpi_where() + ": " +                     \
                               std::string(fsdpsim_msg_, static_cast<size_t>(fsdpsim_len_)));               \
    }                                                                                                        \
  } while (0)

}  // namespace fsdpsim::calibrate::cpu

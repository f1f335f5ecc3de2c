// MPI call checks (common/check.h): the message is MPI_Error_string's.
#pragma once
#include <mpi.h>

#include <string>

#include "common/check.h"

#define FSDPSIM_MPI_CHECK(call)                                                                        \
  do {                                                                                                 \
    const int fsdpsim_rc_ = (call);                                                                    \
    if (fsdpsim_rc_ != MPI_SUCCESS) {                                                                  \
      char fsdpsim_msg_[MPI_MAX_ERROR_STRING];                                                         \
      int fsdpsim_len_ = 0;                                                                            \
      MPI_Error_string(fsdpsim_rc_, fsdpsim_msg_, &fsdpsim_len_);                                      \
      ::fsdpsim::check_failed(#call, __FILE__, __LINE__,                                               \
                              std::string(fsdpsim_msg_, static_cast<std::size_t>(fsdpsim_len_)));      \
    }                                                                                                  \
  } while (0)

// Every MPI call is checked with common/check_mpi.h's FSDPSIM_MPI_CHECK: a failure becomes an exception
// naming the call, file:line, the host and the rank; main() reports it and aborts the job.
#pragma once
#include "common/check_mpi.h"

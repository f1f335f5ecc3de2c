// Before `fsdpsim run|validate --backend cpu` starts its ranks: do they fit in this host's memory?
// The CPU runtime places every buffer with the simulator's allocator model (README "How accurate
// is it": peak allocated and reserved match to 0.00%), so the simulated peak per rank on the CPU
// profile is what each rank will hold; the ranks together must fit in MemAvailable
// (/proc/meminfo). A run that would not fit ends before it starts with exit 3 and a message naming
// host memory, instead of an out-of-memory kill mid-run.
#pragma once
#include "models/model_spec.h"
#include "runtime/launcher.h"

namespace fsdpsim::cli {

// Throws DoesNotFitError when the ranks' predicted peak exceeds the host's available memory; does
// nothing for the CUDA backend or when /proc/meminfo cannot be read.
void check_host_memory(const runtime::LaunchOptions& o, const models::ModelSpec& model);

}  // namespace fsdpsim::cli

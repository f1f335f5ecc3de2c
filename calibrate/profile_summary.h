// `fsdpsim profile show FILE|NAME`: loads a profile by built-in cluster/GPU name or file, and
// renders a human summary (GPU, peak flops, memory, the collective table's busbw at a few sizes per
// group size, efficiencies and every source).
#pragma once
#include <string>

#include "calibrate/hardware_profile.h"

namespace fsdpsim::calibrate {

// NAME: a cluster name ("8xH100-SXM", "2x8xA100-80GB-IB-HDR200"), a built-in GPU name ("H100-SXM"
// means one node of 8), or a profile JSON file (its "cluster" section, if any, gives the shape).
HardwareProfile load_profile_for_show(const std::string& name_or_path, const std::string& field);
std::string profile_summary(const HardwareProfile& p);

}  // namespace fsdpsim::calibrate

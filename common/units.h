// Units used everywhere (design.md "Units and numbers"): time in integer nanoseconds,
// sizes in 64-bit bytes, bandwidths in bytes per second.
#pragma once
#include <cstdint>

namespace fsdpsim {

using TimeNs = std::int64_t;   // simulated or measured time, nanoseconds
using Bytes = std::int64_t;    // a size in bytes (signed so differences are safe)
using Flops = double;          // floating-point operation counts (can exceed 2^63 for big steps)

inline constexpr Bytes kKiB = 1024;
inline constexpr Bytes kMiB = 1024 * kKiB;
inline constexpr Bytes kGiB = 1024 * kMiB;   // reports say GiB (2^30), never GB

inline constexpr TimeNs kNsPerUs = 1000;
inline constexpr TimeNs kNsPerMs = 1000 * kNsPerUs;
inline constexpr TimeNs kNsPerS = 1000 * kNsPerMs;

inline double to_gib(Bytes b) { return static_cast<double>(b) / static_cast<double>(kGiB); }
inline double to_seconds(TimeNs t) { return static_cast<double>(t) * 1e-9; }

}  // namespace fsdpsim

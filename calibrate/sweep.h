// What the calibration harnesses (CPU + MPI, CUDA + NCCL) share, as nccl-tests does: the message
// sizes, the result of one timed size, the bandwidth factors, the console table and the
// conversion of a finished sweep into the profile's "measured" JSON (profiles/README.md).
// Plain C++ (no MPI, no CUDA) so both executables and the tests link it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/hardware_profile.h"
#include "common/units.h"

namespace fsdpsim::calibrate {

struct SweepOptions {
  Bytes min_bytes = 4 * kKiB;
  Bytes max_bytes = kGiB;
  double step_factor = 2.0;   // nccl-tests -f 2
  int warmup_iters = 5;       // nccl-tests -w default
  int iters = 20;             // nccl-tests -n default
  Bytes iter_budget_bytes = 0; // > 0: fewer timed iterations for large sizes (iters * S <= budget, at least 2)
};

// min_bytes, min*f, ... up to max_bytes (inclusive when hit), each rounded down to a multiple of `align`.
std::vector<Bytes> sweep_sizes(const SweepOptions& o, Bytes align);
int timed_iters_for(const SweepOptions& o, Bytes bytes);

struct SweepPoint {
  Bytes bytes = 0;        // S as nccl-tests counts it (the full gathered / reduced buffer)
  double time_ns = 0;     // per-iteration time, the maximum over ranks of each rank's average
  bool check_ok = false;  // the result of a separate, initialized run was verified
  double algbw_GBps() const { return time_ns > 0 ? static_cast<double>(bytes) / time_ns : 0; }  // bytes/ns = GB/s
};

struct SweepResult {
  CollectiveOp op = CollectiveOp::AllGather;
  int group_size = 2;
  int nodes = 1;
  std::string dtype = "fp32";
  std::string source;     // e.g. "measured by fsdpsim-calibrate-cpu (MPI_Allgather, in place) on host X"
  std::vector<SweepPoint> points;
};

// One line per size in nccl-tests' columns: size, count, type, time(us), algbw, busbw, #wrong.
std::string format_sweep_header(const SweepResult& r);
std::string format_sweep_row(const SweepResult& r, const SweepPoint& p);

// {"op", "group_size", "nodes", "dtype", "source", "points": [[bytes, time_ns, algbw_GBps, busbw_GBps], ...]}
nlohmann::json sweep_to_json(const SweepResult& r);

// A complete calibrated profile document: the schema, the context block, the GPU section, the
// fabrics (if given) and the measured collectives and GEMMs; HardwareProfile::from_file reads it.
struct MeasuredGemm {
  std::int64_t m = 0, n = 0, k = 0;
  std::string dtype = "fp32";
  double time_ns = 0;
};
// An intra-node fabric section (profiles/README.md "fabric") fitted on the measured sweeps of the
// largest single-node group: peak busbw per op = the best measured, base latency = the smallest
// measured time, and the size ramp busbw(S) = peak / (1 + (S_half/S)^gamma) fitted by least squares
// in log busbw (the procedure used for the built-in NVLink ramps). The profile's model for group
// sizes or ops that were not measured.
nlohmann::json measured_intra_fabric(const std::vector<SweepResult>& sweeps, const std::string& name,
                                     const std::string& link_class, const std::string& where);

nlohmann::json make_profile_document(const std::string& name, const nlohmann::json& context, const nlohmann::json& gpu,
                                     const std::vector<SweepResult>& sweeps, const std::vector<MeasuredGemm>& gemms,
                                     const std::string& gemm_source);

}  // namespace fsdpsim::calibrate

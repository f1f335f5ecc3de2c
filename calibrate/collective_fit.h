// A measured collective sweep turned into a cost function (profiles/README.md "Fitting"):
// - at a measured size: the measured time, exactly;
// - between two measured sizes: log-log interpolation (a power law through both points, which is
//   linear in log size and exact for a pure bandwidth term t ~ S);
// - above the largest size: latency + bytes/bandwidth, continuing from the last point with the slope
//   (seconds per byte) fitted by least squares on the top points;
// - below the smallest size: the smallest size's time (small messages are latency-bound).
// Outside the measured range the result is flagged extrapolated. Times are made non-decreasing in
// size first (a running maximum): a larger message never takes less time; measurement noise that
// says otherwise is dropped.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "common/units.h"

namespace fsdpsim::calibrate {

class CollectiveFit {
 public:
  CollectiveFit() = default;
  // points: (bytes, time_ns), bytes > 0 and distinct; at least one point. InputError(field, ...) otherwise.
  CollectiveFit(std::vector<std::pair<Bytes, double>> points, const std::string& field);

  TimeNs time(Bytes bytes) const;
  bool extrapolated(Bytes bytes) const { return bytes < min_bytes() || bytes > max_bytes(); }
  Bytes min_bytes() const { return sizes_.front(); }
  Bytes max_bytes() const { return sizes_.back(); }
  double tail_ns_per_byte() const { return beta_; }   // the alpha-beta slope beyond the largest size
  const std::vector<Bytes>& sizes() const { return sizes_; }
  const std::vector<double>& times_ns() const { return times_; }

 private:
  std::vector<Bytes> sizes_;
  std::vector<double> times_, log_s_, log_t_;
  double beta_ = 0;   // ns per byte beyond the largest point
};

}  // namespace fsdpsim::calibrate

#include "calibrate/collective_fit.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/errors.h"

namespace fsdpsim::calibrate {

CollectiveFit::CollectiveFit(std::vector<std::pair<Bytes, double>> points, const std::string& field) {
  if (points.empty()) throw InputError(field, "[]", "a measured sweep needs at least one (bytes, time_ns) point");
  std::sort(points.begin(), points.end());
  for (size_t i = 0; i < points.size(); ++i) {
    auto [s, t] = points[i];
    std::string where = field + "[" + std::to_string(i) + "]";
    if (s <= 0) throw InputError(where, std::to_string(s), "bytes must be > 0");
    if (!(t > 0) || !std::isfinite(t)) throw InputError(where, std::to_string(t), "time_ns must be a positive number");
    if (i > 0 && s == points[i - 1].first) throw InputError(where, std::to_string(s), "each size may appear once");
    double tm = times_.empty() ? t : std::max(t, times_.back());   // running maximum (see header)
    sizes_.push_back(s);
    times_.push_back(tm);
    log_s_.push_back(std::log(static_cast<double>(s)));
    log_t_.push_back(std::log(tm));
  }
  // Slope beyond the largest size: least squares t = a + beta*S on the top (up to) 3 points; a
  // single point, or a non-positive fit, falls back to the last point's average rate t/S.
  size_t n = sizes_.size(), first = n >= 3 ? n - 3 : 0;
  beta_ = times_.back() / static_cast<double>(sizes_.back());
  if (n - first >= 2) {
    double ms = 0, mt = 0, cnt = static_cast<double>(n - first);
    for (size_t i = first; i < n; ++i) ms += sizes_[i], mt += times_[i];
    ms /= cnt, mt /= cnt;
    double num = 0, den = 0;
    for (size_t i = first; i < n; ++i) {
      num += (sizes_[i] - ms) * (times_[i] - mt);
      den += (sizes_[i] - ms) * (sizes_[i] - ms);
    }
    if (den > 0 && num > 0) beta_ = num / den;
  }
}

TimeNs CollectiveFit::time(Bytes bytes) const {
  if (bytes <= sizes_.front()) return static_cast<TimeNs>(std::llround(times_.front()));
  if (bytes >= sizes_.back())
    return static_cast<TimeNs>(std::llround(times_.back() + beta_ * static_cast<double>(bytes - sizes_.back())));
  size_t hi = static_cast<size_t>(std::upper_bound(sizes_.begin(), sizes_.end(), bytes) - sizes_.begin());
  size_t lo = hi - 1;
  if (sizes_[lo] == bytes) return static_cast<TimeNs>(std::llround(times_[lo]));
  double x = (std::log(static_cast<double>(bytes)) - log_s_[lo]) / (log_s_[hi] - log_s_[lo]);
  return static_cast<TimeNs>(std::llround(std::exp(log_t_[lo] + x * (log_t_[hi] - log_t_[lo]))));
}

}  // namespace fsdpsim::calibrate

#include "reports/format.h"

#include <cmath>
#include <cstdio>

namespace fsdpsim::reports {

namespace {
constexpr const char* kNotAvailable = "n/a";
}

std::string fmt_fixed(double v, int decimals) {
  if (!std::isfinite(v)) return kNotAvailable;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  std::string s = buf;
  // "-0.00" reads as a sign error in a report: print it as zero.
  if (s[0] == '-' && s.find_first_not_of("-0.") == std::string::npos) s.erase(0, 1);
  return s;
}

std::string fmt_thousands(double v) {
  if (!std::isfinite(v)) return kNotAvailable;
  std::string digits = fmt_fixed(std::fabs(v), 0);
  std::string out;
  int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    out += digits[i];
    int left = n - 1 - i;
    if (left > 0 && left % 3 == 0) out += ',';
  }
  bool negative = v < 0 && digits.find_first_not_of('0') != std::string::npos;
  return negative ? "-" + out : out;
}

std::string fmt_gib(double bytes, int decimals) {
  if (!std::isfinite(bytes)) return kNotAvailable;
  return fmt_fixed(bytes / static_cast<double>(kGiB), decimals) + " GiB";
}

std::string fmt_seconds(double s) {
  if (!std::isfinite(s)) return kNotAvailable;
  double a = std::fabs(s);
  if (a >= 10.0) return fmt_fixed(s, 1) + " s";
  if (a >= 1.0) return fmt_fixed(s, 2) + " s";
  if (a >= 0.1) return fmt_fixed(s * 1e3, 0) + " ms";
  if (a >= 0.01) return fmt_fixed(s * 1e3, 1) + " ms";
  if (a >= 0.001 || a == 0.0) return fmt_fixed(s * 1e3, 2) + " ms";
  return fmt_fixed(s * 1e6, 1) + " us";
}

std::string fmt_ms(double s, int decimals) {
  if (!std::isfinite(s)) return kNotAvailable;
  return fmt_fixed(s * 1e3, decimals) + " ms";
}

std::string fmt_percent(double fraction, int decimals) {
  if (!std::isfinite(fraction)) return kNotAvailable;
  return fmt_fixed(fraction * 100.0, decimals) + "%";
}

std::string fmt_signed_percent(double fraction, int decimals) {
  if (!std::isfinite(fraction)) return kNotAvailable;
  std::string s = fmt_fixed(fraction * 100.0, decimals);
  if (s[0] != '-' && s.find_first_not_of("0.") != std::string::npos) s = "+" + s;
  return s + "%";
}

std::string fmt_count(double n) {
  if (!std::isfinite(n)) return kNotAvailable;
  double a = std::fabs(n);
  if (a >= 1e12) return fmt_fixed(n / 1e12, 2) + " T";
  if (a >= 1e9) return fmt_fixed(n / 1e9, 2) + " B";
  if (a >= 1e6) return fmt_fixed(n / 1e6, a >= 1e8 ? 0 : 1) + " M";
  if (a >= 1e3) return fmt_fixed(n / 1e3, 1) + " K";
  return fmt_fixed(n, 0);
}

std::string fmt_tokens_per_s(double v) {
  if (!std::isfinite(v)) return kNotAvailable;
  return fmt_thousands(v) + " tokens/s";
}

std::string fmt_bytes_auto(double bytes) {
  if (!std::isfinite(bytes)) return kNotAvailable;
  double a = std::fabs(bytes);
  if (a >= static_cast<double>(kGiB)) return fmt_gib(bytes);
  if (a >= static_cast<double>(kMiB)) return fmt_fixed(bytes / static_cast<double>(kMiB), 1) + " MiB";
  if (a >= static_cast<double>(kKiB)) return fmt_fixed(bytes / static_cast<double>(kKiB), 1) + " KiB";
  return fmt_fixed(bytes, 0) + " B";
}

std::string svg_num(double v) {
  if (!std::isfinite(v)) return "0";
  std::string s = fmt_fixed(v, 2);
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

}  // namespace fsdpsim::reports

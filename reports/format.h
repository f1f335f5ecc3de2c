// Number formatting for the report: always with a unit, deterministic (no locale: printf's "C"
// locale), and never "nan"/"inf" (a non-finite value prints as "n/a").
#pragma once
#include <string>

#include "common/units.h"

namespace fsdpsim::reports {

std::string fmt_fixed(double v, int decimals);            // "12.35"; -0 prints as "0.00"
std::string fmt_thousands(double v);                       // rounded to an integer: "12,345"
std::string fmt_gib(double bytes, int decimals = 2);       // GiB = 2^30 bytes: "12.35 GiB"
std::string fmt_seconds(double s);                          // "1.23 s", "123 ms", "12.3 ms", "1.23 ms", "45.6 us"
std::string fmt_ms(double s, int decimals = 1);            // always milliseconds: "123.4 ms"
std::string fmt_percent(double fraction, int decimals = 1); // 0.4213 -> "42.1%"
std::string fmt_signed_percent(double fraction, int decimals = 1);  // relative error: "+3.2%", "-0.5%"
std::string fmt_count(double n);                           // 8.03e9 -> "8.03 B", 124e6 -> "124 M", 950 -> "950"
std::string fmt_tokens_per_s(double v);                    // "3,456 tokens/s"
std::string fmt_bytes_auto(double bytes);                  // "512 B", "1.5 KiB", "12.0 MiB", "3.25 GiB"
// SVG coordinates: at most 2 decimals, trailing zeros dropped ("12", "12.5", "12.25").
std::string svg_num(double v);

}  // namespace fsdpsim::reports

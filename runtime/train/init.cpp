#include "runtime/train/init.h"

#include <cmath>
#include <string>

namespace fsdpsim::runtime {

std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
std::uint64_t name_hash(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;   // FNV-1a offset basis
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}
}  // namespace

ParamInitializer::ParamInitializer(std::uint64_t seed, const ParamTensor& t)
    : kind_(ends_with(t.name, "norm.weight") ? Kind::One : ends_with(t.name, ".bias") ? Kind::Zero : Kind::Uniform),
      base_(mix64(seed ^ name_hash(t.name))) {}

float ParamInitializer::operator()(std::int64_t index) const {
  if (kind_ == Kind::One) return 1.0f;
  if (kind_ == Kind::Zero) return 0.0f;
  const std::uint64_t r = mix64(base_ + static_cast<std::uint64_t>(index));
  const double u = static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);   // [0, 1), 53 bits
  const double a = kInitStd * std::sqrt(3.0);
  return static_cast<float>((2.0 * u - 1.0) * a);
}

float init_param_value(std::uint64_t seed, const ParamTensor& t, std::int64_t index) {
  return ParamInitializer(seed, t)(index);
}

}  // namespace fsdpsim::runtime

// Error types. Inputs are validated once, at the boundary, and a bad one raises InputError naming
// the field, the value and what is allowed; only main() turns errors into exit codes
// (design.md: 2 bad input, 3 plan does not fit where fitting was required, other non-zero internal).
#pragma once
#include <stdexcept>
#include <string>

namespace fsdpsim {

class InputError : public std::runtime_error {
 public:
  // field: dotted path ("plan.mesh.shard", "--model", "config.json:hidden_size");
  // value: the offending value as the user wrote it; allowed: what would have been accepted.
  InputError(std::string field, std::string value, std::string allowed)
      : std::runtime_error(field + " = " + value + ": " + allowed),
        field_(std::move(field)), value_(std::move(value)), allowed_(std::move(allowed)) {}
  const std::string& field() const { return field_; }
  const std::string& value() const { return value_; }
  const std::string& allowed() const { return allowed_; }

 private:
  std::string field_, value_, allowed_;
};

// A plan that does not fit in GPU memory where the command required it to fit (exit 3).
class DoesNotFitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitDoesNotFit = 3;

}  // namespace fsdpsim

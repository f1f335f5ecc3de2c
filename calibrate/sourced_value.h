// Profile numbers are written as {"value": X, "source": "where X comes from"} (profiles/README.md):
// a number without a source is rejected when a profile is loaded, exactly as the built-in profile
// test rejects one in the embedded files.
#pragma once
#include <string>

#include "common/json_reader.h"

namespace fsdpsim::calibrate {

// parent.key must be an object {"value": number in [lo, hi], "source": non-empty string}.
double sourced_number(const JsonReader& parent, const std::string& key, double lo, double hi);
// The same, with a default when parent.key is absent.
double sourced_number(const JsonReader& parent, const std::string& key, double lo, double hi, double dflt);
std::string sourced_text(const JsonReader& parent, const std::string& key);   // its "source"
nlohmann::json sourced(double value, const std::string& source);

}  // namespace fsdpsim::calibrate

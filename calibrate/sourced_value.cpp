#include "calibrate/sourced_value.h"

#include "common/errors.h"

namespace fsdpsim::calibrate {

double sourced_number(const JsonReader& parent, const std::string& key, double lo, double hi) {
  JsonReader r = parent.get_object(key);
  std::string src = r.get_string("source");
  if (src.empty()) throw InputError(r.field("source"), "\"\"", "every profile number needs a non-empty source");
  return r.get_double("value", lo, hi);
}

double sourced_number(const JsonReader& parent, const std::string& key, double lo, double hi, double dflt) {
  if (!parent.has(key)) return dflt;
  return sourced_number(parent, key, lo, hi);
}

std::string sourced_text(const JsonReader& parent, const std::string& key) {
  if (!parent.has(key)) return "";
  return parent.get_object(key).get_string("source", "");
}

nlohmann::json sourced(double value, const std::string& source) {
  return nlohmann::json{{"value", value}, {"source", source}};
}

}  // namespace fsdpsim::calibrate

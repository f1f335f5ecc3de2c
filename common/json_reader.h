// Reading user JSON at the boundary: every accessor names the field's dotted path in its error
// (InputError), checks the type and the range, and rejects NaN/inf. Unknown keys are rejected by
// check_no_unknown_keys() (the policy for plan/cluster/profile files: a typo must not be ignored).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdpsim {

using Json = nlohmann::json;

// Parses text as JSON; a syntax error becomes InputError(source, "<parse error at byte N>", ...).
Json parse_json_text(const std::string& text, const std::string& source);
// Reads a file; a missing/unreadable file is InputError(field, path, "file not found/readable").
std::string read_text_file(const std::string& path, const std::string& field);
Json read_json_file(const std::string& path, const std::string& field);

class JsonReader {
 public:
  // obj must be a JSON object; path is its dotted name for messages ("plan", "cluster").
  JsonReader(const Json& obj, std::string path);

  bool has(const std::string& key) const;  // present and not null
  const Json& raw(const std::string& key) const;
  std::string field(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const std::string& path() const { return path_; }

  std::int64_t get_int(const std::string& key, std::int64_t lo, std::int64_t hi) const;
  std::int64_t get_int(const std::string& key, std::int64_t lo, std::int64_t hi, std::int64_t dflt) const;
  double get_double(const std::string& key, double lo, double hi) const;
  double get_double(const std::string& key, double lo, double hi, double dflt) const;
  bool get_bool(const std::string& key) const;
  bool get_bool(const std::string& key, bool dflt) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;
  // One of `allowed` (exact match); the message lists them.
  std::string get_enum(const std::string& key, const std::vector<std::string>& allowed) const;
  std::string get_enum(const std::string& key, const std::vector<std::string>& allowed,
                       const std::string& dflt) const;
  JsonReader get_object(const std::string& key) const;

  // Throws InputError on the first key not in `known`.
  void check_no_unknown_keys(const std::vector<std::string>& known) const;

 private:
  const Json& obj_;
  std::string path_;
};

// Renders a JSON value for an error message (strings quoted, long values cut).
std::string json_value_for_message(const Json& v);

}  // namespace fsdpsim

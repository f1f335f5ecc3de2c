#include "common/json_reader.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "common/errors.h"

namespace fsdpsim {

Json parse_json_text(const std::string& text, const std::string& source) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw InputError(source, "<malformed JSON>", std::string("not valid JSON (") + e.what() + ")");
  } catch (const Json::out_of_range& e) {   // a number literal beyond a double (e.g. 1e999)
    std::string what = e.what();
    if (what.size() > 160) what = what.substr(0, 157) + "...";
    throw InputError(source, "<number out of range>", "not valid JSON (" + what + ")");
  }
}

std::string read_text_file(const std::string& path, const std::string& field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(field, "\"" + path + "\"", "file not found or not readable");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InputError(field, "\"" + path + "\"", "file could not be read");
  return ss.str();
}

Json read_json_file(const std::string& path, const std::string& field) {
  return parse_json_text(read_text_file(path, field), field + " (" + path + ")");
}

std::string json_value_for_message(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

JsonReader::JsonReader(const Json& obj, std::string path) : obj_(obj), path_(std::move(path)) {
  if (!obj_.is_object())
    throw InputError(path_.empty() ? "<root>" : path_, json_value_for_message(obj_), "expected a JSON object");
}

bool JsonReader::has(const std::string& key) const {
  auto it = obj_.find(key);
  return it != obj_.end() && !it->is_null();
}

const Json& JsonReader::raw(const std::string& key) const {
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) throw InputError(field(key), "<missing>", "this field is required");
  return *it;
}

std::int64_t JsonReader::get_int(const std::string& key, std::int64_t lo, std::int64_t hi) const {
  const Json& v = raw(key);
  std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (v.is_number_integer()) {
    // nlohmann stores large positives as unsigned: check before converting.
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
      throw InputError(field(key), json_value_for_message(v), "expected " + range);
    std::int64_t x = v.get<std::int64_t>();
    if (x < lo || x > hi) throw InputError(field(key), json_value_for_message(v), "expected " + range);
    return x;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && d >= static_cast<double>(lo) && d <= static_cast<double>(hi))
      return static_cast<std::int64_t>(d);
  }
  throw InputError(field(key), json_value_for_message(v), "expected " + range);
}

std::int64_t JsonReader::get_int(const std::string& key, std::int64_t lo, std::int64_t hi, std::int64_t dflt) const {
  return has(key) ? get_int(key, lo, hi) : dflt;
}

double JsonReader::get_double(const std::string& key, double lo, double hi) const {
  const Json& v = raw(key);
  std::ostringstream range;
  range << "a finite number in [" << lo << ", " << hi << "]";
  if (!v.is_number()) throw InputError(field(key), json_value_for_message(v), "expected " + range.str());
  double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    throw InputError(field(key), json_value_for_message(v), "expected " + range.str());
  return d;
}

double JsonReader::get_double(const std::string& key, double lo, double hi, double dflt) const {
  return has(key) ? get_double(key, lo, hi) : dflt;
}

bool JsonReader::get_bool(const std::string& key) const {
  const Json& v = raw(key);
  if (!v.is_boolean()) throw InputError(field(key), json_value_for_message(v), "expected true or false");
  return v.get<bool>();
}

bool JsonReader::get_bool(const std::string& key, bool dflt) const { return has(key) ? get_bool(key) : dflt; }

std::string JsonReader::get_string(const std::string& key) const {
  const Json& v = raw(key);
  if (!v.is_string()) throw InputError(field(key), json_value_for_message(v), "expected a string");
  return v.get<std::string>();
}

std::string JsonReader::get_string(const std::string& key, const std::string& dflt) const {
  return has(key) ? get_string(key) : dflt;
}

std::string JsonReader::get_enum(const std::string& key, const std::vector<std::string>& allowed) const {
  std::string s = get_string(key);
  for (const auto& a : allowed)
    if (a == s) return s;
  std::string list;
  for (size_t i = 0; i < allowed.size(); ++i) list += (i ? ", " : "") + allowed[i];
  throw InputError(field(key), "\"" + s + "\"", "expected one of " + list);
}

std::string JsonReader::get_enum(const std::string& key, const std::vector<std::string>& allowed,
                                 const std::string& dflt) const {
  return has(key) ? get_enum(key, allowed) : dflt;
}

JsonReader JsonReader::get_object(const std::string& key) const { return JsonReader(raw(key), field(key)); }

void JsonReader::check_no_unknown_keys(const std::vector<std::string>& known) const {
  for (auto it = obj_.begin(); it != obj_.end(); ++it) {
    bool ok = false;
    for (const auto& k : known)
      if (k == it.key()) ok = true;
    if (!ok) {
      std::string list;
      for (size_t i = 0; i < known.size(); ++i) list += (i ? ", " : "") + known[i];
      throw InputError(field(it.key()), json_value_for_message(it.value()), "unknown key; known keys: " + list);
    }
  }
}

}  // namespace fsdpsim

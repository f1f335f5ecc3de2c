#include "common/args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "common/errors.h"

namespace fsdpsim {

Args::Args(const std::vector<std::string>& argv, const std::vector<OptionSpec>& specs) {
  auto find = [&](const std::string& n) -> const OptionSpec* {
    for (const auto& s : specs)
      if (s.name == n) return &s;
    return nullptr;
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const OptionSpec* spec = find(name);
    if (!spec) {
      std::string list;
      for (const auto& s : specs) list += (list.empty() ? "--" : ", --") + s.name;
      throw InputError("--" + name, a, "unknown option; known: " + list + " (see --help)");
    }
    if (spec->takes_value && !inline_value) {
      if (i + 1 >= argv.size()) throw InputError("--" + name, "<missing>", "expects a value: --" + name + " " + spec->metavar);
      value = argv[++i];
    } else if (!spec->takes_value) {
      if (inline_value && value != "true" && value != "false")
        throw InputError("--" + name, value, "a flag takes no value (or =true/=false)");
      if (!inline_value) value = "true";
    }
    auto& v = values_[name];
    if (!v.empty() && !spec->repeatable) throw InputError("--" + name, value, "given more than once");
    v.push_back(value);
  }
}

bool Args::has(const std::string& name) const { return values_.count(name) > 0; }

std::string Args::get(const std::string& name, const std::string& dflt) const {
  auto it = values_.find(name);
  return it == values_.end() ? dflt : it->second.back();
}

std::string Args::require(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw InputError("--" + name, "<missing>", "this option is required");
  return it->second.back();
}

std::vector<std::string> Args::all(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

std::int64_t Args::get_int(const std::string& name, std::int64_t dflt, std::int64_t lo, std::int64_t hi) const {
  if (!has(name)) return dflt;
  std::string s = get(name);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi)
    throw InputError("--" + name, s, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

double Args::get_double(const std::string& name, double dflt, double lo, double hi) const {
  if (!has(name)) return dflt;
  std::string s = get(name);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi)
    throw InputError("--" + name, s, "expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

std::string usage_text(const std::string& command, const std::string& summary, const std::vector<OptionSpec>& specs) {
  std::string s = "Usage: fsdpsim " + command + " [options]\n\n" + summary + "\n\nOptions:\n";
  for (const auto& o : specs) {
    std::string left = "  --" + o.name + (o.takes_value ? " " + o.metavar : "");
    if (left.size() < 32) left += std::string(32 - left.size(), ' ');
    else left += "\n" + std::string(32, ' ');
    s += left + o.help + (o.repeatable ? " (repeatable)" : "") + "\n";
  }
  s += "  --help, -h                    show this help\n";
  return s;
}

}  // namespace fsdpsim

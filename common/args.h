// Command-line options for subcommands: `--key value`, `--key=value`, boolean `--flag`, repeatable
// options. Unknown options and missing values are InputError naming the option.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fsdpsim {

struct OptionSpec {
  std::string name;        // without dashes: "model"
  bool takes_value = true; // false = a boolean flag
  bool repeatable = false;
  std::string help;        // one line for --help
  std::string metavar = "VALUE";
};

class Args {
 public:
  // argv excludes the program and subcommand names. "--help"/"-h" sets help().
  Args(const std::vector<std::string>& argv, const std::vector<OptionSpec>& specs);
  bool help() const { return help_; }
  bool has(const std::string& name) const;
  std::string get(const std::string& name, const std::string& dflt = "") const;
  std::string require(const std::string& name) const;  // InputError("--name", "<missing>") if absent
  std::vector<std::string> all(const std::string& name) const;
  std::int64_t get_int(const std::string& name, std::int64_t dflt, std::int64_t lo, std::int64_t hi) const;
  double get_double(const std::string& name, double dflt, double lo, double hi) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  bool help_ = false;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

// "Usage: fsdpsim CMD [options]\n\n<summary>\n\nOptions:\n  --name VALUE  help\n"
std::string usage_text(const std::string& command, const std::string& summary, const std::vector<OptionSpec>& specs);

}  // namespace fsdpsim

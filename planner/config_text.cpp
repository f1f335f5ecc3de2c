// Shared scanning and value helpers of the config readers (config_text.h).
#include "planner/config_text.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <regex>
#include <sstream>

#include "common/errors.h"
#include "program/plan_keys.h"

namespace fsdpsim::planner::config_text {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
std::string unquote(std::string s) {
  s = trim(s);
  if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front()) return s.substr(1, s.size() - 2);
  return s;
}
std::string last_component(const std::string& s) {
  std::string u = unquote(s);
  auto d = u.rfind('.');
  return d == std::string::npos ? u : u.substr(d + 1);
}

bool as_bool(const std::string& key, const std::string& v) {
  std::string l = lower(unquote(v));
  if (l == "true" || l == "1" || l == "yes") return true;
  if (l == "false" || l == "0" || l == "no" || l == "none" || l == "null" || l.empty()) return false;
  // cpu_offload=CPUOffload(offload_params=True)
  if (l.find("offload_params=true") != std::string::npos) return true;
  if (l.find("offload_params=false") != std::string::npos || l.rfind("cpuoffload(", 0) == 0) return false;
  throw InputError(key, v, "True or False");
}

long long as_int(const std::string& key, const std::string& v, long long lo, long long hi) {
  std::string u = unquote(v);
  char* end = nullptr;
  double d = std::strtod(u.c_str(), &end);   // accepts 1e8 (min_num_params=1e8)
  // !(lo <= d <= hi) also rejects NaN ("nan"), whose conversion to an integer is undefined.
  if (u.empty() || *end != '\0' || !(d >= static_cast<double>(lo) && d <= static_cast<double>(hi)) ||
      d != static_cast<long long>(d))
    throw InputError(key, v, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<long long>(d);
}

std::vector<std::string> as_names(const std::string& v) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : v) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.') cur += c;
    else {
      if (!cur.empty()) out.push_back(last_component(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(last_component(cur));
  return out;
}

std::vector<long long> as_ints(const std::string& v) {
  std::vector<long long> out;
  std::string cur;
  for (char c : v + " ") {
    if (std::isdigit(static_cast<unsigned char>(c))) cur += c;
    else if (!cur.empty()) {
      // More than 18 digits would overflow std::stoll: saturate, the caller's range check rejects it.
      out.push_back(cur.size() > 18 ? std::numeric_limits<long long>::max() : std::stoll(cur));
      cur.clear();
    }
  }
  return out;
}

std::string strip_python_comments(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quote) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == quote || c == '\n') quote = 0;
    } else if (c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
      if (i < text.size()) out += '\n';
    } else {
      if (c == '"' || c == '\'') quote = c;
      out += c;
    }
  }
  return out;
}

bool call_arguments(const std::string& text, const std::string& name, std::string& out) {
  std::regex re("\\b" + name + "\\s*\\(");
  std::smatch m;
  if (!std::regex_search(text, m, re)) return false;
  size_t i = static_cast<size_t>(m.position(0) + m.length(0));
  int depth = 1;
  char quote = 0;
  size_t start = i;
  for (; i < text.size() && depth > 0; ++i) {
    char c = text[i];
    if (quote) {
      if (c == '\\') ++i;
      else if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') quote = c;
    else if (c == '#') { while (i < text.size() && text[i] != '\n') ++i; }
    else if (c == '(' || c == '[' || c == '{') ++depth;
    else if (c == ')' || c == ']' || c == '}') --depth;
  }
  if (depth != 0) throw InputError(name + "(...)", "<unbalanced parentheses>", "a complete call");
  out = text.substr(start, i - 1 - start);
  return true;
}

KV keyword_arguments(const std::string& args) {
  KV kv;
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  char quote = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    char c = args[i];
    if (quote) {
      cur += c;
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '#') { while (i < args.size() && args[i] != '\n') ++i; continue; }
    if (c == '"' || c == '\'') quote = c;
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  for (const auto& p : parts) {
    auto eq = p.find('=');
    if (eq == std::string::npos) continue;
    std::string k = trim(p.substr(0, eq));
    bool ident = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (ident) kv[k] = trim(p.substr(eq + 1));
  }
  return kv;
}

std::string yaml_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  if (n.IsNull()) return "None";
  std::string s = "[";
  if (n.IsSequence())
    for (size_t i = 0; i < n.size(); ++i) s += (i ? ", " : "") + yaml_text(n[i]);
  return s + "]";
}

KV yaml_map(const YAML::Node& n) {
  KV kv;
  if (n && n.IsMap())
    for (const auto& it : n) kv[it.first.as<std::string>()] = yaml_text(it.second);
  return kv;
}

void set_plan_key(sim::Plan& p, const std::string& plan_key, const std::string& value, const std::string& key) {
  // The error names the framework's field (`key`) and its value; the plan key it maps to is in the expectation.
  const std::string v = sim::strip_quotes(value);
  if (v.empty()) throw InputError(key, "\"\"", "a value for the plan's " + plan_key + " (it is empty)");
  sim::plan_key(plan_key).set(p, v, key);
}

void read_directive(const std::string& text, UserConfig& cfg) {
  std::regex re("#\\s*fsdpsim:([^\\n]*)");
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) {
    std::istringstream is((*it)[1].str());
    std::string tok;
    while (is >> tok) {
      auto eq = tok.find('=');
      if (eq == std::string::npos) continue;
      std::string k = tok.substr(0, eq), v = tok.substr(eq + 1);
      if (k == "micro_batch") { cfg.plan.micro_batch = as_int("# fsdpsim: micro_batch", v, 1, 65536); cfg.micro_batch_given = true; }
      else if (k == "seq_len") { cfg.plan.seq_len = as_int("# fsdpsim: seq_len", v, 1, 1 << 22); cfg.seq_len_given = true; }
      else if (k == "grad_accum") cfg.plan.grad_accum = as_int("# fsdpsim: grad_accum", v, 1, 65536);
      else throw InputError("# fsdpsim: " + k, v, "micro_batch, seq_len or grad_accum");
    }
  }
}

void read_sequence_length(const std::string& text, UserConfig& cfg) {
  // The names training scripts give the sequence length: LitGPT (max_seq_length, block_size), HF
  // tokenizers and datasets (max_length, seq_length), torchtitan (seq_len), nanoGPT (block_size).
  // A comment line is skipped so `# seq_len = 4096 is too long` does not count.
  static const std::regex re(
      "(^|[^A-Za-z0-9_#])(seq_len|seq_length|max_seq_len|max_seq_length|sequence_length|max_sequence_length|"
      "block_size|max_length|context_length)\\s*[=:]\\s*([0-9][0-9_]*)",
      std::regex::icase);
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    std::smatch m;
    if (!std::regex_search(line, m, re)) continue;
    std::string digits;
    for (char c : m[3].str())
      if (c != '_') digits += c;
    cfg.plan.seq_len = as_int(m[2].str(), digits, 1, 1 << 22);
    cfg.seq_len_given = true;
    cfg.facts.push_back("sequence length " + std::to_string(cfg.plan.seq_len) + " read from `" + m[2].str() + " = " + m[3].str() + "`");
    return;
  }
}

namespace {
int edit_distance(const std::string& a, const std::string& b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

std::string closest_key(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  int best_d = 1 << 30;
  for (const auto& k : known) {
    int d = edit_distance(lower(key), lower(k));
    if (d < best_d) { best_d = d; best = k; }
  }
  const int limit = key.size() >= 16 ? 3 : 2;
  return best_d > 0 && best_d <= limit ? best : "";
}

std::string block_class_for(const models::ModelSpec& model, models::ModelImpl impl) {
  // litgpt/model.py `class Block(nn.Module)`; torchtitan/models/llama3/model/model.py `class TransformerBlock`.
  if (impl == models::ModelImpl::LitGPT) return "Block";
  if (impl == models::ModelImpl::TorchTitan) return "TransformerBlock";
  return model.block_class;
}

bool names_block(const std::vector<std::string>& classes, const models::ModelSpec& model, models::ModelImpl impl) {
  const std::string cls = block_class_for(model, impl);
  return std::find(classes.begin(), classes.end(), cls) != classes.end();
}

}  // namespace fsdpsim::planner::config_text

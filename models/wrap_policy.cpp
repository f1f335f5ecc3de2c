// Wrap policies as the CLI and plan files spell them, and module-name matching for the explicit list.
#include <string>

#include "common/errors.h"
#include "models/wrap_graph.h"

namespace fsdpsim::models {
namespace {

constexpr const char* kAllowed = "block | none | size:N (N >= 1, FSDP1 min_num_params) | modules:a,b,... (e.g. modules:layers.*,embed_tokens,lm_head)";

bool parse_positive(const std::string& s, std::int64_t& out) {
  if (s.empty() || s.size() > 18) return false;
  std::int64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    v = v * 10 + (ch - '0');
  }
  if (v < 1) return false;
  out = v;
  return true;
}

}  // namespace

WrapPolicy parse_wrap_policy(const std::string& text, const std::string& field) {
  WrapPolicy p;
  if (text == "block" || text == "transformer_block") {
    p.kind = WrapPolicy::Kind::TransformerBlock;
  } else if (text == "none") {
    p.kind = WrapPolicy::Kind::None;
  } else if (text.rfind("size:", 0) == 0) {
    p.kind = WrapPolicy::Kind::Size;
    if (!parse_positive(text.substr(5), p.min_num_params)) throw InputError(field, "\"" + text + "\"", kAllowed);
  } else if (text.rfind("modules:", 0) == 0) {
    p.kind = WrapPolicy::Kind::Modules;
    std::string rest = text.substr(8);
    size_t start = 0;
    while (start <= rest.size()) {
      size_t comma = rest.find(',', start);
      if (comma == std::string::npos) comma = rest.size();
      std::string name = rest.substr(start, comma - start);
      if (name.empty()) throw InputError(field, "\"" + text + "\"", std::string(kAllowed) + "; empty module name");
      p.modules.push_back(name);
      start = comma + 1;
    }
  } else {
    throw InputError(field, "\"" + text + "\"", kAllowed);
  }
  return p;
}

std::string wrap_policy_name(const WrapPolicy& p) {
  switch (p.kind) {
    case WrapPolicy::Kind::TransformerBlock: return "block";
    case WrapPolicy::Kind::None: return "none";
    case WrapPolicy::Kind::Size: return "size:" + std::to_string(p.min_num_params);
    case WrapPolicy::Kind::Modules: {
      std::string s = "modules:";
      for (size_t i = 0; i < p.modules.size(); ++i) s += (i ? "," : "") + p.modules[i];
      return s;
    }
  }
  return "block";
}

}  // namespace fsdpsim::models

// FSDP units from the module tree under a wrap policy. The tree is a Boost.Graph adjacency_list
// (edges parent -> child in registration order), walked with depth-first search:
//   * Size policy (FSDP1 `size_based_auto_wrap_policy` driven by `_recursive_wrap`, torch/distributed/
//     fsdp/wrap.py): post-order. A module's unwrapped numel at entry is its whole subtree; children are
//     wrapped first and each returns the numel it took (its whole subtree if it got wrapped, else what
//     its descendants took); the module itself is wrapped when subtree - taken >= min_num_params and it is
//     not a ModuleList/ModuleDict (the policy's default exclude_wrap_modules). The root is only asked to
//     wrap its children (`only_wrap_children`): it is the root unit anyway.
//   * Transformer-block policy (`transformer_auto_wrap_policy({block_class})`, or fully_shard on each
//     block as torchtitan does): every block is a unit.
//   * Modules policy: the listed names (dotted suffixes, '*' / '?' globs per component) are units.
//   * None: the root unit holds everything.
// Then pre-order (= named_parameters order): each module's own tensors go to its nearest wrapped
// ancestor-or-self; the root unit (id 0) gets what no other unit takes. Unit ids follow that pre-order;
// forward_order sorts units by when forward() first enters their module. A subtree without parameters
// (a tied lm_head) never becomes a unit: it would all-gather nothing.
#include <algorithm>
#include <set>
#include <string>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/depth_first_search.hpp>

#include "common/errors.h"
#include "models/wrap_graph.h"

namespace fsdpsim::models {
namespace {

using Tree = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;
using Vertex = boost::graph_traits<Tree>::vertex_descriptor;

Tree to_graph(const std::vector<Module>& mods) {
  Tree g(mods.size());
  for (size_t i = 0; i < mods.size(); ++i)
    for (int c : mods[i].children) boost::add_edge(i, static_cast<size_t>(c), g);
  return g;
}

template <class Visitor>
void walk(const Tree& g, Visitor vis) {
  std::vector<boost::default_color_type> color(boost::num_vertices(g), boost::white_color);
  boost::depth_first_visit(g, Vertex{0}, vis,
                           boost::make_iterator_property_map(color.begin(), boost::get(boost::vertex_index, g)));
}

// Post-order half of FSDP1's _recursive_wrap for the size policy.
struct SizeWrapVisitor : boost::default_dfs_visitor {
  const std::vector<Module>* mods;
  std::int64_t min_num_params;
  std::vector<std::int64_t>* taken;  // numel each module returns to its parent
  std::vector<char>* wrapped;
  void finish_vertex(Vertex v, const Tree& g) const {
    std::int64_t by_children = 0;
    for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) by_children += (*taken)[boost::target(*e, g)];
    const Module& m = (*mods)[v];
    const std::int64_t remainder = m.subtree_params - by_children;
    const bool excluded = m.type == "ModuleList" || m.type == "ModuleDict";
    if (v != 0 && !excluded && remainder >= min_num_params && remainder > 0) {
      (*wrapped)[v] = 1;
      (*taken)[v] = m.subtree_params;
    } else {
      (*taken)[v] = by_children;
    }
  }
};

// Pre-order: unit assignment and tensor order.
struct AssignVisitor : boost::default_dfs_visitor {
  std::vector<Module>* mods;
  const std::vector<char>* wrapped;
  std::vector<FsdpUnit>* units;
  void discover_vertex(Vertex v, const Tree&) const {
    Module& m = (*mods)[v];
    if (v == 0) {
      m.unit = 0;
    } else if ((*wrapped)[v]) {
      FsdpUnit u;
      u.id = static_cast<int>(units->size());
      u.name = m.name;
      u.module = static_cast<int>(v);
      units->push_back(std::move(u));
      m.unit = units->back().id;
    } else {
      m.unit = (*mods)[m.parent].unit;
    }
    FsdpUnit& u = (*units)[m.unit];
    u.params += m.own_params;
    u.tensors.insert(u.tensors.end(), m.params.begin(), m.params.end());
  }
};

bool glob_match(const std::string& pat, size_t pi, const std::string& s, size_t si) {
  while (pi < pat.size()) {
    if (pat[pi] == '*') {
      for (size_t k = si; k <= s.size(); ++k)
        if (glob_match(pat, pi + 1, s, k)) return true;
      return false;
    }
    if (si >= s.size() || (pat[pi] != '?' && pat[pi] != s[si])) return false;
    ++pi, ++si;
  }
  return si == s.size();
}

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t dot = s.find('.', start);
    out.push_back(s.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return out;
}

// A pattern matches a module when it matches the trailing components of its dotted name.
bool name_matches(const std::vector<std::string>& pat, const std::vector<std::string>& name) {
  if (pat.size() > name.size()) return false;
  const size_t off = name.size() - pat.size();
  for (size_t i = 0; i < pat.size(); ++i)
    if (!glob_match(pat[i], 0, name[off + i], 0)) return false;
  return true;
}

std::vector<char> choose_wrapped(const std::vector<Module>& mods, const Tree& g, const WrapPolicy& p) {
  std::vector<char> wrapped(mods.size(), 0);
  switch (p.kind) {
    case WrapPolicy::Kind::None: break;
    case WrapPolicy::Kind::TransformerBlock:
      for (size_t i = 1; i < mods.size(); ++i)
        if (mods[i].layer >= 0 && mods[mods[i].parent].layer < 0) wrapped[i] = 1;
      break;
    case WrapPolicy::Kind::Size: {
      if (p.min_num_params < 1)
        throw InputError("wrap_policy.min_num_params", std::to_string(p.min_num_params), "an integer >= 1");
      std::vector<std::int64_t> taken(mods.size(), 0);
      walk(g, SizeWrapVisitor{{}, &mods, p.min_num_params, &taken, &wrapped});
      break;
    }
    case WrapPolicy::Kind::Modules: {
      if (p.modules.empty()) throw InputError("wrap_policy.modules", "[]", "at least one module name");
      std::vector<std::vector<std::string>> names(mods.size());
      for (size_t i = 1; i < mods.size(); ++i) names[i] = split_dots(mods[i].name);
      for (const auto& pattern : p.modules) {
        const auto pat = split_dots(pattern);
        bool any = false;
        for (size_t i = 1; i < mods.size(); ++i) {
          if (!name_matches(pat, names[i])) continue;
          any = true;
          if (mods[i].subtree_params > 0) wrapped[i] = 1;
        }
        if (!any)
          throw InputError("wrap_policy.modules", "\"" + pattern + "\"",
                           "a module name of this model (dotted suffix, '*' globs one component), e.g. " +
                               mods[mods.size() > 2 ? 2 : mods.size() - 1].name + ", layers.*, lm_head");
      }
      break;
    }
  }
  return wrapped;
}

}  // namespace

WrapGraph build_wrap_graph(const ModelSpec& m, const WrapPolicy& policy, ModelImpl impl) {
  WrapGraph wg;
  wg.modules = build_module_tree(m, impl);
  const Tree g = to_graph(wg.modules);
  const std::vector<char> wrapped = choose_wrapped(wg.modules, g, policy);

  FsdpUnit root;
  root.id = 0;
  root.name = "root";
  root.module = 0;
  root.is_root = true;
  wg.units.push_back(std::move(root));
  walk(g, AssignVisitor{{}, &wg.modules, &wrapped, &wg.units});

  // Compute parts and layers: where each leaf module (the ones that run kernels) lands.
  std::vector<std::set<ModulePart>> parts(wg.units.size());
  std::vector<std::set<int>> layers(wg.units.size());
  for (const Module& mod : wg.modules) {
    if (!mod.children.empty()) continue;
    parts[mod.unit].insert(mod.part);
    if (mod.layer >= 0) layers[mod.unit].insert(mod.layer);
  }
  for (auto& u : wg.units) {
    u.parts.assign(parts[u.id].begin(), parts[u.id].end());
    u.layers.assign(layers[u.id].begin(), layers[u.id].end());
    wg.total_params += u.params;
  }
  for (const auto& u : wg.units) wg.forward_order.push_back(u.id);
  std::stable_sort(wg.forward_order.begin(), wg.forward_order.end(), [&](int a, int b) {
    return wg.modules[wg.units[a].module].exec_index < wg.modules[wg.units[b].module].exec_index;
  });
  return wg;
}

}  // namespace fsdpsim::models

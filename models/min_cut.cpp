// Dinic's algorithm: BFS levels, then blocking flows by DFS along increasing levels.
#include "models/min_cut.h"

#include <algorithm>
#include <queue>

namespace fsdpsim::models {

MinCut::MinCut(int nodes) : out_(static_cast<std::size_t>(nodes)) {}

void MinCut::edge(int from, int to, std::int64_t capacity) {
  out_[static_cast<std::size_t>(from)].push_back(static_cast<int>(arcs_.size()));
  arcs_.push_back({to, capacity});
  out_[static_cast<std::size_t>(to)].push_back(static_cast<int>(arcs_.size()));
  arcs_.push_back({from, 0});
}

bool MinCut::levels(int s, int t) {
  level_.assign(out_.size(), -1);
  std::queue<int> q;
  level_[static_cast<std::size_t>(s)] = 0;
  q.push(s);
  while (!q.empty()) {
    const int v = q.front();
    q.pop();
    for (int a : out_[static_cast<std::size_t>(v)]) {
      const Arc& arc = arcs_[static_cast<std::size_t>(a)];
      if (arc.cap > 0 && level_[static_cast<std::size_t>(arc.to)] < 0) {
        level_[static_cast<std::size_t>(arc.to)] = level_[static_cast<std::size_t>(v)] + 1;
        q.push(arc.to);
      }
    }
  }
  return level_[static_cast<std::size_t>(t)] >= 0;
}

std::int64_t MinCut::push(int v, int t, std::int64_t f) {
  if (v == t) return f;
  const auto vi = static_cast<std::size_t>(v);
  for (int& i = next_[vi]; i < static_cast<int>(out_[vi].size()); ++i) {
    const int a = out_[vi][static_cast<std::size_t>(i)];
    Arc& arc = arcs_[static_cast<std::size_t>(a)];
    if (arc.cap <= 0 || level_[static_cast<std::size_t>(arc.to)] != level_[vi] + 1) continue;
    const std::int64_t got = push(arc.to, t, std::min(f, arc.cap));
    if (got > 0) {
      arc.cap -= got;
      arcs_[static_cast<std::size_t>(a ^ 1)].cap += got;
      return got;
    }
  }
  return 0;
}

std::vector<char> MinCut::source_side(int source, int sink) {
  while (levels(source, sink)) {
    next_.assign(out_.size(), 0);
    while (push(source, sink, kInfinite) > 0) {
    }
  }
  levels(source, sink);  // what the source still reaches in the residual graph
  std::vector<char> side(out_.size(), 0);
  for (std::size_t v = 0; v < out_.size(); ++v) side[v] = level_[v] >= 0;
  return side;
}

}  // namespace fsdpsim::models

// A minimum s-t cut on a small directed graph (Dinic's max-flow). Used to model inductor's
// partitioner (torch/_functorch/partitioners.py solve_min_cut), which picks the tensors to save for
// backward as a minimum cut between what the forward computes and what the backward needs.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

namespace fsdpsim::models {

class MinCut {
 public:
  static constexpr std::int64_t kInfinite = std::numeric_limits<std::int64_t>::max() / 4;

  explicit MinCut(int nodes);
  void edge(int from, int to, std::int64_t capacity);
  // Runs max-flow from `source` to `sink`; returns, per node, whether it is on the source side of
  // the minimum cut found (the one closest to the source).
  std::vector<char> source_side(int source, int sink);

 private:
  struct Arc {
    int to;
    std::int64_t cap;
  };
  bool levels(int s, int t);
  std::int64_t push(int v, int t, std::int64_t f);
  std::vector<Arc> arcs_;                // arc i and i ^ 1 are each other's reverse
  std::vector<std::vector<int>> out_;    // per node: its arcs
  std::vector<int> level_, next_;
};

}  // namespace fsdpsim::models

// stretch_program (sim/stretch.h): why the result is the longer model's program is written there; this
// file is the mechanics. Terms: the source's site groups (lowering::SiteGroup) are "block groups"
// (a transformer block's ops and buffers, site layer >= 0) or "other groups"; a block group belongs to
// a phase key (micro-batch, phase). Every op id or buffer id in the source's lists is classified once
// by what it points to:
//   Abs       an op/buffer of an other group: the same op/buffer of that group in the result;
//   Rel       (from a block group) an op/buffer of a block group: (micro-batch, phase, layer) taken
//             relative to the source's own, so a copied block points to the block as many layers away;
//   AbsBlock  (from an other group) an op/buffer of a block group at a fixed layer, renumbered when it
//             lies after the inserted layers;
//   Literal   -1 (a free's reuse_after_op without record_stream).
// Layers l < first + period keep their number; later ones move up by copies * period; copy j of the
// template (layers first .. first+period-1) holds layers first + period*(j+1) ...
#include "sim/stretch.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace fsdpsim::sim {
namespace {

using lowering::SiteGroup;
using lowering::SitePhase;

constexpr int kPhases = 4;

struct Group {
  int mb = -1, phase = 0, layer = -1;
  int op_begin = 0, op_end = 0, buf_begin = 0, buf_end = 0;
  int key() const { return (mb + 1) * kPhases + phase; }
};

enum class RefKind : std::uint8_t { Literal, Abs, Rel, AbsBlock };
struct Ref {
  RefKind kind = RefKind::Literal;
  std::int8_t phase = 0;
  int group = -1;   // Abs: the source group
  int mb = 0;       // Rel: micro-batch delta; AbsBlock: the micro-batch
  int layer = 0;    // Rel: layer delta; AbsBlock: the layer; Literal: the value
  int offset = 0;   // the op's or buffer's index within its group
  bool operator==(const Ref&) const = default;
};

// One group of the result: a source group, or (copy >= 0) a copy of a template group.
struct NewGroup {
  int src = 0;
  int copy = -1;
  int layer = -1;      // its layer in the result (-1: other group)
  int op_base = 0, buf_base = 0;
};

class Stretcher {
 public:
  Stretcher(const StretchSource& s, const StretchShape& sh) : src_(s), sh_(sh) {}
  bool run(CompiledProgram& out, OpCosts& costs, StretchInfo* info, std::string* why);

 private:
  bool fail(std::string w) {
    why_ = std::move(w);
    return false;
  }
  // "op 12 (backward of micro-batch 0, block 5)" for messages.
  std::string where(int op) const {
    const Group& g = groups_[op_group_[op]];
    static const char* phases[] = {"persistent", "forward", "backward", "step"};
    std::string w = "op " + std::to_string(op) + " (" + phases[g.phase];
    if (g.mb >= 0) w += " of micro-batch " + std::to_string(g.mb);
    w += g.layer >= 0 ? ", block " + std::to_string(g.layer) + ")" : ", outside the blocks)";
    return w;
  }
  bool build_groups();
  void classify();
  void fix_absolute();
  Ref classify_one(int from_group, int target, bool is_op) const;
  bool congruent(int ga, int gb);
  bool check_references();
  bool plan_groups();
  int mapped_layer(int l) const { return l < split_ ? l : l + shift_; }
  int lookup(int key, int layer) const {
    if (layer < 0 || layer >= new_layers_ || key < 0 || key >= num_keys_) return -1;
    return new_blk_[static_cast<std::size_t>(key) * new_layers_ + layer];
  }
  // The id in the result that reference r, made by an op of new group `from`, points to (-2: none).
  int map_ref(const Ref& r, const NewGroup& from, bool is_op) const;
  bool emit(CompiledProgram& out, OpCosts& costs);
  bool emit_list(int begin, int end, int stride, int op_index, int new_op, const NewGroup& ng, std::vector<int>& lists);

  const StretchSource& src_;
  const StretchShape& sh_;
  std::string why_, mismatch_;
  int n_ops_ = 0, n_bufs_ = 0, src_layers_ = 0;
  int split_ = 0, shift_ = 0, new_layers_ = 0, num_keys_ = 0;
  int new_bufs_ = 0;
  int reach_ = 0, lo_ = 0, hi_ = 0;   // reference reach; the blocks [lo_, hi_) checked periodic
  std::vector<Group> groups_;
  std::vector<int> op_group_, buf_group_;
  std::vector<Ref> refs_;                 // parallel to the source's lists
  std::vector<int> blk_;                  // [key * src_layers_ + layer] -> source group (-1)
  std::vector<int> tmpl_first_, tmpl_last_;   // per key: first and last template group index (-1: none)
  std::vector<std::int8_t> ascending_;    // per key with a template
  std::vector<NewGroup> new_groups_;
  std::vector<int> a2n_;                  // source group -> its new group
  std::vector<int> new_blk_;              // [key * new_layers_ + layer] -> new group (-1)
  std::vector<int> copies_base_;          // per key with a template: the new group index of its first copy
  // For each list entry of a template group: its value in copy 0 and the step from one copy to the next.
  std::vector<int> v0_, dv_;
  int new_group_of_copy(int t, int j) const {
    const int key = groups_[t].key();
    const int T = tmpl_last_[key] - tmpl_first_[key] + 1;
    const int jj = ascending_[key] ? j : sh_.copies - 1 - j;
    return copies_base_[key] + jj * T + (t - tmpl_first_[key]);
  }
  bool prepare_copies();
};

bool Stretcher::build_groups() {
  const StepProgram& p = *src_.program;
  const auto& sites = *src_.sites;
  n_ops_ = static_cast<int>(p.ops.size());
  n_bufs_ = static_cast<int>(p.buffers.size());
  if (src_.compiled->num_ops() != n_ops_ || static_cast<int>(src_.compiled->buffers.size()) != n_bufs_)
    return fail("the compiled source does not match its program");
  if (static_cast<int>(src_.costs->gpu_ns.size()) != n_ops_ || static_cast<int>(src_.costs->cpu_ns.size()) != n_ops_)
    return fail("the source's costs do not match its ops");
  if (sites.empty() || sites.front().op_begin != 0 || sites.front().buf_begin != 0)
    return fail("the source has no site for its first ops and buffers");
  groups_.resize(sites.size());
  src_layers_ = 0;
  int max_mb = -1;
  for (std::size_t g = 0; g < sites.size(); ++g) {
    const SiteGroup& s = sites[g];
    Group& x = groups_[g];
    x.mb = s.site.mb;
    x.phase = static_cast<int>(s.site.phase);
    x.layer = s.site.layer;
    x.op_begin = s.op_begin;
    x.buf_begin = s.buf_begin;
    x.op_end = g + 1 < sites.size() ? sites[g + 1].op_begin : n_ops_;
    x.buf_end = g + 1 < sites.size() ? sites[g + 1].buf_begin : n_bufs_;
    if (x.op_end < x.op_begin || x.buf_end < x.buf_begin || x.mb < -1 || x.phase < 0 || x.phase >= kPhases)
      return fail("malformed site groups");
    src_layers_ = std::max(src_layers_, x.layer + 1);
    max_mb = std::max(max_mb, x.mb);
  }
  num_keys_ = (max_mb + 2) * kPhases;
  op_group_.resize(n_ops_);
  buf_group_.resize(n_bufs_);
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g) {
    for (int i = groups_[g].op_begin; i < groups_[g].op_end; ++i) op_group_[i] = g;
    for (int b = groups_[g].buf_begin; b < groups_[g].buf_end; ++b) buf_group_[b] = g;
  }
  blk_.assign(static_cast<std::size_t>(num_keys_) * src_layers_, -1);
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g) {
    const Group& x = groups_[g];
    if (x.layer < 0) continue;
    int& slot = blk_[static_cast<std::size_t>(x.key()) * src_layers_ + x.layer];
    if (slot >= 0) return fail("two site groups for one block in one phase");
    slot = g;
  }
  return true;
}

Ref Stretcher::classify_one(int from_group, int target, bool is_op) const {
  Ref r;
  if (target < 0) {
    r.kind = RefKind::Literal;
    r.layer = target;
    return r;
  }
  const int tg = is_op ? op_group_[target] : buf_group_[target];
  const Group& t = groups_[tg];
  r.offset = target - (is_op ? t.op_begin : t.buf_begin);
  r.phase = static_cast<std::int8_t>(t.phase);
  if (t.layer < 0) {
    r.kind = RefKind::Abs;
    r.group = tg;
    return r;
  }
  const Group& f = groups_[from_group];
  if (f.layer >= 0) {
    r.kind = RefKind::Rel;
    r.mb = t.mb - f.mb;
    r.layer = t.layer - f.layer;
  } else {
    r.kind = RefKind::AbsBlock;
    r.mb = t.mb;
    r.layer = t.layer;
  }
  return r;
}

void Stretcher::classify() {
  const CompiledProgram& a = *src_.compiled;
  refs_.resize(a.lists.size());
  const int* lists = a.lists.data();
  int pos = 0;
  for (int i = 0; i < n_ops_; ++i) {
    const OpRec& r = a.ops[i];
    const int g = op_group_[i];
    for (; pos < r.allocs; ++pos) refs_[pos] = classify_one(g, lists[pos], true);        // GPU and CPU waits
    for (; pos < r.frees; ++pos) refs_[pos] = classify_one(g, lists[pos], false);        // allocs
    for (; pos < r.end; pos += 2) {                                                      // (buffer, reuse op)
      refs_[pos] = classify_one(g, lists[pos], false);
      refs_[pos + 1] = classify_one(g, lists[pos + 1], true);
    }
  }
  fix_absolute();
}

// A block's reference to a block is relative (the previous block's op, the same block's forward
// buffer) unless it names one fixed block from every block (FSDP1's wait on "the last all-gather so
// far", which in a SHARD_GRAD_OP backward is the last block's forward one): where two blocks a period
// apart, of the same shape, name the same block at different distances, both entries become AbsBlock.
void Stretcher::fix_absolute() {
  const CompiledProgram& a = *src_.compiled;
  const int k = sh_.period;
  for (int key = 0; key < num_keys_; ++key) {
    const int* row = blk_.data() + static_cast<std::size_t>(key) * src_layers_;
    for (int l = 0; l + k < src_layers_; ++l) {
      const int ga = row[l], gb = row[l + k];
      if (ga < 0 || gb < 0) continue;
      const Group& x = groups_[ga];
      const Group& y = groups_[gb];
      if (x.op_end - x.op_begin != y.op_end - y.op_begin) continue;
      for (int i = x.op_begin, j = y.op_begin; i < x.op_end; ++i, ++j) {
        const int ps = i == 0 ? 0 : a.ops[i - 1].end, qs = j == 0 ? 0 : a.ops[j - 1].end;
        if (a.ops[i].end - ps != a.ops[j].end - qs) continue;
        for (int e = 0; e < a.ops[i].end - ps; ++e) {
          Ref& p = refs_[ps + e];
          Ref& q = refs_[qs + e];
          const bool p_rel = p.kind == RefKind::Rel, q_rel = q.kind == RefKind::Rel;
          if (!(p_rel || p.kind == RefKind::AbsBlock) || !(q_rel || q.kind == RefKind::AbsBlock)) continue;
          const int pm = p_rel ? x.mb + p.mb : p.mb, qm = q_rel ? y.mb + q.mb : q.mb;
          const int pl = p_rel ? x.layer + p.layer : p.layer, ql = q_rel ? y.layer + q.layer : q.layer;
          if ((p_rel && q_rel && p.mb == q.mb && p.layer == q.layer) || pm != qm || pl != ql || p.phase != q.phase ||
              p.offset != q.offset)
            continue;
          p.kind = q.kind = RefKind::AbsBlock;
          p.mb = q.mb = pm;
          p.layer = q.layer = pl;
        }
      }
    }
  }
}

// Two block groups of one phase key, `period` layers apart: the same ops, buffers and reference shapes.
bool Stretcher::congruent(int ga, int gb) {
  if (ga < 0 || gb < 0) return ga == gb;
  const Group& x = groups_[ga];
  const Group& y = groups_[gb];
  if (x.op_end - x.op_begin != y.op_end - y.op_begin || x.buf_end - x.buf_begin != y.buf_end - y.buf_begin)
    return false;
  const CompiledProgram& a = *src_.compiled;
  const TimeNs* gpu = src_.costs->gpu_ns.data();
  const TimeNs* cpu = src_.costs->cpu_ns.data();
  for (int i = x.op_begin, j = y.op_begin; i < x.op_end; ++i, ++j) {
    const OpRec& p = a.ops[i];
    const OpRec& q = a.ops[j];
    const int ps = i == 0 ? 0 : a.ops[i - 1].end, qs = j == 0 ? 0 : a.ops[j - 1].end;
    if (p.stream != q.stream || p.flags != q.flags || p.group != q.group || gpu[i] != gpu[j] || cpu[i] != cpu[j] ||
        p.cpu_waits - ps != q.cpu_waits - qs || p.allocs - ps != q.allocs - qs || p.frees - ps != q.frees - qs ||
        p.end - ps != q.end - qs) {
      mismatch_ = where(i) + " and " + where(j);
      return false;
    }
    for (int k = 0; k < p.end - ps; ++k)
      if (!(refs_[ps + k] == refs_[qs + k])) {
        mismatch_ = "list entry " + std::to_string(k) + " of " + where(i) + " and " + where(j);
        return false;
      }
  }
  for (int b = x.buf_begin, c = y.buf_begin; b < x.buf_end; ++b, ++c) {
    const CompiledBuffer& p = a.buffers[b];
    const CompiledBuffer& q = a.buffers[c];
    if (p.bytes != q.bytes || p.pool_stream != q.pool_stream || p.category != q.category || p.persistent != q.persistent)
      return false;
  }
  return true;
}

// Block references that cross the inserted layers must come from the checked periods (where they are
// part of the repeating pattern); other groups may name a fixed block only away from the template.
bool Stretcher::check_references() {
  const CompiledProgram& a = *src_.compiled;
  const int lo = lo_, hi = hi_;   // the checked blocks
  int pos = 0;
  for (int i = 0; i < n_ops_; ++i) {
    const Group& f = groups_[op_group_[i]];
    const int end = a.ops[i].end;
    for (; pos < end; ++pos) {
      const Ref& r = refs_[pos];
      if (r.kind == RefKind::AbsBlock && f.layer >= 0 && r.layer >= lo && r.layer < hi)
        return fail(where(i) + " names block " + std::to_string(r.layer) + ", next to the template, from every block");
      if (r.kind != RefKind::Rel) continue;   // (an other group's names of blocks: emit_list)
      const int t = f.layer + r.layer;
      if ((f.layer < split_) != (t < split_) && (f.layer < lo || f.layer >= hi))
        return fail("block " + std::to_string(f.layer) + " (op " + std::to_string(i) + ") names block " +
                    std::to_string(t) + " across the inserted blocks, outside the checked periods");
    }
  }
  return true;
}

// The result's group order and ids: each phase key's copies go after its template (before it where
// the phase walks the blocks downwards), copy j holding the template's layers + period * (j + 1).
bool Stretcher::plan_groups() {
  const int G = static_cast<int>(groups_.size());
  tmpl_first_.assign(num_keys_, -1);
  tmpl_last_.assign(num_keys_, -1);
  ascending_.assign(num_keys_, 1);
  for (int g = 0; g < G; ++g) {
    const Group& x = groups_[g];
    if (x.layer < sh_.first || x.layer >= split_) continue;
    const int k = x.key();
    if (tmpl_first_[k] < 0) tmpl_first_[k] = g;
    else if (tmpl_last_[k] != g - 1) return fail("a template period's groups are not consecutive");
    tmpl_last_[k] = g;
  }
  for (int k = 0; k < num_keys_; ++k) {
    if (tmpl_first_[k] < 0) continue;
    // The direction: where the next period's first group lies (checked congruent, so it exists).
    const int next = blk_[static_cast<std::size_t>(k) * src_layers_ + split_];
    if (next < 0) return fail("no block group after the template");
    if (next > tmpl_last_[k]) ascending_[k] = 1;
    else if (next < tmpl_first_[k]) ascending_[k] = 0;
    else return fail("the template period is interleaved with the next");
  }
  new_groups_.clear();
  new_groups_.reserve(G + static_cast<std::size_t>(sh_.copies) * 4 * (split_ - sh_.first) * 2);
  a2n_.assign(G, -1);
  copies_base_.assign(num_keys_, -1);
  auto push_copies = [&](int key) {
    const int n = sh_.copies;
    copies_base_[key] = static_cast<int>(new_groups_.size());
    for (int jj = 0; jj < n; ++jj) {
      const int j = ascending_[key] ? jj : n - 1 - jj;
      for (int t = tmpl_first_[key]; t <= tmpl_last_[key]; ++t)
        new_groups_.push_back(NewGroup{t, j, groups_[t].layer + sh_.period * (j + 1), 0, 0});
    }
  };
  for (int g = 0; g < G; ++g) {
    const Group& x = groups_[g];
    const int key = x.key();
    const bool is_tmpl = x.layer >= sh_.first && x.layer < split_;
    if (is_tmpl && !ascending_[key] && g == tmpl_first_[key]) push_copies(key);
    a2n_[g] = static_cast<int>(new_groups_.size());
    new_groups_.push_back(NewGroup{g, -1, x.layer < 0 ? -1 : mapped_layer(x.layer), 0, 0});
    if (is_tmpl && ascending_[key] && g == tmpl_last_[key]) push_copies(key);
  }
  new_blk_.assign(static_cast<std::size_t>(num_keys_) * new_layers_, -1);
  int op = 0, buf = 0;
  for (int h = 0; h < static_cast<int>(new_groups_.size()); ++h) {
    NewGroup& ng = new_groups_[h];
    const Group& s = groups_[ng.src];
    ng.op_base = op;
    ng.buf_base = buf;
    op += s.op_end - s.op_begin;
    buf += s.buf_end - s.buf_begin;
    if (ng.layer >= 0) new_blk_[static_cast<std::size_t>(s.key()) * new_layers_ + ng.layer] = h;
  }
  return true;
}

int Stretcher::map_ref(const Ref& r, const NewGroup& from, bool is_op) const {
  int h = -1;
  switch (r.kind) {
    case RefKind::Literal: return r.layer;
    case RefKind::Abs: h = a2n_[r.group]; break;
    case RefKind::Rel: {
      const Group& f = groups_[from.src];
      h = lookup((f.mb + r.mb + 1) * kPhases + r.phase, from.layer + r.layer);
      break;
    }
    case RefKind::AbsBlock: h = lookup((r.mb + 1) * kPhases + r.phase, mapped_layer(r.layer)); break;
  }
  if (h < 0) return -2;
  return (is_op ? new_groups_[h].op_base : new_groups_[h].buf_base) + r.offset;
}

// Copies the source list entries [begin, end) of one op into `lists`, mapped; stride 2 for the frees
// (buffer, reuse op), 1 otherwise. In an other group's list, a run of entries naming the same op or
// buffer of consecutive blocks (the held all-reduce outputs, the offload syncs) that spans the
// inserted layers gets the inserted blocks' entries.
bool Stretcher::emit_list(int begin, int end, int stride, int op_index, int new_op, const NewGroup& ng,
                          std::vector<int>& lists) {
  const bool frees = stride == 2;
  const bool first_is_op = begin < src_.compiled->ops[op_index].allocs;   // waits name ops, allocs/frees buffers
  const int lo = lo_, hi = hi_;
  const bool other = groups_[ng.src].layer < 0;
  auto same_run = [&](const Ref& a, const Ref& b) {
    return a.kind == RefKind::AbsBlock && b.kind == RefKind::AbsBlock && a.mb == b.mb && a.phase == b.phase &&
           a.offset == b.offset;
  };
  // Appends entry `pos` mapped; with layer >= 0 (a run's inserted entry), its blocks moved to `layer`.
  auto push = [&](int pos, int layer) -> bool {
    const int base_layer = refs_[pos].layer;
    for (int s = 0; s < stride; ++s) {
      const Ref& r = refs_[pos + s];
      const bool is_op = frees ? s == 1 : first_is_op;
      int v;
      if (layer >= 0 && r.kind == RefKind::AbsBlock) {
        const int h = lookup((r.mb + 1) * kPhases + r.phase, layer + (r.layer - base_layer));
        v = h < 0 ? -2 : (is_op ? new_groups_[h].op_base : new_groups_[h].buf_base) + r.offset;
      } else {
        v = map_ref(r, ng, is_op);
      }
      // Ops may only name earlier ops (the engine relies on it); every id must exist.
      if (v == -2 || (is_op && v >= new_op + (frees ? 1 : 0)) || (!is_op && v >= new_bufs_) || v < -1)
        return fail("a reference of op " + std::to_string(op_index) + " has no valid target in the result");
      lists.push_back(v);
    }
    return true;
  };
  for (int pos = begin; pos < end; pos += stride) {
    const Ref& r = refs_[pos];
    if (other && r.kind == RefKind::AbsBlock && r.layer >= lo && r.layer < hi) {
      // Must be part of a run crossing the split: find its neighbour on the other side of the split.
      const int nxt = pos + stride;
      const bool has_next = nxt < end && same_run(r, refs_[nxt]);
      const bool has_prev = pos - stride >= begin && same_run(refs_[pos - stride], r);
      if (!has_next && !has_prev)
        return fail(where(op_index) + " names block " + std::to_string(r.layer) + " next to the template");
      if (!push(pos, -1)) return false;
      if (has_next) {
        const int l0 = r.layer, l1 = refs_[nxt].layer;
        const bool crosses = (l0 < split_) != (l1 < split_);
        if (crosses) {
          const int d = l1 > l0 ? l1 - l0 : l0 - l1;
          // The run must continue on at least one side with the same step, and the step divide the period.
          const bool prev_ok = has_prev && std::abs(r.layer - refs_[pos - stride].layer) == d;
          const bool next_ok = nxt + stride < end && same_run(refs_[nxt], refs_[nxt + stride]) &&
                               std::abs(refs_[nxt + stride].layer - l1) == d;
          if (d == 0 || sh_.period % d != 0 || !(prev_ok || next_ok))
            return fail("a list names blocks across the template in no regular run");
          const int count = sh_.copies * sh_.period / d;
          if (l1 > l0) {
            for (int t = 1; t <= count; ++t)
              if (!push(pos, l0 + d * t)) return false;
          } else {
            const int top = l0 + shift_;   // mapped_layer(l0)
            for (int t = 1; t <= count; ++t)
              if (!push(pos, top - d * t)) return false;
          }
        }
      }
      continue;
    }
    if (!push(pos, -1)) return false;
  }
  return true;
}

// The values of the template groups' list entries in every copy are affine in the copy's index: the
// checked blocks and the copies of one phase key are laid out one period after the other, so a
// reference moves by the same number of ids from one copy to the next. Computed from copies 0 and 1
// and checked against the last copy (ids of ops must also stay below the op's own id: checked at both
// ends, which holds in between since both sides are affine).
bool Stretcher::prepare_copies() {
  const CompiledProgram& a = *src_.compiled;
  v0_.resize(a.lists.size());
  dv_.resize(a.lists.size());
  const int n = sh_.copies;
  for (int key = 0; key < num_keys_; ++key) {
    if (tmpl_first_[key] < 0) continue;
    for (int t = tmpl_first_[key]; t <= tmpl_last_[key]; ++t) {
      const Group& g = groups_[t];
      const NewGroup& c0 = new_groups_[new_group_of_copy(t, 0)];
      const NewGroup& c1 = new_groups_[new_group_of_copy(t, n > 1 ? 1 : 0)];
      const NewGroup& cl = new_groups_[new_group_of_copy(t, n - 1)];
      for (int i = g.op_begin; i < g.op_end; ++i) {
        const OpRec& r = a.ops[i];
        const int o0 = c0.op_base + (i - g.op_begin), ol = cl.op_base + (i - g.op_begin);
        for (int pos = i == 0 ? 0 : a.ops[i - 1].end; pos < r.end; ++pos) {
          const bool is_op = pos < r.allocs || (pos >= r.frees && (pos - r.frees) % 2 == 1);
          const int v0 = map_ref(refs_[pos], c0, is_op), v1 = map_ref(refs_[pos], c1, is_op);
          const int vl = map_ref(refs_[pos], cl, is_op);
          if (v0 == -2 || v1 == -2 || vl == -2) return fail("a copy of " + where(i) + " has a reference with no target");
          const int dv = v1 - v0;
          if (vl != v0 + (n - 1) * dv) return fail("a reference of " + where(i) + " does not move with the copies");
          // (a free's reuse op may be the freeing op itself: record_stream on the current stream)
          const int own = pos >= r.frees ? 1 : 0;
          if (is_op && v0 >= 0 && (v0 >= o0 + own || vl >= ol + own)) {
            const Ref& r = refs_[pos];
            return fail("a copy of " + where(i) + " would wait on a later op (a reference " +
                        (r.kind == RefKind::Rel ? std::to_string(r.layer) + " blocks away in phase " + std::to_string(r.phase)
                                                : std::string("outside the blocks")) + ")");
          }
          v0_[pos] = v0;
          dv_[pos] = dv;
        }
      }
    }
  }
  return true;
}

bool Stretcher::emit(CompiledProgram& out, OpCosts& costs) {
  const CompiledProgram& a = *src_.compiled;
  const NewGroup& last = new_groups_.back();
  const int n_new = last.op_base + (groups_[last.src].op_end - groups_[last.src].op_begin);
  const int b_new = last.buf_base + (groups_[last.src].buf_end - groups_[last.src].buf_begin);
  new_bufs_ = b_new;
  if (!prepare_copies()) return false;
  out.num_streams = a.num_streams;
  out.ops.resize(static_cast<std::size_t>(n_new) + 1);
  out.buffers.resize(static_cast<std::size_t>(b_new));
  costs.gpu_ns.resize(n_new);
  costs.cpu_ns.resize(n_new);
  costs.overlap_slowdown = src_.costs->overlap_slowdown;
  std::vector<int>& lists = out.lists;
  lists.clear();
  // (the copies' lists are as long as the template's; only other groups' lists may grow, by runs)
  std::size_t total = a.lists.size();
  for (const NewGroup& ng : new_groups_) {
    if (ng.copy < 0) continue;
    const Group& s = groups_[ng.src];
    if (s.op_end > s.op_begin) total += a.ops[s.op_end - 1].end - (s.op_begin == 0 ? 0 : a.ops[s.op_begin - 1].end);
  }
  lists.reserve(total + 64);
  OpRec* ops = out.ops.data();
  const TimeNs* gpu = src_.costs->gpu_ns.data();
  const TimeNs* cpu = src_.costs->cpu_ns.data();
  for (const NewGroup& ng : new_groups_) {
    const Group& s = groups_[ng.src];
    std::copy(gpu + s.op_begin, gpu + s.op_end, costs.gpu_ns.begin() + ng.op_base);
    std::copy(cpu + s.op_begin, cpu + s.op_end, costs.cpu_ns.begin() + ng.op_base);
    std::copy(a.buffers.begin() + s.buf_begin, a.buffers.begin() + s.buf_end, out.buffers.begin() + ng.buf_base);
    if (s.op_end == s.op_begin) continue;
    if (ng.copy >= 0) {
      // A copy: the template's records with their lists moved, entries v0 + j * dv.
      const int src_start = s.op_begin == 0 ? 0 : a.ops[s.op_begin - 1].end;
      const int src_end = a.ops[s.op_end - 1].end;
      const int dst_start = static_cast<int>(lists.size());
      const int move = dst_start - src_start;
      for (int i = s.op_begin, o = ng.op_base; i < s.op_end; ++i, ++o) {
        const OpRec& r = a.ops[i];
        OpRec& w = ops[o];
        w = OpRec{};
        w.stream = r.stream;
        w.flags = r.flags;
        w.group = r.group;
        w.wait_pos = (i == 0 ? 0 : a.ops[i - 1].end) + move;
        w.cpu_waits = r.cpu_waits + move;
        w.allocs = r.allocs + move;
        w.frees = r.frees + move;
        w.end = r.end + move;
      }
      lists.resize(static_cast<std::size_t>(dst_start + (src_end - src_start)));
      int* out_list = lists.data() + dst_start;
      const int* v0 = v0_.data() + src_start;
      const int* dv = dv_.data() + src_start;
      const int j = ng.copy;
      for (int e = 0, n = src_end - src_start; e < n; ++e) out_list[e] = v0[e] + j * dv[e];
      continue;
    }
    for (int i = s.op_begin, o = ng.op_base; i < s.op_end; ++i, ++o) {
      const OpRec& r = a.ops[i];
      const int start = i == 0 ? 0 : a.ops[i - 1].end;
      OpRec& w = ops[o];
      w = OpRec{};
      w.stream = r.stream;
      w.flags = r.flags;
      w.group = r.group;
      w.wait_pos = static_cast<int>(lists.size());
      if (!emit_list(start, r.cpu_waits, 1, i, o, ng, lists)) return false;
      w.cpu_waits = static_cast<int>(lists.size());
      if (!emit_list(r.cpu_waits, r.allocs, 1, i, o, ng, lists)) return false;
      w.allocs = static_cast<int>(lists.size());
      if (!emit_list(r.allocs, r.frees, 1, i, o, ng, lists)) return false;
      w.frees = static_cast<int>(lists.size());
      if (!emit_list(r.frees, r.end, 2, i, o, ng, lists)) return false;
      w.end = static_cast<int>(lists.size());
    }
  }
  ops[n_new] = OpRec{};
  return true;
}

bool Stretcher::run(CompiledProgram& out, OpCosts& costs, StretchInfo* info, std::string* why) {
  const auto done = [&](bool ok) {
    if (!ok && why) *why = why_;
    return ok;
  };
  if (sh_.period < 1 || sh_.copies < 1 || sh_.first < sh_.period)
    return done(fail("bad stretch shape"));
  if (!build_groups()) return done(false);
  split_ = sh_.first + sh_.period;
  shift_ = sh_.copies * sh_.period;
  if (split_ + sh_.period > src_layers_) return done(fail("the source has no period after the template"));
  if (sh_.first % sh_.period != 0) return done(fail("the template does not start a period"));
  new_layers_ = src_layers_ + shift_;
  classify();
  // The reach of block-to-block references: the blocks within it of the split (and one period more)
  // must repeat with the period, in every phase key with blocks.
  reach_ = 0;
  int reach_at = 0;
  for (std::size_t pos = 0; pos < refs_.size(); ++pos)
    if (refs_[pos].kind == RefKind::Rel && std::abs(refs_[pos].layer) > reach_)
      reach_ = std::abs(refs_[pos].layer), reach_at = static_cast<int>(pos);
  lo_ = split_ - reach_ - sh_.period;
  hi_ = split_ + reach_ + sh_.period;
  if (lo_ < 0 || hi_ > src_layers_)
    return done(fail("the source has too few blocks around the template (references reach " + std::to_string(reach_) +
                     " blocks, e.g. list entry " + std::to_string(reach_at) + ")"));
  for (int key = 0; key < num_keys_; ++key) {
    const int* row = blk_.data() + static_cast<std::size_t>(key) * src_layers_;
    bool any = false;
    for (int l = 0; l < src_layers_ && !any; ++l) any = row[l] >= 0;
    if (!any) continue;
    for (int l = lo_; l + sh_.period < hi_; ++l)
      if (!congruent(row[l], row[l + sh_.period]))
        return done(fail("the blocks around layer " + std::to_string(l) + " are not periodic: " + mismatch_));
  }
  if (!check_references() || !plan_groups() || !emit(out, costs)) return done(false);

  if (info) {
    info->op_ranges.clear();
    for (const NewGroup& ng : new_groups_)
      if (groups_[ng.src].op_end > groups_[ng.src].op_begin)
        info->op_ranges.emplace_back(groups_[ng.src].op_begin, groups_[ng.src].op_end);
  }
  // Bytes sent: the source's plus each template collective's once per copy.
  const StepProgram& p = *src_.program;
  std::int64_t extra[3] = {0, 0, 0};
  for (int key = 0; key < num_keys_; ++key) {
    if (tmpl_first_[key] < 0) continue;
    const int b = groups_[tmpl_first_[key]].op_begin, e = groups_[tmpl_last_[key]].op_end;
    for (int i = b; i < e; ++i) {
      const Op& op = p.ops[i];
      if (!is_collective(op.kind)) continue;
      const std::int64_t gs = op.group_size;
      const int k = op.kind == OpKind::AllGather ? 0 : op.kind == OpKind::ReduceScatter ? 1 : 2;
      extra[k] += (k == 2 ? 2 : 1) * op.comm_bytes * (gs - 1) / gs;
    }
  }
  for (int k = 0; k < 3; ++k) out.comm_sent[k] = src_.compiled->comm_sent[k] + sh_.copies * extra[k];
  out.notes = p.notes;
  out.record_stream_frees = src_.compiled->record_stream_frees;
  // The periodic runs: per phase key, the copies and the source's blocks checked periodic around them
  // (whole periods aligned with the template: layers [l0, l1) of the source, l1 - l0 a multiple of the
  // period), one after the other in the result.
  out.runs.clear();
  const int k = sh_.period;
  const int l0 = sh_.first - k * ((sh_.first - lo_) / k), l1 = split_ + k * ((hi_ - split_) / k);
  for (int key = 0; key < num_keys_; ++key) {
    if (tmpl_first_[key] < 0) continue;
    const int period = groups_[tmpl_last_[key]].op_end - groups_[tmpl_first_[key]].op_begin;
    if (period <= 0) continue;
    // The run's first group: the lowest layer's (ascending) or the highest layer's (descending).
    const int* row = blk_.data() + static_cast<std::size_t>(key) * src_layers_;
    const int edge = ascending_[key] ? row[l0] : row[l1 - 1];
    if (edge < 0) continue;
    const int begin = new_groups_[a2n_[edge]].op_base;
    out.runs.push_back(PeriodicRun{begin, period, sh_.copies + (l1 - l0) / k});
  }
  std::sort(out.runs.begin(), out.runs.end(), [](const PeriodicRun& x, const PeriodicRun& y) { return x.begin < y.begin; });
  return done(true);
}

}  // namespace

bool stretch_program(const StretchSource& src, const StretchShape& shape, CompiledProgram& out, OpCosts& out_costs,
                     StretchInfo* info, std::string* why) {
  Stretcher s(src, shape);
  return s.run(out, out_costs, info, why);
}

}  // namespace fsdpsim::sim

// stretch_program (sim/stretch.h): why the result is the longer model's program is written there; this
// file is the mechanics. Terms: the source's site groups (lowering::SiteGroup) are "block groups"
// (a transformer block's ops and buffers, site layer >= 0) or "other groups"; a block group belongs to
// a phase key (micro-batch, phase). Every op id or buffer id in the source's lists (an "entry") is
// classified by what it points to:
//   * from a block group to a block group: relative in layers (kRel: the block so many layers away),
//     unless two blocks a period apart name the very same op or buffer (kFixed: one fixed block named
//     from every block, such as FSDP1's wait on "the last all-gather so far");
//     Where blocks a period apart name blocks a period apart the other way (block l names block C - l),
//     the reference is a mirror (kMirror): FSDP1's rate limiter (P4) queues the free events of a
//     backward, which walks the blocks downwards, and the next forward's all-gathers, walking upwards,
//     wait on them in queue order, so forward block l waits on the event of backward block L - 2 - l. A
//     mirror names the block as far from one end as its own block is from the other: C grows with the
//     inserted layers;
//   * anything else names the same op or buffer in the result (an other group; a fixed block, renumbered
//     if it lies after the inserted layers), except that an other group's entries naming blocks next to
//     the template must be one per block in a run that is extended over the inserted blocks (kRun).
// Layers l < first + period keep their number; later ones move up by copies * period; copy j of the
// template (layers first .. first+period-1) holds layers first + period*(j+1) ...
//
// The result is laid out as the source's groups in order, each phase key's n template copies as one
// block next to its template (after it; before it where the phase walks the blocks downwards), and
// micro-batch P's m copies after P. It is built in three steps, each a few tight loops:
//  1. every source group's own image: its records with their list positions moved, and each entry
//     mapped to its "image" (the id its target has in the result: the source id plus the ops or buffers
//     inserted before the target's group), except the few entries whose target is not that image
//     (kCross: a relative reference across the inserted layers, or a mirror between blocks on one side
//     of them, looked up) and the run lists (recomputed);
//  2. each template copy j = 0..n-1 from the template period's own image T: entries T + (j+1) * dv,
//     where dv is how far the entry's target moves from one copy to the next (a period of the target's
//     phase for a relative reference, one back for a mirror, nothing otherwise). The next period after the template is copy n
//     of that line: its image N (computed in step 1, independently) must equal T + (n+1) * dv entry by
//     entry, which checks the line at both ends (ids of ops stay below the op's own id in between, as
//     both are affine in j and hold at both ends, and every target lies in the checked blocks' images
//     and copies, laid out one period after the other);
//  3. micro-batch copies (sim/stretch.h): copy i = 1..m of micro-batch P's image (copy 0) is that image
//     with every micro-batch-relative entry moved by i micro-batches (kMbRel) and the others unchanged.
#include "sim/stretch.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstddef>
#include <cstring>
#include <string>

#include "sim/workspace.h"

namespace fsdpsim::sim {
namespace {

using lowering::SiteGroup;

constexpr int kPhases = 4;

// What a source list entry names and how it moves (a bit set per entry).
enum : std::uint8_t {
  kBuf = 1,     // a buffer id (else an op id, or -1)
  kRel = 2,     // a block group's reference to a block group, relative in layers
  kFixed = 4,   // a block group's reference to one fixed block (the same op or buffer from every block)
  kCross = 8,   // its target in the result is not the image of its source target (looked up)
  kRun = 16,    // an other group's reference to a block next to the template (part of a per-block run)
  kMbRel = 32,  // relative in micro-batches (micro-batch P's entries; see step 3)
  kMirror = 64, // a block group's reference to the block as far from the other end (see kMirror above)
};

// The categories a buffer may have (as program_check.cpp's fast check): all but allocator_slack and
// cuda_context.
constexpr unsigned kBufferCategories =
    ((1u << kNumMemCategories) - 1) & ~(1u << static_cast<int>(MemCategory::AllocatorSlack)) &
    ~(1u << static_cast<int>(MemCategory::CudaContext));
static_assert(kNumMemCategories <= 32);

struct Group {
  int mb = -1, phase = 0, layer = -1, key = 0;
  int op_begin = 0, op_end = 0, buf_begin = 0, buf_end = 0;
  int list_begin = 0, list_end = 0;   // its ops' entries in the source's flat lists
  bool run = false;                   // has ops whose lists hold runs (their lengths change)
  bool cross = false, fixed = false, mirror = false;   // has kCross, kFixed, kMirror entries
};

// out[e] = (cur[e] += d[e]) for e < n: the next copy's entries from the last one's.
inline void step_copy(int* __restrict cur, const int* __restrict d, int* __restrict out, int n) {
  int e = 0;
#if defined(__GNUC__)
  // (four at a time: g++ -O2 vectorizes no loop of unknown length)
  typedef int v4 __attribute__((vector_size(16)));
  for (; e + 4 <= n; e += 4) {
    v4 c, x;
    std::memcpy(&c, cur + e, sizeof c);
    std::memcpy(&x, d + e, sizeof x);
    c += x;
    std::memcpy(cur + e, &c, sizeof c);
    std::memcpy(out + e, &c, sizeof c);
  }
#endif
  for (; e < n; ++e) out[e] = (cur[e] += d[e]);
}

// `n` records from `from` to `to` with their list positions moved by `move`.
inline void move_records(const OpRec* __restrict from, OpRec* __restrict to, int n, int move) {
  for (int i = 0; i < n; ++i) {
    OpRec w = from[i];
    w.wait_pos += move;
    w.cpu_waits += move;
    w.allocs += move;
    w.frees += move;
    w.end += move;
    to[i] = w;
  }
}

// Moves the list positions of `n` records by `move`.
inline void move_lists(OpRec* r, int n, int move) {
  for (int i = 0; i < n; ++i) {
    r[i].wait_pos += move;
    r[i].cpu_waits += move;
    r[i].allocs += move;
    r[i].frees += move;
    r[i].end += move;
  }
}

// n trivially copyable elements (the copies never overlap).
template <typename T>
void copy_n(T* to, const T* from, long n) {
  if (n > 0) std::memcpy(to, from, sizeof(T) * static_cast<std::size_t>(n));
}

// `count` copies of the `n` elements at `p` after them (p[n .. n * (count + 1))), by doubling.
template <typename T>
void replicate(T* p, int n, int count) {
  const long total = static_cast<long>(n) * (count + 1);
  for (long have = n; have < total;) {
    const long now = std::min(have, total - have);
    copy_n(p + have, p, now);
    have += now;
  }
}

class Stretcher {
 public:
  bool run(const StretchSource& s, const StretchShape& sh, CompiledProgram& out, OpCosts& costs, StretchInfo* info,
           std::string* why);

 private:
  bool fail(std::string w) {
    why_ = std::move(w);
    return false;
  }
  bool fail_mb(std::string w) {
    mb_refused_ = true;
    return fail("micro-batches: " + std::move(w));
  }
  // "op 12 (backward of micro-batch 0, block 5)" for messages.
  std::string where(int op) const {
    int g = 0;
    while (g + 1 < static_cast<int>(groups_.size()) && groups_[g + 1].op_begin <= op) ++g;
    const Group& x = groups_[g];
    static const char* phases[] = {"persistent", "forward", "backward", "step"};
    std::string w = "op " + std::to_string(op) + " (" + phases[x.phase];
    if (x.mb >= 0) w += " of micro-batch " + std::to_string(x.mb);
    w += x.layer >= 0 ? ", block " + std::to_string(x.layer) + ")" : ", outside the blocks)";
    return w;
  }
  int begin_of(int g, bool buf) const { return buf ? groups_[g].buf_begin : groups_[g].op_begin; }
  int op_of_entry(int g, int e) const {
    int i = groups_[g].op_begin;
    while (i + 1 < groups_[g].op_end && srec_[i].end <= e) ++i;
    return i;
  }
  bool is_tmpl(const Group& x) const { return layers_ && x.layer >= sh_.first && x.layer < split_; }

  bool build_groups();
  bool plan_layers();
  bool plan_micro_batches();
  bool layout_ids();
  bool read_source();
  bool analyse_layers();
  bool congruent(int ga, int gb);
  bool analyse_micro_batches();
  int compare_micro_batches(int a);
  bool map_entries();
  bool run_lists(int g, int i);
  bool layout_lists();
  void emit_own(CompiledProgram& out, OpCosts& costs);
  bool emit_copies(CompiledProgram& out, OpCosts& costs);
  void emit_micro_batches(CompiledProgram& out, OpCosts& costs);
  void fill_runs(CompiledProgram& out) const;
  void fill_info(StretchInfo& info) const;

  // The result id of the op (buffer) at `offset` of the group holding block `layer` (of the result) of
  // phase key `key`, or -2 if there is none.
  int block_id(int key, int layer, bool buf, int offset) const {
    if (layer < 0 || layer >= new_layers_ || key < 0 || key >= num_keys_) return -2;
    const int* row = blk_.data() + static_cast<std::size_t>(key) * src_layers_;
    if (layer < split_ || layer >= split_ + shift_) {
      const int g = row[layer < split_ ? layer : layer - shift_];
      return g < 0 ? -2 : (buf ? bb_[g] : ob_[g]) + offset;
    }
    const int t = row[sh_.first + (layer - split_) % sh_.period];
    if (t < 0) return -2;
    const int j = (layer - split_) / sh_.period;
    const int jj = ascending_[key] ? j : sh_.copies - 1 - j;
    const int tf = tmpl_first_[key];
    return buf ? cb_buf_[key] + jj * pbuf_[key] + groups_[t].buf_begin - groups_[tf].buf_begin + offset
               : cb_op_[key] + jj * pop_[key] + groups_[t].op_begin - groups_[tf].op_begin + offset;
  }
  // The micro-batch move of an entry of group `from` naming group `target`: a later micro-batch's
  // reference into micro-batches P-R+1 .. P names the last copies (P-R .. P and the copies repeat).
  int mb_move(int from, int target, bool buf) const {
    return mbs_ && from >= gP_end_ && target >= mb_first_[sh_.mb_template - mb_reach_ + 1] && target < gP_end_
               ? sh_.mb_copies * (buf ? pm_bufs_ : pm_ops_)
               : 0;
  }
  // A looked-up value of an entry of an op with id `own` in the result: an existing buffer; an op issued
  // before it (a free's reuse op: or the op itself, or -1).
  bool valid(int v, bool is_op, int own, bool reuse_slot) const {
    if (is_op) return v < own + (reuse_slot ? 1 : 0) && (v >= 0 || (reuse_slot && v == -1));
    return v >= 0 && v < n_new_bufs_;
  }

  const StretchSource* src_ = nullptr;
  StretchShape sh_;
  std::string why_, mismatch_;
  bool mb_refused_ = false;
  int reach_refused_ = -1;   // the reach that made the source too short
  // ---- the source ----
  int n_ops_ = 0, n_bufs_ = 0, n_entries_ = 0, src_layers_ = 0, num_keys_ = 0, n_mbs_ = 0;
  std::vector<OpRec> srec_;            // compile_program's records of the source's ops
  std::vector<int> sl_;                // its flat lists (the layout of CompiledProgram::lists)
  std::vector<int> tg_;                // per entry: the group of the op or buffer it names (-1: the literal -1)
  std::vector<std::uint8_t> cls_;      // per entry: the bits above
  std::vector<CompiledBuffer> sbuf_;
  std::vector<Group> groups_;
  std::vector<int> glayer_;            // per group: its layer (-1: an other group)
  std::vector<int> op_group_, buf_group_;
  std::vector<std::array<std::int64_t, 3>> gsent_;   // per group: bytes sent (all-gather, reduce-scatter, all-reduce)
  // ---- layers ----
  bool layers_ = false;
  int split_ = 0, shift_ = 0, new_layers_ = 0, reach_ = 0, lo_ = 0, hi_ = 0;
  std::vector<int> blk_;                      // [key * src_layers_ + layer] -> source group (-1)
  std::vector<int> tmpl_first_, tmpl_last_;   // per key: first and last template group (-1: none)
  std::vector<std::int8_t> ascending_;        // per key with a template
  std::vector<int> pop_, pbuf_, plist_;       // per key with a template: its period's ops, buffers, entries
  std::vector<int> cb_op_, cb_buf_, cb_list_; // per key with a template: where its block of copies starts
  // ---- micro-batches ----
  bool mbs_ = false;
  int gP_begin_ = 0, gP_end_ = 0;             // micro-batch P's source groups
  int mb_reach_ = 1;                          // R: micro-batches P-R .. P repeat
  int fixed_mb_ = -1;                         // (the last micro-batch two compared ones both name)
  int pm_ops_ = 0, pm_bufs_ = 0, pm_lists_ = 0;   // micro-batch P's size in the result (copy 0)
  std::vector<int> mb_first_;                 // per micro-batch (and one past the last): its first group
  // ---- the result ----
  std::vector<int> ob_, bb_, lb_;             // per source group: its image's first op, buffer, entry
  std::vector<int> oshift_, bshift_;          // per source group: its image's ids - its source ids
  int n_new_ops_ = 0, n_new_bufs_ = 0, n_new_lists_ = 0;
  std::vector<int> img_;                      // per source entry: its value in the group's own image
  std::vector<int> run_at_;                   // per source op: its list in runs_ (-1: its entries as they are)
  std::vector<int> runs_, runs_src_;          // run ops' lists: section lengths and values; each value's entry
  std::vector<int> dv_, cur_, dm_;
};

bool Stretcher::build_groups() {
  const StepProgram& p = *src_->program;
  const auto& sites = *src_->sites;
  n_ops_ = static_cast<int>(p.ops.size());
  n_bufs_ = static_cast<int>(p.buffers.size());
  if (static_cast<int>(src_->costs->gpu_ns.size()) != n_ops_ || static_cast<int>(src_->costs->cpu_ns.size()) != n_ops_)
    return fail("the source's costs do not match its ops");
  if (sites.empty() || sites.front().op_begin != 0 || sites.front().buf_begin != 0)
    return fail("the source has no site for its first ops and buffers");
  const int G = static_cast<int>(sites.size());
  groups_.resize(G);
  glayer_.resize(G);
  src_layers_ = 0;
  int max_mb = -1;
  for (int g = 0; g < G; ++g) {
    const SiteGroup& s = sites[g];
    Group& x = groups_[g];
    x.mb = s.site.mb;
    x.phase = static_cast<int>(s.site.phase);
    x.layer = s.site.layer;
    x.op_begin = s.op_begin;
    x.buf_begin = s.buf_begin;
    x.op_end = g + 1 < G ? sites[g + 1].op_begin : n_ops_;
    x.buf_end = g + 1 < G ? sites[g + 1].buf_begin : n_bufs_;
    x.key = (x.mb + 1) * kPhases + x.phase;
    x.run = x.cross = x.fixed = x.mirror = false;
    glayer_[g] = x.layer;
    if (x.op_end < x.op_begin || x.buf_end < x.buf_begin || x.op_end > n_ops_ || x.buf_end > n_bufs_ || x.mb < -1 ||
        x.phase < 0 || x.phase >= kPhases || x.layer < -1)
      return fail("malformed site groups");
    src_layers_ = std::max(src_layers_, x.layer + 1);
    max_mb = std::max(max_mb, x.mb);
  }
  n_mbs_ = max_mb + 1;
  num_keys_ = (max_mb + 2) * kPhases;
  op_group_.resize(n_ops_);
  buf_group_.resize(n_bufs_);
  int* og = op_group_.data();
  int* bg = buf_group_.data();
  for (int g = 0; g < G; ++g) {
    for (int i = groups_[g].op_begin; i < groups_[g].op_end; ++i) og[i] = g;
    for (int b = groups_[g].buf_begin; b < groups_[g].buf_end; ++b) bg[b] = g;
  }
  return true;
}

// The source's records and flat lists, with compile_program's checks (validate_program's): a source
// that fails one is refused, and the whole lowering then throws the error. Each entry also gets the
// group it names and its image (layout_ids ran before), and each group its bytes sent.
bool Stretcher::read_source() {
  const StepProgram& p = *src_->program;
  const int ns = static_cast<int>(p.streams.size());
  const int nb = n_bufs_;
  if (ns == 0) return fail("the source fails the program checks (no stream)");
  for (int s = 0; s < ns; ++s)
    if (p.streams[s].id != s) return fail("the source fails the program checks (stream ids)");
  sbuf_.resize(nb);
  const Buffer* bufs = p.buffers.data();
  CompiledBuffer* sb = sbuf_.data();
  bool bufs_ok = true;
  for (int b = 0; b < nb; ++b) {
    const Buffer& x = bufs[b];
    const unsigned c = static_cast<unsigned>(x.category);
    bufs_ok &= (x.id == b) & (x.bytes >= 0) & (static_cast<unsigned>(x.pool_stream) < static_cast<unsigned>(ns)) &
               (c < 32) && ((kBufferCategories >> c) & 1u) && (!x.first_step_lazy || x.persistent);
    sb[b] = compiled_buffer(x);
  }
  if (!bufs_ok) return fail("the source fails the program checks (buffers)");
  const int n = n_ops_;
  srec_.resize(static_cast<std::size_t>(n));
  gsent_.assign(groups_.size(), {0, 0, 0});
  if (sl_.size() < 2048) sl_.resize(2048), tg_.resize(2048), cls_.resize(2048), img_.resize(2048);
  const auto below = [](int v, int lim) { return static_cast<unsigned>(v) < static_cast<unsigned>(lim); };
  const Op* ops = p.ops.data();
  const int* og = op_group_.data();
  const int* bg = buf_group_.data();
  const int* os = oshift_.data();
  const int* bs = bshift_.data();
  int pos = 0;
  for (int i = 0; i < n; ++i) {
    const Op& op = ops[i];
    const unsigned kind = static_cast<unsigned>(op.kind);
    const std::uint8_t f = kKindFlags[kind < kNumOpKinds ? kind : kNumOpKinds];
    bool ok = (op.id == i) & below(op.stream, ns) & !(f & kBadKind) &
              ((op.copy_bytes | op.cpu_hooks | op.kernel_launches) >= 0);
    if (f & kCollective)
      ok &= (static_cast<unsigned>(op.group) <= static_cast<unsigned>(CommGroup::PostForward)) &
            (op.group_size >= 1) & (op.comm_bytes >= 0);
    const std::size_t need = op.waits.size() + op.cpu_waits.size() + op.allocs.size() + 2 * op.frees.size();
    if (pos + need > sl_.size()) [[unlikely]] {
      const std::size_t sz = std::max(2 * sl_.size(), pos + need + 256);
      sl_.resize(sz), tg_.resize(sz), cls_.resize(sz), img_.resize(sz);
    }
    int* l = sl_.data();
    int* t = tg_.data();
    int* im = img_.data();
    std::uint8_t* c = cls_.data();
    OpRec r;
    r.stream = op.stream;
    r.flags = f;
    r.launches = f & kCpuOp ? 0 : op.kernel_launches;
    r.group = static_cast<std::uint8_t>(f & kCollective ? static_cast<int>(op.group) : 0);
    r.wait_pos = pos;
    // (each entry with the group it names and its image: its id plus what is inserted before that group)
    for (int w : op.waits) {
      const bool in = below(w, i);
      ok &= in;
      const int tg = in ? og[w] : 0;
      l[pos] = w, t[pos] = tg, im[pos] = w + os[tg], c[pos] = 0, ++pos;
    }
    r.cpu_waits = pos;
    for (int w : op.cpu_waits) {
      const bool in = below(w, i);
      ok &= in;
      const int tg = in ? og[w] : 0;
      l[pos] = w, t[pos] = tg, im[pos] = w + os[tg], c[pos] = 0, ++pos;
    }
    r.allocs = pos;
    for (int b : op.allocs) {
      const bool in = below(b, nb);
      ok &= in && (!bufs[b].persistent || bufs[b].first_step_lazy);
      const int tg = in ? bg[b] : 0;
      l[pos] = b, t[pos] = tg, im[pos] = b + bs[tg], c[pos] = kBuf, ++pos;
    }
    r.frees = pos;
    int prev_reuse = free_inside_op(1);
    for (const FreeSpec& fr : op.frees) {
      const bool in = below(fr.buffer, nb);
      const int ro = fr.reuse_after_op;
      ok &= in & valid_free_reuse(ro, prev_reuse, i, static_cast<int>(op.allocs.size()));
      prev_reuse = ro;
      const int tg = in ? bg[fr.buffer] : 0;
      l[pos] = fr.buffer, t[pos] = tg, im[pos] = fr.buffer + bs[tg], c[pos] = kBuf;
      const bool op_in = below(ro, i + 1);
      const int to = op_in ? og[ro] : -1;
      l[pos + 1] = ro, t[pos + 1] = to, im[pos + 1] = op_in ? ro + os[to] : ro, c[pos + 1] = 0;
      pos += 2;
    }
    r.end = pos;
    srec_[i] = r;
    if (!ok) [[unlikely]]
      return fail("the source fails the program checks (" + where(i) + ")");
    if (f & kCollective) {
      // Bytes each rank sends (N1), as compile_program counts them.
      const std::int64_t gs = op.group_size;
      auto& s = gsent_[og[i]];
      if (op.kind == OpKind::AllGather) s[0] += op.comm_bytes * (gs - 1) / gs;
      else if (op.kind == OpKind::ReduceScatter) s[1] += op.comm_bytes * (gs - 1) / gs;
      else s[2] += 2 * op.comm_bytes * (gs - 1) / gs;
    }
  }
  n_entries_ = pos;
  for (Group& x : groups_) {
    x.list_begin = x.op_begin == x.op_end ? (x.op_begin == 0 ? 0 : srec_[x.op_begin - 1].end) : srec_[x.op_begin].wait_pos;
    x.list_end = x.op_begin == x.op_end ? x.list_begin : srec_[x.op_end - 1].end;
  }
  return true;
}

// Two block groups of one phase key, `period` layers apart: the same ops, buffers and reference shapes.
bool Stretcher::congruent(int ga, int gb) {
  if (ga < 0 || gb < 0) return ga == gb;
  const Group& x = groups_[ga];
  const Group& y = groups_[gb];
  if (x.op_end - x.op_begin != y.op_end - y.op_begin || x.buf_end - x.buf_begin != y.buf_end - y.buf_begin ||
      x.list_end - x.list_begin != y.list_end - y.list_begin)
    return false;
  const TimeNs* gpu = src_->costs->gpu_ns.data();
  const TimeNs* cpu = src_->costs->cpu_ns.data();
  const int k = sh_.period;
  for (int i = x.op_begin, j = y.op_begin; i < x.op_end; ++i, ++j) {
    const OpRec& p = srec_[i];
    const OpRec& q = srec_[j];
    const int ps = p.wait_pos, qs = q.wait_pos;
    if (p.stream != q.stream || p.flags != q.flags || p.group != q.group || p.launches != q.launches ||
        gpu[i] != gpu[j] || cpu[i] != cpu[j] ||
        p.cpu_waits - ps != q.cpu_waits - qs || p.allocs - ps != q.allocs - qs || p.frees - ps != q.frees - qs ||
        p.end - ps != q.end - qs) {
      mismatch_ = where(i) + " and " + where(j);
      return false;
    }
    for (int e = 0; e < p.end - ps; ++e) {
      const int a = ps + e, b = qs + e;
      const int va = sl_[a], vb = sl_[b];
      bool same;
      if ((cls_[a] ^ cls_[b]) & (kBuf | kRel | kFixed | kMirror)) {
        same = false;
      } else if (cls_[a] & (kRel | kMirror)) {
        // the same place of the block `period` layers on (back, for a mirror)
        const int ta = tg_[a], tb = tg_[b];
        const bool buf = cls_[a] & kBuf;
        same = groups_[ta].key == groups_[tb].key &&
               groups_[tb].layer == groups_[ta].layer + ((cls_[a] & kRel) ? k : -k) &&
               va - begin_of(ta, buf) == vb - begin_of(tb, buf);
      } else {
        same = va == vb;   // the same op or buffer (or -1)
      }
      if (!same) {
        mismatch_ = "list entry " + std::to_string(e) + " of " + where(i) + " and " + where(j);
        return false;
      }
    }
  }
  for (int b = x.buf_begin, c = y.buf_begin; b < x.buf_end; ++b, ++c) {
    const CompiledBuffer& p = sbuf_[b];
    const CompiledBuffer& q = sbuf_[c];
    if (!(p == q)) {
      mismatch_ = "buffer " + std::to_string(b) + " and " + std::to_string(c);
      return false;
    }
  }
  return true;
}

// The layer shape, each phase key's blocks and its template period: its groups (consecutive), sizes and
// direction. (From the site groups alone: the result's ids are laid out before the lists are read.)
bool Stretcher::plan_layers() {
  const int k = sh_.period;
  if (k < 1 || sh_.first < k) return fail("bad stretch shape");
  split_ = sh_.first + k;
  shift_ = sh_.copies * k;
  if (split_ + k > src_layers_) return fail("the source has no period after the template");
  if (sh_.first % k != 0) return fail("the template does not start a period");
  new_layers_ = src_layers_ + shift_;
  const int G = static_cast<int>(groups_.size());
  blk_.assign(static_cast<std::size_t>(num_keys_) * src_layers_, -1);
  for (int g = 0; g < G; ++g) {
    const Group& x = groups_[g];
    if (x.layer < 0) continue;
    int& slot = blk_[static_cast<std::size_t>(x.key) * src_layers_ + x.layer];
    if (slot >= 0) return fail("two site groups for one block in one phase");
    slot = g;
  }
  tmpl_first_.assign(num_keys_, -1);
  tmpl_last_.assign(num_keys_, -1);
  ascending_.assign(num_keys_, 1);
  pop_.assign(num_keys_, 0);
  pbuf_.assign(num_keys_, 0);
  plist_.assign(num_keys_, 0);
  cb_op_.assign(num_keys_, 0);
  cb_buf_.assign(num_keys_, 0);
  cb_list_.assign(num_keys_, 0);
  for (int g = 0; g < G; ++g) {
    const Group& x = groups_[g];
    if (!is_tmpl(x)) continue;
    const int key = x.key;
    if (tmpl_first_[key] < 0) tmpl_first_[key] = g;
    else if (tmpl_last_[key] != g - 1) return fail("a template period's groups are not consecutive");
    tmpl_last_[key] = g;
    pop_[key] += x.op_end - x.op_begin;
    pbuf_[key] += x.buf_end - x.buf_begin;
  }
  for (int key = 0; key < num_keys_; ++key) {
    if (tmpl_first_[key] < 0) continue;
    // The direction: where the next period's first group lies (checked congruent, so it exists).
    const int next = blk_[static_cast<std::size_t>(key) * src_layers_ + split_];
    if (next < 0) return fail("no block group after the template");
    if (next > tmpl_last_[key]) ascending_[key] = 1;
    else if (next < tmpl_first_[key]) ascending_[key] = 0;
    else return fail("the template period is interleaved with the next");
  }
  return true;
}

bool Stretcher::analyse_layers() {
  const int k = sh_.period;
  const int G = static_cast<int>(groups_.size());
  const int* t = tg_.data();
  std::uint8_t* c = cls_.data();
  const int* l = sl_.data();
  const int* gl = glayer_.data();
  const int split = split_;
  // A block's reference to a block is relative (the previous block's op, the same block's forward
  // buffer) unless it names one fixed block from every block: where two blocks a period apart, of the
  // same shape, name the very same op or buffer of a block, both entries are kFixed; where they name the
  // same place of blocks a period apart the other way, both are kMirror. Block y's entries are settled
  // once it has been compared with y - k and y + k: the others are kRel, and their reach (in layers) sets
  // the blocks checked periodic. (Entries whose target is not their image are marked kCross as they
  // settle: a relative one across the split, a mirror between blocks on one side of it.)
  reach_ = 0;
  int reach_at = 0;
  for (int key = 0; key < num_keys_; ++key) {
    const int* row = blk_.data() + static_cast<std::size_t>(key) * src_layers_;
    for (int y = 0; y < src_layers_; ++y) {
      const int ga = row[y], gb = y + k < src_layers_ ? row[y + k] : -1;
      if (ga < 0) continue;
      Group& x = groups_[ga];
      if (gb >= 0 && x.op_end - x.op_begin == groups_[gb].op_end - groups_[gb].op_begin) {
        for (int i = x.op_begin, j = groups_[gb].op_begin; i < x.op_end; ++i, ++j) {
          const OpRec& p = srec_[i];
          const OpRec& q = srec_[j];
          const int ps = p.wait_pos, qs = q.wait_pos;
          if (p.cpu_waits - ps != q.cpu_waits - qs || p.allocs - ps != q.allocs - qs || p.frees - ps != q.frees - qs ||
              p.end - ps != q.end - qs)
            continue;
          for (int e = 0, ne = p.end - ps; e < ne; ++e) {
            const int a = ps + e, b = qs + e, v = l[a];
            if (v < 0 || gl[t[a]] < 0) continue;
            if (v == l[b]) {
              c[a] |= kFixed, c[b] |= kFixed;
            } else if (l[b] >= 0 && gl[t[b]] == gl[t[a]] - k && groups_[t[a]].key == groups_[t[b]].key &&
                       ((c[a] ^ c[b]) & kBuf) == 0 && v - begin_of(t[a], c[a] & kBuf) == l[b] - begin_of(t[b], c[b] & kBuf)) {
              c[a] |= kMirror, c[b] |= kMirror;
            }
          }
        }
      }
      const bool left = y < split;
      for (int e = x.list_begin; e < x.list_end; ++e) {
        if (l[e] < 0) continue;
        const int lt = gl[t[e]];
        if (lt < 0) continue;
        const std::uint8_t ce = c[e];
        if (ce & kFixed) {
          x.fixed = true;
          continue;
        }
        if (ce & kMirror) {
          x.mirror = true;
          if (left == (lt < split)) c[e] = ce | kCross, x.cross = true;
          continue;
        }
        c[e] = ce | kRel | (left != (lt < split) ? kCross : 0);
        x.cross |= left != (lt < split);
        const int d = std::abs(lt - y);
        if (d > reach_) reach_ = d, reach_at = e;
      }
    }
  }
  lo_ = split_ - reach_ - k;
  hi_ = split_ + reach_ + k;
  // (and the blocks the template's mirrors name, with the period below them the next period's name)
  for (int g = 0; g < G; ++g) {
    if (gl[g] < sh_.first || gl[g] >= split_ || !groups_[g].mirror) continue;
    for (int e = groups_[g].list_begin; e < groups_[g].list_end; ++e)
      if (c[e] & kMirror) lo_ = std::min(lo_, gl[t[e]] - k), hi_ = std::max(hi_, gl[t[e]] + 1);
  }
  if (lo_ < 0 || hi_ > src_layers_) {
    reach_refused_ = reach_;
    return fail("the source has too few blocks around the template (references reach " + std::to_string(reach_) +
                " blocks, e.g. list entry " + std::to_string(reach_at) + ")");
  }
  for (int g = 0; g < G; ++g) {
    Group& x = groups_[g];
    const int lf = gl[g];
    if (lf < 0 || !(x.fixed || x.mirror || x.cross)) continue;
    const bool outside = lf < lo_ || lf >= hi_;
    for (int e = x.list_begin; e < x.list_end; ++e) {
      if (l[e] < 0) continue;
      const int lt = gl[t[e]];
      // Fixed blocks must lie away from the template.
      if ((c[e] & kFixed) && lt >= lo_ && lt < hi_)
        return fail(where(op_of_entry(g, e)) + " names block " + std::to_string(lt) +
                    ", next to the template, from every block");
      if (!outside || !(c[e] & kCross)) continue;
      // A mirror only shows in the checked blocks: its two blocks lie on either side of the inserted
      // layers, or next to them. Outside the checked blocks, two blocks on one side of them that look
      // mirrored are the blocks next to an end keeping their relation to that end (the previous
      // backward's last events FULL_SHARD's rate limiter hands the next forward's first blocks, the
      // forward events it carries into the first backward blocks): relative, within the reach.
      if (c[e] & kMirror) {
        if (std::abs(lt - lf) > reach_)
          return fail("block " + std::to_string(lf) + " (" + where(op_of_entry(g, e)) + ") names block " +
                      std::to_string(lt) + ", further than the reach of the checked blocks");
        c[e] = static_cast<std::uint8_t>((c[e] & ~(kMirror | kCross)) | kRel);
        continue;
      }
      // References across the inserted layers must come from the checked periods (where they are part
      // of the repeating pattern: looked up in the result).
      return fail("block " + std::to_string(lf) + " (" + where(op_of_entry(g, e)) + ") names block " +
                  std::to_string(lt) + " across the inserted blocks, outside the checked periods");
    }
  }
  // The blocks within that reach of the split (and one period more) must repeat with the period, in
  // every phase key with blocks.
  for (int key = 0; key < num_keys_; ++key) {
    const int* row = blk_.data() + static_cast<std::size_t>(key) * src_layers_;
    bool any = false;
    for (int y = 0; y < src_layers_ && !any; ++y) any = row[y] >= 0;
    if (!any) continue;
    for (int y = lo_; y + k < hi_; ++y)
      if (!congruent(row[y], row[y + k]))
        return fail("the blocks around layer " + std::to_string(y) + " are not periodic: " + mismatch_);
  }
  return true;
}

// Two micro-batches in a row, a and a+1 (sim/stretch.h): the same groups, ops, buffers, and each pair of
// entries naming either the very same op or buffer, or the same place one micro-batch later (then both
// are kMbRel). Returns how far back micro-batch a+1's relative entries reach (-1: the two differ).
int Stretcher::compare_micro_batches(int a) {
  const int per = mb_first_[1] - mb_first_[0];
  const TimeNs* gpu = src_->costs->gpu_ns.data();
  const TimeNs* cpu = src_->costs->cpu_ns.data();
  const int* l = sl_.data();
  const int* t = tg_.data();
  std::uint8_t* c = cls_.data();
  int reach = 0;
  for (int x = 0; x < per; ++x) {
    const Group& ga = groups_[mb_first_[a] + x];
    const Group& gb = groups_[mb_first_[a + 1] + x];
    if (ga.phase != gb.phase || ga.layer != gb.layer || ga.op_end - ga.op_begin != gb.op_end - gb.op_begin ||
        ga.buf_end - ga.buf_begin != gb.buf_end - gb.buf_begin || ga.list_end - ga.list_begin != gb.list_end - gb.list_begin)
      return fail_mb("micro-batches " + std::to_string(a) + " and " + std::to_string(a + 1) + " differ at site group " +
                     std::to_string(x)), -1;
    for (int i = ga.op_begin, j = gb.op_begin; i < ga.op_end; ++i, ++j) {
      const OpRec& p = srec_[i];
      const OpRec& q = srec_[j];
      const int ps = p.wait_pos, qs = q.wait_pos;
      if (p.stream != q.stream || p.flags != q.flags || p.group != q.group || p.launches != q.launches ||
          gpu[i] != gpu[j] || cpu[i] != cpu[j] ||
          p.cpu_waits - ps != q.cpu_waits - qs || p.allocs - ps != q.allocs - qs || p.frees - ps != q.frees - qs ||
          p.end - ps != q.end - qs)
        return fail_mb(where(i) + " and " + where(j) + " differ"), -1;
      for (int e = 0; e < p.end - ps; ++e) {
        const int u = ps + e, v = qs + e;
        if (l[u] == l[v]) {
          // the same op or buffer (or -1): outside the micro-batches, or one of an earlier micro-batch both
          // name (the caller checks it lies before the repeating ones)
          if (l[u] >= 0) fixed_mb_ = std::max(fixed_mb_, groups_[t[u]].mb);
          continue;
        }
        const bool buf = c[u] & kBuf;
        const int tu = t[u], tv = t[v];
        if (l[u] < 0 || l[v] < 0 || ((c[u] ^ c[v]) & kBuf) || groups_[tu].mb < 0 || groups_[tv].mb != groups_[tu].mb + 1 ||
            groups_[tv].mb > a + 1 || tv - mb_first_[groups_[tv].mb] != tu - mb_first_[groups_[tu].mb] ||
            l[v] - begin_of(tv, buf) != l[u] - begin_of(tu, buf))
          return fail_mb("list entry " + std::to_string(e) + " of " + where(i) + " and " + where(j) + " differ"), -1;
        c[u] |= kMbRel, c[v] |= kMbRel;
        reach = std::max(reach, a + 1 - groups_[tv].mb);
      }
    }
    for (int p = ga.buf_begin, q = gb.buf_begin; p < ga.buf_end; ++p, ++q)
      if (!(sbuf_[p] == sbuf_[q]))
        return fail_mb("buffers " + std::to_string(p) + " and " + std::to_string(q) + " differ"), -1;
  }
  return reach;
}

// Micro-batch P's site groups (from the site groups alone: the result's ids are laid out before the
// lists are read): the persistent ones, each micro-batch's (the same sites), the optimizer step's.
bool Stretcher::plan_micro_batches() {
  const int P = sh_.mb_template;
  const int G = static_cast<int>(groups_.size());
  if (P < 2 || P >= n_mbs_ || sh_.mb_copies < 1) return fail_mb("bad micro-batch shape");
  mb_first_.assign(n_mbs_ + 1, 0);
  int g = 0;
  while (g < G && groups_[g].mb < 0) ++g;
  for (int m = 0; m < n_mbs_; ++m) {
    mb_first_[m] = g;
    while (g < G && groups_[g].mb == m) ++g;
  }
  mb_first_[n_mbs_] = g;
  for (int h = 0; h < G; ++h)
    if ((h < mb_first_[0] && groups_[h].phase != static_cast<int>(lowering::SitePhase::Persistent)) ||
        (h >= g && groups_[h].mb >= 0))
      return fail_mb("the groups are not in micro-batch order");
  const int per = mb_first_[1] - mb_first_[0];
  for (int m = 1; m < n_mbs_; ++m)
    if (mb_first_[m + 1] - mb_first_[m] != per) return fail_mb("micro-batches with different sites");
  gP_begin_ = mb_first_[P];
  gP_end_ = mb_first_[P + 1];
  // (P's copies go after its last group, which must not be followed by template copies)
  if (gP_end_ == gP_begin_ || is_tmpl(groups_[gP_begin_]) || is_tmpl(groups_[gP_end_ - 1]))
    return fail_mb("micro-batch " + std::to_string(P) + " begins or ends with a template block");
  return true;
}

// Micro-batch P against the ones before it that its references reach (R of them: P-R .. P repeat), and
// the other micro-batches' references: none from before P to P or later; from after P none to P-R, and
// to P-R+1 .. P only within the reach (relative: they name the last copies, so their images move); none
// from the optimizer step to P-R .. P but to P when it is the last micro-batch (otherwise ambiguous: a
// list of one entry per micro-batch, or one reaching over the copies?).
bool Stretcher::analyse_micro_batches() {
  const int P = sh_.mb_template;
  const int G = static_cast<int>(groups_.size());
  fixed_mb_ = -1;
  mb_reach_ = compare_micro_batches(P - 1);
  if (mb_reach_ < 0) return false;
  mb_reach_ = std::max(mb_reach_, 1);
  if (P - mb_reach_ < 1)
    return fail_mb("micro-batch " + std::to_string(P) + " names micro-batches " + std::to_string(mb_reach_) +
                   " back, as far as the first");
  for (int a = P - 2; a >= P - mb_reach_; --a)
    if (compare_micro_batches(a) < 0) return false;
  const int q = P - mb_reach_;   // the first of the repeating micro-batches
  if (fixed_mb_ >= q)
    return fail_mb("micro-batches " + std::to_string(q) + " .. " + std::to_string(P) + " name one op or buffer of micro-batch " +
                   std::to_string(fixed_mb_));
  const int* t = tg_.data();
  const std::uint8_t* c = cls_.data();
  for (int h = 0; h < G; ++h) {
    if (h >= gP_begin_ && h < gP_end_) continue;
    const bool after = h >= gP_end_;
    const int hm = groups_[h].mb;
    for (int e = groups_[h].list_begin; e < groups_[h].list_end; ++e) {
      if (t[e] < 0) continue;
      if (!after) {
        if (t[e] >= gP_begin_)
          return fail_mb(where(op_of_entry(h, e)) + " names micro-batch " + std::to_string(P) + " or later");
        continue;
      }
      const int tm = groups_[t[e]].mb;
      if (tm < q || tm > P) continue;   // (before the repeating ones: a fixed one; after P: not moved)
      if (hm < 0 ? tm != P || P != n_mbs_ - 1 : tm == q || hm - tm > mb_reach_)
        return fail_mb(where(op_of_entry(h, e)) + " names micro-batch " + std::to_string(tm));
      img_[e] += mb_move(h, t[e], c[e] & kBuf);
    }
  }
  // The repeating micro-batches are as long in the result (copies of blocks included).
  for (int m = q; m < P; ++m)
    if (ob_[mb_first_[m + 1]] - ob_[mb_first_[m]] != pm_ops_ || bb_[mb_first_[m + 1]] - bb_[mb_first_[m]] != pm_bufs_)
      return fail_mb("micro-batches differ in size after the layers are stretched");
  return true;
}

// The result's op and buffer ids: every source group's image, each key's block of copies next to its
// template, micro-batch P's copies after P. (Before the lists are read: they are read as images.)
bool Stretcher::layout_ids() {
  const int G = static_cast<int>(groups_.size());
  ob_.resize(G);
  bb_.resize(G);
  oshift_.resize(G);
  bshift_.resize(G);
  const int n = sh_.copies;
  int op = 0, buf = 0;
  for (int g = 0; g < G; ++g) {
    const Group& x = groups_[g];
    const bool tm = is_tmpl(x);
    if (tm && !ascending_[x.key] && g == tmpl_first_[x.key]) {
      cb_op_[x.key] = op, cb_buf_[x.key] = buf;
      op += n * pop_[x.key], buf += n * pbuf_[x.key];
    }
    ob_[g] = op, bb_[g] = buf;
    oshift_[g] = op - x.op_begin, bshift_[g] = buf - x.buf_begin;
    op += x.op_end - x.op_begin, buf += x.buf_end - x.buf_begin;
    if (tm && ascending_[x.key] && g == tmpl_last_[x.key]) {
      cb_op_[x.key] = op, cb_buf_[x.key] = buf;
      op += n * pop_[x.key], buf += n * pbuf_[x.key];
    }
    if (mbs_ && g == gP_end_ - 1) {
      pm_ops_ = op - ob_[gP_begin_];
      pm_bufs_ = buf - bb_[gP_begin_];
      op += sh_.mb_copies * pm_ops_, buf += sh_.mb_copies * pm_bufs_;
    }
  }
  n_new_ops_ = op;
  n_new_bufs_ = buf;
  return true;
}

// The entries whose value is not their image (read_source): block references across the inserted
// layers, looked up in the result (analyse_layers marked them kCross); an other group's references to
// blocks next to the template, which must be in runs (run_lists).
bool Stretcher::map_entries() {
  const int G = static_cast<int>(groups_.size());
  run_at_.assign(n_ops_, -1);
  runs_.clear();
  runs_src_.clear();
  if (!layers_) return true;
  int* im = img_.data();
  const int* l = sl_.data();
  const int* t = tg_.data();
  std::uint8_t* c = cls_.data();
  const int* gl = glayer_.data();
  for (int g = 0; g < G; ++g) {
    Group& x = groups_[g];
    const int lb = x.list_begin, le = x.list_end, lf = gl[g];
    if (lf < 0) {
      for (int e = lb; e < le; ++e)
        if (l[e] >= 0 && gl[t[e]] >= lo_ && gl[t[e]] < hi_) c[e] |= kRun, x.run = true;
      if (!x.run) continue;
      for (int i = x.op_begin; i < x.op_end; ++i) {
        const OpRec& r = srec_[i];
        bool any = false;
        for (int e = r.wait_pos; e < r.end && !any; ++e) any = (c[e] & kRun) != 0;
        if (any && !run_lists(g, i)) return false;
      }
      continue;
    }
    if (!x.cross) continue;
    for (int e = lb; e < le; ++e) {
      if (!(c[e] & kCross)) continue;
      const bool buf = c[e] & kBuf;
      const int tg = t[e];
      // relative: as many layers away from its own block in the result; a mirror: the sum of the two
      // layers grows by the inserted layers
      const int layer = (c[e] & kMirror) ? gl[tg] + (lf < split_ ? shift_ : 0)
                                         : (lf < split_ ? lf : lf + shift_) + (gl[tg] - lf);
      int v = block_id(groups_[tg].key, layer, buf, l[e] - begin_of(tg, buf));
      if (v != -2) v += mb_move(g, tg, buf);
      const int i = op_of_entry(g, e);
      if (!valid(v, !buf, i + oshift_[g], e >= srec_[i].frees))
        return fail("a reference of " + where(i) + " has no valid target in the result");
      im[e] = v;
    }
  }
  return true;
}

// The lists of op i of other group g, some entries of which name blocks next to the template. They must
// be in runs: consecutive entries naming blocks of one phase key, a block apart or a few (d, dividing the
// period), such as the held all-reduce outputs or the offload syncs, one per block, or the same number m
// per block in a row (a unit's per-parameter optimizer states), which move as one. In a run, entries a
// period apart must name the same place of their blocks within the checked ones (with every_k
// checkpointing a buffer may sit elsewhere in a checkpointed block); a run across the inserted layers
// gets their entries, each naming the place the template's block at its position in the period names.
// A lone entry is refused.
bool Stretcher::run_lists(int g, int i) {
  const OpRec& rec = srec_[i];
  const int head = static_cast<int>(runs_.size());
  run_at_[i] = head;
  // (the section lengths first, the values after)
  runs_.insert(runs_.end(), {0, 0, 0, 0});
  runs_src_.insert(runs_src_.end(), {-1, -1, -1, -1});
  const int own = i + oshift_[g];
  const int k = sh_.period;
  const int* l = sl_.data();
  const int* t = tg_.data();
  const std::uint8_t* c = cls_.data();
  const int* gl = glayer_.data();
  const auto block = [&](int x) { return l[x] >= 0 && gl[t[x]] >= 0; };
  const auto offset = [&](int x) { return l[x] - begin_of(t[x], c[x] & kBuf); };
  // (both name blocks of one phase key)
  const auto same_key = [&](int a, int b) {
    return block(a) && block(b) && ((c[a] ^ c[b]) & kBuf) == 0 && groups_[t[a]].key == groups_[t[b]].key;
  };
  // Appends entry `e` (stride entries) mapped; with layer >= 0 (a run's inserted entry), its blocks moved
  // to `layer` (of the result).
  auto push = [&](int e, int stride, int layer, bool frees) -> bool {
    const int base_layer = gl[t[e]];
    for (int s = 0; s < stride; ++s) {
      const int x = e + s;
      const bool buf = c[x] & kBuf;
      int v = img_[x];
      if (layer >= 0 && block(x)) {
        const int tg = t[x];
        v = block_id(groups_[tg].key, layer + (gl[tg] - base_layer), buf, offset(x));
        if (v != -2) v += mb_move(g, tg, buf);
      }
      if (!valid(v, !buf, own, frees && s % 2 == 1))
        return fail("a reference of " + where(i) + " has no valid target in the result");
      runs_.push_back(v);
      runs_src_.push_back(x);
    }
    return true;
  };
  const int bounds[5] = {rec.wait_pos, rec.cpu_waits, rec.allocs, rec.frees, rec.end};
  for (int sec = 0; sec < 4; ++sec) {
    const int begin = bounds[sec], end = bounds[sec + 1], unit = sec == 3 ? 2 : 1;
    const bool frees = sec == 3;
    const std::size_t before = runs_.size();
    for (int e = begin; e < end;) {
      // Entries naming one block in a row (a unit's per-parameter buffers, such as its optimizer states)
      // move together: m of them, the run's stride m entries (m = 1: one entry per block).
      const auto in_block = [&](int x, int y) { return same_key(x, y) && gl[t[y]] == gl[t[x]]; };
      int m = 1;
      while (block(e) && e + m * unit < end && in_block(e, e + m * unit)) ++m;
      const int stride = m * unit;
      // (a block of exactly m entries starts at x)
      const auto whole = [&](int x) {
        if (x + stride > end) return false;
        for (int z = 1; z < m; ++z)
          if (!in_block(x, x + z * unit)) return false;
        return x + stride == end || !in_block(x, x + stride);
      };
      // The run starting at e: [e, r).
      int r = e + stride, step = 0;
      if (block(e) && r < end && same_key(e, r) && gl[t[r]] != gl[t[e]] && whole(r)) {
        step = gl[t[r]] - gl[t[e]];
        while (r < end && same_key(r - stride, r) && gl[t[r]] - gl[t[r - stride]] == step && whole(r)) r += stride;
      }
      bool near = false;
      for (int x = e; x < r; x += stride) near |= (c[x] & kRun) != 0;
      if (!near) {
        for (int x = e; x < r; x += stride)
          if (!push(x, stride, -1, frees)) return false;
        e = r;
        continue;
      }
      const int d = std::abs(step);
      if (d == 0) return fail(where(i) + " names block " + std::to_string(gl[t[e]]) + " next to the template");
      if (k % d != 0) return fail(where(i) + " names blocks " + std::to_string(d) + " apart, across a period of " + std::to_string(k));
      const int q = k / d;   // entries a period apart
      for (int x = e; x + q * stride < r; x += stride) {
        const int y = x + q * stride;
        if (gl[t[x]] < lo_ || gl[t[x]] >= hi_ || gl[t[y]] < lo_ || gl[t[y]] >= hi_) continue;
        for (int z = 0; z < stride; z += unit)
          if (offset(x + z) != offset(y + z))
            return fail(where(i) + " names blocks next to the template at places that do not repeat with the period");
      }
      for (int x = e; x < r; x += stride) {
        if (!push(x, stride, -1, frees)) return false;
        const int y = x + stride;
        if (y >= r || (gl[t[x]] < split_) == (gl[t[y]] < split_)) continue;
        // Across the inserted blocks: their entries, each from the template's block at its place in the
        // period. (They lie in the blocks of copies, laid out one period after the other: from the
        // (q + 1)-th on, each is the one q before it moved by one period.)
        const int l0 = gl[t[x]];
        const int count = shift_ / d;
        const std::size_t first = runs_.size();
        for (int s = 1; s <= count; ++s) {
          if (s <= q + 1) {
            const int layer = step > 0 ? l0 + d * s : l0 + shift_ - d * s;
            const int tl = sh_.first + (layer - split_) % k;   // the template's block at its place
            const int xt = x + (tl - l0) / step * stride;
            if ((tl - l0) % step != 0 || xt < e || xt >= r || gl[t[xt]] != tl)
              return fail(where(i) + " names blocks across the template in a run without the template's blocks");
            if (!push(xt, stride, layer, frees)) return false;
            continue;
          }
          for (int z = 0; z < stride; ++z) {
            const std::size_t at = first + static_cast<std::size_t>(stride) * (s - 1) + z;
            const std::size_t back = at - static_cast<std::size_t>(stride) * q;
            const int v = runs_[back] + (runs_[first + stride * q + z] - runs_[first + z]);
            if (!valid(v, !(c[x + z] & kBuf), own, frees && z % 2 == 1))
              return fail("a reference of " + where(i) + " has no valid target in the result");
            runs_.push_back(v);
            runs_src_.push_back(x + z);
          }
        }
      }
      e = r;
    }
    runs_[head + sec] = static_cast<int>(runs_.size() - before);
  }
  return true;
}

// The result's list positions, as layout_ids laid out the ids (the run lists may be longer).
bool Stretcher::layout_lists() {
  const int G = static_cast<int>(groups_.size());
  lb_.resize(G);
  for (int key = 0; key < num_keys_; ++key)
    if (tmpl_first_[key] >= 0)
      plist_[key] = groups_[tmpl_last_[key]].list_end - groups_[tmpl_first_[key]].list_begin;
  const int n = sh_.copies;
  int lp = 0;
  for (int g = 0; g < G; ++g) {
    const Group& x = groups_[g];
    const bool tm = is_tmpl(x);
    if (tm && !ascending_[x.key] && g == tmpl_first_[x.key]) cb_list_[x.key] = lp, lp += n * plist_[x.key];
    lb_[g] = lp;
    if (!x.run) {
      lp += x.list_end - x.list_begin;
    } else {
      for (int i = x.op_begin; i < x.op_end; ++i) {
        if (run_at_[i] < 0) {
          lp += srec_[i].end - srec_[i].wait_pos;
        } else {
          const int* h = runs_.data() + run_at_[i];
          lp += h[0] + h[1] + h[2] + h[3];
        }
      }
    }
    if (tm && ascending_[x.key] && g == tmpl_last_[x.key]) cb_list_[x.key] = lp, lp += n * plist_[x.key];
    if (mbs_ && g == gP_end_ - 1) {
      pm_lists_ = lp - lb_[gP_begin_];
      for (int m = sh_.mb_template - mb_reach_; m < sh_.mb_template; ++m)
        if (lb_[mb_first_[m + 1]] - lb_[mb_first_[m]] != pm_lists_)
          return fail_mb("micro-batches' lists differ in length after the layers are stretched");
      lp += sh_.mb_copies * pm_lists_;
    }
  }
  n_new_lists_ = lp;
  return true;
}

// Step 1 (see the top): every source group's own image, at its result ids.
void Stretcher::emit_own(CompiledProgram& out, OpCosts& costs) {
  OpRec* ops = out.ops.data();
  int* lists = out.lists.data();
  CompiledBuffer* bufs = out.buffers.data();
  TimeNs* gpu = costs.gpu_ns.data();
  TimeNs* cpu = costs.cpu_ns.data();
  const TimeNs* sgpu = src_->costs->gpu_ns.data();
  const TimeNs* scpu = src_->costs->cpu_ns.data();
  const int G = static_cast<int>(groups_.size());
  for (int g = 0; g < G;) {
    // (a stretch of groups with no copies between them is contiguous in the source and the result)
    int h = g + 1;
    const auto next_to = [&](int y) {
      return y < G && !groups_[y - 1].run && !groups_[y].run && ob_[y] - ob_[y - 1] == groups_[y].op_begin - groups_[y - 1].op_begin &&
             bb_[y] - bb_[y - 1] == groups_[y].buf_begin - groups_[y - 1].buf_begin &&
             lb_[y] - lb_[y - 1] == groups_[y].list_begin - groups_[y - 1].list_begin;
    };
    while (next_to(h)) ++h;
    const Group& s = groups_[g];
    const Group& z = groups_[h - 1];
    const int nops = z.op_end - s.op_begin;
    copy_n(gpu + ob_[g], sgpu + s.op_begin, nops);
    copy_n(cpu + ob_[g], scpu + s.op_begin, nops);
    copy_n(bufs + bb_[g], sbuf_.data() + s.buf_begin, z.buf_end - s.buf_begin);
    if (!s.run) {
      move_records(srec_.data() + s.op_begin, ops + ob_[g], nops, lb_[g] - s.list_begin);
      copy_n(lists + lb_[g], img_.data() + s.list_begin, z.list_end - s.list_begin);
      g = h;
      continue;
    }
    int pos = lb_[g];
    OpRec* w = ops + ob_[g];
    for (int i = s.op_begin; i < s.op_end; ++i, ++w) {
      const OpRec& r = srec_[i];
      if (run_at_[i] < 0) {
        move_records(&r, w, 1, pos - r.wait_pos);
        std::memcpy(lists + pos, img_.data() + r.wait_pos, sizeof(int) * (r.end - r.wait_pos));
        pos = w->end;
        continue;
      }
      const int* hd = runs_.data() + run_at_[i];
      *w = r;
      w->wait_pos = pos;
      w->cpu_waits = pos + hd[0];
      w->allocs = w->cpu_waits + hd[1];
      w->frees = w->allocs + hd[2];
      w->end = w->frees + hd[3];
      std::memcpy(lists + pos, hd + 4, sizeof(int) * (w->end - pos));
      pos = w->end;
    }
    g = h;
  }
}

// Step 2 (see the top): the template copies, and the check of each line against the next period.
bool Stretcher::emit_copies(CompiledProgram& out, OpCosts& costs) {
  OpRec* ops = out.ops.data();
  int* lists = out.lists.data();
  const int n = sh_.copies, k = sh_.period;
  for (int key = 0; key < num_keys_; ++key) {
    const int tf = tmpl_first_[key];
    if (tf < 0) continue;
    const Group& s = groups_[tf];
    const int len = plist_[key], nops = pop_[key], nbufs = pbuf_[key];
    // The next period's first group (in the source's order: its lowest layer where the phase ascends).
    const int* row = blk_.data() + static_cast<std::size_t>(key) * src_layers_;
    int nf = -1;
    for (int y = split_; y < split_ + k; ++y)
      if (row[y] >= 0 && (nf < 0 || row[y] < nf)) nf = row[y];
    const std::size_t need = std::max<std::size_t>(len, 9 * static_cast<std::size_t>(nops));
    if (dv_.size() < need) dv_.resize(need), cur_.resize(need);
    int* dv = dv_.data();
    const int* T = lists + lb_[tf];
    const int* N = lists + lb_[nf];
    for (int e = 0; e < len; ++e) {
      const int x = s.list_begin + e;
      int d = 0;
      if (cls_[x] & (kRel | kMirror)) {
        const int tk = groups_[tg_[x]].key;
        if (tmpl_first_[tk] < 0) return fail("a template references a phase with no template");
        d = (cls_[x] & kBuf) ? pbuf_[tk] : pop_[tk];
        if (!ascending_[tk]) d = -d;
        // A mirror's targets between the template's and the next period's (one period below it) must lie
        // in the checked blocks' images and copies, laid out one period after the other.
        if (cls_[x] & kMirror) {
          const int lt = groups_[tg_[x]].layer;
          if (lt - k < lo_ || lt >= hi_)
            return fail("a mirror reference of " + where(op_of_entry(tf + (x >= groups_[tf].list_end ? 1 : 0), x)) +
                        " names block " + std::to_string(lt) + ", away from the checked blocks");
          d = -d;
        }
      }
      if (N[e] != T[e] + (n + 1) * d)
        return fail("a reference of " + where(op_of_entry(tf + (x >= groups_[tf].list_end ? 1 : 0), x)) +
                    " does not move with the copies");
      dv[e] = d;
    }
    // Copy j lies at jj = j (ascending) or n-1-j (descending) periods into the block of copies.
    const int jj0 = ascending_[key] ? 0 : n - 1;
    copy_n(cur_.data(), T, len);
    for (int j = 0; j < n; ++j) step_copy(cur_.data(), dv, lists + cb_list_[key] + (jj0 + (ascending_[key] ? j : -j)) * len, len);
    // Records: the template's with their list positions moved.
    OpRec* r = ops + cb_op_[key];
    copy_n(r, ops + ob_[tf], nops);
    replicate(r, nops, n - 1);
    for (int jj = 0; jj < n; ++jj) move_lists(r + jj * nops, nops, cb_list_[key] + jj * len - lb_[tf]);
    // Costs and buffers: the template's, in every copy.
    TimeNs* g = costs.gpu_ns.data() + cb_op_[key];
    TimeNs* c = costs.cpu_ns.data() + cb_op_[key];
    CompiledBuffer* b = out.buffers.data() + cb_buf_[key];
    copy_n(g, src_->costs->gpu_ns.data() + s.op_begin, nops);
    copy_n(c, src_->costs->cpu_ns.data() + s.op_begin, nops);
    copy_n(b, sbuf_.data() + s.buf_begin, nbufs);
    replicate(g, nops, n - 1);
    replicate(c, nops, n - 1);
    replicate(b, nbufs, n - 1);
  }
  return true;
}

// Step 3 (see the top): copies 1..m of micro-batch P's image.
void Stretcher::emit_micro_batches(CompiledProgram& out, OpCosts& costs) {
  OpRec* ops = out.ops.data();
  int* lists = out.lists.data();
  const int op0 = ob_[gP_begin_], buf0 = bb_[gP_begin_], list0 = lb_[gP_begin_];
  // Each entry's move per micro-batch: one micro-batch for kMbRel entries, none for the others, in the
  // result's order (P's groups, with the copies next to their templates).
  if (dm_.size() < static_cast<std::size_t>(pm_lists_)) dm_.resize(pm_lists_);
  if (cur_.size() < static_cast<std::size_t>(pm_lists_)) cur_.resize(pm_lists_);
  int* dm = dm_.data();
  int pos = 0;
  const auto add = [&](int x) { dm[pos++] = (cls_[x] & kMbRel) ? ((cls_[x] & kBuf) ? pm_bufs_ : pm_ops_) : 0; };
  const auto add_copies = [&](int key) {
    const Group& a = groups_[tmpl_first_[key]];
    const Group& z = groups_[tmpl_last_[key]];
    for (int j = 0; j < sh_.copies; ++j)
      for (int x = a.list_begin; x < z.list_end; ++x) add(x);
  };
  for (int g = gP_begin_; g < gP_end_; ++g) {
    const Group& s = groups_[g];
    const bool tm = is_tmpl(s);
    if (tm && !ascending_[s.key] && g == tmpl_first_[s.key]) add_copies(s.key);
    if (!s.run) {
      for (int x = s.list_begin; x < s.list_end; ++x) add(x);
    } else {
      for (int i = s.op_begin; i < s.op_end; ++i) {
        if (run_at_[i] < 0) {
          for (int x = srec_[i].wait_pos; x < srec_[i].end; ++x) add(x);
          continue;
        }
        const int* hd = runs_.data() + run_at_[i];
        const int len = hd[0] + hd[1] + hd[2] + hd[3];
        for (int a = 0; a < len; ++a) add(runs_src_[run_at_[i] + 4 + a]);
      }
    }
    if (tm && ascending_[s.key] && g == tmpl_last_[s.key]) add_copies(s.key);
  }
  copy_n(cur_.data(), lists + list0, pm_lists_);
  for (int m = 1; m <= sh_.mb_copies; ++m) step_copy(cur_.data(), dm, lists + list0 + m * pm_lists_, pm_lists_);
  // Records: P's with their list positions moved; costs and buffers: P's.
  replicate(ops + op0, pm_ops_, sh_.mb_copies);
  for (int m = 1; m <= sh_.mb_copies; ++m) move_lists(ops + op0 + m * pm_ops_, pm_ops_, m * pm_lists_);
  replicate(costs.gpu_ns.data() + op0, pm_ops_, sh_.mb_copies);
  replicate(costs.cpu_ns.data() + op0, pm_ops_, sh_.mb_copies);
  replicate(out.buffers.data() + buf0, pm_bufs_, sh_.mb_copies);
}

// The periodic runs: per phase key, the template and its copies (one after the other in the result),
// in every micro-batch copy too; and micro-batches P-R .. P and P's copies.
void Stretcher::fill_runs(CompiledProgram& out) const {
  out.runs.clear();
  if (mbs_ && pm_ops_ > 0)
    out.runs.push_back(PeriodicRun{ob_[mb_first_[sh_.mb_template - mb_reach_]], pm_ops_, sh_.mb_copies + 1 + mb_reach_});
  if (layers_) {
    // A key's run: its copies and the source blocks checked periodic around them, whole periods
    // aligned with the template (layers [l0, l1) of the source), one after the other in the result
    // (the timing fast-forward finds a period a little before the copies as often as in them).
    const int k = sh_.period;
    const int l0 = sh_.first - k * ((sh_.first - lo_) / k), l1 = split_ + k * ((hi_ - split_) / k);
    for (int key = 0; key < num_keys_; ++key) {
      const int tf = tmpl_first_[key];
      if (tf < 0 || pop_[key] <= 0) continue;
      const int* row = blk_.data() + static_cast<std::size_t>(key) * src_layers_;
      const int edge = ascending_[key] ? row[l0] : row[l1 - 1];
      int begin, count;
      if (edge >= 0) {
        begin = ob_[edge];
        count = sh_.copies + (l1 - l0) / k;
      } else {
        // ascending: template, then copies 0..n-1; descending: copies n-1..0, then the template
        begin = ascending_[key] ? ob_[tf] : cb_op_[key];
        count = sh_.copies + 1;
      }
      out.runs.push_back(PeriodicRun{begin, pop_[key], count});
      if (mbs_ && groups_[tf].mb == sh_.mb_template)
        for (int m = 1; m <= sh_.mb_copies; ++m) out.runs.push_back(PeriodicRun{begin + m * pm_ops_, pop_[key], count});
    }
  }
  // By begin; a run holding another (same begin) first.
  std::sort(out.runs.begin(), out.runs.end(), [](const PeriodicRun& x, const PeriodicRun& y) {
    return x.begin != y.begin ? x.begin < y.begin : x.period * x.count > y.period * y.count;
  });
}

// The result's ops as source op ranges (StretchInfo): each source group's, each block of copies as the
// template period `copies` times; contiguous ranges merged.
void Stretcher::fill_info(StretchInfo& info) const {
  info.spans.clear();
  info.mb_begin = info.mb_end = 0;
  info.mb_repeat = 1;
  int fresh = 0;   // spans before it are closed (micro-batch P's first and last)
  const auto add = [&](int b, int e, int repeat, int copies) {
    if (e <= b) return;
    if (repeat == 1 && copies == 0 && static_cast<int>(info.spans.size()) > fresh && info.spans.back().repeat == 1 &&
        info.spans.back().copies == 0 && info.spans.back().end == b)
      info.spans.back().end = e;
    else
      info.spans.push_back(StretchInfo::Span{b, e, repeat, copies});
  };
  const int G = static_cast<int>(groups_.size());
  for (int g = 0; g < G; ++g) {
    const Group& x = groups_[g];
    if (mbs_ && g == gP_begin_) info.mb_begin = fresh = static_cast<int>(info.spans.size());
    const bool tm = is_tmpl(x);
    const auto copies = [&]() {
      add(groups_[tmpl_first_[x.key]].op_begin, groups_[tmpl_last_[x.key]].op_end, sh_.copies, ascending_[x.key] ? 1 : -1);
    };
    if (tm && !ascending_[x.key] && g == tmpl_first_[x.key]) copies();
    add(x.op_begin, x.op_end, 1, 0);
    if (tm && ascending_[x.key] && g == tmpl_last_[x.key]) copies();
    if (mbs_ && g == gP_end_ - 1) {
      info.mb_end = fresh = static_cast<int>(info.spans.size());
      info.mb_repeat = sh_.mb_copies + 1;
    }
  }
}

bool Stretcher::run(const StretchSource& s, const StretchShape& sh, CompiledProgram& out, OpCosts& costs,
                    StretchInfo* info, std::string* why) {
  src_ = &s;
  sh_ = sh;
  mb_refused_ = false;
  reach_refused_ = -1;
  const auto done = [&](bool ok) {
    if (!ok && why) *why = why_;
    if (!ok && info) info->micro_batches_refused = mb_refused_, info->reach = reach_refused_;
    return ok;
  };
  layers_ = sh.copies > 0;
  mbs_ = sh.mb_template >= 0;
  if (!layers_ && !mbs_) return done(fail("nothing to stretch"));
  if (!build_groups()) return done(false);
  if (layers_) {
    if (!plan_layers()) return done(false);
  } else {
    split_ = shift_ = 0;
    new_layers_ = src_layers_;
    tmpl_first_.assign(num_keys_, -1);
    tmpl_last_.assign(num_keys_, -1);
  }
  if ((mbs_ && !plan_micro_batches()) || !layout_ids() || !read_source()) return done(false);
  if ((layers_ && !analyse_layers()) || (mbs_ && !analyse_micro_batches()) || !map_entries() || !layout_lists())
    return done(false);
  out.num_streams = static_cast<int>(src_->program->streams.size());
  out.ops.resize(static_cast<std::size_t>(n_new_ops_) + 1);
  out.lists.resize(static_cast<std::size_t>(n_new_lists_));
  out.buffers.resize(static_cast<std::size_t>(n_new_bufs_));
  costs.gpu_ns.resize(n_new_ops_);
  costs.cpu_ns.resize(n_new_ops_);
  costs.overlap_slowdown = src_->costs->overlap_slowdown;
  costs.launch_queue_depth = src_->costs->launch_queue_depth;
  emit_own(out, costs);
  if (layers_ && !emit_copies(out, costs)) return done(false);
  if (mbs_) emit_micro_batches(out, costs);
  out.ops[n_new_ops_] = OpRec{};

  // Bytes sent: the source's, each template's once more per copy, micro-batch P's (so stretched) once
  // more per micro-batch copy.
  std::int64_t total[3] = {0, 0, 0}, tmpl[3] = {0, 0, 0}, tmpl_p[3] = {0, 0, 0}, in_p[3] = {0, 0, 0};
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g) {
    const bool tm = is_tmpl(groups_[g]);
    const bool is_p = mbs_ && g >= gP_begin_ && g < gP_end_;
    for (int k = 0; k < 3; ++k) {
      total[k] += gsent_[g][k];
      if (tm) tmpl[k] += gsent_[g][k];
      if (tm && is_p) tmpl_p[k] += gsent_[g][k];
      if (is_p) in_p[k] += gsent_[g][k];
    }
  }
  for (int k = 0; k < 3; ++k)
    out.comm_sent[k] = total[k] + sh_.copies * tmpl[k] +
                       (mbs_ ? static_cast<std::int64_t>(sh_.mb_copies) * (in_p[k] + sh_.copies * tmpl_p[k]) : 0);
  out.notes = src_->program->notes;
  // (one request per distinct size: the inserted blocks' are the template's, already there)
  out.init_scratch = src_->program->init_scratch;
  // (the root's shard is a persistent buffer of the root unit, laid out before every block's: its id stays)
  out.init_flatten_world = src_->program->init_flatten_world;
  out.init_flatten_last = src_->program->init_flatten_last;
  out.init_originals = src_->program->init_originals;   // (named by index: the copies' buffers name the template's)
  out.init_offloaded = src_->program->init_offloaded;
  out.loop_setup = src_->program->loop_setup;   // (it names buffers by their order among after_construction ones)
  // Whether memory waits on GPU work somewhere (a free with record_stream): the copies repeat the
  // source's frees, so the source tells.
  out.record_stream_frees = false;
  for (const Op& op : src_->program->ops)
    for (const FreeSpec& f : op.frees) out.record_stream_frees = out.record_stream_frees || f.reuse_after_op >= 0;
  fill_runs(out);
  if (info) fill_info(*info);
  return done(true);
}

}  // namespace

bool stretch_program(const StretchSource& src, const StretchShape& shape, CompiledProgram& out, OpCosts& out_costs,
                     StretchInfo* info, std::string* why, Workspace* ws) {
  return with_storage<Stretcher>(ws, 
      [&](Stretcher& st) { return st.run(src, shape, out, out_costs, info, why); });
}

}  // namespace fsdpsim::sim

// sim/peak_location.h: describing the op at a memory peak.
#include "sim/peak_location.h"

#include <stdexcept>
#include <string>

namespace fsdpsim::sim {

namespace {
bool is_optimizer(OpKind k) { return k == OpKind::OptimizerStep || k == OpKind::CpuOptimizerStep; }

void start_of_step(PeakLocation& loc) {
  loc.kind.clear();
  loc.name.clear();
  loc.unit = -1;
  loc.micro_batch = -1;
  loc.phase = "start";
}
}  // namespace

PhaseIndex phase_index(const StepProgram& p) {
  PhaseIndex ix;
  const int n = static_cast<int>(p.ops.size());
  for (int i = n - 1; i >= 0; --i) {
    const Op& o = p.ops[static_cast<std::size_t>(i)];
    if (is_optimizer(o.kind)) ix.first_optimizer = i;
    if (o.kind != OpKind::Forward) continue;
    if (ix.last_forward < 0) ix.last_forward = i;
    if (o.micro_batch < 0) continue;
    const std::size_t mb = static_cast<std::size_t>(o.micro_batch);
    if (mb >= ix.last_forward_of.size()) ix.last_forward_of.resize(mb + 1, -1);
    if (ix.last_forward_of[mb] < 0) ix.last_forward_of[mb] = i;
  }
  return ix;
}

const char* op_phase(const StepProgram& p, const PhaseIndex& ix, int op) {
  if (op < 0) return "start";
  if (ix.first_optimizer >= 0 && op >= ix.first_optimizer) return "optimizer";
  const int mb = p.ops[static_cast<std::size_t>(op)].micro_batch;
  const int last = mb < 0 ? ix.last_forward
                          : (static_cast<std::size_t>(mb) < ix.last_forward_of.size() ? ix.last_forward_of[static_cast<std::size_t>(mb)] : -1);
  return op <= last ? "forward" : "backward";
}

void describe_peaks(const StepProgram& p, std::initializer_list<PeakLocation*> locs) {
  const PhaseIndex ix = phase_index(p);
  for (PeakLocation* loc : locs) {
    if (loc->op < 0) {
      start_of_step(*loc);
      continue;
    }
    if (loc->op >= static_cast<int>(p.ops.size()))
      throw std::logic_error("describe_peaks: op " + std::to_string(loc->op) + " of a program of " +
                             std::to_string(p.ops.size()) + " ops");
    const Op& o = p.ops[static_cast<std::size_t>(loc->op)];
    loc->kind = op_kind_name(o.kind);
    loc->name = o.name;
    loc->unit = o.unit;
    loc->micro_batch = o.micro_batch;
    loc->phase = op_phase(p, ix, loc->op);
  }
}

namespace {

// Walks the stretched program's ops as StretchInfo lays them out (spans [0, mb_begin) once, [mb_begin,
// mb_end) mb_repeat times, the rest once; each span its source ops `repeat` times over) to the one
// that op x is. Units: a copy r of the template moves the units of blocks by whole periods (ascending
// phases: r + 1 periods; descending: repeat - r); the source's own ops move them by all the copies when
// they lie behind the template in layer order: after the copies of an ascending phase and before those
// of a descending one (the head and the loss between the forward and the backward of one micro-batch).
void describe_stretched(const StretchedOps& s, const PhaseIndex& ix, PeakLocation& loc) {
  if (loc.op < 0) return start_of_step(loc);
  const StretchInfo& info = *s.info;
  const int num_spans = static_cast<int>(info.spans.size());
  const int inserted = s.tmpl_units * s.copies;
  int pos = 0;
  bool behind = false;   // own ops here lie behind the template (in layer order)
  const auto walk = [&](int from, int to, int q) {
    for (int i = from; i < to; ++i) {
      const StretchInfo::Span& sp = info.spans[static_cast<std::size_t>(i)];
      if (sp.copies > 0) behind = true;
      const int len = sp.end - sp.begin, total = len * sp.repeat;
      if (loc.op < pos + total) {
        const int r = (loc.op - pos) / len, src = sp.begin + (loc.op - pos) % len;
        const Op& o = s.source->ops[static_cast<std::size_t>(src)];
        loc.kind = op_kind_name(o.kind);
        loc.name.clear();
        loc.phase = op_phase(*s.source, ix, src);
        loc.micro_batch = o.micro_batch;
        const int u = o.unit;
        const bool block = u >= 0 && u < static_cast<int>(s.block_unit.size()) && s.block_unit[static_cast<std::size_t>(u)];
        if (u < 0) {
          loc.unit = -1;
        } else if (!block) {
          loc.unit = u < s.tmpl_units_end ? u : u + inserted;
        } else if (sp.copies > 0) {
          loc.unit = u + s.tmpl_units * (r + 1);
        } else if (sp.copies < 0) {
          loc.unit = u + s.tmpl_units * (sp.repeat - r);
        } else {
          loc.unit = behind ? u + inserted : u;
        }
        return q;
      }
      if (sp.copies < 0) behind = false;
      pos += total;
    }
    return -1;
  };
  // q: which copy of the template micro-batch (-1: not found in that range)
  int q = walk(0, info.mb_begin, 0);
  int region = 0;   // 0 before the micro-batch copies, 1 inside them, 2 after
  if (q < 0) {
    region = 1;
    for (int m = 0; m < info.mb_repeat && q < 0; ++m) q = walk(info.mb_begin, info.mb_end, m);
  }
  if (q < 0) {
    region = 2;
    q = walk(info.mb_end, num_spans, 0);
  }
  if (q < 0)
    throw std::logic_error("describe_peaks: op " + std::to_string(loc.op) + " is past the stretched program's ops");
  if (loc.micro_batch >= 0) {
    if (region == 1) loc.micro_batch += q;
    else if (region == 2) loc.micro_batch += info.mb_repeat - 1;
  }
}

}  // namespace

void describe_peaks(const StretchedOps& s, std::initializer_list<PeakLocation*> locs) {
  const PhaseIndex ix = phase_index(*s.source);
  for (PeakLocation* loc : locs) describe_stretched(s, ix, *loc);
}

}  // namespace fsdpsim::sim

// Where a memory peak is (SimResult::PeakLocation): the op whose allocation set it, described as the
// program names it — kind, name, FSDP unit, micro-batch and phase. The executor knows only op ids; the
// caller that has the program fills in the rest: from the StepProgram itself, or, for a stretched
// program (sim/stretch.h), from the shorter source it was written out from.
#pragma once
#include <initializer_list>
#include <vector>

#include "program/sim_result.h"
#include "program/step_program.h"
#include "sim/stretch.h"

namespace fsdpsim::sim {

// The phase of op `op` of `p`, from its kind and place: "optimizer" for the optimizer step and every op
// after the first one; else "forward" while a forward compute op of its micro-batch (of any micro-batch,
// for an op outside them) is still to come, at or after it; else "backward" (recompute, the backward
// prefetch, the post-backward reductions). "start" for op -1. PhaseIndex holds what that reads, from one
// pass over the ops.
struct PhaseIndex {
  int first_optimizer = -1;        // -1: none
  int last_forward = -1;           // of any micro-batch
  std::vector<int> last_forward_of;   // per micro-batch
};
PhaseIndex phase_index(const StepProgram& p);
const char* op_phase(const StepProgram& p, const PhaseIndex& ix, int op);

// Fills each location's kind, name, unit, micro_batch and phase from its op of `p` (op -1: the step's start).
void describe_peaks(const StepProgram& p, std::initializer_list<PeakLocation*> locs);

// A stretched program's ops as ops of its source. The units of a copy of the template period are the
// template's moved by whole periods: `tmpl_units` units per period (the source's units whose block lies in
// the template period end before `tmpl_units_end`), `copies` periods inserted; units that hold no block
// (root, embedding, final norm and head) keep their place before the template or move behind the copies.
struct StretchedOps {
  const StepProgram* source = nullptr;
  const StretchInfo* info = nullptr;
  int copies = 0;                     // StretchShape::copies
  int tmpl_units = 0;                 // units per template period
  int tmpl_units_end = 0;             // one past the template's last unit (in the source)
  std::vector<char> block_unit;       // per source unit: it holds transformer blocks
};
// Fills each location from the source op that its op of the stretched program copies: its kind and phase,
// the unit and micro-batch the copy has in the full program; no name (the source's would name another block).
void describe_peaks(const StretchedOps& s, std::initializer_list<PeakLocation*> locs);

}  // namespace fsdpsim::sim

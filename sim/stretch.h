// The stretch: the compiled program (sim/compiled_program.h) of a model with L layers and G
// micro-batches, built from the lowering of the same model with L' = L - n*k layers and G' = G - m
// micro-batches by inserting n copies of one k-layer period and m copies of one micro-batch.
//
// Why this is the program the lowering would build for L layers. The lowering (program/lower_fsdp*.cpp)
// walks the transformer blocks one after the other in each phase (persistent state, each micro-batch's
// forward and backward), and with its sites (lowering::Builder::site) every op and buffer records at
// which micro-batch and block it was created. Blocks are identical (a ModelSpec has one block shape), so
// away from the first and last blocks the ops and buffers created at block l+k are those created at
// block l, with every reference moved by the same k blocks: the program is periodic there, and a longer
// model only has more periods. stretch_program checks that periodicity on the source itself, for the
// template period and its neighbours on both sides, in every phase: the same ops (stream, kind flags,
// NCCL group, durations), the same buffers (bytes, pool, category) and every reference of the same shape
// (to the same op or buffer outside the blocks, to the same op or buffer of the block so many blocks
// away, or of the block as far from the other end: FSDP1's rate limiter makes a forward wait on the
// previous backward's events in the order that backward freed the blocks). It then inserts the copies
// after the template (before it in phases that walk the blocks backwards), maps each reference by its
// shape, and extends the lists that name one op or buffer per block (the held all-reduce outputs freed
// at the end of backward, the offload syncs).
//
// Micro-batches likewise: the lowering runs the same forward and backward for every micro-batch; only
// the first few (the first gradients, the no_sync accumulations the first allocates, what the first
// micro-batches hand on) and the last (the gradient sync of no_sync, the optimizer step after it) differ,
// and what one micro-batch hands the next is the streams' last work and the rate limiter's queued
// events, which the next one names relative to itself. The source has a template micro-batch P (the
// fourth with grad_sync, the third without, whose last then syncs) and checks it against the R
// micro-batches before it that its references reach, like periods of blocks: the same groups, ops,
// buffers, and every reference either to the same op or buffer (outside the micro-batches, or one of an
// earlier micro-batch that both name, such as the no_sync gradient the first allocated) or to the same
// place one micro-batch later. Copies of P then follow P. A later micro-batch's reference into the last
// R micro-batches up to P names the last copies; one that reaches over them to an earlier micro-batch
// names that one (the repeating micro-batches never name it: were it handed on by them it would be theirs).
//
// It refuses (returns false, saying why) whatever it cannot map that way; the caller then lowers a
// longer source or the whole model. tests/sim/test_stretch.cpp compares the result with the compiled
// program of the full lowering, op by op and buffer by buffer, over the zoo and random plans.
#pragma once
#include <string>
#include <vector>

#include "sim/compiled_program.h"
#include "sim/executor.h"
#include "program/lower_context.h"

namespace fsdpsim::sim {

// The lowering of the shorter model, with what the stretch reads of it. The stretch runs the program
// checks of compile_program on it (refusing a source that fails them: the whole lowering then throws).
struct StretchSource {
  const StepProgram* program = nullptr;                     // lowered with Context::sites
  const std::vector<lowering::SiteGroup>* sites = nullptr;  // its site groups
  const OpCosts* costs = nullptr;                           // its op costs
};

struct StretchShape {
  int period = 1;        // k: layers per repeated period
  int first = 0;         // the template period's first layer, in the source
  int copies = 0;        // n: periods inserted (the result has n*k more layers; 0: layers as in the source)
  int mb_template = -1;  // P: the micro-batch copied (>= 2: P-1 is checked against it; -1: none)
  int mb_copies = 0;     // micro-batches inserted after P
};

// What the caller needs besides the program: the result's ops, in order, as ranges of the source's ops
// they copy (a sum over the result's ops in its order, e.g. of FLOPs, can be taken from the source):
// spans[0, mb_begin), then spans[mb_begin, mb_end) mb_repeat times, then the rest, each span its source
// ops [begin, end) `repeat` times over.
struct StretchInfo {
  struct Span {
    int begin = 0, end = 0, repeat = 1;
    // Copies of the template period (sim/peak_location.h maps their units): +1 in a phase walking the
    // blocks in ascending order (copy r is the (r+1)-th period after the template), -1 descending (copy r
    // the (repeat-r)-th), 0 the source's own ops. Spans of copies are never merged with others.
    int copies = 0;
  };
  std::vector<Span> spans;
  int mb_begin = 0, mb_end = 0, mb_repeat = 1;
  bool micro_batches_refused = false;           // (on refusal) the micro-batch dimension was the reason
  int reach = -1;                               // (on refusal) the references' reach, where too long
};

// Fills `out` and `out_costs` (storage reused) with the stretched program; false (with the reason in
// *why) if the source is not periodic around the templates or has a reference the stretch cannot map.
// Its working storage is kept in `ws` (sim/workspace.h; null: this call allocates its own).
bool stretch_program(const StretchSource& src, const StretchShape& shape, CompiledProgram& out, OpCosts& out_costs,
                     StretchInfo* info = nullptr, std::string* why = nullptr, Workspace* ws = nullptr);

}  // namespace fsdpsim::sim

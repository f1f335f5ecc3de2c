// The stretch: the compiled program (sim/compiled_program.h) of a model with L layers, built from
// the lowering of the same model with L' = L - n*k layers by inserting n copies of one k-layer period.
//
// Why this is the program the lowering would build for L layers. The lowering (sim/lower_fsdp*.cpp)
// walks the transformer blocks one after the other in each phase (persistent state, each micro-batch's
// forward and backward), and with its sites (lowering::Builder::site) every op and buffer records at
// which block it was created. Blocks are identical (a ModelSpec has one block shape), so away from the
// first and last blocks the ops and buffers created at block l+k are those created at block l, with
// every reference moved by the same k blocks: the program is periodic there, and a longer model only
// has more periods. stretch_program checks that periodicity on the source itself, for the template
// period and its neighbours on both sides, in every phase: the same ops (stream, kind flags, NCCL
// group, durations), the same buffers (bytes, pool, category) and every reference of the same shape
// (to the same op or buffer outside the blocks, or to the same op or buffer of the block so many
// blocks away). It then inserts the copies after the template (before it in phases that walk the
// blocks backwards), maps each reference by its shape, and extends the lists that name one op or
// buffer per block (the held all-reduce outputs freed at the end of backward, the offload syncs).
// It refuses (returns false, saying why) whatever it cannot map that way; the caller then lowers
// the whole model. tests/sim/test_stretch.cpp compares the result with the compiled program of the
// full lowering, op by op and buffer by buffer, over the zoo and random plans.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "sim/compiled_program.h"
#include "sim/executor.h"
#include "sim/lower_context.h"

namespace fsdpsim::sim {

// The lowering of the shorter model, with what the stretch reads of it.
struct StretchSource {
  const StepProgram* program = nullptr;                     // lowered with Context::sites
  const std::vector<lowering::SiteGroup>* sites = nullptr;  // its site groups
  const CompiledProgram* compiled = nullptr;                // compile_program(*program)
  const OpCosts* costs = nullptr;                           // its op costs
};

struct StretchShape {
  int period = 1;    // k: layers per repeated period
  int first = 0;     // the template period's first layer, in the source
  int copies = 0;    // n: periods inserted (the result has n*k more layers)
};

// What the caller needs besides the program: the result's ops, in order, as ranges of the source's ops
// they copy (a sum over the result's ops in its order, e.g. of FLOPs, can be taken from the source).
struct StretchInfo {
  std::vector<std::pair<int, int>> op_ranges;   // [begin, end) of source ops, one per group of the result
};

// Fills `out` and `out_costs` (storage reused) with the stretched program; false (with the reason in
// *why) if the source is not periodic around the template or has a reference the stretch cannot map.
bool stretch_program(const StretchSource& src, const StretchShape& shape, CompiledProgram& out, OpCosts& out_costs,
                     StretchInfo* info = nullptr, std::string* why = nullptr);

}  // namespace fsdpsim::sim

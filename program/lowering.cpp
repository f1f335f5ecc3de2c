// FSDP lowering front door: validates the inputs the lowering relies on and dispatches to the FSDP1
// or FSDP2 lowering (program/lower_fsdp1.cpp, program/lower_fsdp2.cpp; shared parts in program/lower_context.*).
#include "program/lowering.h"

#include <memory>
#include <string>

#include "common/errors.h"
#include "program/lower_context.h"

namespace fsdpsim::sim {

namespace lowering {

namespace {
// `lower` on a Context made for these inputs. The Context's ~20 vectors (per unit, per segment) are
// rebuilt for every plan: a caller's OpRecycler keeps their storage from one lowering to the next
// instead of allocating and freeing them every time. make_context clears or assigns every vector, so
// only capacity carries over. (A nested lowering with the same recycler gets a fresh Context.)
template <typename Lower>
StepProgram with_context(const models::ModelSpec& model, const models::WrapGraph& graph, const Plan& plan,
                         const Topology& topo, OpRecycler* recycler, Lower lower) {
  if (topo.world < 1) throw InputError("cluster.gpus", std::to_string(topo.world), "expected at least 1 GPU");
  if (topo.gpus_per_node < 1)
    throw InputError("cluster.gpus_per_node", std::to_string(topo.gpus_per_node), "expected at least 1");
  if (model.n_layers < 0) throw InputError("model.n_layers", std::to_string(model.n_layers), "expected >= 0");
  Context c;
  const bool reuse = recycler && !recycler->spare_in_use;
  if (reuse) {
    if (!recycler->spare) recycler->spare = std::make_unique<Context>();
    swap_storage(c, *recycler->spare);
    recycler->spare_in_use = true;
  }
  struct GiveBack {
    Context& c;
    OpRecycler* r;
    ~GiveBack() {
      if (r) swap_storage(c, *r->spare), r->spare_in_use = false;
    }
  } give_back{c, reuse ? recycler : nullptr};
  c.recycler = recycler;
  make_context(c, model, graph, plan, topo);
  return lower(c);
}

StepProgram dispatch(const Context& c) {
  return c.plan->fsdp_version == FsdpVersion::FSDP1 ? lower_fsdp1(c) : lower_fsdp2(c);
}
}  // namespace

StepProgram lower_with(const models::ModelSpec& model, const models::WrapGraph& graph, const Plan& plan,
                       const Topology& topo, OpRecycler* recycler, bool full) {
  return with_context(model, graph, plan, topo, recycler, [&](Context& c) {
    c.full = full;
    return dispatch(c);
  });
}

StepProgram lower_for_stretch(const models::ModelSpec& model, const models::WrapGraph& graph, const Plan& plan,
                              const Topology& topo, OpRecycler* recycler, std::vector<SiteGroup>& sites, int first,
                              int period, int copies, int micro_batches) {
  return with_context(model, graph, plan, topo, recycler, [&](Context& c) {
    // (only the loop runs fewer micro-batches: the step's facts, e.g. tokens_per_rank, stay the plan's)
    if (micro_batches > 0) c.micro_batches = micro_batches;
    StepTotals totals = step_totals(c);
    for (int u = 0; u < static_cast<int>(c.sizes.size()); ++u) {
      const int l = unit_site_layer(c, u);
      if (l < first || l >= first + period) continue;
      add_unit_step_totals(c, u, copies, totals);
    }
    c.full = false;
    c.sites = &sites;
    c.step_totals = &totals;
    return dispatch(c);
  });
}

}  // namespace lowering

StepProgram lower(const models::ModelSpec& model, const models::WrapGraph& graph, const Plan& plan,
                  const Topology& topo) {
  return lowering::lower_with(model, graph, plan, topo, nullptr);
}

}  // namespace fsdpsim::sim

// simulate() (sim/simulator.h): resolve the plan for the cluster, build the wrap graph, lower to a
// StepProgram, execute it against the profile's costs, and derive the user-facing figures: fits,
// tokens/s per GPU, MFU (design.md "Units and numbers": against the dense peak of the compute dtype).
#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "common/errors.h"
#include "models/kernels.h"
#include "models/wrap_graph.h"
#include "sim/executor.h"
#include "sim/lower_context.h"
#include "sim/lowering.h"
#include "sim/profile_cost_model.h"

namespace fsdpsim::sim {

namespace {

bool is_compute(OpKind k) { return k == OpKind::Forward || k == OpKind::Backward || k == OpKind::Recompute; }

// build_wrap_graph builds the whole module tree with its names (~20% of a simulate() for llama3-70b),
// yet a planner simulates thousands of plans of one model with a handful of wrap policies. Each thread
// keeps its most recent graphs, keyed by the full ModelSpec (after with_seq_len) and WrapPolicy
// compared field by field, so a hit is exactly the graph build_wrap_graph would return. Thread-local:
// no locking, and simulate() stays free of shared mutable state.
std::shared_ptr<const models::WrapGraph> wrap_graph_for(const models::ModelSpec& m, const models::WrapPolicy& policy) {
  struct Entry {
    models::ModelSpec model;
    models::WrapPolicy policy;
    std::shared_ptr<const models::WrapGraph> graph;
  };
  constexpr std::size_t kEntries = 4;   // a search alternates between a few wrap policies
  thread_local std::vector<Entry> cache;
  for (std::size_t i = 0; i < cache.size(); ++i) {
    if (cache[i].policy == policy && cache[i].model == m) {
      std::rotate(cache.begin(), cache.begin() + static_cast<std::ptrdiff_t>(i),
                  cache.begin() + static_cast<std::ptrdiff_t>(i) + 1);   // most recent first
      return cache.front().graph;
    }
  }
  auto g = std::make_shared<const models::WrapGraph>(models::build_wrap_graph(m, policy));
  if (cache.size() == kEntries) cache.pop_back();
  cache.insert(cache.begin(), Entry{m, policy, g});
  return g;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

SimResult simulate(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const Plan& plan,
                   const SimOptions& opts) {
  if (!(opts.memory_margin >= 0.0 && opts.memory_margin < 1.0))
    throw InputError("memory_margin", fmt("%g", opts.memory_margin), "a fraction in [0, 1)");
  const calibrate::Cluster& cluster = hw.cluster();
  const Plan rp = resolve_plan(plan, cluster.world(), cluster.gpus_per_node);
  // MPT-style models size their position table by the training sequence length (models/model_spec.h).
  const models::ModelSpec m = models::with_seq_len(model, rp.seq_len);
  const std::shared_ptr<const models::WrapGraph> graph = wrap_graph_for(m, rp.auto_wrap_policy);
  thread_local lowering::OpRecycler recycler;   // see OpRecycler: storage reused across calls
  // Without a trace the program is built for the simulator alone: no names (they label trace spans only; a
  // recycled op's old name is cleared) and no op inputs/outputs (only the runtimes read them).
  StepProgram prog = lowering::lower_with(m, *graph, rp, Topology{cluster.world(), cluster.gpus_per_node}, &recycler,
                                          /*full=*/opts.record_trace);

  const Bytes capacity = hw.memory_capacity();
  const Bytes context = hw.cuda_context_bytes();
  ProfileCostModel cost(hw);
  ExecOptions eo;
  eo.record_trace = opts.record_trace;
  eo.record_memory_timeline = opts.record_memory_timeline;
  // The caching allocator sees what is left after the CUDA context and NCCL's own buffers (M15).
  eo.memory_capacity = capacity > context ? capacity - context : 0;
  SimResult r = execute(prog, cost, eo);

  // ---- memory ----
  r.capacity = capacity;
  r.context_bytes = context;
  r.peak_total_device = r.peak_reserved + context;
  const double usable = static_cast<double>(capacity) * (1.0 - opts.memory_margin);
  r.fits = static_cast<double>(r.peak_total_device) <= usable;
  r.breakdown_at_peak[mem_category_name(MemCategory::CudaContext)] = context;

  // ---- throughput ----
  const int world = rp.mesh_replicate * rp.mesh_shard;
  const double tokens_per_rank = prog.tokens_per_rank > 0
                                     ? static_cast<double>(prog.tokens_per_rank)
                                     : static_cast<double>(rp.micro_batch * rp.seq_len * rp.grad_accum);
  r.tokens_per_step = tokens_per_rank * world;
  const double step_s = to_seconds(r.step_time_ns);
  r.tokens_per_s_per_gpu = step_s > 0 ? tokens_per_rank / step_s : 0.0;

  // ---- FLOPs and MFU ----
  r.model_flops_per_step_per_gpu =
      prog.model_flops_per_rank > 0 ? prog.model_flops_per_rank
                                    : models::flops_per_token(m, rp.seq_len).forward_backward * tokens_per_rank;
  double hw_flops = 0;
  {
    // Sum each shared kernel list once (a list's sum does not depend on where it is computed; the
    // per-op additions stay in op order). A program uses a handful of lists, remembered in a small array.
    std::pair<const std::vector<models::KernelDesc>*, double> seen[8];
    int n_seen = 0;
    for (const Op& op : prog.ops) {
      if (!is_compute(op.kind)) continue;
      const auto& ks = op.kernel_list();
      double flops = 0;
      int k = 0;
      while (k < n_seen && seen[k].first != &ks) ++k;
      if (k < n_seen) {
        flops = seen[k].second;
      } else {
        flops = models::total_flops(ks);
        if (n_seen < 8) seen[n_seen++] = {&ks, flops};
      }
      hw_flops += flops;
    }
  }
  lowering::recycle(prog, recycler);   // prog is not used past this point
  r.hardware_flops_per_step_per_gpu = hw_flops;
  // The compute dtype is param_dtype: an fp8 all-gather (fp8_all_gather) only changes what is
  // communicated, the matmuls still run at param_dtype in this model.
  r.peak_flops = hw.peak_flops(rp.param_dtype);
  r.peak_flops_dtype = std::string(dtype_name(rp.param_dtype));
  r.mfu = (step_s > 0 && r.peak_flops > 0) ? r.model_flops_per_step_per_gpu / (step_s * r.peak_flops) : 0.0;

  // ---- what the user must know about how these figures were obtained ----
  if (cost.overlap_slowdown() > 1.0)
    r.notes.push_back("compute and memory-bound kernels run " + fmt("%.2f", cost.overlap_slowdown()) +
                      "x slower while any collective runs (profile comm_overlap_slowdown); kernels on "
                      "different non-NCCL streams are assumed not to slow each other");
  const auto& ex = cost.extrapolations();
  if (!ex.empty()) {
    std::string line = "collective times extrapolated beyond the profile's measured/sourced range for " +
                       std::to_string(ex.size()) + " distinct quer" + (ex.size() == 1 ? "y" : "ies") + ": ";
    for (std::size_t i = 0; i < ex.size() && i < 4; ++i) line += (i ? "; " : "") + ex[i];
    if (ex.size() > 4) line += "; ...";
    r.notes.push_back(line);
  }
  if (!r.fits)
    r.notes.push_back("does not fit: peak reserved " + fmt("%.2f", to_gib(r.peak_reserved)) + " GiB + context " +
                      fmt("%.2f", to_gib(context)) + " GiB > " + fmt("%.2f", usable / static_cast<double>(kGiB)) +
                      " GiB usable");
  return r;
}

}  // namespace fsdpsim::sim

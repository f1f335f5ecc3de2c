// simulate() (sim/simulator.h): resolve the plan for the cluster, build the wrap graph, lower to a
// StepProgram, execute it against the profile's costs, and derive the user-facing figures: fits,
// tokens/s per GPU, MFU (design.md "Units and numbers": against the dense peak of the compute dtype).
#include "sim/simulator.h"

#include <stdexcept>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "models/kernels.h"
#include "models/wrap_graph.h"
#include "sim/executor.h"
#include "sim/host_memory.h"
#include "program/lower_context.h"
#include "program/lowering.h"
#include "sim/peak_location.h"
#include "sim/profile_cost_model.h"
#include "sim/stretch.h"
#include "sim/workspace.h"

namespace fsdpsim::sim {

namespace {

bool is_compute(OpKind k) { return k == OpKind::Forward || k == OpKind::Backward || k == OpKind::Recompute; }

// build_wrap_graph builds the whole module tree with its names (~20% of a simulate() for llama3-70b),
// yet a planner simulates thousands of plans of one model with a handful of wrap policies. A Simulator
// keeps its most recent graphs, keyed by the full ModelSpec (after with_seq_len) and WrapPolicy
// compared field by field, so a hit is exactly the graph build_wrap_graph would return.
struct WrapGraphCache {
  struct Entry {
    models::ModelSpec model;
    models::WrapPolicy policy;
    models::ModelImpl impl = models::ModelImpl::HF;
    std::shared_ptr<const models::WrapGraph> graph;
  };
  std::vector<Entry> entries;   // most recent first
};

std::shared_ptr<const models::WrapGraph> wrap_graph_for(WrapGraphCache& c, const models::ModelSpec& m,
                                                        const models::WrapPolicy& policy, models::ModelImpl impl) {
  // a search alternates between a few wrap policies, each with the stretch's shorter model (sim/stretch.h)
  constexpr std::size_t kEntries = 8;
  auto& cache = c.entries;
  for (std::size_t i = 0; i < cache.size(); ++i) {
    if (cache[i].policy == policy && cache[i].impl == impl && cache[i].model == m) {
      std::rotate(cache.begin(), cache.begin() + static_cast<std::ptrdiff_t>(i),
                  cache.begin() + static_cast<std::ptrdiff_t>(i) + 1);   // most recent first
      return cache.front().graph;
    }
  }
  auto g = std::make_shared<const models::WrapGraph>(models::build_wrap_graph(m, policy, impl));
  if (cache.size() == kEntries) cache.pop_back();
  cache.insert(cache.begin(), WrapGraphCache::Entry{m, policy, impl, g});
  return g;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Hardware FLOPs of ops [begin, end) added to `sum` one op at a time, in op order. Each shared kernel
// list's sum is computed once (it does not depend on where it is computed); a program uses a handful of
// lists, remembered in a small array.
struct FlopsSum {
  std::pair<const std::vector<models::KernelDesc>*, double> seen[8];
  int n_seen = 0;
  double sum = 0;
  void add(const StepProgram& prog, int begin, int end) {
    for (int i = begin; i < end; ++i) {
      const Op& op = prog.ops[i];
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
      sum += flops;
    }
  }
};

// The layers per repeated period of the program (sim/stretch.h) under this plan, or 0 if it has no
// regular period: every unit that holds whole blocks holds the same number of them, and every_k
// checkpointing repeats every k blocks.
int layer_period(const models::WrapGraph& g, const Plan& rp) {
  int per_unit = 0;
  for (std::size_t u = 1; u < g.units.size(); ++u) {
    const models::FsdpUnit& unit = g.units[u];
    if (lowering::block_unit_layer(unit) < 0) continue;
    const int n = static_cast<int>(unit.layers.size());
    if (per_unit != 0 && n != per_unit) return 0;
    per_unit = n;
  }
  const int every = rp.activation_checkpointing.mode == ActivationCheckpointing::Mode::EveryK
                        ? std::max(1, rp.activation_checkpointing.every_k)
                        : 1;
  return std::lcm(std::max(per_unit, 1), every);
}

// The wrap graph of the model with fewer layers must be the full one's with the template's units
// copied: the same units before the template, `copies` copies of its units, then the same units after.
// (Units are numbered in module order, blocks by layer.) first/period in layers.
bool units_line_up(const models::WrapGraph& full, const models::WrapGraph& small, int first, int period, int copies) {
  const auto same = [](const models::FsdpUnit& a, const models::FsdpUnit& b) {
    return a.params == b.params && a.parts == b.parts && a.layers.size() == b.layers.size() &&
           a.tensors.size() == b.tensors.size() && a.is_root == b.is_root;
  };
  std::vector<int> tmpl;
  for (std::size_t u = 0; u < small.units.size(); ++u) {
    const int l = lowering::block_unit_layer(small.units[u]);
    if (l >= first && l < first + period) tmpl.push_back(static_cast<int>(u));
  }
  if (tmpl.empty() || full.units.size() != small.units.size() + tmpl.size() * static_cast<std::size_t>(copies))
    return false;
  const int after = tmpl.back() + 1;   // the full graph has copies * |tmpl| more units from here
  const int extra = static_cast<int>(tmpl.size()) * copies;
  for (int u = 0; u < static_cast<int>(small.units.size()); ++u)
    if (!same(small.units[u], full.units[u < after ? u : u + extra])) return false;
  for (int i = 0; i < extra; ++i)
    if (!same(small.units[tmpl[i % tmpl.size()]], full.units[after + i])) return false;
  return true;
}

// The stretched program (sim/stretch.h) of `m` (its whole wrap graph `graph`) under the resolved plan,
// into the Simulator's storage below. Returns false (stats.refused says why) when the plan or the
// program does not allow it; the caller then lowers the whole model.
struct Stretched {
  lowering::OpRecycler recycler;
  std::vector<lowering::SiteGroup> sites;
  CompiledProgram program;
  OpCosts source_costs, costs;
  StretchInfo info;
  StepProgram a;                  // the lowering of the shorter model (recycled after use)
  std::vector<double> flops;      // the source's compute ops' hardware FLOPs, in op order
  std::vector<int> flops_at;      // per source op (and one past the last): its first entry in `flops`
  double hw_flops = 0;
  StretchedOps ops;               // the result's ops as the source's (peak locations)
};

// st.ops for a source with wrap graph g stretched by `shape` (sim/peak_location.h).
void map_ops(const models::WrapGraph& g, const StretchShape& shape, Stretched& st) {
  StretchedOps& o = st.ops;
  o.source = &st.a;
  o.info = &st.info;
  o.copies = shape.copies;
  o.tmpl_units = o.tmpl_units_end = 0;
  o.block_unit.assign(g.units.size(), 0);
  for (std::size_t u = 0; u < g.units.size(); ++u) {
    const int l = lowering::block_unit_layer(g.units[u]);
    if (l < 0) continue;
    o.block_unit[u] = 1;
    if (l >= shape.first && l < shape.first + shape.period) {
      ++o.tmpl_units;
      o.tmpl_units_end = static_cast<int>(u) + 1;
    }
  }
}

// Lowers the source (`model`, wrap graph `graph`, `micro_batches` micro-batches) and stretches it by
// `shape` into st.program / st.costs.
bool stretch_source(const models::ModelSpec& model, const models::WrapGraph& graph, const Plan& rp,
                    const Topology& topo, const CostModel& cost, const StretchShape& shape, int micro_batches,
                    Stretched& st, SimulateStats& stats, Workspace& ws) {
  ++stats.sources;
  lowering::recycle(st.a, st.recycler);
  st.a = lowering::lower_for_stretch(model, graph, rp, topo, &st.recycler, st.sites, shape.first, shape.period,
                                     shape.copies, micro_batches);
  fill_op_costs(st.a, cost, st.source_costs);
  const StretchSource src{&st.a, &st.sites, &st.source_costs};
  st.info.micro_batches_refused = false;
  st.info.reach = -1;
  return stretch_program(src, shape, st.program, st.costs, &st.info, &stats.refused, &ws);
}

// Hardware FLOPs of the stretched program: its ops' in its order (StretchInfo::spans), each the
// FLOPs of the source op it copies: the sum FlopsSum takes over the whole lowering, term by term.
double stretched_flops(Stretched& st) {
  const StepProgram& p = st.a;
  const int n = static_cast<int>(p.ops.size());
  st.flops.clear();
  st.flops_at.resize(static_cast<std::size_t>(n) + 1);
  FlopsSum one;
  for (int i = 0; i < n; ++i) {
    st.flops_at[i] = static_cast<int>(st.flops.size());
    if (!is_compute(p.ops[i].kind)) continue;
    one.sum = 0;
    one.add(p, i, i + 1);
    st.flops.push_back(one.sum);
  }
  st.flops_at[n] = static_cast<int>(st.flops.size());
  const double* f = st.flops.data();
  const int* at = st.flops_at.data();
  const auto& r = st.info.spans;
  double sum = 0;
  const auto add = [&](int from, int to) {
    for (int x = from; x < to; ++x)
      for (int rep = 0; rep < r[x].repeat; ++rep)
        for (int c = at[r[x].begin], e = at[r[x].end]; c < e; ++c) sum += f[c];
  };
  add(0, st.info.mb_begin);
  for (int m = 0; m < st.info.mb_repeat; ++m) add(st.info.mb_begin, st.info.mb_end);
  add(st.info.mb_end, static_cast<int>(r.size()));
  return sum;
}

bool build_stretched(const models::ModelSpec& m, const models::WrapGraph& graph, const Plan& rp, const Topology& topo,
                     const CostModel& cost, Stretched& st, WrapGraphCache& graphs, SimulateStats& stats,
                     Workspace& ws) {
  const int L = static_cast<int>(m.n_layers);
  // Micro-batches (sim/stretch.h): the source has the template P, the micro-batches before it that P's
  // references reach (checked against it), and what differs around them: the first micro-batch, and
  // without grad_sync the last (the sync). With grad_sync P is the fourth: micro-batch 1 names the
  // first's last reduction (the streams' last work), and only later micro-batches accumulate their
  // reduced gradients (a cast more), so 1 and 2 name different places. Where that is still not enough
  // (a reach of two, as FSDP1's rate limiter queue can have), a micro-batch more; then every one.
  int mb_template = rp.grad_sync ? 3 : 2;
  const auto source_mbs = [&] { return rp.grad_sync ? mb_template + 1 : mb_template + 2; };
  bool mbs = rp.grad_accum > source_mbs();
  const auto mb_shape = [&](StretchShape s) {
    s.mb_template = mbs ? mb_template : -1;
    s.mb_copies = mbs ? static_cast<int>(rp.grad_accum) - source_mbs() : 0;
    return s;
  };
  // After a refusal for the micro-batches: the next micro-batch source to try (false: none).
  const auto next_mbs = [&] {
    if (!mbs) return false;
    ++mb_template;
    mbs = mb_template == (rp.grad_sync ? 4 : 3) && rp.grad_accum > source_mbs();
    return mbs;
  };
  const auto stretched = [&](int layers) {
    st.hw_flops = stretched_flops(st);
    stats.stretched = true;
    stats.refused.clear();
    stats.source_layers = layers;
    stats.source_micro_batches = mbs ? source_mbs() : static_cast<int>(rp.grad_accum);
    return true;
  };
  // Micro-batches alone, with every layer, where the layers cannot be stretched.
  const auto micro_batches_only = [&]() {
    const std::string why = stats.refused;
    for (; mbs; next_mbs())
      if (stretch_source(m, graph, rp, topo, cost, mb_shape(StretchShape{1, 0, 0}), source_mbs(), st, stats, ws))
        return map_ops(graph, StretchShape{1, 0, 0}, st), stretched(L);
    if (!stats.refused.empty() && stats.refused != why) stats.refused = why + "; " + stats.refused;
    return false;
  };
  const int k = layer_period(graph, rp);
  if (k == 0) return stats.refused = "no regular block period", micro_batches_only();
  // Frozen weights (models/trainable.h): which blocks train follows the number of layers (evenly spaced
  // blocks), so a shorter model's blocks are not the full one's.
  if (rp.trainable_fraction < 1.0)
    return stats.refused = "frozen weights differ from block to block", micro_batches_only();
  if (rp.lora.on()) return stats.refused = "LoRA adapters (not in the stretched lowering)", micro_batches_only();
  // A unit named in module_overrides may not exist in a shorter model (its aliases do).
  for (const ModuleOverride& o : rp.module_overrides)
    if (o.module != "root" && o.module != "last_block")
      return stats.refused = "module_overrides names a unit", micro_batches_only();
  // The source: the template period, with the blocks that references reach (prefetching reaches
  // prefetch_depth + 1 blocks back) checked periodic on both sides (sim/stretch.h), and `margin` blocks
  // at each end left unchecked, as the blocks next to the ends differ: nothing to prefetch, the root's
  // hooks prefetch the first or last prefetch_depth blocks, FSDP1's rate limiter carries forward events
  // into the first backward blocks (a margin of 4 there: over 8,000 random plans the fewest sources
  // lowered, 6,089 against 6,291 with 2, with as many stretched). Where that is not enough, wider margins.
  const int reach = std::max(rp.prefetch_depth, 1) + 1;
  constexpr int kMargin = 2;
  const bool limiter = rp.fsdp_version == FsdpVersion::FSDP1 && rp.limit_all_gathers;
  const int first_margin = std::max(kMargin, limiter ? 4 : reach);
  for (int margin = first_margin;;) {
    const int first = k * ((reach + margin + k - 1) / k);   // the checked blocks start `margin` in
    const int want = first + 2 * k + reach + margin;
    if (L < want + k) {
      if (margin == first_margin) stats.refused = "too few layers";
      return micro_batches_only();
    }
    const int Ls = want + (L - want) % k;
    const int copies = (L - Ls) / k;
    models::ModelSpec ms = m;
    ms.n_layers = Ls;
    const std::shared_ptr<const models::WrapGraph> small = wrap_graph_for(graphs, ms, rp.auto_wrap_policy, rp.implementation);
    if (!units_line_up(graph, *small, first, k, copies))
      return stats.refused = "units do not repeat", micro_batches_only();
    if (stretch_source(ms, *small, rp, topo, cost, mb_shape(StretchShape{k, first, copies}), mbs ? source_mbs() : 0, st,
                       stats, ws))
      return map_ops(*small, StretchShape{k, first, copies}, st), stretched(Ls);
    if (mbs && st.info.micro_batches_refused) {
      if (!next_mbs()) mbs = false;   // (then the same source with every micro-batch)
      continue;
    }
    // References reaching over half the source grow with it (a pattern no source holds): no longer one.
    if (2 * st.info.reach > Ls) return micro_batches_only();
    margin += reach + k;
  }
}

}  // namespace

struct Simulator::Scratch {
  WrapGraphCache graphs;
  Stretched stretched;
  lowering::OpRecycler recycler;   // the whole lowering's (see OpRecycler: storage reused across calls)
  Workspace ws;                    // the engine's, the stretch's and the compiled program's
};

Simulator::Simulator() : s_(std::make_unique<Scratch>()) {}
Simulator::~Simulator() = default;
Simulator::Simulator(Simulator&&) noexcept = default;
Simulator& Simulator::operator=(Simulator&&) noexcept = default;

bool Simulator::stretched_program(const models::ModelSpec& model, const calibrate::HardwareProfile& hw,
                                  const Plan& plan, CompiledProgram& program, OpCosts& costs, std::string* why,
                                  SimulateStats* stats_out) {
  SimulateStats stats;
  const calibrate::Cluster& cluster = hw.cluster();
  const Plan rp = resolve_plan(plan, cluster.world(), cluster.gpus_per_node);
  const models::ModelSpec m = models::with_seq_len(model, rp.seq_len);
  const std::shared_ptr<const models::WrapGraph> graph = wrap_graph_for(s_->graphs, m, rp.auto_wrap_policy, rp.implementation);
  ProfileCostModel cost(hw, rp.implementation == models::ModelImpl::Runtime);
  Stretched& st = s_->stretched;
  const bool ok = build_stretched(m, *graph, rp, topology_of(hw),
                                  cost, st, s_->graphs, stats, s_->ws);
  if (why) *why = stats.refused;
  if (stats_out) *stats_out = stats;
  if (!ok) return false;
  program = st.program;
  costs = st.costs;
  return true;
}

bool stretched_program(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const Plan& plan,
                       CompiledProgram& program, OpCosts& costs, std::string* why, SimulateStats* stats) {
  return Simulator().stretched_program(model, hw, plan, program, costs, why, stats);
}

Topology topology_of(const calibrate::HardwareProfile& hw) {
  return Topology{hw.cluster().world(), hw.cluster().gpus_per_node, hw.cublas_workspace_bytes(), hw.cuda_sm_count()};
}

SimResult simulate(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const Plan& plan,
                   const SimOptions& opts) {
  return Simulator().simulate(model, hw, plan, opts);
}

SimResult SimulatorPool::simulate(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const Plan& plan,
                                  const SimOptions& opts) {
  std::unique_ptr<Simulator> s;
  {
    std::lock_guard<std::mutex> lock(m_);
    if (!idle_.empty()) {
      s = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (!s) s = std::make_unique<Simulator>();
  struct GiveBack {
    SimulatorPool& pool;
    std::unique_ptr<Simulator>& s;
    ~GiveBack() {
      std::lock_guard<std::mutex> lock(pool.m_);
      pool.idle_.push_back(std::move(s));
    }
  } give_back{*this, s};
  return s->simulate(model, hw, plan, opts);
}

SimResult Simulator::simulate(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const Plan& plan,
                              const SimOptions& opts) {
  if (!(opts.memory_margin >= 0.0 && opts.memory_margin < 1.0))
    throw InputError("memory_margin", fmt("%g", opts.memory_margin), "a fraction in [0, 1)");
  SimulateStats stats;
  const calibrate::Cluster& cluster = hw.cluster();
  const Plan rp = resolve_plan(plan, cluster.world(), cluster.gpus_per_node);
  // MPT-style models size their position table by the training sequence length (models/model_spec.h).
  const models::ModelSpec m = models::with_seq_len(model, rp.seq_len);
  const std::shared_ptr<const models::WrapGraph> graph = wrap_graph_for(s_->graphs, m, rp.auto_wrap_policy, rp.implementation);
  const Topology topo = topology_of(hw);

  const Bytes capacity = hw.memory_capacity();
  const Bytes context = hw.cuda_context_bytes();
  const bool native = rp.implementation == models::ModelImpl::Runtime;   // the bundled C++ runtime's program
  ProfileCostModel cost(hw, native);
  ExecOptions eo;
  eo.record_trace = opts.record_trace;
  eo.record_memory_timeline = opts.record_memory_timeline;
  // The caching allocator sees what is left after the CUDA context and NCCL's own buffers (M15).
  eo.memory_capacity = capacity > context ? capacity - context : 0;
  eo.expandable_segments = rp.alloc_conf.expandable_segments;   // PYTORCH_CUDA_ALLOC_CONF
  eo.max_split_size = rp.alloc_conf.max_split_size;
  eo.workspace = &s_->ws;
  ExecStats es;
  eo.stats = &es;

  SimResult r;
  double hw_flops = 0;
  std::int64_t tokens_per_rank = 0;
  Stretched& st = s_->stretched;
  // The program is the lowering's own: a structural check it fails (validate_program's, field "program...") is a bug
  // in fsdpsim, reported as one (exit 1), not as the user's bad input.
  try {
    const bool stretched =
        opts.stretch && !opts.record_trace && build_stretched(m, *graph, rp, topo, cost, st, s_->graphs, stats, s_->ws);
    if (stretched) {
      r = execute_compiled(st.program, st.costs, eo);
      describe_peaks(st.ops, {&r.peak_allocated_at, &r.peak_reserved_at, &r.first_step_peak_allocated_at,
                              &r.first_step_peak_reserved_at});
      hw_flops = st.hw_flops;
      tokens_per_rank = st.a.tokens_per_rank;
    } else {
      lowering::OpRecycler& recycler = s_->recycler;
      // Without a trace the program is built for the simulator alone: no names (they label trace spans only; a
      // recycled op's old name is cleared) and no op inputs/outputs (only the runtimes read them).
      StepProgram prog = lowering::lower_with(m, *graph, rp, topo, &recycler, /*full=*/opts.record_trace);
      r = execute(prog, cost, eo);
      FlopsSum flops;
      flops.add(prog, 0, static_cast<int>(prog.ops.size()));
      hw_flops = flops.sum;
      tokens_per_rank = prog.tokens_per_rank;
      lowering::recycle(prog, recycler);   // prog is not used past this point
    }
  } catch (const InputError& e) {
    if (e.field().rfind("program", 0) != 0) throw;
    throw std::logic_error(std::string("the lowering built an ill-formed program (a bug in fsdpsim): ") + e.what());
  }
  stats.time_jumps = es.jumps;
  stats.memory_fold_jumps = es.memory_jumps;
  stats.memory_shift_jumps = es.memory_shift_jumps;
  stats.steady_periods_shifted = es.steady_periods_shifted;
  r.simulate_stats = std::move(stats);

  // ---- memory ----
  r.capacity = capacity;
  r.context_bytes = context;
  r.peak_total_device = r.peak_reserved + context;
  const double usable = static_cast<double>(capacity) * (1.0 - opts.memory_margin);
  // Both steps must fit: the first (optimizer state created inside it) and the steady one; and FSDP1's construction
  // before them.
  const Bytes worst_reserved = std::max({r.peak_reserved, r.first_step_peak_reserved, r.construction_peak_reserved});
  r.fits = static_cast<double>(worst_reserved + context) <= usable;
  if (r.construction_peak_reserved > std::max(r.peak_reserved, r.first_step_peak_reserved))
    r.notes.push_back("FSDP1's construction peaks above both steps: " +
                      fmt("%.2f", to_gib(r.construction_peak_reserved)) +
                      " GiB reserved while a unit's original parameters, its flattened copy and its shard exist beside "
                      "the shards made before");
  r.breakdown_at_peak[mem_category_name(MemCategory::CudaContext)] = context;
  const models::TrainableSet trainable = lowering::plan_trainable_set(m, *graph, rp);
  HostMemory host = host_memory(*graph, rp, cluster.gpus_per_node, trainable);   // CPU offload's host RAM
  host.pinned_per_rank += offloaded_activations_pinned(m, rp);
  apply_host_memory(host, hw, rp, r);
  if (const Bytes paged = paged_optimizer_bytes(*graph, rp, trainable); paged > 0) {
    // What the GPU cannot hold beside the step's peak moves to host memory and back every step.
    const Bytes out = std::max(worst_reserved, r.peak_reserved) + context + paged - capacity;
    r.notes.push_back("paged optimizer state: " + fmt("%.2f", to_gib(paged)) +
                      " GiB per GPU in CUDA unified memory (bitsandbytes F.get_paged, cudaMallocManaged), outside "
                      "PyTorch's allocator: not in allocated, reserved or the fits verdict; the driver keeps it on the "
                      "GPU while there is room and pages it to host memory when the GPU runs short (that page traffic "
                      "is not timed)" +
                      (out > 0 ? "; at the peak " + fmt("%.2f", to_gib(std::min(out, paged))) +
                                     " GiB of it cannot stay on the GPU and crosses the host link every step"
                               : ""));
  }

  // ---- throughput ----
  const int world = rp.mesh_replicate * rp.mesh_shard;
  const double tokens = tokens_per_rank > 0 ? static_cast<double>(tokens_per_rank)
                                            : static_cast<double>(rp.micro_batch * rp.seq_len * rp.grad_accum);
  r.tokens_per_step = tokens * world;
  const double step_s = to_seconds(r.step_time_ns);
  r.tokens_per_s_per_gpu = step_s > 0 ? tokens / step_s : 0.0;

  // ---- FLOPs and MFU ----
  // (as the lowering's fill_facts: 6N+attention FLOPs per token of the whole model times the tokens; with
  // frozen weights, trainable_fraction < 1, without the weight-gradient matmuls that do not run: those of the
  // matrices autograd sees frozen, lowering::grad_flows)
  // LoRA adapters: each adapter weight costs 2 FLOPs per token forward, 2 for its input gradient and 2 for
  // its weight gradient (6 per parameter, as the model's own weights; approximate: the first block's
  // adapters compute no input gradient, litgpt's zero-pad and the scaling are not counted)
  r.model_flops_per_step_per_gpu =
      (models::trained_flops_per_token(m, rp.seq_len, lowering::grad_flows(m, *graph, rp, trainable).matmul_trained) +
       (trainable.lora.on() ? 6.0 * static_cast<double>(trainable.trainable) : 0.0)) *
      tokens;
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
  // A step whose CPU issues for (nearly) all of it is CPU-bound: the GPU waits for the CPU, and the step time
  // rests on the profile's CPU costs, which belong to the host and the PyTorch version.
  if (cpu_bound(r))
    r.notes.push_back("CPU-bound: the CPU issues the step's ops for " + fmt("%.4f", to_seconds(r.cpu_issue_ns)) +
                      " s of the " + fmt("%.4f", to_seconds(r.step_time_ns)) + " s step (the compute stream is busy " +
                      fmt("%.4f", to_seconds(r.compute_ns)) + " s), at the profile's " +
                      fmt("%.0f", static_cast<double>(native ? hw.runtime_launch_ns() : hw.kernel_launch_ns()) / 1e3) +
                      (native ? " us per op of the bundled runtime (runtime_launch_ns) and "
                              : " us per eager op (kernel_launch_ns, fitted on PyTorch 2.11 eager steps of one host: "
                                "scripts/fit_cpu_issue.py) and ") +
                      fmt("%.0f", static_cast<double>(hw.framework_hook_ns()) / 1e3) + " us per FSDP hook (framework_hook_ns, "
                      "assumed); this step time depends on the host CPU and the PyTorch version more than on the GPU. "
                      "A larger micro-batch (fewer ops per token), torch.compile or CUDA graphs shorten it");
  const auto& ex = cost.extrapolations();
  if (!ex.empty()) {
    std::string line = "collective times extrapolated beyond the profile's measured/sourced range for " +
                       std::to_string(ex.size()) + " distinct quer" + (ex.size() == 1 ? "y" : "ies") + ": ";
    for (std::size_t i = 0; i < ex.size() && i < 4; ++i) line += (i ? "; " : "") + ex[i];
    if (ex.size() > 4) line += "; ...";
    r.notes.push_back(line);
  }
  if (!r.fits)
    r.notes.push_back("does not fit: peak reserved " + fmt("%.2f", to_gib(worst_reserved)) +
                      (worst_reserved > r.peak_reserved ? " GiB (first step) + context " : " GiB + context ") +
                      fmt("%.2f", to_gib(context)) + " GiB > " + fmt("%.2f", usable / static_cast<double>(kGiB)) +
                      " GiB usable");
  return r;
}

}  // namespace fsdpsim::sim

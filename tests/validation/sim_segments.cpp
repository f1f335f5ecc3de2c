// sim_segments: the simulator's caching-allocator segments, one line per cudaMalloc, to set beside a measured
// allocator history (scripts/torch_memory/trace_segments.py prints PyTorch's) and find the first segment where
// the two part ways. Not a test: a diagnosis tool.
//
//   build/tests/validation/sim_segments MODEL CLUSTER PLAN.json [--ordered] [--buffers MIN_BYTES]
//       [--layout | --pool-layout] [--peak] [--profile FILE]
//
// It lowers the whole program (op and buffer names), runs the executor once for its times, and replays the
// program's allocations and frees for a first and a steady step through the caching-allocator model as
// MemoryTracker does (persistent buffers first; first_step_lazy ones only in the first step; a record_stream
// free's block reusable once its op has completed when the freeing or allocating op is issued). Op times come
// from the executor's trace (CPU issue span and GPU span of each op, matched by name in program order); the
// first step's memory is the engine's own replay at those times and the steady step's is replayed from them
// (sim/memory_tracker.h replay_timed), so the peaks agree unless two spans of one name are told apart wrongly.
// --ordered: every op before the one issued has completed (a GPU never behind the CPU) instead.
// --buffers: also every alloc and free of at least MIN_BYTES that makes no segment.
// --layout: after each alloc that grows the reserved bytes (and each one --buffers prints), the layout of the segment it landed in, in
// address order (blocks of 8 MiB and more, free ranges of 2 MiB and more, the rest summed in brackets; the
// new block marked *): with expandable segments, which free range sat at the end decides how much is mapped
// (trace_segments.py --layout EVENT prints PyTorch's alike).
// --pool-layout: as --layout, but every live segment of the block's pool (trace_segments.py --layout EVENT
// prints all of PyTorch's segments at that event).
// --profile FILE: a hardware profile file instead of the cluster's built-in one (say, to see the fake process
// group's instant collectives: a profile whose collective bandwidth is huge and latency zero).
// --peak: at each step's peak of allocated bytes, the live buffers by size and name (trace_segments.py
// --peak prints PyTorch's live blocks at its peak alike).
// Per step it also counts the record_stream frees (FSDP1) whose block the next allocation could reuse and those
// still waiting on their event then (trace_segments.py --frees counts the measured ones alike).
// The last line per step compares its reserved peak with what simulate() reports (they agree when the
// replay is the simulator's).
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "common/errors.h"
#include "common/json_reader.h"
#include "memory/caching_allocator.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "program/lower_context.h"
#include "program/plan.h"
#include "sim/executor.h"
#include "sim/reference_engine.h"
#include "sim/profile_cost_model.h"
#include "sim/simulator.h"

using namespace fsdpsim;
using namespace fsdpsim::sim;

namespace {

struct Times {
  std::vector<TimeNs> issue, complete;
};

// Each op's issue time as the executor's memory sees it (the end of its CPU issue span: the engine allocates
// and frees when the issue is done, sim/executor.cpp issue_done; an op that costs no CPU time has no span and
// is issued when the op before it was, or when the CPU stops being blocked before it) and its completion (the
// end of its GPU span; an op without one, a CPU op or a memory-only op, when it is issued). Spans are matched
// to ops by name in program order.
Times op_times(const StepProgram& p, const SimResult& r) {
  std::map<std::string, std::deque<const TraceSpan*>> cpu, blocked, gpu;
  const std::string kBlocked = "blocked before ";
  for (const TraceSpan& s : r.trace) {
    if (s.track == "cpu") {
      if (s.name.rfind(kBlocked, 0) == 0) blocked[s.name.substr(kBlocked.size())].push_back(&s);
      else cpu[s.name].push_back(&s);
    } else {
      gpu[s.name].push_back(&s);
    }
  }
  Times t;
  t.issue.assign(p.ops.size(), 0);
  t.complete.assign(p.ops.size(), 0);
  TimeNs last = 0;
  for (const Op& op : p.ops) {
    const auto i = static_cast<std::size_t>(op.id);
    auto& c = cpu[op.name];
    auto& b = blocked[op.name];
    auto& g = gpu[op.name];
    TimeNs issued = last;
    if (!b.empty() && b.front()->start_ns >= last) {
      issued = std::max(issued, b.front()->start_ns + b.front()->dur_ns);
      b.pop_front();
    }
    if (!c.empty()) {
      issued = c.front()->start_ns + c.front()->dur_ns;
      c.pop_front();
    }
    t.issue[i] = last = issued;
    if (!g.empty()) {
      t.complete[i] = g.front()->start_ns + g.front()->dur_ns;
      g.pop_front();
    } else {
      t.complete[i] = issued;
    }
  }
  return t;
}

double mib(Bytes b) { return static_cast<double>(b) / static_cast<double>(kMiB); }

// --peak: the live buffers at a step's peak, grouped by (bytes, name without the unit, pool), largest total
// first (>= 4 MiB).
void print_live(const StepProgram& p, const std::vector<char>& live, Bytes allocated, const std::string& op) {
  std::map<std::tuple<Bytes, std::string, int>, int> groups;
  for (const Buffer& b : p.buffers) {
    if (!live[static_cast<std::size_t>(b.id)]) continue;
    std::string name = b.name;   // (without its unit: " u12")
    if (const auto sp = name.rfind(" u"); sp != std::string::npos && sp + 2 < name.size() &&
                                          name.find_first_not_of("0123456789", sp + 2) == std::string::npos)
      name.resize(sp);
    ++groups[{b.bytes, name, b.pool_stream}];
  }
  std::vector<std::pair<Bytes, std::string>> rows;
  for (const auto& [key, n] : groups) {
    const auto& [bytes, name, pool] = key;
    if (bytes * n < 4 * kMiB) continue;
    char buf[160];
    std::snprintf(buf, sizeof buf, "  %12lld x%-4d %-18s %-20s %10.1f MiB", static_cast<long long>(bytes), n,
                  p.streams[static_cast<std::size_t>(pool)].name.c_str(), name.c_str(), mib(bytes * n));
    rows.emplace_back(bytes * n, buf);
  }
  std::sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  std::printf("peak allocated %lld at op %s; live buffers:\n", static_cast<long long>(allocated), op.c_str());
  for (const auto& r : rows) std::printf("%s\n", r.second.c_str());
}

// --layout: the segment holding `block`, in address order (see the header comment for the format). An
// expandable segment's last block is its unmapped rest of the address range: left out, and the size printed is
// what is mapped.
void print_segment(const CachingAllocator& a, int seg, int block) {
  std::vector<CachingAllocator::BlockInfo> blocks;
  a.segment_blocks(seg, blocks);
  Bytes size = a.segment_size(seg);
  if (a.segment_expandable(seg) && !blocks.empty()) {
    size -= blocks.back().size;
    blocks.pop_back();
  }
  std::string line;
  Bytes small = 0;
  const auto flush_small = [&] {
    if (small == 0) return;
    char buf[48];
    std::snprintf(buf, sizeof buf, " | [%.1f small]", mib(small));
    line += buf;
    small = 0;
  };
  for (const auto& b : blocks) {
    if (b.size >= 8 * kMiB || (b.free && b.size >= 2 * kMiB)) {
      flush_small();
      char buf[48];
      std::snprintf(buf, sizeof buf, " | %s%.1f%s", b.free ? "FREE " : "", mib(b.size), b.block == block ? "*" : "");
      line += buf;
    } else {
      small += b.size;
    }
  }
  flush_small();
  std::printf("      segment of %.1f MiB%s (pool %d):%s\n", mib(size),
              a.segment_expandable(seg) ? " (expandable, mapped)" : "", a.segment_pool(seg),
              line.empty() ? "" : line.c_str() + 2);
}
void print_layout(const CachingAllocator& a, int block) { print_segment(a, a.block_segment(block), block); }
// --pool-layout: every live large-pool segment of the block's pool (trace_segments.py --layout EVENT prints all
// of PyTorch's alike), the block marked
void print_pool_layout(const CachingAllocator& a, int block) {
  const int pool = a.segment_pool(a.block_segment(block));
  for (int seg = 0; seg < a.num_segment_slots(); ++seg)
    if (a.segment_live(seg) && a.segment_pool(seg) == pool) print_segment(a, seg, block);
}

int run(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: sim_segments MODEL CLUSTER PLAN.json [--ordered] [--buffers MIN_BYTES] "
                         "[--layout | --pool-layout] [--peak] [--profile FILE]\n");
    return 2;
  }
  bool ordered = false;
  Bytes min_buffer = -1;
  bool layout = false, pool_layout = false, peak_list = false;
  std::string profile;
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ordered") ordered = true;
    else if (a == "--profile" && i + 1 < argc) profile = argv[++i];
    else if (a == "--buffers" && i + 1 < argc) min_buffer = std::atoll(argv[++i]);
    else if (a == "--layout") layout = true;
    else if (a == "--pool-layout") layout = pool_layout = true;
    else if (a == "--peak") peak_list = true;
    else throw InputError(a, a, "--ordered, --buffers MIN_BYTES, --layout, --pool-layout, --peak or --profile FILE");
  }
  const models::ModelSpec model = models::load_model(argv[1]);
  const calibrate::Cluster cluster = calibrate::load_cluster(argv[2]);
  const calibrate::HardwareProfile hw = profile.empty() ? calibrate::HardwareProfile::for_cluster(cluster)
                                                         : calibrate::HardwareProfile::from_file(profile, cluster);
  const Plan plan = parse_plan(read_json_file(argv[3], "plan"));
  const Plan rp = resolve_plan(plan, cluster.world(), cluster.gpus_per_node);
  const models::ModelSpec m = models::with_seq_len(model, rp.seq_len);
  const models::WrapGraph graph = models::build_wrap_graph(m, rp.auto_wrap_policy, rp.implementation);
  const Topology topo = topology_of(hw);
  const StepProgram p = lowering::lower_with(m, graph, rp, topo, nullptr, /*full=*/true);

  const Bytes capacity = hw.memory_capacity() > hw.cuda_context_bytes() ? hw.memory_capacity() - hw.cuda_context_bytes() : 0;
  ProfileCostModel cost(hw);
  ExecOptions eo;
  eo.memory_capacity = capacity;
  eo.expandable_segments = rp.alloc_conf.expandable_segments;
  eo.max_split_size = rp.alloc_conf.max_split_size;
  const SimResult r = execute(p, cost, eo);
  const Times t = op_times(p, r);

  AllocatorConfig config{capacity};
  if (rp.alloc_conf.max_split_size > 0) config.max_split_size = rp.alloc_conf.max_split_size;
  config.expandable_segments = rp.alloc_conf.expandable_segments;
  CachingAllocator a(config);
  std::printf("streams:");
  for (const Stream& s : p.streams) std::printf(" %d=%s", s.id, s.name.c_str());
  std::printf("\n");
  std::vector<int> block(p.buffers.size(), -2);
  allocate_before_first_step(p, a, block);
  std::printf("persistent buffers: allocated %lld reserved %lld\n", static_cast<long long>(a.stats().allocated),
              static_cast<long long>(a.stats().reserved));
  for (int step = 1; step <= 2; ++step) {
    std::printf("== step %d (%s)\n", step, step == 1 ? "first: optimizer state created in it" : "steady");
    a.reset_peaks();
    // pool stream -> record_stream frees whose block the next allocation could reuse, and those still waiting
    std::map<std::string, std::pair<int, int>> rs;
    std::vector<char> live(p.buffers.size(), 0);   // --peak: the step's live buffers, and those at its peak
    for (const Buffer& b : p.buffers) live[static_cast<std::size_t>(b.id)] = b.persistent && block[static_cast<std::size_t>(b.id)] >= 0;
    std::vector<char> at_peak;
    Bytes peak_alloc = -1;
    std::string peak_op;
    std::vector<std::pair<std::string, int>> waiting;   // frees left pending, until the next allocation
    for (const Op& op : p.ops) {
      const auto i = static_cast<std::size_t>(op.id);
      const auto done = [&](std::int64_t j) {
        return j < op.id ? ordered || t.complete[static_cast<std::size_t>(j)] <= t.issue[i]
                         : j == op.id && t.complete[i] <= t.issue[i];
      };
      a.process_events(done);
      const auto alloc = [&](int id) {
        const Buffer& b = p.buffers[static_cast<std::size_t>(id)];
        if (step == 2 && b.first_step_lazy) return;
        for (const auto& [name, j] : waiting) (done(j) ? rs[name].first : rs[name].second) += 1;
        waiting.clear();
        const Bytes before = a.stats().reserved;
        block[static_cast<std::size_t>(id)] = a.alloc(b.bytes, b.pool_stream);
        live[static_cast<std::size_t>(id)] = 1;
        if (peak_list && a.stats().allocated > peak_alloc) {
          peak_alloc = a.stats().allocated;
          at_peak = live;
          peak_op = op.name;
        }
        const Bytes grew = a.stats().reserved - before;
        if (grew != 0) {
          std::printf("  op %4d %-16s SEGMENT %+13lld (%8.2f MiB) %-18s for %-12s %12lld B (%8.2f MiB)  allocated %lld "
                      "reserved %lld\n",
                      op.id, op.name.c_str(), static_cast<long long>(grew), mib(grew),
                      p.streams[static_cast<std::size_t>(b.pool_stream)].name.c_str(), b.name.c_str(),
                      static_cast<long long>(b.bytes), mib(b.bytes), static_cast<long long>(a.stats().allocated),
                      static_cast<long long>(a.stats().reserved));
          if (layout) (pool_layout ? print_pool_layout : print_layout)(a, block[static_cast<std::size_t>(id)]);
        } else if (min_buffer >= 0 && b.bytes >= min_buffer) {
          // The segment the block was cut from (its size: which cached segment a request lands in is
          // where two replays part ways).
          Bytes seg_size = 0;
          std::vector<CachingAllocator::BlockInfo> blocks;
          for (int seg = 0; seg < a.num_segment_slots() && seg_size == 0; ++seg) {
            if (!a.segment_live(seg)) continue;
            blocks.clear();
            a.segment_blocks(seg, blocks);
            for (const auto& bi : blocks)
              if (bi.block == block[static_cast<std::size_t>(id)]) seg_size = a.segment_size(seg);
          }
          std::printf("      op %4d %-16s alloc %-12s %12lld B %-18s allocated %lld  in a %.2f MiB segment\n", op.id,
                      op.name.c_str(), b.name.c_str(), static_cast<long long>(b.bytes),
                      p.streams[static_cast<std::size_t>(b.pool_stream)].name.c_str(),
                      static_cast<long long>(a.stats().allocated), mib(seg_size));
          if (layout) (pool_layout ? print_pool_layout : print_layout)(a, block[static_cast<std::size_t>(id)]);
        }
      };
      const auto free = [&](const FreeSpec& f) {
        const Buffer& b = p.buffers[static_cast<std::size_t>(f.buffer)];
        const bool pending = f.reuse_after_op >= 0 && !done(f.reuse_after_op);
        if (min_buffer >= 0 && b.bytes >= min_buffer)
          std::printf("      op %4d %-16s free  %-12s %12lld B%s\n", op.id, op.name.c_str(), b.name.c_str(),
                      static_cast<long long>(b.bytes), pending ? " (record_stream: pending)" : "");
        if (f.reuse_after_op >= 0) {
          const std::string& pool = p.streams[static_cast<std::size_t>(b.pool_stream)].name;
          if (pending) waiting.emplace_back(pool, f.reuse_after_op);
          else rs[pool].first += 1;
        }
        live[static_cast<std::size_t>(f.buffer)] = 0;
        if (pending) a.free_after(block[static_cast<std::size_t>(f.buffer)], f.reuse_after_op);
        else a.free(block[static_cast<std::size_t>(f.buffer)]);
        block[static_cast<std::size_t>(f.buffer)] = -2;
      };
      // (in the executors' order: the frees inside the op among its allocs, the others after it)
      for (std::size_t k = issue_memory(op, alloc, free); k < op.frees.size(); ++k) free(op.frees[k]);
    }
    a.process_events([](std::int64_t) { return true; });   // the next step starts once this one has ended
    if (peak_list && !at_peak.empty()) print_live(p, at_peak, peak_alloc, peak_op);
    for (const auto& [name, c] : rs)
      std::printf("record_stream frees of %s blocks: %d reusable by the next allocation, %d still waiting\n",
                  name.c_str(), c.first, c.second);
    const Bytes simulated = step == 1 ? r.first_step_peak_reserved : r.peak_reserved;
    std::printf("end of step %d: allocated %lld, reserved %lld; peak reserved %lld (the executor's: %lld%s)\n", step,
                static_cast<long long>(a.stats().allocated), static_cast<long long>(a.stats().reserved),
                static_cast<long long>(a.stats().peak_reserved), static_cast<long long>(simulated),
                a.stats().peak_reserved == simulated ? ", the same" : ", differs");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sim_segments: %s\n", e.what());
    return 2;
  }
}

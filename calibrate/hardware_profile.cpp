// HardwareProfile: loads a GPU profile + fabric profiles (built-in or from a calibrated profile file)
// into flat precomputed parameters, so every cost query is arithmetic (compute_model.h,
// collective_model.h) or one hash lookup of a measured sweep (collective_fit.h).
#include "calibrate/hardware_profile.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "calibrate/builtin_profiles.h"
#include "calibrate/collective_fit.h"
#include "calibrate/collective_model.h"
#include "calibrate/compute_model.h"
#include "calibrate/sourced_value.h"
#include "common/errors.h"
#include "common/json_reader.h"

namespace fsdpsim::calibrate {

const char* collective_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::AllGather: return "all_gather";
    case CollectiveOp::ReduceScatter: return "reduce_scatter";
    case CollectiveOp::AllReduce: return "all_reduce";
  }
  return "all_gather";
}

namespace {

inline std::uint64_t fit_key(int op, int n, int k) {
  return (static_cast<std::uint64_t>(op) << 48) | (static_cast<std::uint64_t>(n) << 24) | static_cast<std::uint64_t>(k);
}

struct GemmKey {
  std::int64_t m, n, k;
  int dtype;
  bool operator==(const GemmKey& o) const { return m == o.m && n == o.n && k == o.k && dtype == o.dtype; }
};
struct GemmKeyHash {
  size_t operator()(const GemmKey& g) const {
    std::uint64_t h = static_cast<std::uint64_t>(g.m) * 0x9E3779B97F4A7C15ULL;
    h ^= static_cast<std::uint64_t>(g.n) + 0x7F4A7C159E3779B9ULL + (h << 6) + (h >> 2);
    h ^= static_cast<std::uint64_t>(g.k) + 0x94D049BB133111EBULL + (h << 6) + (h >> 2);
    return static_cast<size_t>(h ^ static_cast<std::uint64_t>(g.dtype));
  }
};

struct MeasuredSweep {
  CollectiveOp op;
  int group_size, nodes;
  CollectiveFit fit;
};

int dtype_index(const std::string& s) {
  if (s == "fp32") return 0;
  if (s == "bf16") return 1;
  if (s == "fp16") return 2;
  if (s == "fp8") return 3;
  return -1;
}

CollectiveOp parse_op(const JsonReader& r, const std::string& key) {
  std::string s = r.get_enum(key, {"all_gather", "reduce_scatter", "all_reduce"});
  return s == "all_gather" ? CollectiveOp::AllGather : s == "reduce_scatter" ? CollectiveOp::ReduceScatter : CollectiveOp::AllReduce;
}

}  // namespace

struct HardwareProfile::Impl {
  std::string name, source;
  Cluster cluster;
  nlohmann::json context = nlohmann::json::object();
  nlohmann::json gpu_doc, intra_doc, inter_doc, measured_doc;
  Bytes capacity = 0, context_bytes = 0;
  Bytes cublas_workspace = 0;     // one cuBLAS workspace (per handle and stream), from the caching allocator
  ComputeParams cp;
  TimeNs launch_ns = 0, hook_ns = 0;
  TimeNs runtime_launch_ns = 0;   // the bundled C++ runtime's CPU cost per op (default: launch_ns)
  double overlap = 1.0;
  int launch_queue_depth = kDefaultLaunchQueueDepth;   // (0: unbounded)
  double pcie_bw = 1e10;
  double cpu_mem_bw = 1e10;       // bytes/s one rank's CPU optimizer step gets (all ranks of the node at once)
  Bytes host_capacity = 0;        // host RAM of one node (0: unknown)
  CollectiveModel model;
  std::vector<MeasuredSweep> sweeps;
  std::unordered_map<std::uint64_t, int> sweep_index;
  std::unordered_map<GemmKey, TimeNs, GemmKeyHash> gemms;

  void load_gpu(const nlohmann::json& j, const std::string& path);
  static LinkParams load_fabric(const nlohmann::json& j, const std::string& path, bool inter, int* nics);
  void load_measured(const nlohmann::json& j, const std::string& path);
  const MeasuredSweep* nearest_sweep(CollectiveOp op, int n, int k) const;
};

void HardwareProfile::Impl::load_gpu(const nlohmann::json& j, const std::string& path) {
  JsonReader r(j, path);
  std::string kind = r.get_enum("kind", {"gpu", "cpu"});
  JsonReader peak = r.get_object("peak_flops");
  const char* names[4] = {"fp32", "bf16", "fp16", "fp8"};
  for (int i = 0; i < 4; ++i) cp.peak_flops[i] = sourced_number(peak, names[i], 1e6, 1e18, 0.0);
  if (cp.peak_flops[0] <= 0 && cp.peak_flops[1] <= 0)
    throw InputError(peak.field("bf16"), "<missing>", "a profile needs at least a bf16 or fp32 peak");
  JsonReader g = r.get_object("gemm");
  cp.sm_count = static_cast<std::int64_t>(sourced_number(g, "sm_count", 1, 100000));
  cp.tile_m = static_cast<std::int64_t>(sourced_number(g, "tile_m", 1, 4096));
  cp.tile_n = static_cast<std::int64_t>(sourced_number(g, "tile_n", 1, 4096));
  cp.k_half = sourced_number(g, "k_half", 0, 1e6);
  cp.min_kernel_ns = static_cast<TimeNs>(sourced_number(g, "min_kernel_ns", 0, 1e9));
  JsonReader mamf = g.get_object("mamf");
  double mamf_rate = sourced_number(g, "mamf", 1e6, 1e18);
  int mdt = dtype_index(mamf.get_enum("dtype", {"fp32", "bf16", "fp16", "fp8"}));
  if (cp.peak_flops[mdt] <= 0) throw InputError(mamf.field("dtype"), names[mdt], "no peak_flops for this dtype");
  cp.gemm_core_eff = gemm_core_efficiency_from_point(cp, mamf_rate, cp.peak_flops[mdt], mamf.get_int("m", 1, 1 << 30),
                                                     mamf.get_int("n", 1, 1 << 30), mamf.get_int("k", 1, 1 << 30));
  JsonReader at = r.get_object("attention");
  cp.attn_fwd_eff = sourced_number(at, "fwd_efficiency", 1e-4, 1.0);
  cp.attn_bwd_eff = sourced_number(at, "bwd_efficiency", 1e-4, 1.0);
  // Optional shape dependence (compute_model.h): without it the efficiencies hold at every shape.
  cp.attn_seq_half = sourced_number(at, "seq_half", 0, 1e7, 0.0);
  cp.attn_causal_half = sourced_number(at, "causal_half", 0, 1e7, 0.0);
  cp.attn_head_dim_half = sourced_number(at, "head_dim_half", 0, 1e5, 0.0);
  cp.attn_ref_seq = sourced_number(at, "reference_seq", 0, 1e8, 0.0);
  cp.attn_ref_head_dim = sourced_number(at, "reference_head_dim", 0, 1e5, 0.0);
  // Sustained training vs burst micro-benchmarks (clocks under sustained power, real shapes and
  // framework gaps): scales GEMM and attention rates; 1 when the profile does not give it.
  double sustained = sourced_number(g, "sustained_fraction", 0.05, 1.0, 1.0);
  cp.gemm_core_eff *= sustained;
  cp.attn_fwd_eff *= sustained;
  cp.attn_bwd_eff *= sustained;
  JsonReader hbm = r.get_object("hbm");
  cp.mem_bw = sourced_number(hbm, "bandwidth_bytes_per_s", 1e6, 1e15) * sourced_number(hbm, "efficiency", 1e-3, 1.0);
  if (r.has("elementwise_bytes_per_s")) {   // optional per-class rates (a calibrated CPU profile)
    JsonReader ew = r.get_object("elementwise_bytes_per_s");
    for (int c = 0; c < kMemoryClasses; ++c)
      cp.class_bw[c] = sourced_number(ew, memory_class_name(static_cast<MemoryClass>(c)), 1e3, 1e15, 0.0);
  }
  JsonReader ov = r.get_object("overheads");
  launch_ns = static_cast<TimeNs>(sourced_number(ov, "kernel_launch_ns", 0, 1e9));
  runtime_launch_ns = static_cast<TimeNs>(sourced_number(ov, "runtime_launch_ns", 0, 1e9, static_cast<double>(launch_ns)));
  hook_ns = static_cast<TimeNs>(sourced_number(ov, "framework_hook_ns", 0, 1e10));
  overlap = sourced_number(ov, "comm_overlap_slowdown", 1.0, 10.0);
  launch_queue_depth = static_cast<int>(sourced_number(ov, "launch_queue_depth", 0, 1e8, kDefaultLaunchQueueDepth));
  JsonReader mem = r.get_object("memory");
  double cap_gib = sourced_number(mem, "capacity_gib", 1e-3, 1e7);
  // CPU ranks of one node share the host memory (issue: memory capacity = host memory share).
  const bool host_is_device = sourced_number(mem, "shared_by_ranks_of_a_node", 0, 1, 0) > 0;
  if (host_is_device) host_capacity = static_cast<Bytes>(cap_gib * static_cast<double>(kGiB));
  if (host_is_device) cap_gib /= std::max(cluster.gpus_per_node, 1);
  capacity = static_cast<Bytes>(cap_gib * static_cast<double>(kGiB));
  context_bytes = static_cast<Bytes>(sourced_number(mem, "cuda_context_gib", 0, 1e4) * static_cast<double>(kGiB));
  cublas_workspace = static_cast<Bytes>(sourced_number(mem, "cublas_workspace_mib", 0, 1e6, 0.0) * static_cast<double>(kMiB));
  JsonReader host = r.get_object("host");
  pcie_bw = sourced_number(host, "pcie_bytes_per_s", 1e6, 1e15) * sourced_number(host, "pcie_efficiency", 1e-3, 1.0);
  // The CPU optimizer step: the node's host memory bandwidth, shared by the node's ranks, which all step
  // at once; or (a CPU calibration) the bandwidth one rank measured while every rank of the node ran.
  if (host.has("memory_bandwidth_per_node_bytes_per_s")) {
    const double node_bw = sourced_number(host, "memory_bandwidth_per_node_bytes_per_s", 1e6, 1e15) *
                           sourced_number(host, "memory_efficiency", 1e-3, 1.0, 1.0);
    cpu_mem_bw = node_bw / std::max(cluster.gpus_per_node, 1);
  } else {
    cpu_mem_bw = sourced_number(host, "cpu_memory_bandwidth_bytes_per_s", 1e6, 1e15);
  }
  if (host.has("memory_per_node_gib"))
    host_capacity = static_cast<Bytes>(sourced_number(host, "memory_per_node_gib", 1e-3, 1e8) * static_cast<double>(kGiB));
  (void)kind;
}

LinkParams HardwareProfile::Impl::load_fabric(const nlohmann::json& j, const std::string& path, bool inter, int* nics) {
  JsonReader r(j, path);
  LinkParams p;
  if (inter) {
    p.busbw[0] = sourced_number(r, "per_nic_busbw_bytes_per_s", 1e3, 1e15);
    if (nics) *nics = static_cast<int>(sourced_number(r, "default_nics_per_node", 1, 64));
  } else {
    JsonReader bw = r.get_object("busbw_bytes_per_s");
    p.busbw[0] = sourced_number(bw, "all_gather", 1e3, 1e15);
    p.busbw[1] = sourced_number(bw, "reduce_scatter", 1e3, 1e15);
    p.busbw[2] = sourced_number(bw, "all_reduce", 1e3, 1e15);
  }
  JsonReader lat = r.get_object("latency");
  p.base_ns = sourced_number(lat, "base_ns", 0, 1e9);
  p.step_ns = sourced_number(lat, "step_ns", 0, 1e9);
  JsonReader ramp = r.get_object("ramp");
  p.ramp.half_size_bytes = sourced_number(ramp, "half_size_bytes", 0, 1e15);
  p.ramp.exponent = sourced_number(ramp, "exponent", 0.05, 4.0);
  p.ramp.min_bytes = sourced_number(ramp, "min_bytes", 1, 1e15);
  p.ramp.max_bytes = sourced_number(ramp, "max_bytes", 1, 1e18);
  return p;
}

namespace {
// Element i of a measured point, checked before converting: a whole number in [lo, hi] (a double
// like 1e300 must not reach an integer conversion) or a finite number; InputError otherwise.
std::int64_t point_int(const nlohmann::json& pt, size_t i, std::int64_t lo, std::int64_t hi, const std::string& field,
                       const std::string& expected) {
  const auto& v = pt[i];
  if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))) {
    const std::int64_t x = v.get<std::int64_t>();
    if (x >= lo && x <= hi) return x;
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d >= static_cast<double>(lo) && d <= static_cast<double>(hi) && d == std::floor(d)) return static_cast<std::int64_t>(d);
  }
  throw InputError(field, json_value_for_message(pt),
                   expected + " (element " + std::to_string(i) + " must be an integer in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "])");
}
double point_number(const nlohmann::json& pt, size_t i, const std::string& field, const std::string& expected) {
  if (pt[i].is_number() && std::isfinite(pt[i].get<double>())) return pt[i].get<double>();
  throw InputError(field, json_value_for_message(pt), expected + " (element " + std::to_string(i) + " must be a number)");
}
}  // namespace

void HardwareProfile::Impl::load_measured(const nlohmann::json& j, const std::string& path) {
  JsonReader r(j, path);
  r.check_no_unknown_keys({"collectives", "gemms", "source"});
  if (r.has("collectives")) {
    const auto& arr = r.raw("collectives");
    if (!arr.is_array()) throw InputError(r.field("collectives"), json_value_for_message(arr), "expected an array");
    for (size_t i = 0; i < arr.size(); ++i) {
      JsonReader s(arr[i], r.field("collectives") + "[" + std::to_string(i) + "]");
      s.check_no_unknown_keys({"op", "group_size", "nodes", "source", "dtype", "points"});
      if (s.get_string("source").empty()) throw InputError(s.field("source"), "\"\"", "a measured sweep needs a source");
      MeasuredSweep m{parse_op(s, "op"), static_cast<int>(s.get_int("group_size", 2, 1 << 20)),
                      static_cast<int>(s.get_int("nodes", 1, 1 << 20)), {}};
      const auto& pts = s.raw("points");
      if (!pts.is_array()) throw InputError(s.field("points"), json_value_for_message(pts), "expected an array of [bytes, time_ns, ...]");
      std::vector<std::pair<Bytes, double>> xy;
      for (size_t p = 0; p < pts.size(); ++p) {
        const auto& pt = pts[p];
        const std::string where = s.field("points") + "[" + std::to_string(p) + "]";
        const std::string expected = "expected [bytes, time_ns, algbw_GBps, busbw_GBps]";
        if (!pt.is_array() || pt.size() < 2) throw InputError(where, json_value_for_message(pt), expected);
        xy.emplace_back(point_int(pt, 0, 0, Bytes{1} << 50, where, expected), point_number(pt, 1, where, expected));
      }
      m.fit = CollectiveFit(std::move(xy), s.field("points"));
      std::uint64_t key = fit_key(static_cast<int>(m.op), m.group_size, m.nodes);
      if (sweep_index.count(key))
        throw InputError(s.field("group_size"), std::to_string(m.group_size), "a second sweep for the same op, group size and nodes");
      sweep_index[key] = static_cast<int>(sweeps.size());
      sweeps.push_back(std::move(m));
    }
  }
  if (r.has("gemms")) {
    const auto& arr = r.raw("gemms");
    if (!arr.is_array()) throw InputError(r.field("gemms"), json_value_for_message(arr), "expected an array");
    for (size_t i = 0; i < arr.size(); ++i) {
      JsonReader s(arr[i], r.field("gemms") + "[" + std::to_string(i) + "]");
      s.check_no_unknown_keys({"dtype", "source", "points"});
      if (s.get_string("source").empty()) throw InputError(s.field("source"), "\"\"", "measured GEMMs need a source");
      int dt = dtype_index(s.get_enum("dtype", {"fp32", "bf16", "fp16", "fp8"}));
      for (const auto& pt : s.raw("points")) {
        const std::string expected = "expected [m, n, k, time_ns, ...]";
        if (!pt.is_array() || pt.size() < 4) throw InputError(s.field("points"), json_value_for_message(pt), expected);
        double t = point_number(pt, 3, s.field("points"), expected);
        if (!(t > 0) || t > 1e15) throw InputError(s.field("points"), json_value_for_message(pt), "time_ns must be in (0, 1e15]");
        const std::int64_t kMaxDim = std::int64_t{1} << 30;
        gemms[GemmKey{point_int(pt, 0, 1, kMaxDim, s.field("points"), expected),
                      point_int(pt, 1, 1, kMaxDim, s.field("points"), expected),
                      point_int(pt, 2, 1, kMaxDim, s.field("points"), expected), dt}] = static_cast<TimeNs>(std::llround(t));
      }
    }
  }
}

const MeasuredSweep* HardwareProfile::Impl::nearest_sweep(CollectiveOp op, int n, int k) const {
  const MeasuredSweep* best = nullptr;
  for (const auto& s : sweeps) {
    if (s.op != op || (s.nodes > 1) != (k > 1)) continue;
    if (!best || std::abs(s.group_size - n) < std::abs(best->group_size - n)) best = &s;
  }
  return best;
}

// ---- construction ----
HardwareProfile::HardwareProfile() : impl_(std::make_unique<Impl>()) {}
HardwareProfile::~HardwareProfile() = default;
HardwareProfile::HardwareProfile(const HardwareProfile& o) : impl_(std::make_unique<Impl>(*o.impl_)) {}
HardwareProfile& HardwareProfile::operator=(const HardwareProfile& o) {
  if (this != &o) impl_ = std::make_unique<Impl>(*o.impl_);
  return *this;
}
HardwareProfile::HardwareProfile(HardwareProfile&&) noexcept = default;
HardwareProfile& HardwareProfile::operator=(HardwareProfile&&) noexcept = default;

namespace {

void load_fabrics(HardwareProfile::Impl& im, const nlohmann::json& intra, const nlohmann::json& inter, const std::string& where) {
  im.intra_doc = intra;
  im.model.intra = HardwareProfile::Impl::load_fabric(intra, where + "intra_node", false, nullptr);
  im.inter_doc = inter;
  im.model.has_inter = !inter.is_null();
  if (im.model.has_inter) {
    int dflt = 0;
    im.model.inter = HardwareProfile::Impl::load_fabric(inter, where + "inter_node", true, &dflt);
    im.model.nics_per_node = im.cluster.nics_per_node > 0 ? im.cluster.nics_per_node : dflt;
    im.model.gpus_per_node = im.cluster.gpus_per_node;
  }
}

}  // namespace

HardwareProfile HardwareProfile::for_cluster(const Cluster& c) {
  HardwareProfile p;
  Impl& im = *p.impl_;
  im.cluster = c;
  im.source = "builtin";
  im.gpu_doc = builtin_gpu_json(c.gpu, "cluster.gpu");
  im.load_gpu(im.gpu_doc, "calibrate/profiles/gpus/" + c.gpu + ".json");
  nlohmann::json inter = c.inter_node.empty() ? nlohmann::json() : builtin_fabric_json(c.inter_node, "cluster.inter_node");
  load_fabrics(im, builtin_fabric_json(c.intra_node, "cluster.intra_node"), inter, "calibrate/profiles/fabrics/");
  im.name = c.gpu + " + " + c.intra_node + (c.inter_node.empty() ? "" : " + " + c.inter_node);
  im.context = nlohmann::json{{"note", "built-in profile: public figures, each with its source; not measured on this machine"}};
  if (c.gpu_memory_override > 0) im.capacity = c.gpu_memory_override;
  if (c.host_memory_override > 0) im.host_capacity = c.host_memory_override;
  return p;
}

HardwareProfile HardwareProfile::from_file(const std::string& path, const Cluster& c, const std::string& field) {
  return from_json(read_json_file(path, field), path, c, field);
}

HardwareProfile HardwareProfile::from_json(const nlohmann::json& j, const std::string& path, const Cluster& c,
                                           const std::string& field) {
  JsonReader r(j, field);
  r.check_no_unknown_keys({"schema", "context", "name", "cluster", "gpu", "intra_node", "inter_node", "measured", "notes"});
  std::string schema = r.get_string("schema");
  if (schema != "fsdpsim.hardware_profile/1")
    throw InputError(r.field("schema"), "\"" + schema + "\"", "expected \"fsdpsim.hardware_profile/1\"");
  HardwareProfile p;
  Impl& im = *p.impl_;
  im.cluster = c;
  im.source = path;
  im.name = r.get_string("name");
  if (r.has("context")) im.context = r.raw("context");
  im.gpu_doc = r.raw("gpu");
  im.load_gpu(im.gpu_doc, r.field("gpu"));
  im.cluster.gpu = im.gpu_doc.value("name", c.gpu);
  // Fabrics for what was not measured: the file's own, else the cluster's built-in ones.
  nlohmann::json intra = r.has("intra_node") ? r.raw("intra_node") : builtin_fabric_json(c.intra_node, "cluster.intra_node");
  nlohmann::json inter = r.has("inter_node") ? r.raw("inter_node")
                         : c.inter_node.empty() ? nlohmann::json() : builtin_fabric_json(c.inter_node, "cluster.inter_node");
  load_fabrics(im, intra, inter, r.field(""));
  if (r.has("measured")) {
    im.measured_doc = r.raw("measured");
    im.load_measured(im.measured_doc, r.field("measured"));
  }
  if (c.gpu_memory_override > 0) im.capacity = c.gpu_memory_override;
  if (c.host_memory_override > 0) im.host_capacity = c.host_memory_override;
  return p;
}

// ---- identity ----
std::string HardwareProfile::name() const { return impl_->name; }
std::string HardwareProfile::source() const { return impl_->source; }
const Cluster& HardwareProfile::cluster() const { return impl_->cluster; }
nlohmann::json HardwareProfile::context() const { return impl_->context; }

// ---- memory ----
Bytes HardwareProfile::memory_capacity() const { return impl_->capacity; }
Bytes HardwareProfile::cuda_context_bytes() const { return impl_->context_bytes; }
Bytes HardwareProfile::cublas_workspace_bytes() const { return impl_->cublas_workspace; }
int HardwareProfile::cuda_sm_count() const {
  return impl_->cublas_workspace > 0 ? static_cast<int>(impl_->cp.sm_count) : 0;
}

// ---- compute ----
double HardwareProfile::peak_flops(Dtype dtype) const {
  double p = impl_->cp.peak_flops[static_cast<int>(dtype)];
  if (p <= 0)
    throw InputError("dtype", std::string(dtype_name(dtype)), impl_->cluster.gpu + " has no " + std::string(dtype_name(dtype)) +
                                                                   " compute in its profile (e.g. fp8 tensor cores: Ada sm_89, Hopper and later)");
  return p;
}

TimeNs HardwareProfile::gemm_time(std::int64_t m, std::int64_t n, std::int64_t k, Dtype dtype) const {
  if (!impl_->gemms.empty()) {
    auto it = impl_->gemms.find(GemmKey{m, n, k, static_cast<int>(dtype)});
    if (it != impl_->gemms.end()) return it->second;
  }
  if (dtype == Dtype::FP8 && impl_->cp.peak_flops[static_cast<int>(Dtype::FP8)] <= 0)
    // fp8 GEMMs come only from torchao float8 training (plan key float8): name it.
    throw InputError("plan.float8", "(fp8 GEMMs on " + impl_->cluster.gpu + ")",
                     "float8 training needs fp8 tensor cores (Ada sm_89, Hopper and later; the built-in profiles with fp8: H100, "
                     "H200, B200); " +
                         impl_->cluster.gpu + " has none in its profile: use float8 \"none\"");
  peak_flops(dtype);   // unsupported dtype -> InputError
  return model_gemm_time(impl_->cp, m, n, k, dtype);
}

TimeNs HardwareProfile::attention_time(std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                                       std::int64_t head_dim, Dtype dtype, bool backward) const {
  peak_flops(dtype);
  return model_attention_time(impl_->cp, batch, seq, heads, kv_heads, head_dim, dtype, backward);
}

TimeNs HardwareProfile::memory_bound_time(Bytes bytes_moved, MemoryClass cls) const {
  return model_memory_bound_time(impl_->cp, bytes_moved, cls);
}
TimeNs HardwareProfile::kernel_launch_ns() const { return impl_->launch_ns; }
TimeNs HardwareProfile::runtime_launch_ns() const { return impl_->runtime_launch_ns; }
TimeNs HardwareProfile::framework_hook_ns() const { return impl_->hook_ns; }
double HardwareProfile::comm_overlap_slowdown() const { return impl_->overlap; }
int HardwareProfile::launch_queue_depth() const { return impl_->launch_queue_depth; }

// ---- host <-> device ----
TimeNs HardwareProfile::host_copy_time(Bytes bytes) const {
  if (bytes <= 0) return 0;
  return static_cast<TimeNs>(std::llround(static_cast<double>(bytes) / impl_->pcie_bw * 1e9)) + impl_->cp.min_kernel_ns;
}

TimeNs HardwareProfile::cpu_optimizer_time(std::int64_t params) const {
  if (params <= 0) return 0;
  return static_cast<TimeNs>(std::llround(static_cast<double>(params) * kCpuAdamBytesPerParam / impl_->cpu_mem_bw * 1e9));
}

double HardwareProfile::cpu_optimizer_bytes_per_s() const { return impl_->cpu_mem_bw; }
Bytes HardwareProfile::host_memory_per_node() const { return impl_->host_capacity; }

// ---- communication ----
// A measured sweep timed one group alone (`fsdpsim calibrate` runs one group at a time); under SPMD
// the node's other groups of this shape share its NICs (collective_model.h): the part of the measured
// time past the model's ring latency is the transfer, and it takes sharing_slowdown() times longer.
TimeNs HardwareProfile::shared_by_node(CollectiveOp op, double measured_ns, int group_size, int nodes_spanned) const {
  const CollectiveModel& m = impl_->model;
  const double slow = m.sharing_slowdown(op, group_size, nodes_spanned);
  if (slow <= 1.0) return static_cast<TimeNs>(std::llround(measured_ns));
  const double lat = std::min(measured_ns, m.latency_ns(op, group_size, nodes_spanned));
  return static_cast<TimeNs>(std::llround(lat + (measured_ns - lat) * slow));
}

TimeNs HardwareProfile::collective_time(CollectiveOp op, Bytes bytes, int group_size, int nodes_spanned) const {
  if (group_size <= 1 || bytes <= 0) return 0;
  const Impl& im = *impl_;
  if (!im.sweeps.empty()) {
    auto it = im.sweep_index.find(fit_key(static_cast<int>(op), group_size, std::max(nodes_spanned, 1)));
    if (it != im.sweep_index.end())
      return shared_by_node(op, static_cast<double>(im.sweeps[static_cast<size_t>(it->second)].fit.time(bytes)),
                            group_size, nodes_spanned);
    // Another group size of the same op on the same kind of span: the ring moves busbw-factor x S
    // bytes per rank at about the same bus bandwidth, so scale by the factor ratio (extrapolated).
    if (const MeasuredSweep* s = im.nearest_sweep(op, group_size, nodes_spanned)) {
      double scale = busbw_factor(op, group_size) / busbw_factor(op, s->group_size);
      return shared_by_node(op, static_cast<double>(s->fit.time(bytes)) * scale, group_size, nodes_spanned);
    }
  }
  return im.model.time(op, bytes, group_size, nodes_spanned);
}

bool HardwareProfile::collective_extrapolated(CollectiveOp op, Bytes bytes, int group_size, int nodes_spanned) const {
  if (group_size <= 1 || bytes <= 0) return false;
  const Impl& im = *impl_;
  if (!im.sweeps.empty()) {
    auto it = im.sweep_index.find(fit_key(static_cast<int>(op), group_size, std::max(nodes_spanned, 1)));
    if (it != im.sweep_index.end()) return im.sweeps[static_cast<size_t>(it->second)].fit.extrapolated(bytes);
    return true;   // scaled from another group size, or the analytic model instead of this machine's sweep
  }
  return im.model.extrapolated(op, bytes, group_size, nodes_spanned);
}

// ---- serialization ----
nlohmann::json HardwareProfile::to_json() const {
  const Impl& im = *impl_;
  nlohmann::json cl{{"name", im.cluster.name},           {"nodes", im.cluster.nodes},
                    {"gpus_per_node", im.cluster.gpus_per_node}, {"gpu", im.cluster.gpu},
                    {"intra_node", im.cluster.intra_node}, {"inter_node", im.cluster.inter_node},
                    {"nics_per_node", im.cluster.nics_per_node}};
  if (im.cluster.host_memory_override > 0)
    cl["host_memory_gib"] = static_cast<double>(im.cluster.host_memory_override) / static_cast<double>(kGiB);
  nlohmann::json j{{"schema", "fsdpsim.hardware_profile/1"}, {"context", im.context}, {"name", im.name},
                   {"cluster", cl}, {"gpu", im.gpu_doc}, {"intra_node", im.intra_doc}};
  if (!im.inter_doc.is_null()) j["inter_node"] = im.inter_doc;
  if (!im.measured_doc.is_null()) j["measured"] = im.measured_doc;
  return j;
}

}  // namespace fsdpsim::calibrate

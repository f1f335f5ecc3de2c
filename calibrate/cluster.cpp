// Cluster names and files (hardware_profile.h `load_cluster`).
//   one node:    <gpus>x<GPU>[-<intra fabric>][-<inter fabric>]            e.g. 8xH100-SXM, 8xA100-80GB-PCIe4, 2xCPU
//   many nodes:  <nodes>x<gpus_per_node>x<GPU>[-<intra fabric>]-<inter fabric>   e.g. 16x8xA100-80GB-IB-HDR200
// The GPU's default intra-node fabric applies when none is named (NVLink3 for A100, NVLink4 for
// H100/H200, NVLink5 for B200, PCIe4 for RTX4090, shared memory for CPU ranks). NICs per node default
// to the inter fabric's (one per GPU for IB/RoCE, one per node for Ethernet), capped at the GPUs per
// node. A file may also set `host_memory_gib`, the host RAM of one node (default: the GPU profile's
// typical node; none for RTX4090, whose host memory is then not checked).
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "calibrate/builtin_profiles.h"
#include "calibrate/hardware_profile.h"
#include "common/errors.h"
#include "common/json_reader.h"

namespace fsdpsim::calibrate {
namespace {

constexpr int kMaxGpusPerNode = 64;    // issue text: gpus_per_node > 64 is rejected
constexpr int kMaxNodes = 16384;       // far above any FSDP job; guards against typos like 10000000x8
constexpr double kMaxHostGib = 1048576;   // 1 PiB per node: far above any server (DGX B200: up to 4 TB)

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

const char* kNameGrammar =
    "expected <gpus>x<GPU>[-<intra>] (one node) or <nodes>x<gpus_per_node>x<GPU>[-<intra>]-<inter> "
    "(e.g. 8xH100-SXM, 16x8xA100-80GB-IB-HDR200)";

// Reads a positive decimal count at s[pos..] followed by 'x'; advances pos past the 'x'.
bool read_count(const std::string& s, size_t& pos, long long& out) {
  size_t start = pos;
  while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) ++pos;
  if (pos == start || pos >= s.size() || s[pos] != 'x' || pos - start > 9) {
    pos = start;
    return false;
  }
  out = std::stoll(s.substr(start, pos - start));
  ++pos;
  return true;
}

int default_nics(const std::string& inter, int gpus_per_node) {
  const auto& j = builtin_fabric_json(inter, "inter_node");
  int nics = j.at("default_nics_per_node").at("value").get<int>();
  return std::min(nics, std::max(gpus_per_node, 1));
}

void validate(const Cluster& c, const std::string& field) {
  if (c.nodes < 1 || c.nodes > kMaxNodes)
    throw InputError(field + ".nodes", std::to_string(c.nodes), "nodes must be in [1, " + std::to_string(kMaxNodes) + "]");
  if (c.gpus_per_node < 1 || c.gpus_per_node > kMaxGpusPerNode)
    throw InputError(field + ".gpus_per_node", std::to_string(c.gpus_per_node),
                     "gpus_per_node must be in [1, " + std::to_string(kMaxGpusPerNode) + "]");
  builtin_gpu_json(c.gpu, field + ".gpu");
  const auto& intra = builtin_fabric_json(c.intra_node, field + ".intra_node");
  if (intra.value("kind", "") != "intra_node")
    throw InputError(field + ".intra_node", "\"" + c.intra_node + "\"",
                     "not an intra-node fabric; intra-node fabrics: " + join(builtin_fabric_names("intra_node")));
  if (c.nodes > 1 && c.inter_node.empty())
    throw InputError(field + ".inter_node", "<missing>",
                     "a cluster of several nodes needs an inter-node fabric: " + join(builtin_fabric_names("inter_node")));
  if (!c.inter_node.empty()) {
    const auto& inter = builtin_fabric_json(c.inter_node, field + ".inter_node");
    if (inter.value("kind", "") != "inter_node")
      throw InputError(field + ".inter_node", "\"" + c.inter_node + "\"",
                       "not an inter-node fabric; inter-node fabrics: " + join(builtin_fabric_names("inter_node")));
  }
  if (c.nodes > 1 && (c.nics_per_node < 1 || c.nics_per_node > kMaxGpusPerNode))
    throw InputError(field + ".nics_per_node", std::to_string(c.nics_per_node), "nics_per_node must be in [1, 64]");
  if (c.gpu_memory_override < 0)
    throw InputError(field + ".gpu_memory_gib", std::to_string(c.gpu_memory_override), "must be > 0");
  if (c.host_memory_override < 0)
    throw InputError(field + ".host_memory_gib", std::to_string(c.host_memory_override), "must be > 0");
}

Cluster parse_name(const std::string& name, const std::string& field) {
  auto bad = [&](const std::string& why) { return InputError(field, "\"" + name + "\"", why); };
  size_t pos = 0;
  long long a = 0, b = 0;
  if (!read_count(name, pos, a)) throw bad(kNameGrammar);
  Cluster c;
  c.name = name;
  bool multi = read_count(name, pos, b);
  c.nodes = multi ? static_cast<int>(std::min<long long>(a, kMaxNodes + 1LL)) : 1;
  long long gpn = multi ? b : a;
  c.gpus_per_node = static_cast<int>(std::min<long long>(gpn, kMaxGpusPerNode + 1LL));
  std::string rest = name.substr(pos);
  // GPU: the longest built-in GPU name that `rest` starts with, followed by the end or '-'.
  std::string gpu;
  for (const auto& g : builtin_gpu_names())
    if (rest.rfind(g, 0) == 0 && (rest.size() == g.size() || rest[g.size()] == '-') && g.size() > gpu.size()) gpu = g;
  if (gpu.empty()) throw bad("unknown GPU \"" + rest + "\"; built-in GPUs: " + join(builtin_gpu_names()));
  c.gpu = gpu;
  std::string fabrics = rest.size() > gpu.size() ? rest.substr(gpu.size() + 1) : "";
  // Fabric suffix: [<intra>][-<inter>], matched against the built-in names (which contain dashes).
  auto take = [&](const std::string& kind) -> std::string {
    std::string best;
    for (const auto& f : builtin_fabric_names(kind))
      if (fabrics.rfind(f, 0) == 0 && (fabrics.size() == f.size() || fabrics[f.size()] == '-') && f.size() > best.size()) best = f;
    if (!best.empty()) fabrics = fabrics.size() > best.size() ? fabrics.substr(best.size() + 1) : "";
    return best;
  };
  c.intra_node = take("intra_node");
  c.inter_node = take("inter_node");
  if (!fabrics.empty())
    throw bad("unknown fabric \"" + fabrics + "\"; intra-node: " + join(builtin_fabric_names("intra_node")) +
              "; inter-node: " + join(builtin_fabric_names("inter_node")));
  if (c.intra_node.empty()) c.intra_node = builtin_gpu_json(gpu, field).at("default_intra_node").get<std::string>();
  if (c.nodes > 1 && c.inter_node.empty())
    throw bad("a cluster of several nodes needs an inter-node fabric suffix, one of: " +
              join(builtin_fabric_names("inter_node")) + " (e.g. 2x8xH100-SXM-IB-NDR400)");
  if (a == 0 || (multi && b == 0)) throw bad("counts must be >= 1; " + std::string(kNameGrammar));
  if (!c.inter_node.empty()) c.nics_per_node = default_nics(c.inter_node, c.gpus_per_node);
  validate(c, field);
  return c;
}

}  // namespace

Cluster cluster_from_json(const Json& j, const std::string& path) {
  JsonReader r(j, "cluster");
  r.check_no_unknown_keys({"name", "nodes", "gpus_per_node", "gpu", "intra_node", "inter_node", "nics_per_node",
                           "gpu_memory_gib", "host_memory_gib", "description"});
  Cluster c;
  c.name = r.get_string("name", path);
  c.nodes = static_cast<int>(r.get_int("nodes", 1, kMaxNodes));
  c.gpus_per_node = static_cast<int>(r.get_int("gpus_per_node", 1, kMaxGpusPerNode));
  c.gpu = r.get_enum("gpu", builtin_gpu_names());
  std::string dflt_intra = builtin_gpu_json(c.gpu, r.field("gpu")).at("default_intra_node").get<std::string>();
  c.intra_node = r.get_enum("intra_node", builtin_fabric_names("intra_node"), dflt_intra);
  if (c.nodes > 1 || r.has("inter_node")) c.inter_node = r.get_enum("inter_node", builtin_fabric_names("inter_node"));
  if (!c.inter_node.empty())
    c.nics_per_node = static_cast<int>(r.get_int("nics_per_node", 1, kMaxGpusPerNode, default_nics(c.inter_node, c.gpus_per_node)));
  if (r.has("gpu_memory_gib"))
    c.gpu_memory_override = static_cast<Bytes>(r.get_double("gpu_memory_gib", 0.001, 65536.0) * static_cast<double>(kGiB));
  if (r.has("host_memory_gib"))
    c.host_memory_override = static_cast<Bytes>(r.get_double("host_memory_gib", 0.001, kMaxHostGib) * static_cast<double>(kGiB));
  validate(c, "cluster");
  return c;
}

namespace {

Cluster parse_file(const std::string& path, const std::string& field) {
  return cluster_from_json(read_json_file(path, field), path);
}

}  // namespace

Cluster load_cluster(const std::string& name_or_path, const std::string& field) {
  if (name_or_path.empty()) throw InputError(field, "\"\"", kNameGrammar);
  bool looks_like_file = name_or_path.find('/') != std::string::npos ||
                         (name_or_path.size() > 5 && name_or_path.substr(name_or_path.size() - 5) == ".json");
  if (looks_like_file) return parse_file(name_or_path, field);
  return parse_name(name_or_path, field);
}

std::vector<std::string> builtin_cluster_examples() {
  return {"8xH100-SXM",           "8xA100-80GB",          "8xA100-40GB",          "8xH200",
          "8xB200",               "4xA100-80GB-PCIe4",    "2x8xH100-SXM-IB-NDR400", "4x8xH100-SXM-IB-NDR400",
          "16x8xA100-80GB-IB-HDR200", "8x8xA100-80GB-RoCE-200G", "2x8xH100-SXM-ETH-10G", "4xRTX4090", "2xCPU"};
}

}  // namespace fsdpsim::calibrate

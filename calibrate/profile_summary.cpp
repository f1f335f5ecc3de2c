#include "calibrate/profile_summary.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <set>
#include <sstream>

#include "calibrate/builtin_profiles.h"
#include "calibrate/collective_model.h"
#include "common/errors.h"
#include "common/json_reader.h"

namespace fsdpsim::calibrate {
namespace {

bool is_file_arg(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 5 && s.substr(s.size() - 5) == ".json");
}

// The cluster a profile file describes: its "cluster" section, else one node of the largest
// measured group on the GPU's default intra-node fabric.
Cluster cluster_of_file(const nlohmann::json& j, const std::string& field) {
  JsonReader r(j, field);
  Cluster c;
  c.name = r.get_string("name", "profile");
  const nlohmann::json& gpu = r.raw("gpu");
  c.gpu = gpu.value("name", "");
  c.intra_node = gpu.value("default_intra_node", "");
  c.gpus_per_node = 1;
  if (r.has("cluster")) {
    JsonReader cl = r.get_object("cluster");
    c.nodes = static_cast<int>(cl.get_int("nodes", 1, 1 << 20, 1));
    c.gpus_per_node = static_cast<int>(cl.get_int("gpus_per_node", 1, 64, 8));
    c.intra_node = cl.get_string("intra_node", c.intra_node);
    c.inter_node = cl.get_string("inter_node", "");
    c.nics_per_node = static_cast<int>(cl.get_int("nics_per_node", 0, 64, 0));
  } else if (j.contains("measured") && j["measured"].contains("collectives")) {
    for (const auto& s : j["measured"]["collectives"])
      if (s.value("nodes", 1) == 1) c.gpus_per_node = std::max(c.gpus_per_node, s.value("group_size", 1));
  }
  return c;
}

void add_sources(const nlohmann::json& j, const std::string& path, std::ostringstream& os) {
  if (!j.is_object()) return;
  if (j.contains("source") && j.contains("value") && j["value"].is_number()) {
    char v[48];
    std::snprintf(v, sizeof(v), "%.6g", j["value"].get<double>());
    os << "  " << path << " = " << v << "\n      source: " << j["source"].get<std::string>() << "\n";
    return;
  }
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "context") add_sources(it.value(), path.empty() ? it.key() : path + "." + it.key(), os);
}

}  // namespace

HardwareProfile load_profile_for_show(const std::string& name_or_path, const std::string& field) {
  if (is_file_arg(name_or_path)) {
    nlohmann::json j = read_json_file(name_or_path, field);
    return HardwareProfile::from_file(name_or_path, cluster_of_file(j, field), field);
  }
  if (is_builtin_gpu(name_or_path)) return HardwareProfile::for_cluster(load_cluster("8x" + name_or_path, field));
  if (name_or_path.empty() || !std::isdigit(static_cast<unsigned char>(name_or_path[0]))) {
    std::string gpus;
    for (const auto& g : builtin_gpu_names()) gpus += (gpus.empty() ? "" : ", ") + g;
    throw InputError(field, "\"" + name_or_path + "\"",
                     "expected a profile file, a built-in GPU (" + gpus + ") or a cluster name such as 8xH100-SXM");
  }
  return HardwareProfile::for_cluster(load_cluster(name_or_path, field));
}

std::string profile_summary(const HardwareProfile& p) {
  std::ostringstream os;
  const Cluster& c = p.cluster();
  char line[256];
  os << "profile: " << p.name() << "\nsource:  " << p.source() << "\n";
  os << "cluster: " << c.nodes << " node(s) x " << c.gpus_per_node << " " << c.gpu << ", intra-node " << c.intra_node;
  if (!c.inter_node.empty()) os << ", inter-node " << c.inter_node << " (" << c.nics_per_node << " NICs/node)";
  os << "\n\ncompute (dense peak; MFU is reported against it):\n";
  for (Dtype d : {Dtype::BF16, Dtype::FP16, Dtype::FP32, Dtype::FP8}) {
    try {
      double pk = p.peak_flops(d);
      double t = static_cast<double>(p.gemm_time(8192, 8192, 8192, d));
      std::snprintf(line, sizeof(line), "  %-5s peak %9.1f TFLOP/s   8192^3 GEMM %9.1f TFLOP/s (%.0f%%)\n",
                    std::string(dtype_name(d)).c_str(), pk / 1e12, 2.0 * 8192.0 * 8192 * 8192 / t / 1e3,
                    100.0 * 2.0 * 8192.0 * 8192 * 8192 / t / 1e3 / (pk / 1e12));
      os << line;
    } catch (const InputError&) {
      os << "  " << dtype_name(d) << "  not supported\n";
    }
  }
  std::snprintf(line, sizeof(line),
                "  memory-bound kernels: %.0f GB/s achieved; kernel launch %.1f us, framework hook %.1f us, "
                "compute slowdown while a collective runs x%.2f\n",
                static_cast<double>(kGiB) / static_cast<double>(p.memory_bound_time(kGiB)), p.kernel_launch_ns() / 1e3,
                p.framework_hook_ns() / 1e3, p.comm_overlap_slowdown());
  os << line;
  std::snprintf(line, sizeof(line), "\nmemory: %.2f GiB per %s (allocatable), %.2f GiB CUDA/NCCL context outside the allocator\n",
                to_gib(p.memory_capacity()), c.gpu.c_str(), to_gib(p.cuda_context_bytes()));
  os << line;
  os << "\ncollectives: busbw in GB/s (nccl-tests definition; * = extrapolated beyond measured/sourced data)\n";
  std::set<std::pair<int, int>> groups = {{2, 1}};
  if (c.gpus_per_node > 2) groups.insert({c.gpus_per_node, 1});
  if (c.nodes > 1) groups.insert({c.world(), c.nodes}), groups.insert({c.nodes, c.nodes});
  const Bytes sizes[] = {kMiB, 16 * kMiB, 256 * kMiB, kGiB};
  std::snprintf(line, sizeof(line), "  %-15s %6s %6s %10s %10s %10s %10s\n", "op", "ranks", "nodes", "1 MiB", "16 MiB", "256 MiB", "1 GiB");
  os << line;
  for (auto op : {CollectiveOp::AllGather, CollectiveOp::ReduceScatter, CollectiveOp::AllReduce}) {
    for (auto [n, k] : groups) {
      std::snprintf(line, sizeof(line), "  %-15s %6d %6d", collective_name(op), n, k);
      os << line;
      for (Bytes s : sizes) {
        double t = static_cast<double>(p.collective_time(op, s, n, k));
        double bus = static_cast<double>(s) / t * busbw_factor(op, n);
        std::snprintf(line, sizeof(line), " %9.1f%s", bus, p.collective_extrapolated(op, s, n, k) ? "*" : " ");
        os << line;
      }
      os << "\n";
    }
  }
  os << "\nvalues and their sources:\n";
  nlohmann::json j = p.to_json();
  add_sources(j, "", os);
  if (j.contains("measured")) {
    os << "  measured sweeps:\n";
    for (const auto& s : j["measured"].value("collectives", nlohmann::json::array()))
      os << "    " << s.value("op", "") << " x" << s.value("group_size", 0) << " on " << s.value("nodes", 0)
         << " node(s): " << s["points"].size() << " sizes; " << s.value("source", "") << "\n";
  }
  return os.str();
}

}  // namespace fsdpsim::calibrate

// A hardware profile: every cost the simulator needs for one cluster (GPU + fabrics), each value
// measured by `fsdpsim calibrate` or taken from a cited public figure. Knows nothing of FSDP.
// JSON schema: calibrate/profiles/README.md. Built-in GPUs/fabrics: calibrate/profiles/*.json.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "common/memory_class.h"
#include "calibrate/launch_queue.h"
#include "common/units.h"

namespace fsdpsim::calibrate {

enum class CollectiveOp { AllGather, ReduceScatter, AllReduce };
const char* collective_name(CollectiveOp op);

// The cluster's shape (issue "simulator", Cluster and hardware).
struct Cluster {
  std::string name;              // "8xH100-SXM", "16x8xA100-80GB-IB-HDR200", or the file name
  int nodes = 1;
  int gpus_per_node = 8;
  std::string gpu;               // GPU profile name: "H100-SXM", "A100-80GB", ...
  std::string intra_node;        // fabric name: "NVLink4-NVSwitch", "PCIe4", ...
  std::string inter_node;        // fabric name: "IB-NDR400", "ETH-10G", ... ("" for one node)
  int nics_per_node = 0;
  Bytes gpu_memory_override = 0; // 0 = the GPU profile's
  Bytes host_memory_override = 0; // host RAM of one node; 0 = the GPU profile's (its typical node's)
  int world() const { return nodes * gpus_per_node; }
};

// Parses a cluster name ("8xH100-SXM", "2x8xH100-SXM-ETH-10G") or a JSON file; InputError otherwise.
Cluster load_cluster(const std::string& name_or_path, const std::string& field = "--cluster");
// The JSON core of a cluster file (load_cluster reads the file, then calls this); `path` is the
// default name and appears in messages.
Cluster cluster_from_json(const nlohmann::json& j, const std::string& path);
std::vector<std::string> builtin_cluster_examples();

// AdamW on fp32 master params, one fused pass: reads param, grad, exp_avg, exp_avg_sq (16 B) and writes
// param, exp_avg, exp_avg_sq (12 B) per parameter (torch.optim.AdamW(fused=True); the CPU kernel is
// memory-bound). PyTorch's default on CPU tensors is the for-loop implementation (foreach and fused are
// defaulted to only on CUDA-like devices: torch/optim/optimizer.py `_default_to_fused_or_foreach`), which
// makes one pass per elementwise op and moves more.
inline constexpr int kCpuAdamBytesPerParam = 28;

class HardwareProfile {
 public:
  // ---- identity ----
  std::string name() const;            // "H100-SXM + NVLink4-NVSwitch + IB-NDR400" or the file's name
  std::string source() const;          // "builtin" or the profile file path
  const Cluster& cluster() const;
  nlohmann::json context() const;      // the profile's own context block (measured where/when)

  // ---- memory ----
  Bytes memory_capacity() const;       // per GPU (the cluster override applies)
  Bytes cuda_context_bytes() const;    // CUDA context + NCCL buffers outside the caching allocator
  // One cuBLAS workspace (memory.cublas_workspace_mib, 0 when the profile has none): PyTorch allocates
  // one per (cuBLAS handle, stream) from the caching allocator at that pair's first GEMM and keeps it.
  Bytes cublas_workspace_bytes() const;
  // The CUDA device's multiprocessors (gpu.gemm.sm_count), which PyTorch's reduction kernels size their
  // staging buffers by (models/cuda_reduce.h); 0 for a CPU profile (one without a cuBLAS workspace).
  int cuda_sm_count() const;

  // ---- compute (single kernel, alone on the GPU) ----
  double peak_flops(Dtype dtype) const;   // dense peak FLOP/s for MFU (H100 SXM bf16 = 989e12)
  TimeNs gemm_time(std::int64_t m, std::int64_t n, std::int64_t k, Dtype dtype) const;
  TimeNs attention_time(std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                        std::int64_t head_dim, Dtype dtype, bool backward) const;
  // Elementwise/copy kernels (read + write bytes), at the class's rate (a calibrated CPU profile's
  // gpu.elementwise_bytes_per_s.<class>; otherwise HBM bandwidth x efficiency for every class).
  TimeNs memory_bound_time(Bytes bytes_moved, MemoryClass cls = MemoryClass::Copy) const;
  TimeNs kernel_launch_ns() const;     // CPU cost of one eager PyTorch op (Python, dispatch, the launch)
  TimeNs runtime_launch_ns() const;    // CPU cost of one op of the bundled C++ runtime (default: kernel_launch_ns)
  TimeNs framework_hook_ns() const;    // CPU cost of one framework hook (module pre/post hook in Python)
  double comm_overlap_slowdown() const; // compute time multiplier while a collective runs (>= 1)
  // Kernels one stream's launch queue holds before a launch blocks the CPU (overheads.launch_queue_depth,
  // default kDefaultLaunchQueueDepth, an assumption: calibrate/launch_queue.h); 0 = unbounded.
  int launch_queue_depth() const;

  // ---- host <-> device (offload) ----
  TimeNs host_copy_time(Bytes bytes) const;      // pinned H2D or D2H over this GPU's own PCIe link
  // AdamW step on the CPU (offloaded optimizer) of one rank, `params` parameters, while every rank of
  // the node steps at once: kCpuAdamBytesPerParam x params at cpu_optimizer_bytes_per_s().
  TimeNs cpu_optimizer_time(std::int64_t params) const;
  double cpu_optimizer_bytes_per_s() const;      // one rank's share of the node's host memory bandwidth
  Bytes host_memory_per_node() const;            // host RAM of one node (0: unknown)

  // ---- communication ----
  // `bytes` is S as nccl-tests counts it: the full (gathered / pre-scatter / reduced) buffer.
  // group_size ranks spread over `nodes_spanned` nodes (1 = intra-node only).
  TimeNs collective_time(CollectiveOp op, Bytes bytes, int group_size, int nodes_spanned) const;
  // True if the query falls outside the measured/sourced range (the result is extrapolated).
  bool collective_extrapolated(CollectiveOp op, Bytes bytes, int group_size, int nodes_spanned) const;

  // ---- loading ----
  // Built-in: from the cluster's gpu / fabric names; file: a calibrated profile JSON for this cluster.
  static HardwareProfile for_cluster(const Cluster& c);
  static HardwareProfile from_file(const std::string& path, const Cluster& c, const std::string& field = "--profile");
  // The in-memory core of from_file: a parsed profile document; `source` is what source() reports.
  static HardwareProfile from_json(const nlohmann::json& j, const std::string& source, const Cluster& c,
                                   const std::string& field = "--profile");
  nlohmann::json to_json() const;

  struct Impl;
  HardwareProfile();
  ~HardwareProfile();
  HardwareProfile(const HardwareProfile&);
  HardwareProfile& operator=(const HardwareProfile&);
  HardwareProfile(HardwareProfile&&) noexcept;
  HardwareProfile& operator=(HardwareProfile&&) noexcept;

 private:
  TimeNs shared_by_node(CollectiveOp op, double measured_ns, int group_size, int nodes_spanned) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdpsim::calibrate

#include "torch_ops_fixture.h"

#include <algorithm>
#include <cctype>

#include "common/errors.h"
#include "common/json_reader.h"
#include "models/kernels.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "program/lowering.h"

namespace fsdpsim::validation {

namespace {

bool contains_lower(const std::string& s, const std::string& needle) {
  std::string low(s.size(), ' ');
  std::transform(s.begin(), s.end(), low.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return low.find(needle) != std::string::npos;
}

}  // namespace

std::string measured_class(const std::string& harness_class, const std::string& kernel_name) {
  // The harness files every memcpy under its fake collectives; the pinned ones are host copies.
  if (contains_lower(kernel_name, "memcpy") && contains_lower(kernel_name, "pinned")) return "host_copy";
  if (harness_class == "fake_collective") return "";
  if (harness_class == "gemm" || harness_class == "attention" || harness_class == "optimizer" ||
      harness_class == "fsdp_copy")
    return harness_class;
  // cuDNN's SDPA runs helper kernels beside its fprop / bprop (dO.O dot product, dQ conversion).
  if (contains_lower(kernel_name, "cudnn")) return "attention";
  return "other_compute";
}

TorchOpsFixture read_torch_ops_fixture(const std::string& path) {
  const Json j = read_json_file(path, path);
  const std::string file = path.substr(path.find_last_of('/') + 1);
  if (!j.is_object()) throw InputError(file, json_value_for_message(j), "expected a JSON object");
  JsonReader r(j, file);
  TorchOpsFixture f;
  f.file = file;
  JsonReader ctx = r.get_object("context");
  f.gpu = ctx.get_object("gpu").get_string("name");
  f.torch_version = ctx.get_object("torch").get_string("version");
  JsonReader c = r.get_object("case");
  f.name = c.get_string("name");
  f.model = models::load_model(c.get_string("model"), c.field("model"));
  f.cluster = calibrate::load_cluster(c.get_string("cluster"), c.field("cluster"));
  f.plan = sim::parse_plan(c.raw("plan"));
  f.plan = sim::resolve_plan(f.plan, f.cluster.world(), f.cluster.gpus_per_node);
  const Json& walls = r.raw("step_wall_unprofiled_s");
  if (!walls.is_array() || walls.empty())
    throw InputError(r.field("step_wall_unprofiled_s"), json_value_for_message(walls), "expected a non-empty array");
  for (const auto& w : walls) {
    if (!w.is_number() || w.get<double>() <= 0)
      throw InputError(r.field("step_wall_unprofiled_s"), json_value_for_message(w), "expected seconds > 0");
    f.step_wall_unprofiled_s += w.get<double>() / static_cast<double>(walls.size());
  }
  for (const auto& cls : kOpClasses) f.measured[cls] = ClassFigure{};
  const Json& kernels = r.raw("top_kernels");
  if (!kernels.is_array()) throw InputError(r.field("top_kernels"), json_value_for_message(kernels), "expected an array");
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    JsonReader k(kernels[i], r.field("top_kernels") + "[" + std::to_string(i) + "]");
    const std::string cls = measured_class(k.get_string("class"), k.get_string("name"));
    const double us = k.get_double("us_per_step", 0, 1e12);
    double n = k.get_double("count_per_step", 0, 1e9);
    // cuBLASLt runs a split-K GEMM as two kernels, the GEMM and cublasLt::splitKreduce_kernel summing its
    // partial products: the reduction's time is the GEMM's, but it is not another GEMM.
    if (cls == "gemm" && k.get_string("name").find("splitKreduce") != std::string::npos) n = 0;
    if (cls.empty()) {
      f.fake_collective_us += us;
      continue;
    }
    f.measured[cls].us_per_step += us;
    f.measured[cls].kernels_per_step += n;
  }
  return f;
}

std::map<std::string, ClassFigure> simulated_classes(const TorchOpsFixture& f, const calibrate::HardwareProfile& hw) {
  const models::ModelSpec m = models::with_seq_len(f.model, f.plan.seq_len);
  const models::WrapGraph graph = models::build_wrap_graph(m, f.plan.auto_wrap_policy, f.plan.implementation);
  const sim::StepProgram prog = sim::lower(m, graph, f.plan, sim::Topology{f.cluster.world(), f.cluster.gpus_per_node});
  std::map<std::string, ClassFigure> out;
  for (const auto& cls : kOpClasses) out[cls] = ClassFigure{};
  auto add = [&](const std::string& cls, TimeNs t, double kernels) {
    out[cls].us_per_step += static_cast<double>(t) / 1e3;
    out[cls].kernels_per_step += kernels;
  };
  for (const sim::Op& op : prog.ops) {
    switch (op.kind) {
      case sim::OpKind::Forward:
      case sim::OpKind::Backward:
      case sim::OpKind::Recompute:
        for (const models::KernelDesc& k : op.kernel_list()) {
          switch (k.kind) {
            case models::KernelKind::Gemm:
              add("gemm", k.m > 0 && k.n > 0 && k.k > 0 ? hw.gemm_time(k.m, k.n, k.k, k.dtype) * k.count : 0,
                  static_cast<double>(k.count));
              break;
            case models::KernelKind::Attention:
              add("attention",
                  hw.attention_time(k.batch, k.seq, k.heads, k.kv_heads, k.head_dim, k.dtype, k.backward), 1);
              break;
            default:
              add("other_compute", hw.memory_bound_time(k.bytes, k.mem_class), 1);
          }
        }
        break;
      case sim::OpKind::CopyIn:
      case sim::OpKind::CopyOut:
        add("fsdp_copy", hw.memory_bound_time(op.copy_bytes), 1);
        break;
      case sim::OpKind::Cast:
      case sim::OpKind::Pad:
      case sim::OpKind::Divide:
        add("other_compute", hw.memory_bound_time(op.copy_bytes), 1);
        break;
      case sim::OpKind::OptimizerStep:
        add("optimizer", hw.memory_bound_time(op.copy_bytes, MemoryClass::Optimizer), 1);
        break;
      case sim::OpKind::D2H:
      case sim::OpKind::H2D:
        add("host_copy", op.copy_bytes > 0 ? hw.host_copy_time(op.copy_bytes) : 0, 1);
        break;
      default:
        break;   // collectives, host copies, the CPU optimizer: not GPU kernels of the compute model
    }
  }
  return out;
}

}  // namespace fsdpsim::validation

#include "tests/fuzz/fuzz_targets.h"

#include <cstdint>
#include <string>

#include "calibrate/hardware_profile.h"
#include "common/dtype.h"
#include "common/errors.h"
#include "common/json_reader.h"
#include "models/model_info.h"
#include "models/zoo.h"
#include "planner/user_config.h"
#include "program/plan.h"

namespace fsdpsim::fuzz {
namespace {

using calibrate::CollectiveOp;
using calibrate::HardwareProfile;

// The profile-dependent costs the simulator asks for, over a spread of sizes and group shapes.
void query_profile(const HardwareProfile& hw) {
  (void)hw.memory_capacity();
  (void)hw.cuda_context_bytes();
  for (Dtype dt : {Dtype::FP32, Dtype::BF16, Dtype::FP16}) {
    try {
      (void)hw.peak_flops(dt);
      (void)hw.gemm_time(4096, 4096, 4096, dt);
      (void)hw.gemm_time(1, 1, 1, dt);
      (void)hw.attention_time(1, 2048, 32, 8, 128, dt, false);
      (void)hw.attention_time(2, 4096, 32, 8, 128, dt, true);
    } catch (const InputError&) {   // a dtype the profile has no compute for
    }
  }
  (void)hw.memory_bound_time(0);
  (void)hw.memory_bound_time(1 << 30);
  (void)hw.kernel_launch_ns();
  (void)hw.runtime_launch_ns();
  (void)hw.framework_hook_ns();
  (void)hw.comm_overlap_slowdown();
  (void)hw.host_copy_time(1 << 20);
  (void)hw.cpu_optimizer_time(1000000);
  const int world = hw.cluster().world(), gpn = hw.cluster().gpus_per_node, nodes = hw.cluster().nodes;
  for (CollectiveOp op : {CollectiveOp::AllGather, CollectiveOp::ReduceScatter, CollectiveOp::AllReduce})
    for (Bytes b : {Bytes{0}, Bytes{512}, Bytes{1} << 20, Bytes{1} << 34}) {
      (void)hw.collective_time(op, b, 1, 1);
      (void)hw.collective_time(op, b, gpn, 1);
      (void)hw.collective_time(op, b, world, nodes);
      (void)hw.collective_extrapolated(op, b, world, nodes);
    }
  (void)hw.to_json().dump();
}

// config.json bytes -> import (as load_model does) -> validation -> model-info (params, FLOPs,
// activations, the wrap graph).
void run_hf_config(const std::string& data) {
  const Json j = parse_json_text(data, "config.json");
  const models::ModelSpec m = models::import_hf_config(j, "config.json");
  models::validate_model(m, "config.json");
  models::ModelInfoRequest req;
  req.seq_len = 2048;
  (void)models::model_info_json(m, req).dump();
  (void)models::model_to_json(m).dump();
}

// plan JSON -> parse_plan -> resolve for two cluster shapes -> plan_to_json must parse back to the
// same plan (what `fsdpsim plan` writes, `simulate --plan` must read).
void run_plan(const std::string& data) {
  const sim::Plan p = sim::parse_plan(parse_json_text(data, "--plan"));
  const Json once = sim::plan_to_json(p);
  const Json twice = sim::plan_to_json(sim::parse_plan(once));
  if (once != twice)
    throw std::logic_error("plan_to_json does not round-trip: " + once.dump() + " vs " + twice.dump());
  for (auto [gpus, gpn] : {std::pair{8, 8}, std::pair{16, 8}}) {
    try {
      (void)sim::plan_to_json(sim::resolve_plan(p, gpus, gpn)).dump();
    } catch (const InputError&) {   // e.g. a mesh that does not match this cluster
    }
  }
}

// A calibrated profile document for an 8-GPU and a 2-node cluster, then every cost query.
void run_profile(const std::string& data) {
  const Json j = parse_json_text(data, "--profile");
  for (const char* cluster : {"8xH100-SXM", "2x8xA100-80GB-IB-HDR200"}) {
    const HardwareProfile hw = HardwareProfile::from_json(j, "fuzz.json", calibrate::load_cluster(cluster));
    query_profile(hw);
  }
}

// A cluster: a JSON cluster file when it starts with '{', else a cluster name; then the built-in
// profile for it.
void run_cluster(const std::string& data) {
  const auto first = data.find_first_not_of(" \t\r\n");
  calibrate::Cluster c;
  if (first != std::string::npos && data[first] == '{') {
    c = calibrate::cluster_from_json(parse_json_text(data, "--cluster"), "cluster.json");
  } else {
    // load_cluster reads a file for anything that looks like a path: only names are fuzzed here.
    if (data.find('/') != std::string::npos || data.find(".json") != std::string::npos) return;
    c = calibrate::load_cluster(data, "--cluster");
  }
  query_profile(HardwareProfile::for_cluster(c));
}

const models::ModelSpec& user_model() {
  static const models::ModelSpec m = models::load_model("llama3-8b");
  return m;
}

// A diagnose config as read_user_config reads it after choosing the format, then its plan resolved.
void run_user(const std::string& data, const std::string& format) {
  const planner::UserConfig cfg = planner::parse_user_config_text(data, format, "fuzz", user_model());
  const int gpn = cfg.gpus_per_node > 0 ? cfg.gpus_per_node : 8;
  const int gpus = gpn * (cfg.nodes > 0 ? cfg.nodes : 1);
  (void)sim::plan_to_json(sim::resolve_plan(cfg.plan, gpus, gpn)).dump();
}

void run_user_yaml(const std::string& data) { run_user(data, planner::yaml_format_of(data)); }   // read_user_config's choice
void run_user_toml(const std::string& data) { run_user(data, "torchtitan"); }
void run_user_lightning(const std::string& data) { run_user(data, "lightning"); }

}  // namespace

const std::vector<Target>& targets() {
  static const std::vector<Target> t = {
      {"hf_config", "models::import_hf_config + validate_model + model_info_json", run_hf_config},
      {"plan", "sim::parse_plan + plan_to_json round trip + resolve_plan", run_plan},
      {"profile", "calibrate::HardwareProfile::from_json + cost queries", run_profile},
      {"cluster", "calibrate::cluster_from_json / load_cluster(name) + for_cluster", run_cluster},
      {"user_yaml", "planner::parse_user_config_text (accelerate / torchtune / lightning-yaml)", run_user_yaml},
      {"user_toml", "planner::parse_user_config_text (torchtitan)", run_user_toml},
      {"user_lightning", "planner::parse_user_config_text (lightning .py)", run_user_lightning},
  };
  return t;
}

const Target* find_target(const std::string& name) {
  for (const auto& t : targets())
    if (name == t.name) return &t;
  return nullptr;
}

}  // namespace fsdpsim::fuzz

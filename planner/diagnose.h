// `fsdpsim diagnose`: predict a user's existing configuration and list its problems, each with the
// fix in the user's terms and the predicted gain (the fixed plan is simulated too). The checks
// encode the pitfalls users report (ecosystem.md §1, fsdp-semantics.md §7 K1-K3):
//   wrap_nothing               an auto-wrap policy that wraps nothing (one FSDP unit), or a size policy
//                              that wraps far too many tiny units (hook overhead, D6)
//   precision                  fp32 master weights ("16-mixed"/"bf16-mixed") where "bf16-true" would fit
//                              or free memory (K1); fp32 compute ("32-true"); fp16 loss scaling
//   activation_checkpointing   none where activations dominate or the plan does not fit (long sequences)
//   full_shard_across_nodes    FULL_SHARD/SHARD_GRAD_OP sharded over slow inter-node links vs HYBRID_SHARD (K2)
//   no_shard / full_shard_overhead  NO_SHARD (DDP-like) for a small model that fits is fine; FULL_SHARD's
//                              extra all-gathers when NO_SHARD fits and is faster (K2, OLMo#762)
//   hf_gradient_checkpointing  checkpoint(FSDP(block)): an extra all-gather per unit (A2)
//   cpu_offload                offload although the plan fits without it
//   offload_accumulation       FSDP1 + CPU offload accumulating outside no_sync (wrong gradients, PyTorch FSDP docs)
//   cpu_bound                  the CPU issues eager ops for nearly the whole step (small models, small micro-
//                              batches: K3): twice the micro-batch in half the micro-batches, when it fits and is faster
// Fixes are spelled in the config's own framework (diagnose_fixes.h) and each is simulated; a
// finding says what its problem costs in memory (the simulated difference).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/hardware_profile.h"
#include "models/model_spec.h"
#include "planner/user_config.h"
#include "program/sim_result.h"

namespace fsdpsim::planner {

struct Finding {
  std::string id;
  std::string severity;        // "problem", "ok", "info"
  std::string message;         // what is wrong (or fine), with numbers
  std::string fix;             // the change, in the config's own terms ("" = none)
  bool simulated = false;      // a fixed plan was simulated
  sim::Plan fixed_plan;
  sim::SimResult fixed_result;
  bool fixed_fits_with_margin = false;
  std::string gain;            // "tokens/s per GPU 1200 -> 1500 (+25.0%), peak 70.1 -> 52.3 GiB"
  Bytes memory_saved = 0;      // simulated: peak device memory of the config minus that of the fixed plan
};

struct Diagnosis {
  UserConfig config;
  sim::Plan plan;              // resolved
  sim::SimResult result;
  Bytes usable = 0;            // capacity less the margin (explain.h "headroom and margin")
  double memory_margin = 0.05;
  bool fits_with_margin = false;
  std::vector<Finding> findings;
  bool has_combined = false;   // every problem's fix applied together
  sim::Plan combined_plan;
  sim::SimResult combined_result;
  std::string combined_gain;
};

// The plan a user config describes on a cluster: torchtitan's "-1" shard degree and global batch
// size resolved, then resolve_plan (InputError naming the config key or plan field).
sim::Plan user_plan(const UserConfig& cfg, const calibrate::Cluster& cl);

// `simulate` defaults to sim::simulate without a trace (tests may pass their own).
using SimulateFn = std::function<sim::SimResult(const sim::Plan&)>;
Diagnosis diagnose(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const UserConfig& cfg,
                   double memory_margin, const SimulateFn& simulate = {});

nlohmann::json diagnosis_to_json(const Diagnosis& d, const models::ModelSpec& model, const calibrate::Cluster& cluster);
std::string diagnosis_text(const Diagnosis& d);

}  // namespace fsdpsim::planner

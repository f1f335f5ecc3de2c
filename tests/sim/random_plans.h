// Random plans for the differential tests (tests/sim/test_stretch.cpp, test_memory_fold.cpp): every
// plan key with a spread of values, some combinations invalid for the cluster on purpose.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "calibrate/hardware_profile.h"

namespace fsdpsim::sim {

// The zoo models and clusters the widest random groups draw from.
inline constexpr const char* kRandomPlanModels[] = {"llama3-8b", "llama3-70b", "mistral-7b", "qwen2-7b", "gemma-2b",
                                                     "llama-1b",  "gpt2-xl",    "mixtral-8x7b", "llama2-13b"};
inline constexpr const char* kRandomPlanClusters[] = {"8xH100-SXM", "2x8xH100-SXM-IB-NDR400", "4x8xA100-40GB-IB-HDR200",
                                                       "16x8xH100-SXM-IB-NDR400", "2x8xH100-SXM-ETH-10G"};

// One of names, drawn by rng.
template <class Names>
std::string random_name(std::mt19937& rng, const Names& names) {
  return names[rng() % std::size(names)];
}

// How many random plans a group tries: FSDPSIM_RANDOM_PLANS (a longer run, e.g. after changing the
// stretch, the engine or the fold), else the group's CI count.
// FSDPSIM_RANDOM_PLANS_MAX caps it (scripts/sanitize.sh: the sanitized run looks for memory errors on the
// same paths with fewer plans; the plain run keeps CI's counts).
inline int random_plan_count(int ci) {
  const char* env = std::getenv("FSDPSIM_RANDOM_PLANS");
  int n = env ? std::max(1, std::atoi(env)) : ci;
  if (const char* cap = std::getenv("FSDPSIM_RANDOM_PLANS_MAX")) n = std::min(n, std::max(1, std::atoi(cap)));
  return n;
}

// A group's seed: FSDPSIM_RANDOM_SEED plus the group's offset, else the group's CI seed.
inline std::uint32_t random_seed(std::uint32_t ci, std::uint32_t offset = 0) {
  const char* env = std::getenv("FSDPSIM_RANDOM_SEED");
  return env ? static_cast<std::uint32_t>(std::atoll(env)) + offset : ci;
}

// A random plan as JSON text; some are invalid for the cluster (simulate() then throws InputError, the
// same with the stretch on and off).
inline std::string random_plan(std::mt19937& rng, int gpus, int gpus_per_node) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto one = [&](std::initializer_list<const char*> v) { return std::string(*(v.begin() + pick(0, static_cast<int>(v.size()) - 1))); };
  nlohmann::json j;
  const bool fsdp1 = pick(0, 2) == 0;
  j["fsdp_version"] = fsdp1 ? 1 : 2;
  if (fsdp1) {
    j["sharding_strategy"] = one({"FULL_SHARD", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"});
    j["backward_prefetch"] = one({"BACKWARD_PRE", "BACKWARD_POST", "NONE"});
    j["forward_prefetch"] = pick(0, 1) == 1;
    j["limit_all_gathers"] = pick(0, 1) == 1;
    j["use_orig_params"] = pick(0, 3) != 0;
  } else {
    const int r = pick(0, 4);
    if (r == 1) j["reshard_after_forward"] = false;
    if (r == 2 && gpus_per_node > 1 && gpus > gpus_per_node) j["reshard_after_forward"] = gpus_per_node;
    if (pick(0, 3) == 0) j["prefetch_depth"] = pick(1, 3);
    if (pick(0, 4) == 0) j["forward_prefetch"] = true;
    if (pick(0, 5) == 0) j["sharding_strategy"] = one({"HYBRID_SHARD", "NO_SHARD", "_HYBRID_SHARD_ZERO2"});
    if (pick(0, 5) == 0) j["fp8_all_gather"] = true;
  }
  if (gpus > gpus_per_node && pick(0, 2) == 0) j["mesh"] = {{"replicate", gpus / gpus_per_node}, {"shard", gpus_per_node}};
  const int ac = pick(0, 6);
  if (ac == 1) j["activation_checkpointing"] = "full";
  if (ac == 2) j["activation_checkpointing"] = "selective_op";
  if (ac == 3) j["activation_checkpointing"] = "every_" + std::to_string(pick(2, 4));
  if (ac == 4) j["activation_checkpointing"] = {{"mode", "full"}, {"outside_fsdp", true}};
  if (pick(0, 3) == 0) j["param_dtype"] = one({"fp32", "fp16", "bf16"});
  if (pick(0, 3) == 0) j["reduce_dtype"] = one({"bf16", "fp16", "fp32"});
  if (pick(0, 5) == 0) j["master_weights_dtype"] = "bf16";
  j["micro_batch"] = pick(1, 4);
  j["seq_len"] = 512 * pick(1, 16);
  {
    static const int kAccum[] = {1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 64};
    j["grad_accum"] = kAccum[pick(0, static_cast<int>(std::size(kAccum)) - 1)];
  }
  j["grad_sync"] = pick(0, 1) == 1;
  const int off = pick(0, 9);
  if (off == 1) j["cpu_offload"] = true;
  if (off == 2) j["cpu_offload"] = {{"params", false}, {"optimizer", true}};
  if (pick(0, 5) == 0) j["trainable_fraction"] = 0.05 * pick(1, 10);
  if (pick(0, 3) == 0) j["optimizer"] = "sgd";
  const int w = pick(0, 7);
  if (w == 1) j["auto_wrap_policy"] = {{"min_num_params", 100000000LL * pick(1, 8)}};
  if (w == 2) j["auto_wrap_policy"] = "none";
  if (w == 3) j["auto_wrap_policy"] = {{"modules", {"layers.*", "embed_tokens", "lm_head"}}};
  if (pick(0, 3) == 0) j["cross_entropy"] = one({"fused", "fused_linear", "chunked"});
  const int conf = pick(0, 7);   // PYTORCH_CUDA_ALLOC_CONF
  if (conf == 1) j["alloc_conf"] = "expandable_segments:True";
  if (conf == 2) j["alloc_conf"] = "max_split_size_mb:" + std::to_string(64 * pick(1, 8));
  if (conf == 3) j["alloc_conf"] = "expandable_segments:True,max_split_size_mb:512";
  // LoRA and QLoRA adapters, drawn from the plan drawn so far rather than from rng, so that the plans each CI
  // seed gave before they existed stay the same: one plan in six without trainable_fraction gets adapters,
  // half of those under FSDP2 with NF4 base weights (some then invalid: FSDP1, offload, fp32 master weights,
  // a shard count the weights do not split into).
  const std::size_t h = std::hash<std::string>{}(j.dump());
  if (h % 6 == 0 && !j.contains("trainable_fraction")) {
    static const char* const kTargets[][3] = {{"q", "v", ""}, {"q", "k", "v"}, {"mlp", "o", ""}};
    const auto& t = kTargets[(h / 6) % 3];
    nlohmann::json targets = nlohmann::json::array();
    for (const char* x : t)
      if (*x) targets.push_back(x);
    j["lora"] = {{"rank", 8 << ((h / 18) % 3)}, {"targets", targets}, {"dropout", (h / 54) % 2 ? 0.05 : 0.0}};
    if ((h / 108) % 2) j["lora"]["quantize_base"] = "nf4";
    if ((h / 216) % 2) j["frozen_units"] = {"root"};
  }
  // The low-bit and paged AdamWs (program/optimizer_state.h), drawn the same way: one plan in five (some then
  // invalid: bitsandbytes under FSDP2, CPU offload, the runtime implementation).
  const std::size_t g = std::hash<std::string>{}(j.dump() + "optimizer");
  if (g % 5 == 0 && !j.contains("optimizer")) {
    static const char* const kLowBit[] = {"bnb_adamw8bit", "bnb_paged_adamw", "bnb_paged_adamw8bit",
                                          "torchao_adamw8bit", "torchao_adamw4bit"};
    j["optimizer"] = kLowBit[(g / 5) % 5];
  }
  // torchtune's activation offloading, drawn the same way: one plan in three with full checkpointing (the pairing
  // torchtune's recipes use), one in six with any other mode or none (some then invalid: outside_fsdp, the runtime).
  const std::size_t o = std::hash<std::string>{}(j.dump() + "offload");
  const bool full = j.contains("activation_checkpointing") && j["activation_checkpointing"] == "full";
  if (full ? o % 3 == 0 : o % 6 == 1) j["activation_offloading"] = (o / 3) % 2 ? "sync" : "streams";
  return j.dump();
}

// One random case of the differential tests: a zoo model and a cluster, the cluster's built-in hardware
// profile, and a random plan for it (JSON text), drawn in that order.
struct RandomCase {
  std::string model, cluster, plan;
  calibrate::HardwareProfile hw;
};
inline RandomCase random_case(std::mt19937& rng) {
  RandomCase c;
  c.model = random_name(rng, kRandomPlanModels);
  c.cluster = random_name(rng, kRandomPlanClusters);
  c.hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster(c.cluster));
  c.plan = random_plan(rng, c.hw.cluster().world(), c.hw.cluster().gpus_per_node);
  return c;
}

}  // namespace fsdpsim::sim

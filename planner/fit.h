// `fsdpsim fit`: the quick memory answers (note "fit", copied into the README):
//  * does the plan fit (headroom and margin as explain.h defines them)?
//  * the largest micro-batch that fits, without checkpointing and with each checkpointing mode, the
//    plan's other settings kept (peak memory grows with the micro-batch, so a doubling search and a
//    bisection find it exactly);
//  * the smallest change that makes it fit: each single change of the plan (checkpointing, a smaller
//    micro-batch with more accumulation, resharding after forward, pure bf16, a fused loss, the fused
//    optimizer, expandable segments, reducing every micro-batch, CPU offload, sharding over all GPUs,
//    FSDP2) is simulated, and of those that fit the one that keeps the most tokens/s is "the smallest".
// Every figure is a simulation; nothing is estimated by formula here.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/hardware_profile.h"
#include "program/plan.h"
#include "program/sim_result.h"

namespace fsdpsim::planner {

struct FitAnswer {
  sim::Plan plan;                        // resolved
  sim::SimResult result;
  bool fits = false;                     // with the margin
  double margin = 0.05;
  struct LargestBatch {
    std::string checkpointing;           // "none", "selective_op", "full"
    std::int64_t micro_batch = 0;        // 0: not even one sequence fits
    bool capped = false;                 // the search stopped at its upper limit (it fits there)
    sim::SimResult result;               // at micro_batch (when > 0)
  };
  std::vector<LargestBatch> largest;
  struct Change {
    std::string what;                    // in plan keys: "activation_checkpointing \"full\""
    sim::Plan plan;
    sim::SimResult result;
    bool fits = false;
    double tokens_gain = 0;              // vs the plan
  };
  std::vector<Change> changes;           // fitting first, by tokens/s; then the rest by peak memory
};

using FitSimulateFn = std::function<sim::SimResult(const sim::Plan&)>;

// `plan` as given (resolved here against the cluster). `simulate` defaults to sim::simulate without a trace.
FitAnswer fit_plan(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const sim::Plan& plan, double margin,
                   const FitSimulateFn& simulate = {});
std::string fit_text(const FitAnswer& a);
nlohmann::json fit_json(const FitAnswer& a);

}  // namespace fsdpsim::planner

// Shared fixtures of the runtime suites: a tiny Llama-shaped model (hidden 64, 2 layers, GQA), plans
// from inline JSON, and the unsharded reference step on the same global batch.
#pragma once
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model_spec.h"
#include "runtime/model/dims.h"
#include "runtime/train/reference_trainer.h"
#include "runtime/train/synthetic_data.h"
#include "program/plan.h"

namespace fsdpsim::runtime::testing {

inline models::ModelSpec tiny_llama(bool tied = false) {
  models::ModelSpec m;
  m.name = "test-tiny-llama";
  m.model_type = "llama";
  m.block_class = "LlamaDecoderLayer";
  m.vocab_size = 96;
  m.hidden = 64;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.head_dim = 16;
  m.ffn_hidden = 160;
  m.max_positions = 64;
  m.tied_embeddings = tied;
  return m;
}

inline sim::Plan plan_from(const std::string& json, int world) {
  sim::Plan p = sim::parse_plan(nlohmann::json::parse(json));
  return sim::resolve_plan(p, world, world);
}

// The reference's parameters after `steps` steps on the global batches the sharded run consumed.
struct ReferenceOutcome {
  std::vector<float> params, grads;   // after the last step; grads of the last step
  std::vector<double> losses;
};
inline ReferenceOutcome reference_run(const models::ModelSpec& m, const sim::Plan& p, int world, std::uint64_t seed,
                                      OptimizerConfig opt, int steps) {
  opt.adamw = p.optimizer == sim::Optimizer::AdamW;
  ReferenceOutcome out;
  Dims d = runtime_dims(m, p.micro_batch, p.seq_len);
  ReferenceTrainer ref(d, seed, opt);
  const std::int64_t G = world * p.grad_accum * p.micro_batch;
  for (int s = 0; s < steps; ++s) {
    std::vector<std::int64_t> idx;
    for (std::int64_t j = 0; j < G; ++j) idx.push_back(s * G + j);
    out.losses.push_back(ref.step(make_batch(seed, idx, d.T, d.V)));
  }
  out.params = ref.params();
  out.grads = ref.grads();
  return out;
}

// Parameters after an update: AdamW's first steps move each element by about lr * g / (|g| + eps),
// which is ill-conditioned where |g| is near eps (1e-8): a 1e-7 relative change of such a gradient
// moves the element by a visible fraction of lr. Elements are compared with a relative tolerance
// plus `lr_fraction` of the learning rate.
inline double max_update_error(const std::vector<float>& a, const std::vector<float>& b, double rtol, double atol) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    worst = std::max(worst, d / (rtol * std::fabs(static_cast<double>(b[i])) + atol));
  }
  return a.size() == b.size() ? worst : 1e30;   // <= 1 passes
}

// max over elements of |a - b| / (|b| + floor): the relative error with a floor for tiny values.
inline double max_rel_error(const std::vector<float>& a, const std::vector<float>& b, double floor = 1e-3) {
  double e = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    e = std::max(e, std::fabs(static_cast<double>(a[i]) - b[i]) / (std::fabs(static_cast<double>(b[i])) + floor));
  return a.size() == b.size() ? e : 1e30;
}

}  // namespace fsdpsim::runtime::testing

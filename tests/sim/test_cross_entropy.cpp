// The plan's cross_entropy key: parsing, its JSON round trip, and what it changes in a simulated
// step — the logits memory (models::logits_bytes per LossImpl), not the time.
#include <gtest/gtest.h>

#include <string>

#include "calibrate/hardware_profile.h"
#include "common/errors.h"
#include "models/model_spec.h"
#include "models/zoo.h"
#include "sim/plan.h"
#include "sim/simulator.h"

namespace fsdpsim::sim {
namespace {

TEST(CrossEntropy, ParsesEveryValueAndRoundTrips) {
  EXPECT_EQ(parse_plan(nlohmann::json::object()).cross_entropy, models::LossImpl::Torch);
  for (auto [text, impl] : {std::pair{"torch", models::LossImpl::Torch}, std::pair{"fused", models::LossImpl::Fused},
                            std::pair{"fused_linear", models::LossImpl::FusedLinear}}) {
    Plan p = parse_plan({{"cross_entropy", text}});
    EXPECT_EQ(p.cross_entropy, impl) << text;
    EXPECT_EQ(plan_to_json(p).at("cross_entropy"), text);
    EXPECT_EQ(parse_plan(plan_to_json(p)).cross_entropy, impl) << text;
  }
}

TEST(CrossEntropy, UnknownValueNamesTheField) {
  try {
    parse_plan({{"cross_entropy", "liger"}});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.cross_entropy"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("liger"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_plan({{"cross_entropy", 3}}), InputError);
}

// llama3-8b on 8 H100s, seq 8192 (vocab 128256: the logits are GiBs): the logits category at the
// peak never exceeds the loss implementation's peak, the peak falls torch > fused > fused_linear,
// and the step time does not change.
TEST(CrossEntropy, ChangesTheLogitsMemoryOnly) {
  const auto model = models::load_model("llama3-8b");
  const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster("8xH100-SXM"));
  SimOptions o;
  o.record_trace = false;
  o.record_memory_timeline = false;
  TimeNs step = -1;
  Bytes prev_peak = 0;
  for (auto impl : {models::LossImpl::Torch, models::LossImpl::Fused, models::LossImpl::FusedLinear}) {
    Plan p = resolve_plan(parse_plan({{"seq_len", 8192}}), 8, 8);
    p.cross_entropy = impl;
    SimResult r = simulate(model, hw, p, o);
    ASSERT_TRUE(r.breakdown_at_peak.count("logits"));
    // The loss's tensors at the peak, by hand (T = 8192 tokens, V = 128256, bf16 logits the loop keeps):
    //   torch: logits (2) + fp32 log-probs (4) + nll_loss_backward's grad (4) + _log_softmax_backward_data's (4)
    //          at the start of backward: 14 bytes per logit;
    //   fused: logits (2) + logsumexp (4 per token, freed by the loss's backward before the head's own
    //          temporaries) + the logits' gradient (2);
    //   fused_linear: at most the head input's gradient and one fp32 chunk of logits (logits_peak_bytes): the
    //          step's peak is then elsewhere.
    const Bytes tv = Bytes{8192} * 128256;
    const Bytes expected = impl == models::LossImpl::Torch   ? 14 * tv
                           : impl == models::LossImpl::Fused ? 4 * tv + 8192 * 4
                                                             : models::logits_peak_bytes(model, 1, 8192, Dtype::BF16, impl);
    EXPECT_LE(r.breakdown_at_peak.at("logits"), expected + 512) << models::loss_impl_name(impl);
    if (impl == models::LossImpl::Torch) EXPECT_GE(r.breakdown_at_peak.at("logits") + 512, expected);
    if (impl == models::LossImpl::Fused) EXPECT_GE(r.breakdown_at_peak.at("logits") + 512, 4 * tv);
    if (step >= 0) {
      EXPECT_EQ(r.step_time_ns, step);
      EXPECT_LT(r.peak_allocated, prev_peak) << models::loss_impl_name(impl);
    }
    step = r.step_time_ns;
    prev_peak = r.peak_allocated;
  }
}

}  // namespace
}  // namespace fsdpsim::sim

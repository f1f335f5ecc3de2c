// The plan's cross_entropy key: parsing, its JSON round trip, and what it changes in a simulated
// step — the logits memory (models::logits_bytes per LossImpl), not the time.
#include <gtest/gtest.h>

#include <string>

#include "calibrate/hardware_profile.h"
#include "common/errors.h"
#include "models/model_spec.h"
#include "models/zoo.h"
#include "program/plan.h"
#include "sim/simulator.h"

namespace fsdpsim::sim {
namespace {

TEST(CrossEntropy, ParsesEveryValueAndRoundTrips) {
  EXPECT_EQ(parse_plan(nlohmann::json::object()).cross_entropy, models::LossImpl::Torch);
  for (auto [text, impl] : {std::pair{"torch", models::LossImpl::Torch}, std::pair{"fused", models::LossImpl::Fused},
                            std::pair{"fused_linear", models::LossImpl::FusedLinear},
                            std::pair{"chunked", models::LossImpl::Chunked}}) {
    Plan p = parse_plan({{"cross_entropy", text}});
    EXPECT_EQ(p.cross_entropy, impl) << text;
    EXPECT_EQ(plan_to_json(p).at("cross_entropy"), text);
    EXPECT_EQ(parse_plan(plan_to_json(p)).cross_entropy, impl) << text;
    // the chunk count is written only for the chunked loss (torchtune's default 8)
    EXPECT_EQ(plan_to_json(p).contains("cross_entropy_chunks"), impl == models::LossImpl::Chunked) << text;
  }
  Plan c = parse_plan({{"cross_entropy", "chunked"}, {"cross_entropy_chunks", 16}});
  EXPECT_EQ(c.cross_entropy_chunks, 16);
  EXPECT_EQ(parse_plan(plan_to_json(c)).cross_entropy_chunks, 16);
  EXPECT_EQ(parse_plan({{"cross_entropy", "chunked"}}).cross_entropy_chunks, 8);
}

TEST(CrossEntropy, ChunkCountNeedsTheChunkedLoss) {
  EXPECT_THROW(parse_plan({{"cross_entropy_chunks", 8}}), InputError);
  EXPECT_THROW(parse_plan({{"cross_entropy", "torch"}, {"cross_entropy_chunks", 8}}), InputError);
  EXPECT_THROW(parse_plan({{"cross_entropy", "chunked"}, {"cross_entropy_chunks", 0}}), InputError);
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
    if (impl == models::LossImpl::Torch) {
      EXPECT_GE(r.breakdown_at_peak.at("logits") + 512, expected);
    }
    if (impl == models::LossImpl::Fused) {
      EXPECT_GE(r.breakdown_at_peak.at("logits") + 512, 4 * tv);
    }
    if (step >= 0) {
      EXPECT_EQ(r.step_time_ns, step);
      EXPECT_LT(r.peak_allocated, prev_peak) << models::loss_impl_name(impl);
    }
    step = r.step_time_ns;
    prev_peak = r.peak_allocated;
  }
}

// litgpt's chunked_cross_entropy (models::loss_chunk_rows: 128-row chunks, no upcast) on llama-1b with
// full checkpointing at seq 8192, where the step's peak is in the loss's backward. By hand, T = 8192,
// V = 128256, bf16 (2 bytes): the loop holds the logits (2 TV); the 64 chunks' log-probabilities (2 TV
// in all) are swapped chunk by chunk for their gradients (each chunk's nll_loss_backward gradient is
// freed before the next chunk's), and split_with_sizes_backward's cat (2 TV) joins them: 6 bytes per
// logit. One cross_entropy over all rows would hold logits + log-probs + nll grad + log_softmax grad
// (8 bytes per logit). A sequence that is not a multiple of 128 (8000 = 62 x 128 + 64) counts the same.
TEST(CrossEntropy, LitgptChunkedLossByHand) {
  const auto model = models::load_model("llama-1b");
  const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster("8xH100-SXM"));
  SimOptions o;
  o.record_trace = false;
  o.record_memory_timeline = false;
  for (std::int64_t seq : {8192, 8000}) {
    Plan p = resolve_plan(parse_plan({{"seq_len", seq}, {"implementation", "litgpt"}, {"activation_checkpointing", "full"}}), 8, 8);
    SimResult r = simulate(model, hw, p, o);
    ASSERT_TRUE(r.breakdown_at_peak.count("logits")) << seq;
    EXPECT_EQ(r.breakdown_at_peak.at("logits"), 6 * seq * Bytes{128256}) << seq;
    EXPECT_EQ(r.peak_allocated_at.kind, "backward") << seq;   // the cat, a loss backward op
  }
}

// torchtune's chunked output and CEWithChunkedOutputLoss (cross_entropy "chunked", 8 chunks) on llama-1b with
// full checkpointing at seq 8192, the loop keeping the logits (no `del logits`): the step's peak is the first
// chunk's loss backward (chunk 7: the engine runs the last chunk's nodes first). By hand, T = 8192, V = 128256,
// per logit: the bf16 logits chunks (2) + every chunk's saved fp32 log-softmax (4) + chunk 7's nll_loss_backward
// and _log_softmax_backward_data gradients (2 x 4 / 8 = 1): 7 bytes per logit, where one F.cross_entropy over the
// whole upcast logits holds 2 + 4 + 4 + 4 = 14. The time does not change (the same kernels: models/kernels.cpp).
TEST(CrossEntropy, TorchtuneChunkedLossByHand) {
  const auto model = models::load_model("llama-1b");
  const auto hw = calibrate::HardwareProfile::for_cluster(calibrate::load_cluster("8xH100-SXM"));
  SimOptions o;
  o.record_trace = false;
  o.record_memory_timeline = false;
  const Bytes tv = Bytes{8192} * 128256;
  Plan torch = resolve_plan(parse_plan({{"seq_len", 8192}, {"activation_checkpointing", "full"}}), 8, 8);
  Plan chunked = torch;
  chunked.cross_entropy = models::LossImpl::Chunked;
  const SimResult t = simulate(model, hw, torch, o);
  const SimResult c = simulate(model, hw, chunked, o);
  ASSERT_TRUE(c.breakdown_at_peak.count("logits"));
  EXPECT_EQ(c.breakdown_at_peak.at("logits"), 7 * tv);
  EXPECT_EQ(c.peak_allocated_at.kind, "backward");
  EXPECT_EQ(t.breakdown_at_peak.at("logits"), 14 * tv);
  EXPECT_EQ(c.step_time_ns, t.step_time_ns);
}

}  // namespace
}  // namespace fsdpsim::sim

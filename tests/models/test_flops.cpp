// FLOPs per token against a hand derivation, and against llm-foundry's published TFLOP/s.
#include <gtest/gtest.h>

#include "common/json_reader.h"
#include "fixture.h"
#include "models/zoo.h"

using namespace fsdpsim::models;

TEST(Flops, Llama3_8bBySeq8192ByHand) {
  // matmul weights per token: 32 layers * (attention 2*4096*4096 + 2*4096*1024 = 41,943,040
  //   + MLP 3*4096*14336 = 176,160,768) + LM head 128256*4096 = 525,336,576
  //   = 32 * 218,103,808 + 525,336,576 = 7,504,658,432
  // forward = 2 * 7,504,658,432 + 4 * 32 * 8192 * 32 * 128 = 15,009,316,864 + 4,294,967,296
  //         = 19,304,284,160; fwd+bwd = 3x = 57,912,852,480
  const FlopsPerToken f = flops_per_token(load_model("llama3-8b"), 8192);
  EXPECT_DOUBLE_EQ(f.matmul_forward, 15'009'316'864.0);
  EXPECT_DOUBLE_EQ(f.attention_forward, 4'294'967'296.0);
  EXPECT_DOUBLE_EQ(f.forward, 19'304'284'160.0);
  EXPECT_DOUBLE_EQ(f.forward_backward, 57'912'852'480.0);
}

TEST(Flops, FrozenWeightsSkipTheirWeightGradientMatmuls) {
  // llama3-8b at 8192 (above): matmul forward 15,009,316,864, attention 4,294,967,296 per token.
  // All frozen: forward + input gradients of the matmuls (2 x 15,009,316,864) + attention fwd+bwd
  // (3 x 4,294,967,296) = 30,018,633,728 + 12,884,901,888 = 42,903,535,616.
  const ModelSpec m = load_model("llama3-8b");
  EXPECT_DOUBLE_EQ(trained_flops_per_token(m, 8192, 0.0), 42'903'535'616.0);
  // A quarter trained: + 0.25 x 15,009,316,864 = 3,752,329,216 -> 46,655,864,832; all trained: 6N + attention.
  EXPECT_DOUBLE_EQ(trained_flops_per_token(m, 8192, 0.25), 46'655'864'832.0);
  EXPECT_DOUBLE_EQ(trained_flops_per_token(m, 8192, 1.0), 57'912'852'480.0);
}

TEST(Flops, MixtralCountsActiveExpertsOnly) {
  // 32 * (attention 41,943,040 + router 8*4096 + 2 experts * 3*4096*14336) + head 32000*4096
  // = 32 * 394,297,344 + 131,072,000 = 12,748,587,008 matmul weights; seq 4096:
  // attention 4 * 32 * 4096 * 32 * 128 = 2,147,483,648
  const FlopsPerToken f = flops_per_token(load_model("mixtral-8x7b"), 4096);
  EXPECT_DOUBLE_EQ(f.matmul_forward, 2.0 * 12'748'587'008.0);
  EXPECT_DOUBLE_EQ(f.forward, 2.0 * 12'748'587'008.0 + 2'147'483'648.0);
}

TEST(Flops, TiedHeadStillCountsAsMatmul) {
  const ModelSpec m = load_model("gpt2");
  const ParamCounts c = count_params(m);
  // 12 * (attention 4*768*768 + MLP 2*768*3072) + head 50257*768 (tied: the embedding's weight)
  EXPECT_EQ(c.matmul_active, 12 * (4 * 768 * 768 + 2 * 768 * 3072) + 50257 * 768);
}

TEST(Flops, ReproducesLlmFoundryModelTflops) {
  // llm-foundry's MFU counts 6 * all parameters (table lookups, norms and biases included) + the same
  // attention term; ours differs by exactly the non-matmul parameters. Published TFLOP/s = tokens/s *
  // FLOPs/token; both are rounded in the table, so agreement is within 1%.
  const auto doc = fsdpsim::read_json_file(fixture("llm_foundry_mpt.json"), "fixture");
  for (const auto& r : doc.at("records")) {
    const std::int64_t s = r.at("seq_len").get<std::int64_t>();
    const ModelSpec m = with_seq_len(load_model(r.at("model").get<std::string>()), s);
    const ParamCounts c = count_params(m);
    const double foundry = flops_per_token(m, s).forward_backward + 6.0 * static_cast<double>(c.total - c.matmul_active);
    const double tflops = foundry * r.at("tokens_per_sec_per_gpu").get<double>() / 1e12;
    const double published = r.at("model_tflops_per_gpu").get<double>();
    EXPECT_NEAR(tflops / published, 1.0, 0.01) << r.at("id");
  }
}

// model_info_json / model_info_text: the numbers model-info prints come from the tested functions.
#include <gtest/gtest.h>

#include "models/model_info.h"
#include "models/zoo.h"

using namespace fsdpsim;
using namespace fsdpsim::models;

TEST(ModelInfo, JsonKeysAndValues) {
  ModelInfoRequest req;
  req.seq_len = 8192;
  req.micro_batch = 2;
  const ModelSpec m = load_model("llama3-8b");
  const auto j = model_info_json(m, req);
  EXPECT_EQ(j.at("params_total").get<std::int64_t>(), 8'030'261'248);
  EXPECT_EQ(j.at("params_per_block").get<std::int64_t>(), 218'112'000);
  EXPECT_DOUBLE_EQ(j.at("flops_per_token_fwd").get<double>(), 19'304'284'160.0);
  EXPECT_EQ(j.at("activation_bytes_per_block").at("full").get<std::int64_t>(), 2LL * 8192 * 4096 * 2);
  EXPECT_DOUBLE_EQ(j.at("activation_bytes_per_block_per_token").at("full").get<double>(), 8192.0);
  EXPECT_EQ(j.at("logits_bytes").get<std::int64_t>(), logits_bytes(m, 2, 8192, Dtype::BF16));
  EXPECT_EQ(j.at("units").size(), 33u);
  EXPECT_EQ(j.at("forward_order").size(), 33u);
  EXPECT_EQ(j.at("wrap_policy"), "block");
  EXPECT_EQ(j.at("units")[0].at("parts"), (nlohmann::json{"embedding", "final_norm_and_head"}));
}

TEST(ModelInfo, MptSeqLenResizesThePositionTable) {
  ModelInfoRequest req;
  req.seq_len = 512;
  const auto j = model_info_json(load_model("mpt-125m"), req);
  EXPECT_EQ(j.at("params_total").get<std::int64_t>(), 124'131'840);  // llm-foundry's count at 512
  EXPECT_EQ(j.at("model").at("max_positions").get<std::int64_t>(), 512);
}

TEST(ModelInfo, TextMentionsTheEssentials) {
  ModelInfoRequest req;
  req.policy = parse_wrap_policy("modules:layers.*,embed_tokens,lm_head", "p");
  const std::string t = model_info_text(load_model("mixtral-8x7b"), req);
  EXPECT_NE(t.find("46,702,792,704"), std::string::npos);
  EXPECT_NE(t.find("active per token 394,305,536"), std::string::npos);
  EXPECT_NE(t.find("FSDP units, wrap policy modules:layers.*,embed_tokens,lm_head: 35"), std::string::npos);
  EXPECT_NE(t.find("GiB = 2^30"), std::string::npos);
  // lm_head is the last unit in forward order
  EXPECT_NE(t.rfind("lm_head (Linear)"), std::string::npos);
  EXPECT_GT(t.rfind("lm_head (Linear)"), t.rfind("model.layers.31 (MixtralDecoderLayer)"));
}

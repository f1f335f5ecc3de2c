// Bad model inputs: each throws InputError naming the field (the CLI turns it into exit code 2).
#include <gtest/gtest.h>

#include "common/errors.h"
#include "common/json_reader.h"
#include "fixture.h"
#include "models/zoo.h"

using namespace fsdpsim;
using namespace fsdpsim::models;

namespace {

// The field of the InputError that f() throws ("<none>" if it throws nothing).
template <class F>
std::string error_field(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.field();
  }
  return "<none>";
}

Json base() {
  return {{"model_type", "llama"}, {"hidden_size", 4096}, {"intermediate_size", 14336},
          {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"vocab_size", 128256}};
}

}  // namespace

TEST(Validate, BadFixtureFilesNameTheField) {
  const std::string d = fixture("");
  EXPECT_EQ(error_field([&] { load_model(d + "bad_unknown_type.json"); }), d + "bad_unknown_type.json:model_type");
  EXPECT_EQ(error_field([&] { load_model(d + "bad_missing_hidden.json"); }), d + "bad_missing_hidden.json:hidden_size");
  EXPECT_EQ(error_field([&] { load_model(d + "bad_negative_layers.json"); }),
            d + "bad_negative_layers.json:num_hidden_layers");
  EXPECT_EQ(error_field([&] { load_model(d + "bad_heads_not_divisible.json"); }),
            d + "bad_heads_not_divisible.json:num_key_value_heads");
  EXPECT_EQ(error_field([&] { load_model(d + "bad_absurd_hidden.json"); }), d + "bad_absurd_hidden.json:hidden_size");
  // malformed JSON and a missing file: the CLI option is named
  EXPECT_EQ(error_field([&] { load_model(d + "bad_malformed.json"); }).rfind("--model", 0), 0u);
  EXPECT_EQ(error_field([&] { load_model(d + "does_not_exist.json"); }), "--model");
  EXPECT_EQ(error_field([&] { load_model("llama9-1t"); }), "--model");
  EXPECT_EQ(error_field([&] { load_model(""); }), "--model");
  EXPECT_EQ(error_field([&] { load_model("llama9-1t", "plan.model"); }), "plan.model");
}

TEST(Validate, ImporterFieldErrors) {
  auto field_of = [](const Json& j) { return error_field([&] { import_hf_config(j, "c.json"); }); };
  EXPECT_EQ(field_of(Json::array()), "c.json");
  Json j = base();
  j.erase("model_type");
  EXPECT_EQ(field_of(j), "c.json:model_type");
  j = base();
  j["hidden_size"] = "4096";
  EXPECT_EQ(field_of(j), "c.json:hidden_size");
  j = base();
  j["num_hidden_layers"] = 12.5;
  EXPECT_EQ(field_of(j), "c.json:num_hidden_layers");
  j = base();
  j["num_hidden_layers"] = 20000;  // > 10,000
  EXPECT_EQ(field_of(j), "c.json:num_hidden_layers");
  j = base();
  j["vocab_size"] = 0;
  EXPECT_EQ(field_of(j), "c.json:vocab_size");
  j = base();
  j["tie_word_embeddings"] = "yes";
  EXPECT_EQ(field_of(j), "c.json:tie_word_embeddings");
  j = base();
  j["hidden_act"] = "relu";
  EXPECT_EQ(field_of(j), "c.json:hidden_act");
  j = base();
  j.erase("intermediate_size");
  EXPECT_EQ(field_of(j), "c.json:intermediate_size");
  j = base();
  j["num_attention_heads"] = 30;  // 4096 / 30 is not an integer and head_dim is absent
  j["num_key_value_heads"] = 10;
  EXPECT_EQ(field_of(j), "c.json:num_attention_heads");
  j = base();
  j["hidden_size"] = 1'000'000;  // within the hidden limit, but ~1e15 parameters in total
  j["intermediate_size"] = 4'000'000;
  EXPECT_EQ(field_of(j), "c.json:hidden_size");
  j = base();
  j["model_type"] = "mixtral";
  EXPECT_EQ(field_of(j), "c.json:num_local_experts");
  j["num_local_experts"] = 8;
  j["num_experts_per_tok"] = 9;
  EXPECT_EQ(field_of(j), "c.json:num_experts_per_tok");
  Json g = {{"model_type", "gpt2"}, {"n_embd", 768}, {"n_layer", 12}, {"n_head", 12}, {"vocab_size", 50257}};
  EXPECT_EQ(field_of(g), "<none>");
  g["n_head"] = 7;
  EXPECT_EQ(field_of(g), "c.json:n_head");
  g["n_head"] = 12;
  g["n_layer"] = -1;
  EXPECT_EQ(field_of(g), "c.json:n_layer");
  Json mpt = {{"model_type", "mpt"}, {"d_model", 768}, {"n_layers", 12}, {"n_heads", 12}, {"vocab_size", 50368},
              {"expansion_ratio", 4.3}};
  EXPECT_EQ(field_of(mpt), "c.json:expansion_ratio");
}

TEST(Validate, ProgrammaticSpec) {
  ModelSpec m = load_model("tiny-llama");
  EXPECT_NO_THROW(validate_model(m, "spec"));
  m.n_kv_heads = 3;
  EXPECT_EQ(error_field([&] { validate_model(m, "spec"); }), "spec:num_key_value_heads");
  m = load_model("tiny-llama");
  m.head_dim = 0;
  EXPECT_EQ(error_field([&] { validate_model(m, "spec"); }), "spec:head_dim");
}

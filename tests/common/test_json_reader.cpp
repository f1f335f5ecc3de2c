#include <gtest/gtest.h>

#include "common/dtype.h"
#include "common/errors.h"
#include "common/json_reader.h"

using namespace fsdpsim;

TEST(JsonReader, ReadsTypedFieldsWithDefaults) {
  Json j = Json::parse(R"({"a": 3, "b": 2.5, "c": true, "d": "x", "e": 4.0})");
  JsonReader r(j, "plan");
  EXPECT_EQ(r.get_int("a", 0, 10), 3);
  EXPECT_EQ(r.get_int("e", 0, 10), 4);  // an integral float is accepted
  EXPECT_DOUBLE_EQ(r.get_double("b", 0, 10), 2.5);
  EXPECT_TRUE(r.get_bool("c"));
  EXPECT_EQ(r.get_string("d"), "x");
  EXPECT_EQ(r.get_int("missing", 0, 10, 7), 7);
}

TEST(JsonReader, ErrorsNameTheFieldAndValue) {
  Json j = Json::parse(R"({"n": -1, "s": 5, "big": 1e30, "frac": 2.5, "k": "weird"})");
  JsonReader r(j, "plan");
  try {
    r.get_int("n", 1, 100);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "plan.n");
    EXPECT_EQ(e.value(), "-1");
  }
  EXPECT_THROW(r.get_string("s"), InputError);
  EXPECT_THROW(r.get_int("big", 0, 1000), InputError);
  EXPECT_THROW(r.get_int("frac", 0, 1000), InputError);
  EXPECT_THROW(r.get_int("absent", 0, 10), InputError);
  try {
    r.get_enum("k", {"a", "b"});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("expected one of a, b"), std::string::npos);
  }
}

TEST(JsonReader, RejectsUnknownKeysAndNonObjects) {
  Json j = Json::parse(R"({"micro_batch": 1, "mirco_batch": 2})");
  JsonReader r(j, "plan");
  try {
    r.check_no_unknown_keys({"micro_batch"});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "plan.mirco_batch");
  }
  Json arr = Json::parse("[1,2]");
  EXPECT_THROW(JsonReader(arr, "plan"), InputError);
}

TEST(JsonReader, MalformedTextIsInputError) {
  EXPECT_THROW(parse_json_text("{\"a\": ", "--plan"), InputError);
  EXPECT_THROW(read_json_file("/nonexistent/x.json", "--plan"), InputError);
}

TEST(Dtype, ParsesPyTorchSpellings) {
  EXPECT_EQ(parse_dtype("bf16", "f"), Dtype::BF16);
  EXPECT_EQ(parse_dtype("torch.bfloat16", "f"), Dtype::BF16);
  EXPECT_EQ(parse_dtype("float32", "f"), Dtype::FP32);
  EXPECT_EQ(dtype_bytes(Dtype::FP8), 1);
  EXPECT_THROW(parse_dtype("fp64", "plan.param_dtype"), InputError);
}

#include <gtest/gtest.h>

#include "common/args.h"
#include "common/errors.h"

using namespace fsdpsim;

static const std::vector<OptionSpec> kSpecs = {
    {"model", true, false, "model"}, {"json", false, false, "json"}, {"fix", true, true, "pin"}, {"top", true, false, "k"}};

TEST(Args, ParsesValuesFlagsAndRepeats) {
  Args a({"--model", "gpt2", "--json", "--fix", "a=1", "--fix=b=2", "--top=3"}, kSpecs);
  EXPECT_EQ(a.get("model"), "gpt2");
  EXPECT_TRUE(a.has("json"));
  EXPECT_EQ(a.all("fix"), (std::vector<std::string>{"a=1", "b=2"}));
  EXPECT_EQ(a.get_int("top", 5, 1, 10), 3);
  EXPECT_FALSE(a.help());
}

TEST(Args, BadOptionsAreInputErrors) {
  EXPECT_THROW(Args({"--modle", "x"}, kSpecs), InputError);
  EXPECT_THROW(Args({"--model"}, kSpecs), InputError);
  EXPECT_THROW(Args({"--model", "a", "--model", "b"}, kSpecs), InputError);
  Args a({"--top", "-4"}, kSpecs);
  EXPECT_THROW(a.get_int("top", 5, 1, 10), InputError);
  Args b({"--top", "3x"}, kSpecs);
  EXPECT_THROW(b.get_int("top", 5, 1, 10), InputError);
  EXPECT_THROW(a.require("model"), InputError);
}

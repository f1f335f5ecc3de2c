// Reading plan.json for the report: every bad field is an InputError naming its path, and no
// mutation of a valid document crashes the renderer.
#include <gtest/gtest.h>

#include <functional>

#include "common/errors.h"
#include "fixture_plan.h"
#include "reports/html_report.h"
#include "reports/plan_doc.h"

using namespace fsdpsim;
using namespace fsdpsim::reports;
using nlohmann::json;

namespace {
std::string error_field(const json& doc) {
  try {
    render_html(doc);
  } catch (const InputError& e) {
    return e.field();
  }
  return "<no error>";
}
}  // namespace

TEST(PlanDoc, ReadsTheFixture) {
  PlanDocView v = read_plan_doc(fixture::fixture_plan_doc());
  ASSERT_EQ(v.candidates.size(), 8u);
  ASSERT_TRUE(v.recommended.has_value());
  EXPECT_EQ(*v.recommended, 0);
  ASSERT_TRUE(v.detail.has_value());
  EXPECT_EQ(v.detail->trace.size(), 52u);
  EXPECT_FALSE(v.detail->memory_timeline.empty());
  ASSERT_EQ(v.exports.size(), 4u);
  EXPECT_EQ(v.exports[0].key, "fsdp2");       // fixed display order, not JSON's sorted order
  EXPECT_EQ(v.exports[1].key, "torchtitan");
  EXPECT_EQ(v.exports[2].key, "lightning");
  EXPECT_EQ(v.exports[3].key, "accelerate");
  // Breakdown in the simulator's category order.
  ASSERT_GE(v.detail->result.breakdown.size(), 3u);
  EXPECT_EQ(v.detail->result.breakdown[0].first, "sharded_params");
  EXPECT_EQ(v.detail->result.breakdown.back().first, "cuda_context");
}

TEST(PlanDoc, ErrorsNameTheField) {
  json base = fixture::fixture_plan_doc();
  {
    json d = base;
    d.erase("schema_version");
    EXPECT_EQ(error_field(d), "plan.schema_version");
  }
  {
    json d = base;
    d["schema_version"] = "fsdpsim.plan/99";
    EXPECT_EQ(error_field(d), "plan.schema_version");
  }
  {
    json d = base;
    d["candidates"][1]["result"].erase("step_time_s");
    EXPECT_EQ(error_field(d), "plan.candidates[1].result.step_time_s");
  }
  {
    json d = base;
    d["candidates"][2]["result"]["peak_memory_bytes"]["allocated"] = "12 GiB";
    EXPECT_EQ(error_field(d), "plan.candidates[2].result.peak_memory_bytes.allocated");
  }
  {
    json d = base;
    d["recommended"] = 8;
    EXPECT_EQ(error_field(d), "plan.recommended");
  }
  {
    json d = base;
    d["pareto_front"][0] = 42;
    EXPECT_EQ(error_field(d), "plan.pareto_front[0]");
  }
  {
    json d = base;
    d["recommended_detail"]["trace"][3]["dur_ns"] = -5;
    EXPECT_EQ(error_field(d), "plan.recommended_detail.trace[3].dur_ns");
  }
  {
    json d = base;
    d["recommended_detail"]["memory_timeline"][0]["reserved_bytes"] = 1.5;
    EXPECT_EQ(error_field(d), "plan.recommended_detail.memory_timeline[0].reserved_bytes");
  }
  {
    json d = base;
    d["inputs"]["model"].erase("name");
    EXPECT_EQ(error_field(d), "plan.inputs.model.name");
  }
  {
    json d = base;
    d["exports"]["fsdp2"]["text"] = 3;
    EXPECT_EQ(error_field(d), "plan.exports.fsdp2.text");
  }
  EXPECT_EQ(error_field(json::array()), "plan");
}

// Every key of the document deleted, or replaced by a value of the wrong type, one at a time:
// the renderer either succeeds or throws InputError. Never another exception, never a crash.
TEST(PlanDoc, NoMutationCrashesTheRenderer) {
  const json base = fixture::fixture_plan_doc({.candidates = 3});
  std::vector<json::json_pointer> paths;
  std::function<void(const json&, const json::json_pointer&)> walk = [&](const json& j, const json::json_pointer& p) {
    if (!p.empty()) paths.push_back(p);
    if (j.is_object())
      for (auto it = j.begin(); it != j.end(); ++it) walk(*it, p / it.key());
    if (j.is_array())
      for (size_t i = 0; i < j.size() && i < 2; ++i) walk(j[i], p / i);  // the first two elements of each array
  };
  walk(base, json::json_pointer());
  ASSERT_GT(paths.size(), 200u);
  int errors = 0, ok = 0;
  for (const auto& p : paths) {
    for (int kind = 0; kind < 4; ++kind) {
      json d = base;
      if (kind == 0) {
        json& parent = d[p.parent_pointer()];
        if (parent.is_object()) parent.erase(p.back());
        else parent.erase(std::stoul(p.back()));
      } else {
        d[p] = kind == 1 ? json("x<script>") : (kind == 2 ? json(-1) : json(nullptr));
      }
      try {
        std::string html = render_html(d);
        EXPECT_EQ(html.find("x<script>"), std::string::npos);
        ++ok;
      } catch (const InputError&) {
        ++errors;
      } catch (const std::exception& e) {
        ADD_FAILURE() << p.to_string() << " kind " << kind << ": " << e.what();
      }
    }
  }
  EXPECT_GT(errors, 100);
  EXPECT_GT(ok, 100);
}

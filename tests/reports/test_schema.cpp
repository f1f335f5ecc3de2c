#include <unistd.h>
// The JSON Schemas in reports/schema/ validate what we write (plan.json, simulate --json, trace
// files) and reject broken documents. Validation runs python3-jsonschema (tests/reports/validate_schema.py).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sys/wait.h>

#include "common/json_reader.h"
#include "fixture_plan.h"
#include "reports/trace.h"

using namespace fsdpsim;
using namespace fsdpsim::reports;
using nlohmann::json;

namespace {

std::string schema(const std::string& name) { return fixture::source_path("reports/schema/" + name); }

// Per process: CTest runs each test in its own process, in parallel, so a shared directory races.
std::string scratch_dir() { return fixture::artifact_dir() + "/schema-" + std::to_string(::getpid()); }

std::string write_doc(const std::string& name, const json& doc) {
  std::string dir = scratch_dir();
  std::filesystem::create_directories(dir);
  std::string path = dir + "/" + name;
  std::ofstream(path) << doc.dump(2);
  return path;
}

// Debian's interpreter when present (python3-jsonschema is a Debian package; a pyenv shim on PATH
// may also be slow to start), else python3 from PATH.
std::string python() { return std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3"; }

// Exit status of validate_schema.py (0 valid, 1 invalid, 2 unreadable, 3 jsonschema missing).
int validate(const std::string& schema_file, const std::vector<std::string>& docs) {
  std::filesystem::create_directories(scratch_dir());
  std::string cmd = python() + " " + fixture::source_path("tests/reports/validate_schema.py") + " " + schema_file;
  for (const auto& d : docs) cmd += " " + d;
  cmd += " > " + scratch_dir() + "/last_validation.txt 2>&1";
  int rc = std::system(cmd.c_str());
  int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  if (code == 3) ADD_FAILURE() << "python3-jsonschema is missing: apt-get install -y python3-jsonschema";
  return code;
}

std::string last_output() { return fixture::read_file(scratch_dir() + "/last_validation.txt"); }

}  // namespace

TEST(Schema, ValidDocumentsPass) {
  fixture::FixtureOptions nf, m;
  nf.nothing_fits = true;
  m.with_measured = true;
  std::vector<std::string> plans = {fixture::source_path("tests/reports/fixtures/plan_small.json"),
                                    write_doc("plan_nofit.json", fixture::fixture_plan_doc(nf)),
                                    write_doc("plan_measured.json", fixture::fixture_plan_doc(m))};
  EXPECT_EQ(validate(schema("plan.schema.json"), plans), 0) << last_output();
  EXPECT_EQ(validate(schema("simulate.schema.json"), {write_doc("simulate.json", fixture::fixture_simulate_doc())}), 0)
      << last_output();
  json trace = trace_json(fixture::fixture_result(0, {}, true), fixture::fixture_plan_doc()["context"]);
  EXPECT_EQ(validate(schema("trace.schema.json"), {write_doc("trace.json", trace)}), 0) << last_output();
}

// Each broken document must fail on its own (one validator run per document).
TEST(Schema, BrokenDocumentsFail) {
  const json good = fixture::fixture_plan_doc();
  std::vector<std::pair<std::string, std::function<void(json&)>>> breakages = {
      {"missing_fits", [](json& d) { d["candidates"][0]["result"].erase("fits"); }},
      {"step_time_as_string", [](json& d) { d["candidates"][1]["result"]["step_time_s"] = "0.16"; }},
      {"negative_bytes", [](json& d) { d["candidates"][2]["result"]["peak_memory_bytes"]["allocated"] = -1; }},
      {"wrong_version", [](json& d) { d["schema_version"] = "fsdpsim.plan/2"; }},
      {"unknown_top_level_key", [](json& d) { d["candiates"] = json::array(); }},
      {"trace_in_candidate", [](json& d) { d["candidates"][0]["result"]["trace"] = json::array(); }},
      {"summary_row_short", [](json& d) { d["other_candidates"] = {{"columns", json::array()}, {"rows", {{1, "c0001"}}}}; }},
      {"span_missing_track", [](json& d) { d["recommended_detail"]["trace"][0].erase("track"); }},
      {"bad_export_format", [](json& d) { d["exports"]["fsdp2"]["format"] = "python3"; }},
      {"recommended_negative", [](json& d) { d["recommended"] = -1; }},
      {"margin_one", [](json& d) { d["inputs"]["memory_margin"] = 1.0; }},
      {"context_missing_git_sha", [](json& d) { d["context"].erase("git_sha"); }},
      {"measured_without_errors", [](json& d) { d["measured"] = json::object(); }},
  };
  // One validator run for all of them (python start-up is slow on a loaded machine); the script
  // prints "PATH: valid" or "PATH: where: message" per document.
  std::vector<std::string> paths;
  for (const auto& [name, breakit] : breakages) {
    json d = good;
    breakit(d);
    paths.push_back(write_doc("broken_" + name + ".json", d));
  }
  EXPECT_EQ(validate(schema("plan.schema.json"), paths), 1);
  const std::string out = last_output();
  for (const auto& p : paths) {
    EXPECT_EQ(out.find(p + ": valid"), std::string::npos) << p << " passed validation:\n" << out;
    EXPECT_NE(out.find(p + ": "), std::string::npos) << p << "\n" << out;
  }
  json sim = fixture::fixture_simulate_doc();
  sim["result"].erase("mfu");
  EXPECT_EQ(validate(schema("simulate.schema.json"), {write_doc("broken_simulate.json", sim)}), 1) << last_output();
  json trace = trace_json(fixture::fixture_result(0, {}, true), json::object());
  trace["traceEvents"].back()["ph"] = "Q";
  EXPECT_EQ(validate(schema("trace.schema.json"), {write_doc("broken_trace.json", trace)}), 1) << last_output();
}

// The sim_result and context definitions are written out in each schema file (so each file stands
// alone); they must not drift apart.
TEST(Schema, SharedDefinitionsAreIdentical) {
  json plan = read_json_file(schema("plan.schema.json"), "schema");
  json simulate = read_json_file(schema("simulate.schema.json"), "schema");
  for (const char* def : {"context", "sim_result", "trace_span", "memory_sample"})
    EXPECT_EQ(plan["$defs"][def], simulate["$defs"][def]) << def;
}

// Every key sim_result_to_json writes is in the schema (required, or at least described).
TEST(Schema, SchemaCoversEverySimResultKey) {
  json plan = read_json_file(schema("plan.schema.json"), "schema");
  const json& props = plan["$defs"]["sim_result"]["properties"];
  json r = sim::sim_result_to_json(fixture::fixture_result(0, {}, true), true);
  for (auto& [k, v] : r.items()) EXPECT_TRUE(props.contains(k)) << k << " is written by sim_result_to_json but not in the schema";
  for (const auto& k : plan["$defs"]["sim_result"]["required"]) EXPECT_TRUE(r.contains(k.get<std::string>())) << k;
}

// The documents the real commands write follow the schemas: `fsdpsim plan` (plan.json, trace.json,
// report.html) and `fsdpsim simulate --json --trace`, run as a user would, on a small zoo model.
// Needs the fsdpsim program in the build directory (the default `all` build makes it).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>

#include "common/json_reader.h"
#include "fixture_plan.h"
#include "reports/html_report.h"

using namespace fsdpsim;
using namespace fsdpsim::reports;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string python() { return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3"; }

int run(const std::string& cmd, const std::string& log) {
  int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int validate(const std::string& schema, const std::string& doc, const std::string& log) {
  return run(python() + " " + fixture::source_path("tests/reports/validate_schema.py") + " " +
                 fixture::source_path("reports/schema/" + schema) + " " + doc,
             log);
}

}  // namespace

TEST(RealDocuments, PlanAndSimulateOutputsFollowTheSchemas) {
  const std::string exe = std::string(FSDPSIM_BINARY_DIR) + "/fsdpsim";
  if (!fs::exists(exe)) GTEST_SKIP() << exe << " is not built";
  const std::string dir = fixture::artifact_dir() + "/real";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string log = dir + "/log.txt";

  // plan: exit 0, or 3 when nothing fits (the report is written either way). Two keys pinned keep
  // the search to ~500 candidates (a few seconds).
  int rc = run("FSDPSIM_FIXED_CONTEXT=1 " + exe +
                   " plan --model tiny-llama --cluster 8xH100-SXM --seq-len 1024 --fix fsdp_version=2"
                   " --fix activation_checkpointing=none --out " + dir,
               log);
  ASSERT_TRUE(rc == 0 || rc == 3) << "exit " << rc << "\n" << fixture::read_file(log);
  EXPECT_EQ(validate("plan.schema.json", dir + "/plan.json", log), 0) << fixture::read_file(log);
  json doc = read_json_file(dir + "/plan.json", "plan.json");
  if (!doc["recommended"].is_null()) {
    EXPECT_EQ(validate("trace.schema.json", dir + "/trace.json", log), 0) << fixture::read_file(log);
  }
  // report.html is render_html of plan.json as written (numbers survive the JSON round trip), plus the
  // recommendation's trace and memory timeline that plan.json leaves to trace.json: apart from the memory
  // and timeline sections the two are the same bytes.
  auto without_trace_sections = [](std::string h) {
    for (const char* id : {"<section id=\"memory\">", "<section id=\"timeline\">"}) {
      size_t a = h.find(id);
      if (a == std::string::npos) continue;
      h.erase(a, h.find("</section>", a) + 10 - a);
    }
    return h;
  };
  const std::string written = fixture::read_file(dir + "/report.html"), rendered = render_html(doc);
  EXPECT_TRUE(without_trace_sections(written) == without_trace_sections(rendered)) << "report.html differs from render_html(plan.json)";
  if (!doc["recommended"].is_null()) {
    EXPECT_NE(written.find("id=\"stream-timeline\""), std::string::npos);   // the trace is drawn from the simulation
    EXPECT_EQ(rendered.find("id=\"stream-timeline\""), std::string::npos);
    // the memory section says how close memory predictions have come to PyTorch's (plan.json's accuracy block)
    const std::size_t acc = written.find("id=\"memory-accuracy\"");
    ASSERT_NE(acc, std::string::npos);
    const auto& rsv = doc["accuracy"]["memory"]["steady_state_reserved"];
    EXPECT_NE(written.find("within 3% on " + std::to_string(rsv["within"].get<int>()), acc), std::string::npos);
    EXPECT_NE(written.find(std::to_string(doc["accuracy"]["memory"]["plans"].get<int>()) + " measured plans", acc),
              std::string::npos);
  }

  rc = run("FSDPSIM_FIXED_CONTEXT=1 " + exe + " simulate --model tiny-llama --cluster 8xH100-SXM --plan '{}' --json " + dir +
               "/simulate.json --trace " + dir + "/simulate_trace.json",
           dir + "/simulate.txt");
  ASSERT_EQ(rc, 0) << fixture::read_file(dir + "/simulate.txt");
  EXPECT_EQ(validate("simulate.schema.json", dir + "/simulate.json", log), 0) << fixture::read_file(log);
  EXPECT_EQ(validate("trace.schema.json", dir + "/simulate_trace.json", log), 0) << fixture::read_file(log);
  // FSDP1's result carries its construction's peaks (construction_peak_memory_bytes), as the schema describes them
  rc = run(exe + " simulate --model tiny-llama --cluster 8xH100-SXM --plan '{\"fsdp_version\": 1}' --json " + dir +
               "/simulate_fsdp1.json",
           log);
  ASSERT_EQ(rc, 0) << fixture::read_file(log);
  EXPECT_EQ(validate("simulate.schema.json", dir + "/simulate_fsdp1.json", log), 0) << fixture::read_file(log);
  EXPECT_GT(nlohmann::json::parse(fixture::read_file(dir + "/simulate_fsdp1.json"))["result"]
                ["construction_peak_memory_bytes"]["reserved"].get<long long>(),
            0);
  // simulate and fit end their text with how close predictions have come to measurements, and their JSON carries
  // the same record as plan.json
  EXPECT_NE(fixture::read_file(dir + "/simulate.txt").find("How close predictions have come to measurements"), std::string::npos);
  rc = run(exe + " fit --model tiny-llama --cluster 8xH100-SXM --plan '{}' --json " + dir + "/fit.json", log);
  ASSERT_EQ(rc, 0) << fixture::read_file(log);
  EXPECT_NE(fixture::read_file(log).find("How close predictions have come to measurements"), std::string::npos);
  const auto fit = nlohmann::json::parse(fixture::read_file(dir + "/fit.json"));
  EXPECT_EQ(fit["accuracy"], doc["accuracy"]);
  EXPECT_EQ(nlohmann::json::parse(fixture::read_file(dir + "/simulate.json"))["accuracy"], doc["accuracy"]);
}

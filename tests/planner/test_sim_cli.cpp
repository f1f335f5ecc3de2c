// `fsdpsim plan` and `fsdpsim diagnose` as users run them: outputs, exit codes (0, 2 bad input,
// 3 nothing fits after writing the report), byte-identical plan.json across thread counts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_helpers.h"

// Debian's interpreter, whose yaml/jsonschema come from scripts/deps.sh --test (a python3 earlier on
// PATH, e.g. a pyenv shim, may lack them); python3 from PATH otherwise.
static std::string python3_path() {
  return std::filesystem::exists("/usr/bin/python3") ? std::string("/usr/bin/python3") : std::string("python3");
}

using namespace fsdpsim::test_cli;

TEST(Cli, PlanWritesOutputsAndIsDeterministic) {
  const std::string common = "--deterministic plan --model tiny-llama --cluster 8xH100-SXM --seq-len 512 --global-batch 16 "
                             "--exclude cpu_offload=true --fix fsdp_version=2 --top 3";
  std::filesystem::remove_all(tmp("a"));
  ASSERT_EQ(run(common + " --threads 1 --out " + tmp("a"), tmp("a.log")), 0) << slurp(tmp("a.log"));
  ASSERT_EQ(run(common + " --threads 2 --out " + tmp("b"), tmp("b.log")), 0) << slurp(tmp("b.log"));
  std::string a = slurp(tmp("a") + "/plan.json"), b = slurp(tmp("b") + "/plan.json");
  ASSERT_FALSE(a.empty());
  auto ja = nlohmann::json::parse(a), jb = nlohmann::json::parse(b);
  ja["search"].erase("threads");
  jb["search"].erase("threads");
  ja["context"].erase("command");
  jb["context"].erase("command");
  EXPECT_EQ(ja.dump(), jb.dump());
  EXPECT_EQ(ja["schema_version"], "fsdpsim.plan/1");
  EXPECT_EQ(ja["recommended"], 0);
  EXPECT_TRUE(std::filesystem::exists(tmp("a") + "/report.html"));
  EXPECT_TRUE(std::filesystem::exists(tmp("a") + "/trace.json"));
  EXPECT_NE(slurp(tmp("a.log")).find("Recommended:"), std::string::npos);
  for (const auto& c : ja["candidates"]) EXPECT_EQ(c["plan"]["fsdp_version"], 2);
  // The document follows reports/schema/plan.schema.json (checked when python3-jsonschema is installed).
  if (std::system((python3_path() + " -c 'import jsonschema' > /dev/null 2>&1").c_str()) == 0) {
    std::string py = "import json, jsonschema, sys\n"
                     "s = json.load(open('" + std::string(FSDPSIM_SOURCE_DIR) + "/reports/schema/plan.schema.json'))\n"
                     "d = json.load(open('" + tmp("a") + "/plan.json'))\n"
                     "errs = list(jsonschema.validators.validator_for(s)(s).iter_errors(d))\n"
                     "[print(list(e.path), e.message[:300]) for e in errs[:5]]\n"
                     "sys.exit(1 if errs else 0)\n";
    std::ofstream(tmp("schema.py")) << py;
    EXPECT_EQ(std::system((python3_path() + " " + tmp("schema.py") + " > " + tmp("schema.log") + " 2>&1").c_str()), 0) << slurp(tmp("schema.log"));
  }
}

TEST(Cli, PlanExitCodes) {
  EXPECT_EQ(run("plan --help", tmp("h.log")), 0);
  EXPECT_NE(slurp(tmp("h.log")).find("--fix"), std::string::npos);
  EXPECT_EQ(run("plan --fix fsdp_versoin=2 --out " + tmp("bad"), tmp("bad.log")), 2);
  EXPECT_NE(slurp(tmp("bad.log")).find("fsdp_versoin"), std::string::npos);
  EXPECT_EQ(run("plan --model nonesuch --out " + tmp("bad"), tmp("bad.log")), 2);
  EXPECT_EQ(run("plan --global-batch 12 --out " + tmp("bad"), tmp("bad.log")), 2);
  EXPECT_EQ(run("plan --memory-margin 2 --out " + tmp("bad"), tmp("bad.log")), 2);
  // Nothing fits: exit 3, after writing plan.json and report.html that say why.
  std::filesystem::remove_all(tmp("nofit"));
  EXPECT_EQ(run("plan --model llama3-70b --cluster 1xH100-SXM --seq-len 2048 --global-batch 1 --exclude cpu_offload=true --out " +
                    tmp("nofit"),
                tmp("nofit.log")),
            3)
      << slurp(tmp("nofit.log"));
  auto j = nlohmann::json::parse(slurp(tmp("nofit") + "/plan.json"));
  EXPECT_TRUE(j["recommended"].is_null());
  EXPECT_FALSE(j["rejected_families"].empty());
  EXPECT_TRUE(std::filesystem::exists(tmp("nofit") + "/report.html"));
}

TEST(Cli, Diagnose) {
  EXPECT_EQ(run("diagnose --model llama3-8b --cluster 8xH100-SXM --config " + fixture("lightning_wrap_nothing.py") +
                    " --json " + tmp("diag.json"),
                tmp("diag.log")),
            0)
      << slurp(tmp("diag.log"));
  auto j = nlohmann::json::parse(slurp(tmp("diag.json")));
  bool found = false;
  for (const auto& f : j["findings"]) found |= f["id"] == "wrap_nothing";
  EXPECT_TRUE(found);
  EXPECT_NE(slurp(tmp("diag.log")).find("[problem] wrap_nothing"), std::string::npos);
  EXPECT_EQ(run("diagnose --model llama3-8b --cluster 8xH100-SXM --config " + fixture("bad_accelerate.yaml"), tmp("d2.log")), 2);
  EXPECT_NE(slurp(tmp("d2.log")).find("fsdp_config.fsdp_sharding_strategy"), std::string::npos);
  EXPECT_EQ(run("diagnose --model llama3-8b --cluster 8xH100-SXM", tmp("d3.log")), 2);
  EXPECT_EQ(run("diagnose --help", tmp("d4.log")), 0);
}

TEST(Cli, InterruptLeavesTheOldFiles) {
  // SIGINT during the search (the llama3-8b search over all five precision presets on one thread takes
  // ~3 s on the development VM, more under load; the signal comes after 1 s): exit 130, the previous
  // plan.json untouched, no report.
  const std::string dir = tmp("interrupt");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/plan.json") << "old";
  int rc = std::system(("timeout --preserve-status -s INT 1 " + bin() +
                        " plan --threads 1 --precision bf16,bf16-bf16reduce,bf16-true,fp32,fp8-ag --out " + dir + " > " + dir +
                        ".log 2>&1").c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 130) << slurp(dir + ".log");
  EXPECT_EQ(slurp(dir + "/plan.json"), "old");
  EXPECT_FALSE(std::filesystem::exists(dir + "/report.html"));
  EXPECT_NE(slurp(dir + ".log").find("interrupted"), std::string::npos);
}

// How close the simulator has come to measurements, as the outputs state it (simulate's text and JSON,
// plan.json, the HTML report): users ask "will it fit?" and need to know how far to trust the answer.
//
// These are measured figures, not targets. Each is recomputed by a test whenever the model changes, and the
// test fails until this record is updated to what it measures:
//  * memory: tests/validation/test_torch_memory_fixtures (TorchMemoryFixtures.MeasuredFixturesMatchTheSimulator), the
//    simulator against PyTorch's own allocator statistics (torch.cuda.max_memory_allocated / reserved) on the
//    committed fixtures of tests/fixtures/torch_memory (PyTorch 2.11, one H200/H100 emulating the world with the
//    fake process group);
//  * time: tests/calibrate (calibrate_devset_accuracy, calibrate_devset_published2_report with --check-record),
//    tokens/s against MosaicML llm-foundry's published throughput table (MPT models; the built-in profiles'
//    two constants fitted on one subset, the other held out) and against the other published runs of the
//    development set (not fitted on).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdpsim::sim {

struct MetricRecord {
  int within = 0, compared = 0;   // plans within the tolerance, of those compared
  double tolerance = 0;           // fraction
  double mean_abs_error = 0;      // fraction, rounded to 1e-4 (two decimals of a percent)
};

struct TimeRecord {
  std::string gpu;                // the built-in profile's GPU
  int rows = 0;                   // rows held out of the fit
  double held_out_mape = 0;       // fraction, rounded to 1e-3
};

struct ValidationRecord {
  std::string memory_reference;
  int memory_plans = 0;
  MetricRecord steady_allocated, steady_reserved, first_allocated, first_reserved;
  int fits_agree = 0, fits_compared = 0;
  std::string time_reference;
  std::vector<TimeRecord> time_held_out;
  std::string other_time_reference;
  int other_time_rows = 0;
  double other_time_mae = 0;      // fraction, rounded to 1e-3
};

const ValidationRecord& validation_record();

// {"memory": {...}, "time": {...}} for the JSON outputs.
nlohmann::json validation_record_json();
// Two lines for text outputs (no trailing newline on the last): memory, then time.
std::string validation_record_text(const std::string& indent);
// The section the commands' text outputs end with: a blank line, a heading, those two lines.
std::string validation_record_section();

}  // namespace fsdpsim::sim

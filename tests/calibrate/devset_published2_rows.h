// One mapping per record of ../shared/data/published-dev-set-2.jsonl: the plan its source implies, read in
// the framework's code at the commit the record names (reports/validation/devset-memory-causes-2026-11-26.md),
// used by both readers of that file: the memory report (devset_memory.cpp) and the time report
// (devset_published2.cpp). A setting that only the time comparison needs (a typical sample length where the
// memory figure is set by the longest one) is a patch on the row's plan, with its own stated assumption.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model_spec.h"

namespace fsdpsim::devset {

enum class MemoryKind { Allocated, Reserved, NvidiaSmi };
const char* memory_kind_name(MemoryKind k);

// How a record's time figure compares with a simulated step.
enum class TimeMetric {
  None,              // no time comparison for this row
  TokensPerSecond,   // torchtune's tokens/s (per GPU or the job's total: see devset_published2.cpp)
  SecondsPerMicroBatchIteration,   // litgpt's "time for 1k iterations": one iteration is one micro-batch
};

struct Row {
  const char* id;
  const char* model;       // zoo name ("" = not simulated)
  const char* cluster;     // built-in cluster name
  const char* plan;        // plan JSON, as the source implies
  MemoryKind kind;         // what the record's memory figure measures
  const char* summary;     // short plan summary
  const char* assumes;     // every assumption beyond the record
  const char* memory_skip; // non-null: no memory comparison, with this reason
  TimeMetric time = TimeMetric::None;
  const char* time_patch = "{}";   // JSON object merged over `plan` for the time comparison
  const char* time_assumes = "";   // what the time comparison assumes beyond `assumes`
};

const std::vector<Row>& rows();

// The records of a published-dev-set-2 JSONL file, in file order. Exits 2 (the tool's name first) when the file
// cannot be read or a line is not a JSON object with a string "id", a string "source" and an object "metrics";
// `check` may reject a record further by throwing (its message names what is wrong).
std::vector<nlohmann::json> read_records(const std::string& path, const char* tool,
                                         const std::function<void(const nlohmann::json&)>& check = {});
const Row* find_row(const std::string& id);

// The row's plan JSON (time: with time_patch merged); `note` gets a sentence on its LoRA adapters (rank,
// targets, trainable parameters as the lowering counts them), empty when the plan has none.
nlohmann::json row_plan(const Row& r, const models::ModelSpec& model, bool for_time, std::string* note);

}  // namespace fsdpsim::devset

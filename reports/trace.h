// Chrome / Perfetto trace-event JSON (one track per stream, one counter track for memory).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "program/sim_result.h"

namespace fsdpsim::reports {

// {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {context block}}; spans as "X" events,
// memory as "C" counter events (allocated, reserved).
nlohmann::json trace_json(const sim::SimResult& r, const nlohmann::json& context);
// Writes it atomically; InputError(field, path) on failure.
void write_trace(const std::string& path, const sim::SimResult& r, const nlohmann::json& context,
                 const std::string& field = "--trace");

}  // namespace fsdpsim::reports

// The Perfetto / chrome://tracing file: exact events for a hand-made result.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/errors.h"
#include "common/json_reader.h"
#include "fixture_plan.h"
#include "reports/trace.h"

using namespace fsdpsim;
using namespace fsdpsim::reports;
using nlohmann::json;

namespace {
sim::SimResult tiny() {
  sim::SimResult r;
  r.trace = {{"AG unit 0", "all_gather", "all_gather", 0, 0, 1500, 4096},
             {"fwd unit 0", "compute", "forward", 0, 1500, 2001, 0},
             {"issue", "cpu", "cpu", -1, 0, 700, 0}};
  r.memory_timeline = {{0, 100, 2097152}, {1500, 4196, 2097152}};
  return r;
}
}  // namespace

TEST(Trace, ExactEventsForATinyStep) {
  json ctx = {{"tool", "fsdpsim"}};
  json t = trace_json(tiny(), ctx);
  json expected = json::parse(R"({
    "displayTimeUnit": "ns",
    "otherData": {"tool": "fsdpsim"},
    "traceEvents": [
      {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "fsdpsim: one rank, one step"}},
      {"ph": "M", "pid": 0, "tid": 1, "name": "thread_name", "args": {"name": "compute"}},
      {"ph": "M", "pid": 0, "tid": 1, "name": "thread_sort_index", "args": {"sort_index": 1}},
      {"ph": "M", "pid": 0, "tid": 2, "name": "thread_name", "args": {"name": "all_gather"}},
      {"ph": "M", "pid": 0, "tid": 2, "name": "thread_sort_index", "args": {"sort_index": 2}},
      {"ph": "M", "pid": 0, "tid": 3, "name": "thread_name", "args": {"name": "cpu"}},
      {"ph": "M", "pid": 0, "tid": 3, "name": "thread_sort_index", "args": {"sort_index": 3}},
      {"name": "fwd unit 0", "cat": "forward", "ph": "X", "pid": 0, "tid": 1, "ts": 1.5, "dur": 2.001,
       "args": {"kind": "forward", "unit": 0, "bytes": 0, "start_ns": 1500, "dur_ns": 2001}},
      {"name": "AG unit 0", "cat": "all_gather", "ph": "X", "pid": 0, "tid": 2, "ts": 0.0, "dur": 1.5,
       "args": {"kind": "all_gather", "unit": 0, "bytes": 4096, "start_ns": 0, "dur_ns": 1500}},
      {"name": "issue", "cat": "cpu", "ph": "X", "pid": 0, "tid": 3, "ts": 0.0, "dur": 0.7,
       "args": {"kind": "cpu", "unit": -1, "bytes": 0, "start_ns": 0, "dur_ns": 700}},
      {"ph": "C", "pid": 0, "name": "memory", "ts": 0.0, "args": {"allocated_bytes": 100, "reserved_bytes": 2097152}},
      {"ph": "C", "pid": 0, "name": "memory", "ts": 1.5, "args": {"allocated_bytes": 4196, "reserved_bytes": 2097152}}
    ]})");
  EXPECT_EQ(t, expected) << t.dump(1);
}

TEST(Trace, OverlappingSpansOnOneStreamGetASecondLane) {
  sim::SimResult r;
  r.trace = {{"a", "compute", "forward", -1, 0, 100, 0},
             {"b", "compute", "forward", -1, 50, 100, 0},    // overlaps a: lane 2
             {"c", "compute", "forward", -1, 100, 10, 0}};   // fits after a on lane 1
  json t = trace_json(r, json::object());
  std::map<std::string, int> tid;
  std::map<int, std::string> names;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "X") tid[e["name"]] = e["tid"];
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"]] = e["args"]["name"];
  }
  EXPECT_EQ(tid["a"], 1);
  EXPECT_EQ(tid["b"], 2);
  EXPECT_EQ(tid["c"], 1);
  EXPECT_EQ(names[1], "compute");
  EXPECT_EQ(names[2], "compute #2");
}

TEST(Trace, WriteTraceIsAtomicJsonAndNamesTheFieldOnFailure) {
  std::string dir = fixture::artifact_dir();
  std::string path = dir + "/trace_tiny.json";
  write_trace(path, tiny(), json{{"tool", "fsdpsim"}});
  json back = read_json_file(path, "trace");
  EXPECT_EQ(back, trace_json(tiny(), json{{"tool", "fsdpsim"}}));
  try {
    write_trace(dir + "/no/such/dir/trace.json", tiny(), json::object());
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--trace");
  }
}

#include "runtime/mpi/fault_injection.h"

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "runtime/mpi/mpi_communicator.h"

namespace fsdpsim::runtime {

namespace {
constexpr const char* kSyntax =
    "rank=R,op=N,kind=exit|abort|throw|hang|oom[,code=C][,bytes=B] (R a world rank, N >= 0 the rank's N-th "
    "communicator call; e.g. rank=1,op=40,kind=throw)";

std::int64_t parse_count(const std::string& text, const std::string& key, const std::string& value, std::int64_t lo,
                         std::int64_t hi) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || v < lo || v > hi)
    throw InputError("FSDPSIM_FAULT", "\"" + text + "\"",
                     key + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]; " + kSyntax);
  return v;
}
}  // namespace

const char* fault_kind_name(FaultSpec::Kind k) {
  switch (k) {
    case FaultSpec::Kind::Exit: return "exit";
    case FaultSpec::Kind::Abort: return "abort";
    case FaultSpec::Kind::Throw: return "throw";
    case FaultSpec::Kind::Hang: return "hang";
    case FaultSpec::Kind::Oom: return "oom";
  }
  return "?";
}

FaultSpec parse_fault_spec(const std::string& text) {
  FaultSpec f;
  bool have_rank = false, have_kind = false;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) {
      if (comma == text.size()) break;
      continue;
    }
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) throw InputError("FSDPSIM_FAULT", "\"" + text + "\"", "\"" + item + "\" is not key=value; " + kSyntax);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "rank") {
      f.rank = static_cast<int>(parse_count(text, key, value, 0, 1 << 20));
      have_rank = true;
    } else if (key == "op") {
      f.op = parse_count(text, key, value, 0, INT64_MAX / 2);
    } else if (key == "code") {
      f.code = static_cast<int>(parse_count(text, key, value, 1, 255));
    } else if (key == "bytes") {
      f.bytes = parse_count(text, key, value, 0, Bytes{1} << 50);
    } else if (key == "kind") {
      bool found = false;
      for (auto k : {FaultSpec::Kind::Exit, FaultSpec::Kind::Abort, FaultSpec::Kind::Throw, FaultSpec::Kind::Hang,
                     FaultSpec::Kind::Oom})
        if (value == fault_kind_name(k)) {
          f.kind = k;
          found = true;
        }
      if (!found) throw InputError("FSDPSIM_FAULT", "\"" + text + "\"", "kind \"" + value + "\" is unknown; " + kSyntax);
      have_kind = true;
    } else {
      throw InputError("FSDPSIM_FAULT", "\"" + text + "\"", "unknown key \"" + key + "\"; " + kSyntax);
    }
  }
  if (!have_rank || !have_kind) throw InputError("FSDPSIM_FAULT", "\"" + text + "\"", std::string("rank and kind are required; ") + kSyntax);
  return f;
}

std::optional<FaultSpec> fault_spec_from_env() {
  const char* v = std::getenv("FSDPSIM_FAULT");
  if (!v || !*v) return std::nullopt;
  return parse_fault_spec(v);
}

void FaultInjectingCommunicator::maybe_fire(const char* what) {
  const std::int64_t n = calls_.fetch_add(1);
  if (n != spec_.op) return;
  const std::string where = rank_label(inner_.rank(), inner_.world()) + ": injected fault (FSDPSIM_FAULT kind=" +
                            fault_kind_name(spec_.kind) + ") at communicator call #" + std::to_string(n) + " (" + what + ")";
  switch (spec_.kind) {
    case FaultSpec::Kind::Exit:
      std::cerr << "fsdpsim-run-cpu: " << where << ": exiting with status " << spec_.code << std::endl;
      std::_Exit(spec_.code);
    case FaultSpec::Kind::Abort:
      std::cerr << "fsdpsim-run-cpu: " << where << ": aborting" << std::endl;
      std::abort();
    case FaultSpec::Kind::Throw:
      if (on_fault_) on_fault_(where);
      throw std::runtime_error(where);
    case FaultSpec::Kind::Hang:
      std::cerr << "fsdpsim-run-cpu: " << where << ": hanging" << std::endl;
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    case FaultSpec::Kind::Oom:
      return;   // applied to the device memory by the worker, not here
  }
}

void FaultInjectingCommunicator::all_gather(const float* in, float* out, std::int64_t count, sim::CommGroup g) {
  maybe_fire("all_gather");
  inner_.all_gather(in, out, count, g);
}
void FaultInjectingCommunicator::reduce_scatter(const float* in, float* out, std::int64_t count, sim::CommGroup g,
                                                ReduceOp op) {
  maybe_fire("reduce_scatter");
  inner_.reduce_scatter(in, out, count, g, op);
}
void FaultInjectingCommunicator::all_reduce(float* inout, std::int64_t count, sim::CommGroup g, ReduceOp op) {
  maybe_fire("all_reduce");
  inner_.all_reduce(inout, count, g, op);
}
void FaultInjectingCommunicator::barrier() {
  maybe_fire("barrier");
  inner_.barrier();
}
double FaultInjectingCommunicator::sum_world(double v) {
  maybe_fire("sum_world");
  return inner_.sum_world(v);
}
double FaultInjectingCommunicator::max_world(double v) {
  maybe_fire("max_world");
  return inner_.max_world(v);
}

}  // namespace fsdpsim::runtime

// Fault injection for the runtime's fault tests (issue 9), read by fsdpsim-run-cpu from
//   FSDPSIM_FAULT="rank=R,op=N,kind=K[,code=C][,bytes=B]"
//   rank  the world rank that fails (required)
//   op    the rank's N-th communicator call, counted from 0 over the whole run (collectives, the
//         per-step barrier and world reductions); default 0. Ignored by kind=oom.
//   kind  exit   the process exits at once with status `code` (default 17), as a crash would,
//                without MPI_Finalize
//         abort  the process aborts (SIGABRT)
//         throw  the call throws std::runtime_error("injected fault ...")
//         hang   the call never returns (the other ranks' collective timeout must end the run)
//         oom    the rank's device memory (the allocator's address space) is `bytes` (default
//                1 MiB) instead of RunConfig::address_space, so an allocation runs out of it
// A malformed value is InputError naming FSDPSIM_FAULT (exit 2). Unset or empty: no fault.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "common/units.h"
#include "runtime/communicator.h"

namespace fsdpsim::runtime {

struct FaultSpec {
  enum class Kind { Exit, Abort, Throw, Hang, Oom };
  int rank = -1;
  std::int64_t op = 0;
  Kind kind = Kind::Throw;
  int code = 17;
  Bytes bytes = 1 * kMiB;
};

const char* fault_kind_name(FaultSpec::Kind k);
// Parses the FSDPSIM_FAULT syntax above; InputError("FSDPSIM_FAULT", text, syntax) if malformed.
FaultSpec parse_fault_spec(const std::string& text);
// From the environment; nullopt when FSDPSIM_FAULT is unset or empty.
std::optional<FaultSpec> fault_spec_from_env();

// Wraps the rank's communicator and fires the fault at the spec's op (exit/abort/throw/hang); the
// calls themselves are forwarded unchanged.
class FaultInjectingCommunicator : public Communicator {
 public:
  // on_fault(message) runs just before a `throw` fault throws (the worker marks the MPI
  // communicator failed, so the rank's other pending collectives give up at once).
  FaultInjectingCommunicator(Communicator& inner, FaultSpec spec,
                             std::function<void(const std::string&)> on_fault = nullptr)
      : inner_(inner), spec_(spec), on_fault_(std::move(on_fault)) {}

  int rank() const override { return inner_.rank(); }
  int world() const override { return inner_.world(); }
  int group_rank(sim::CommGroup g) const override { return inner_.group_rank(g); }
  int group_size(sim::CommGroup g) const override { return inner_.group_size(g); }
  void all_gather(const float* in, float* out, std::int64_t count, sim::CommGroup g) override;
  void reduce_scatter(const float* in, float* out, std::int64_t count, sim::CommGroup g, ReduceOp op) override;
  void all_reduce(float* inout, std::int64_t count, sim::CommGroup g, ReduceOp op) override;
  void barrier() override;
  double sum_world(double v) override;
  double max_world(double v) override;

 private:
  void maybe_fire(const char* what);

  Communicator& inner_;
  FaultSpec spec_;
  std::function<void(const std::string&)> on_fault_;
  std::atomic<std::int64_t> calls_{0};
};

}  // namespace fsdpsim::runtime

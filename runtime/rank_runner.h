// One rank of the bundled FSDP runtime, whatever the backend: lowers the plan to the StepProgram the
// simulator executes (rank_program.h), places its buffers with the caching-allocator model and executes
// it step after step on a Device (device.h) with real data: sharded fp32 parameters, their gradients and
// optimizer states; unsharded parameters, activations and gradients in the device's compute dtype; real
// collectives; the transformer's kernels; gradient reduction in reduce_dtype, accumulated into the fp32
// sharded grad; the optimizer step on the shards (fsdp-semantics.md M6/M9, F2.2, F2.9, F1.10-F1.12).
// This file gives each op role (rank_program.h OpRole) its FSDP meaning, once for every backend.
// The backends' runners: cpu/rank_runner.h (RankRunner), cuda/cuda_rank_runner.h (cuda::CudaRankRunner).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/model_spec.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/rank_program.h"
#include "runtime/train/optimizer.h"
#include "program/plan.h"
#include "program/sim_result.h"
#include "program/step_program.h"

namespace fsdpsim::runtime {

struct RunConfig {
  models::ModelSpec model;
  sim::Plan plan;                // resolved for the world size
  int gpus_per_node = 1;         // for the program's process-group shapes
  std::uint64_t seed = 1234;     // parameter init and data
  OptimizerConfig optimizer;     // lr etc.; adamw follows plan.optimizer
  Bytes address_space = 64 * kGiB;   // caps the region reserved for the allocator's segments
};

struct StepOutcome {
  double loss = 0;               // mean token loss over the global batch (all ranks), before the update
  sim::SimResult measured;       // this rank's measured step (times, trace, memory so far)
};

class Runner : public OpHandler {
 public:
  // `comm` is the host side of the device's communicator (ranks, groups, world reductions).
  Runner(const RunConfig& cfg, Communicator& comm, std::unique_ptr<Device> device);
  ~Runner() override;

  StepOutcome step();            // one optimizer step on the next global batch
  const sim::StepProgram& program() const { return rp_.program; }
  // Every parameter tensor of the model (registration order), assembled from all shards: valid on
  // every rank (collective: all ranks must call it).
  std::vector<std::pair<std::string, std::vector<float>>> gather_params();
  // The same for the reduced (sharded) gradients of the last step: zero_grad freed their buffers after
  // the optimizer step, and nothing ran after it in the placed region, so their bytes are the step's.
  std::vector<std::pair<std::string, std::vector<float>>> gather_grads();
  Bytes untracked_bytes() const { return dev_->untracked_bytes(); }
  std::vector<std::string> notes() const { return notes_; }

  void run(const sim::Op& op, Stream s) override;

 protected:
  Device& device() { return *dev_; }
  const Device& device() const { return *dev_; }

 private:
  std::string internal(const std::string& what) const;
  char* ptr(int buffer) const { return dev_->memory().address(buffer); }
  Elem elem(int buffer) const { return rp_.buffer_elem.at(buffer); }
  void check_typed(int buffer, Elem type, std::int64_t numel, const char* what) const;
  std::vector<char*> segment_params(int seg, const sim::Op& op);
  std::vector<char*> segment_grads(int seg, const sim::Op& op, Stream s);
  void run_compute(const sim::Op& op);
  void reduce_scatter_copy_in(const sim::Op& op, Stream s);
  void param_copy_out(const sim::Op& op, Stream s);
  void grad_cat(const sim::Op& op, Stream s);
  void cast(const sim::Op& op, Stream s);
  void accumulate_grad(int unit, int src_buffer, Stream s);
  std::vector<std::pair<std::string, std::vector<float>>> gather(const std::vector<int>& per_unit_buffer);

  RunConfig cfg_;
  Communicator& comm_;
  std::unique_ptr<Device> dev_;
  RankProgram rp_;                                  // the program, layouts, segments and op roles
  int steps_done_ = 0;
  std::vector<float*> state_ptr_;                   // per unit optimizer states (in its optim_buf when it fits)
  std::vector<std::vector<int>> act_buf_, recomp_buf_;   // [micro-batch][segment] -> buffer id
  std::vector<std::string> notes_;
};

}  // namespace fsdpsim::runtime

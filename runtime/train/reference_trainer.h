// The oracle: an unsharded, single-process training step of the same transformer on the same
// data, written as plainly as possible (one forward over the whole global batch, one backward,
// one optimizer step over every tensor). The sharded runtime must reproduce its parameters.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/model/dims.h"
#include "runtime/model/param_tensors.h"
#include "runtime/train/optimizer.h"
#include "runtime/train/synthetic_data.h"

namespace fsdpsim::runtime {

// Every parameter tensor of the model in registration order (embedding, blocks, norm, head).
std::vector<ParamTensor> model_param_tensors(const Dims& d);

class ReferenceTrainer {
 public:
  // d.B is ignored: each step's batch size comes from the batch it is given.
  ReferenceTrainer(const Dims& d, std::uint64_t seed, const OptimizerConfig& opt);

  // One optimizer step on a batch of B sequences ([B,T] inputs/targets); returns the mean token loss.
  double step(const TokenBatch& batch);
  // Mean token loss of a batch, no update.
  double loss(const TokenBatch& batch);

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const std::vector<float>& params() const { return params_; }     // all tensors back to back
  const std::vector<float>& grads() const { return grads_; }       // of the last step
  std::vector<float>& mutable_params() { return params_; }
  std::int64_t offset(int tensor) const { return offsets_[tensor]; }
  int find(const std::string& name) const;                         // -1 if absent

  // Forward (+ backward when `backward`) of one batch; fills grads_ (zeroed first). Returns mean loss.
  double forward_backward(const TokenBatch& batch, bool backward);

 private:
  Dims d_;
  OptimizerConfig opt_;
  int steps_ = 0;
  std::vector<ParamTensor> tensors_;
  std::vector<std::int64_t> offsets_;
  std::vector<float> params_, grads_, state_;
};

}  // namespace fsdpsim::runtime

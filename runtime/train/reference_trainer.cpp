#include "runtime/train/reference_trainer.h"

#include <algorithm>
#include <stdexcept>

#include "runtime/model/block.h"
#include "runtime/model/ends.h"
#include "runtime/train/init.h"

namespace fsdpsim::runtime {

std::vector<ParamTensor> model_param_tensors(const Dims& d) {
  using models::ModulePart;
  auto ts = part_param_tensors(d, ModulePart::Embedding, -1);
  for (int l = 0; l < d.L; ++l) {
    auto b = part_param_tensors(d, ModulePart::Block, l);
    ts.insert(ts.end(), b.begin(), b.end());
  }
  auto h = part_param_tensors(d, ModulePart::FinalNormAndHead, -1);
  ts.insert(ts.end(), h.begin(), h.end());
  return ts;
}

ReferenceTrainer::ReferenceTrainer(const Dims& d, std::uint64_t seed, const OptimizerConfig& opt)
    : d_(d), opt_(opt), tensors_(model_param_tensors(d)) {
  std::int64_t off = 0;
  for (const auto& t : tensors_) {
    offsets_.push_back(off);
    off += t.numel();
  }
  params_.resize(off);
  grads_.assign(off, 0.0f);
  state_.assign(off * opt.states(), 0.0f);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const ParamInitializer init(seed, tensors_[i]);
    for (std::int64_t e = 0; e < tensors_[i].numel(); ++e) params_[offsets_[i] + e] = init(e);
  }
}

int ReferenceTrainer::find(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return static_cast<int>(i);
  return -1;
}

double ReferenceTrainer::forward_backward(const TokenBatch& batch, bool backward) {
  Dims d = d_;
  d.B = static_cast<int>(batch.inputs.size() / d.T);
  if (d.B <= 0 || batch.inputs.size() != static_cast<size_t>(d.B) * d.T)
    throw std::invalid_argument("reference batch is not [B, T]");
  const long N = d.tokens();
  std::fill(grads_.begin(), grads_.end(), 0.0f);

  const int per_block = block_tensor_index(d).count;
  auto block_ptrs = [&](int l, std::vector<float>& store) {
    std::vector<float*> p;
    for (int i = 0; i < per_block; ++i) p.push_back(store.data() + offsets_[1 + l * per_block + i]);
    return p;
  };
  const float* wte = params_.data() + offsets_[0];
  const int norm_i = 1 + d.L * per_block;
  const float* norm_w = params_.data() + offsets_[norm_i];
  const float* head_w = d.tied ? wte : params_.data() + offsets_[norm_i + 1];

  // Forward: every block keeps its activations (no checkpointing in the oracle).
  const ArenaLayout acts_l = block_acts_layout(d);
  std::vector<std::vector<float>> acts(d.L, std::vector<float>(acts_l.bytes() / 4));
  std::vector<float> x(N * d.C), y(N * d.C);
  embed_forward(d, wte, batch.inputs.data(), x.data());
  std::vector<BlockActs> a(d.L);
  for (int l = 0; l < d.L; ++l) {
    a[l] = bind_block_acts(d, acts[l].data());
    auto pv = block_ptrs(l, params_);
    BlockParams p = bind_block_params(d, std::vector<const float*>(pv.begin(), pv.end()));
    block_forward(d, p, x.data(), a[l], y.data());
    std::swap(x, y);
  }
  std::vector<float> head_aux(head_aux_layout(d).bytes() / 4), head_logits(head_logits_layout(d).bytes() / 4);
  HeadActs ha = bind_head_acts(d, head_aux.data(), head_logits.data());
  const double total = head_forward(d, norm_w, head_w, x.data(), batch.targets.data(), ha);
  if (!backward) return total / static_cast<double>(N);

  // Backward.
  float* dwte = grads_.data() + offsets_[0];
  float* dnorm = grads_.data() + offsets_[norm_i];
  float* dhead = d.tied ? dwte : grads_.data() + offsets_[norm_i + 1];
  std::vector<float> dx(N * d.C), dln(N * d.C);
  head_backward(d, norm_w, head_w, batch.targets.data(), 1.0f / static_cast<float>(N), ha, dnorm, dhead, dx.data(),
                dln.data());
  std::vector<float> scratch(block_scratch_layout(d).bytes() / 4);
  BlockScratch s = bind_block_scratch(d, scratch.data());
  for (int l = d.L - 1; l >= 0; --l) {
    auto pv = block_ptrs(l, params_);
    BlockParams p = bind_block_params(d, std::vector<const float*>(pv.begin(), pv.end()));
    BlockGrads g = bind_block_grads(d, block_ptrs(l, grads_));
    block_backward(d, p, g, a[l], dx.data(), dx.data(), s);
  }
  embed_backward(d, dwte, batch.inputs.data(), dx.data());
  return total / static_cast<double>(N);
}

double ReferenceTrainer::loss(const TokenBatch& batch) { return forward_backward(batch, false); }

double ReferenceTrainer::step(const TokenBatch& batch) {
  const double l = forward_backward(batch, true);
  ++steps_;
  optimizer_step(opt_, params_.data(), grads_.data(), state_.data(), static_cast<std::int64_t>(params_.size()), steps_);
  return l;
}

}  // namespace fsdpsim::runtime

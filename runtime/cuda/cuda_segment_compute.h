// The compute of one forward segment (embedding, block l, final norm + head) for one micro-batch on
// the GPU, in bf16 with fp32 accumulation: the CUDA counterpart of runtime/cpu/segment_compute.h,
// with the same block structure (runtime/model/block.h) and the same use of the program's buffers.
//
// Saved activations of a block in its "act" buffer, byte layout (what models/model_activations.cpp
// counts for activation dtype bf16, exactly):
//   x [N,C] bf16 | rstd1 [N] f32 | rstd2 [N] f32 | lse [B,NH,T] f32 | ln1 [N,C] | q [N,QD] | k, v [N,KVD]
//   | att [N,QD] | xmid [N,C] | ln2 [N,C] | gate, act, up, h [N,F]            (bf16 unless marked)
// x comes first so that, under full checkpointing, "act" holds x alone and "recomp" everything after.
// The head's "logits" buffer (models::logits_bytes: N*V bf16 + N*V fp32 for PyTorch's log_softmax
// copy) holds the bf16 logits (then, in place, their gradient) and, in its fp32 part, the row lse
// [N] of the fused cross-entropy: the fused loss needs 4N of those 4NV bytes.
// Everything else (residual stream and its gradient between segments, a checkpointed block's
// transient forward, backward temporaries, the final norm's input/statistics/output, token arrays,
// the rotary table, per-token losses) is scratch from cudaMalloc outside the allocator, reported by
// untracked_bytes() as the CPU backend does.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "common/units.h"
#include "runtime/cuda/gemm.h"
#include "runtime/model/dims.h"

namespace fsdpsim::runtime::cuda {

// Bytes of one block's saved activations in the layout above (bf16 compute), and of the head's
// logits buffer; equal to models::block_saved_activation_bytes / logits_bytes for bf16 (tested).
Bytes cuda_block_acts_bytes(const Dims& d);
Bytes cuda_logits_bytes(const Dims& d);
// Offset of the fused cross-entropy's fp32 lse [N] inside the logits buffer (after the bf16
// logits, 4-byte aligned).
Bytes cuda_logits_lse_offset(const Dims& d);

class CudaSegmentCompute {
 public:
  // dloss_scale = d(loss)/d(token loss) for this rank's tokens. All work goes to gemm.stream().
  CudaSegmentCompute(const Dims& d, float dloss_scale, std::vector<bool> checkpointed_layers, Gemm& gemm);
  ~CudaSegmentCompute();
  CudaSegmentCompute(const CudaSegmentCompute&) = delete;
  CudaSegmentCompute& operator=(const CudaSegmentCompute&) = delete;

  int segments() const { return d_.L + 2; }
  // Uploads a micro-batch's tokens (synchronously: call before the step).
  void set_batch(int micro_batch, const std::vector<std::int32_t>& inputs, const std::vector<std::int32_t>& targets);

  // params/grads: the segment's tensors in param_tensors.h order, bf16 device pointers.
  void forward(int seg, int mb, const std::vector<bf16*>& params, char* act);
  void recompute(int seg, int mb, const std::vector<bf16*>& params, char* act, char* recomp);
  // As the CPU backend's SegmentCompute::set_recompute_early_stop.
  void set_recompute_early_stop(bool on) { early_stop_ = on; }
  void backward(int seg, int mb, const std::vector<bf16*>& params, const std::vector<bf16*>& grads, char* act,
                char* recomp);

  // Summed token loss of a micro-batch's forward (reads the device: call after the step).
  double loss_sum(int mb) const;
  Bytes untracked_bytes() const { return untracked_; }
  Bytes act_bytes(int seg) const;
  Bytes recomp_bytes(int seg) const;
  Bytes block_acts_bytes() const { return cuda_block_acts_bytes(d_); }

 private:
  struct Acts;
  Acts bind(char* act, char* recomp, int layer) const;
  void block_forward(const std::vector<bf16*>& p, const bf16* x_in, Acts& a, bf16* out, bool stop_early = false);
  void block_backward(const std::vector<bf16*>& p, const std::vector<bf16*>& g, const Acts& a, bf16* dx);
  template <class T>
  T* scratch(long n);

  Dims d_;
  float dloss_scale_;
  std::vector<bool> ckpt_;
  bool early_stop_ = true;
  Gemm& gemm_;
  cudaStream_t s_;
  std::vector<void*> owned_;     // every cudaMalloc of this object
  Bytes untracked_ = 0;
  struct Batch {
    std::int32_t *inputs = nullptr, *targets = nullptr;     // [N]
    std::int32_t *uniq = nullptr, *off = nullptr, *pos = nullptr;   // embedding backward CSR
    int n_uniq = 0;
    float* loss = nullptr;                                  // [N] per-token loss
  };
  std::vector<Batch> batches_;
  bf16 *x_ = nullptr, *dx_ = nullptr;       // [N, C] residual stream / its gradient
  char* transient_ = nullptr;               // a full block's saved activations (checkpointed forward)
  bf16 *dxmid_ = nullptr, *dh_ = nullptr, *dgate_ = nullptr, *dup_ = nullptr, *dln_ = nullptr;
  bf16 *datt_ = nullptr, *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr;
  float* attn_D_ = nullptr;                 // [B, NH, T]
  bf16 *head_x_ = nullptr, *head_ln_ = nullptr;
  float* head_rstd_ = nullptr;
  float* rope_ = nullptr;                   // [T][HD/2][cos, sin]
};

}  // namespace fsdpsim::runtime::cuda

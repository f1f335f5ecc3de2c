#include "calibrate/cpu/runtime_kernels.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>

#include "calibrate/cpu/mpi_check.h"
#include "common/units.h"
#include "models/kernels.h"
#include "runtime/layers/attention.h"
#include "runtime/layers/cross_entropy.h"
#include "runtime/layers/embedding.h"
#include "runtime/layers/rmsnorm.h"
#include "runtime/layers/rotary.h"
#include "runtime/layers/swiglu.h"
#include "runtime/model/dims.h"
#include "runtime/train/optimizer.h"

namespace fsdpsim::calibrate::cpu {
namespace {

// A typical one of `reps` calls after one warm-up (typical_call_seconds says which and why), as the
// slowest rank sees it (timed_on_ranks).
double time_ns(const std::function<void()>& fn, int reps, MPI_Comm comm, const ComputeTiming& ct) {
  return timed_on_ranks([&] {
    fn();
    return typical_call_seconds(fn, reps);
  }, comm, ct) * 1e9;
}

// A buffer of n floats with small deterministic values (no zeros: the exp and sqrt paths run as in training).
std::vector<float> filled(std::int64_t n, float scale = 0.1f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = scale * static_cast<float>((i * 7919) % 211 - 105) / 105.0f;
  return v;
}

}  // namespace

RuntimeKernelRates time_runtime_kernels(const models::ModelSpec& model, std::int64_t micro_batch, std::int64_t seq_len,
                                        double peak_flops, double min_kernel_ns, std::int64_t copy_bytes, int reps,
                                        MPI_Comm comm, const ComputeTiming& ct) {
  const runtime::Dims d = runtime::runtime_dims(model, micro_batch, seq_len);
  const long N = d.tokens(), NC = N * d.C, NF = N * static_cast<long>(d.F);
  RuntimeKernelRates out;

  // ---- the runtime's calls, each timed alone ----
  auto x = filled(NC), y = filled(NC), g = filled(NC, 0.01f), w = filled(d.C, 1.0f), dw = filled(d.C);
  std::vector<float> rstd(static_cast<size_t>(N));
  const double t_norm_f = time_ns([&] { runtime::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), int(N), d.C); }, reps, comm, ct);
  const double t_norm_b = time_ns([&] {
    runtime::rmsnorm_backward(y.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), int(N), d.C);
  }, reps, comm, ct);
  auto q = filled(N * d.q_dim()), k = filled(N * d.kv_dim()), v = filled(N * d.kv_dim());
  const double t_rot = time_ns([&] {
    runtime::rotary_forward(q.data(), d.B, d.T, d.NH, d.HD);
    runtime::rotary_forward(k.data(), d.B, d.T, d.NKV, d.HD);
  }, reps, comm, ct);
  const double t_rot_b = time_ns([&] {
    runtime::rotary_backward(q.data(), d.B, d.T, d.NH, d.HD);
    runtime::rotary_backward(k.data(), d.B, d.T, d.NKV, d.HD);
  }, reps, comm, ct);
  auto gate = filled(NF), up = filled(NF), act = filled(NF), h = filled(NF), dh = filled(NF, 0.01f), dg = filled(NF),
       du = filled(NF);
  const double t_act = time_ns([&] { runtime::swiglu_forward(act.data(), h.data(), gate.data(), up.data(), NF); }, reps, comm, ct);
  const double t_act_b = time_ns([&] {
    runtime::swiglu_backward(dg.data(), du.data(), dh.data(), gate.data(), act.data(), up.data(), NF);
  }, reps, comm, ct);
  const double t_add = time_ns([&] {
    for (long i = 0; i < NC; ++i) y[static_cast<size_t>(i)] += x[static_cast<size_t>(i)];
  }, reps, comm, ct);
  auto o = filled(N * d.q_dim()), dout = filled(N * d.q_dim(), 0.01f), dq = filled(N * d.q_dim()),
       dk = filled(N * d.kv_dim()), dv = filled(N * d.kv_dim());
  std::vector<float> lse(static_cast<size_t>(d.B) * d.NH * d.T);
  const double t_att = time_ns([&] {
    runtime::attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), d.B, d.T, d.NH, d.NKV, d.HD);
  }, reps, comm, ct);
  const double t_att_b = time_ns([&] {
    runtime::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), o.data(),
                                lse.data(), d.B, d.T, d.NH, d.NKV, d.HD);
  }, reps, comm, ct);
  auto logits = filled(N * static_cast<long>(d.V), 1.0f), logp = filled(N * static_cast<long>(d.V));
  std::vector<std::int32_t> tokens(static_cast<size_t>(N));
  for (long i = 0; i < N; ++i) tokens[static_cast<size_t>(i)] = static_cast<std::int32_t>((i * 31) % d.V);
  const double t_ce = time_ns([&] { runtime::cross_entropy_forward(logp.data(), logits.data(), tokens.data(), int(N), d.V); }, reps, comm, ct);
  auto dlogits = filled(N * static_cast<long>(d.V));
  const double t_ce_b = time_ns([&] {
    runtime::cross_entropy_backward(dlogits.data(), logp.data(), tokens.data(), int(N), d.V, 1.0f);
  }, reps, comm, ct);
  auto table = filled(static_cast<long>(d.V) * d.C);
  const double t_emb = time_ns([&] { runtime::embedding_forward(x.data(), tokens.data(), table.data(), int(N), d.C); }, reps, comm, ct);
  const double t_emb_b = time_ns([&] { runtime::embedding_backward(table.data(), g.data(), tokens.data(), int(N), d.C); }, reps, comm, ct);
  const std::int64_t n_params = std::max<std::int64_t>(copy_bytes / 4, 1024);
  auto p = filled(n_params), grad = filled(n_params, 0.01f), state = filled(2 * n_params, 0.0f);
  runtime::OptimizerConfig adamw;
  int step = 0;
  const double t_opt = time_ns([&] { runtime::optimizer_step(adamw, p.data(), grad.data(), state.data(), n_params, ++step); }, reps, comm, ct);
  // The runtime copies each unit's parameters and gradients once per use, so its copies rarely find their
  // source in cache: cycle through enough distinct buffers (kCopyFootprint in all) that each copy reads memory
  // the previous ones evicted, as they do.
  constexpr std::int64_t kCopyFootprint = 64 * kMiB;
  const int nbuf = static_cast<int>(std::clamp<std::int64_t>(kCopyFootprint / std::max<std::int64_t>(n_params * 8, 1), 1, 64));
  std::vector<std::vector<float>> srcs(static_cast<size_t>(nbuf), std::vector<float>(static_cast<size_t>(n_params), 1.0f)),
      dsts(static_cast<size_t>(nbuf), std::vector<float>(static_cast<size_t>(n_params), 0.0f));
  int next = 0;
  const double t_copy = time_ns([&] {
    std::memcpy(dsts[static_cast<size_t>(next)].data(), srcs[static_cast<size_t>(next)].data(), sizeof(float) * static_cast<size_t>(n_params));
    next = (next + 1) % nbuf;
  }, std::max(reps, nbuf), comm, ct);

  // ---- the kernel lists' bytes per class (fp32, the runtime's fused one-pass kernels) ----
  models::KernelOptions fused;   // implementation "fused", eager, no float8
  Bytes bytes[kMemoryClasses] = {}, kernels[kMemoryClasses] = {};
  auto add = [&](const std::vector<models::KernelDesc>& ks) {
    for (const auto& kd : ks)
      if (kd.kind != models::KernelKind::Gemm && kd.kind != models::KernelKind::Attention)
        bytes[static_cast<int>(kd.mem_class)] += kd.bytes, kernels[static_cast<int>(kd.mem_class)] += 1;
  };
  for (auto part : {models::ModulePart::Embedding, models::ModulePart::Block, models::ModulePart::FinalNormAndHead}) {
    add(models::forward_kernels(model, part, micro_batch, seq_len, Dtype::FP32, fused));
    add(models::backward_kernels(model, part, micro_batch, seq_len, Dtype::FP32, true, fused));
  }
  // Runtime time doing each class's work for one block + the head + the embedding, forward and backward.
  double t_class[kMemoryClasses] = {};
  t_class[static_cast<int>(MemoryClass::Norm)] = 3 * (t_norm_f + t_norm_b);   // two in the block, one in the head
  t_class[static_cast<int>(MemoryClass::Rotary)] = t_rot + t_rot_b;
  t_class[static_cast<int>(MemoryClass::Activation)] = t_act + t_act_b;
  t_class[static_cast<int>(MemoryClass::CrossEntropy)] = t_ce + t_ce_b;
  t_class[static_cast<int>(MemoryClass::Embedding)] = t_emb + t_emb_b;
  // Residual-class kernels each move 3 [T, h] activations, as the add loop timed.
  t_class[static_cast<int>(MemoryClass::Residual)] = static_cast<double>(kernels[static_cast<int>(MemoryClass::Residual)]) * t_add;
  for (int c = 0; c < kMemoryClasses; ++c) {
    const double t = t_class[c] - static_cast<double>(kernels[c]) * min_kernel_ns;
    if (bytes[c] > 0 && t_class[c] > 0) out.class_bw[c] = static_cast<double>(bytes[c]) / (std::max(t, 0.5 * t_class[c]) * 1e-9);
  }
  // AdamW: param, grad, exp_avg, exp_avg_sq read, param and both states written: 28 bytes per parameter
  // (the lowering's OptimizerStep copy_bytes); memcpy: read + write.
  out.class_bw[static_cast<int>(MemoryClass::Optimizer)] = 28.0 * static_cast<double>(n_params) / (t_opt * 1e-9);
  out.class_bw[static_cast<int>(MemoryClass::Copy)] = 8.0 * static_cast<double>(n_params) / (t_copy * 1e-9);
  const double att_flops = 2.0 * d.B * d.NH * static_cast<double>(d.T) * d.T * d.HD;   // executed causal FLOPs (kernels.h)
  out.attn_fwd_eff = std::min(1.0, att_flops / (t_att * 1e-9) / peak_flops);
  out.attn_bwd_eff = std::min(1.0, 2.5 * att_flops / (t_att_b * 1e-9) / peak_flops);

  char line[200];
  auto say = [&](const char* what, double t_ns, double rate) {
    std::snprintf(line, sizeof line, "%-28s %10.1f us   %8.3f GB/s", what, t_ns / 1e3, rate / 1e9);
    out.lines.push_back(line);
  };
  say("rmsnorm fwd+bwd (x3)", t_class[static_cast<int>(MemoryClass::Norm)], out.class_bw[static_cast<int>(MemoryClass::Norm)]);
  say("rotary q,k fwd+bwd", t_class[static_cast<int>(MemoryClass::Rotary)], out.class_bw[static_cast<int>(MemoryClass::Rotary)]);
  say("swiglu fwd+bwd", t_class[static_cast<int>(MemoryClass::Activation)], out.class_bw[static_cast<int>(MemoryClass::Activation)]);
  say("residual add", t_add, out.class_bw[static_cast<int>(MemoryClass::Residual)]);
  say("cross-entropy fwd+bwd", t_class[static_cast<int>(MemoryClass::CrossEntropy)], out.class_bw[static_cast<int>(MemoryClass::CrossEntropy)]);
  say("embedding fwd+bwd", t_class[static_cast<int>(MemoryClass::Embedding)], out.class_bw[static_cast<int>(MemoryClass::Embedding)]);
  say("adamw step", t_opt, out.class_bw[static_cast<int>(MemoryClass::Optimizer)]);
  say("memcpy", t_copy, out.class_bw[static_cast<int>(MemoryClass::Copy)]);
  std::snprintf(line, sizeof line, "%-28s %10.1f us   %8.3f of peak", "attention fwd", t_att / 1e3, out.attn_fwd_eff);
  out.lines.push_back(line);
  std::snprintf(line, sizeof line, "%-28s %10.1f us   %8.3f of peak", "attention bwd", t_att_b / 1e3, out.attn_bwd_eff);
  out.lines.push_back(line);
  return out;
}

}  // namespace fsdpsim::calibrate::cpu

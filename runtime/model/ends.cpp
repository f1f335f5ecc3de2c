#include "runtime/model/ends.h"

#include <cstring>

#include "runtime/layers/cross_entropy.h"
#include "runtime/layers/embedding.h"
#include "runtime/layers/matmul.h"
#include "runtime/layers/rmsnorm.h"

namespace fsdpsim::runtime {

void embed_forward(const Dims& d, const float* wte, const std::int32_t* tokens, float* x0) {
  embedding_forward(x0, tokens, wte, static_cast<int>(d.tokens()), d.C);
}

void embed_backward(const Dims& d, float* dwte, const std::int32_t* tokens, const float* dx0) {
  embedding_backward(dwte, dx0, tokens, static_cast<int>(d.tokens()), d.C);
}

ArenaLayout head_aux_layout(const Dims& d) {
  const long N = d.tokens();
  ArenaLayout l;
  l.add("x", N * d.C);
  l.add("rstd", N);
  l.add("ln", N * d.C);
  return l;
}

ArenaLayout head_logits_layout(const Dims& d) {
  const long N = d.tokens();
  ArenaLayout l;
  l.add("logits", N * d.V);
  l.add("logp", N * d.V);
  return l;
}

HeadActs bind_head_acts(const Dims& d, void* aux, void* logits) {
  const ArenaLayout a = head_aux_layout(d), l = head_logits_layout(d);
  return HeadActs{a.at(aux, 0), a.at(aux, 1), a.at(aux, 2), l.at(logits, 0), l.at(logits, 1)};
}

double head_forward(const Dims& d, const float* norm_w, const float* head_w, const float* x,
                    const std::int32_t* targets, HeadActs& a) {
  const int N = static_cast<int>(d.tokens());
  if (a.x != x) std::memcpy(a.x, x, sizeof(float) * N * static_cast<long>(d.C));
  rmsnorm_forward(a.ln, a.rstd, a.x, norm_w, N, d.C);
  matmul_forward(a.logits, a.ln, head_w, nullptr, N, d.C, d.V);
  return cross_entropy_forward(a.logp, a.logits, targets, N, d.V);
}

void head_backward(const Dims& d, const float* norm_w, const float* head_w, const std::int32_t* targets,
                   float dloss_scale, HeadActs& a, float* dnorm_w, float* dhead_w, float* dx, float* dln) {
  const int N = static_cast<int>(d.tokens());
  float* dlogits = a.logits;   // the logits are dead once the loss is known: reuse their storage
  cross_entropy_backward(dlogits, a.logp, targets, N, d.V, dloss_scale);
  std::memset(dln, 0, sizeof(float) * N * static_cast<long>(d.C));
  matmul_backward(dln, dhead_w, nullptr, dlogits, a.ln, head_w, N, d.C, d.V);
  std::memset(dx, 0, sizeof(float) * N * static_cast<long>(d.C));
  rmsnorm_backward(dx, dnorm_w, dln, a.x, norm_w, a.rstd, N, d.C);
}

}  // namespace fsdpsim::runtime

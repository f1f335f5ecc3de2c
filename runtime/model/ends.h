// The two ends of the model around the blocks: the token embedding (model.embed_tokens) and the
// final RMSNorm + LM head + cross-entropy loss (model.norm, lm_head).
#pragma once
#include <cstdint>

#include "runtime/model/arena.h"
#include "runtime/model/dims.h"

namespace fsdpsim::runtime {

// ---- embedding ----
// x0[N,C] = wte[V,C][tokens[N]].
void embed_forward(const Dims& d, const float* wte, const std::int32_t* tokens, float* x0);
// dwte[V,C] += scatter(dx0[N,C]).
void embed_backward(const Dims& d, float* dwte, const std::int32_t* tokens, const float* dx0);

// ---- final norm + LM head + loss ----
// What the head's forward keeps for its backward, in two regions:
//  * the logits region (what models::logits_bytes counts: the logits + the fp32 log_softmax),
//  * the aux region (final-norm input, statistics and output: not in the models' activation formula,
//    so the runtime keeps it outside the program's buffers and reports its size).
struct HeadActs {
  float* x = nullptr;       // [N, C] input of the final norm (last block's output)   (aux)
  float* rstd = nullptr;    // [N]                                                    (aux)
  float* ln = nullptr;      // [N, C] final norm output (input of lm_head)            (aux)
  float* logits = nullptr;  // [N, V] logits (the model output)                       (logits)
  float* logp = nullptr;    // [N, V] log_softmax(logits), saved by cross-entropy     (logits)
};
ArenaLayout head_aux_layout(const Dims& d);
ArenaLayout head_logits_layout(const Dims& d);
HeadActs bind_head_acts(const Dims& d, void* aux_base, void* logits_base);

// Reads x[N,C] (copied into a.x unless it is a.x), norm_w[C], head_w[V,C] (the embedding when tied);
// returns the summed token loss (double).
double head_forward(const Dims& d, const float* norm_w, const float* head_w, const float* x,
                    const std::int32_t* targets, HeadActs& a);
// dnorm_w[C] +=, dhead_w[V,C] += (the embedding grad when tied); dx[N,C] overwritten; dln [N,C] is
// scratch. dloss_scale = d(loss)/d(token loss). Overwrites a.logits with dlogits.
void head_backward(const Dims& d, const float* norm_w, const float* head_w, const std::int32_t* targets,
                   float dloss_scale, HeadActs& a, float* dnorm_w, float* dhead_w, float* dx, float* dln);

}  // namespace fsdpsim::runtime

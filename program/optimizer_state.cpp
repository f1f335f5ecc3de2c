// Optimizer state layouts (see program/optimizer_state.h for the sources).
#include "program/optimizer_state.h"

#include <algorithm>

namespace fsdpsim::sim {

int optimizer_state_count(Optimizer o) { return o == Optimizer::SGD ? 1 : 2; }

bool optimizer_is_bitsandbytes(Optimizer o) {
  return o == Optimizer::BnbAdamW8bit || o == Optimizer::BnbPagedAdamW || o == Optimizer::BnbPagedAdamW8bit;
}
bool optimizer_is_torchao(Optimizer o) { return o == Optimizer::TorchaoAdamW8bit || o == Optimizer::TorchaoAdamW4bit; }
bool optimizer_is_low_bit(Optimizer o) { return optimizer_is_bitsandbytes(o) || optimizer_is_torchao(o); }
bool optimizer_is_paged(Optimizer o) { return o == Optimizer::BnbPagedAdamW || o == Optimizer::BnbPagedAdamW8bit; }

std::string optimizer_class(Optimizer o) {
  switch (o) {
    case Optimizer::AdamW: return "torch.optim.AdamW";
    case Optimizer::SGD: return "torch.optim.SGD";
    case Optimizer::BnbAdamW8bit: return "bitsandbytes.optim.AdamW8bit";
    case Optimizer::BnbPagedAdamW: return "bitsandbytes.optim.PagedAdamW";
    case Optimizer::BnbPagedAdamW8bit: return "bitsandbytes.optim.PagedAdamW8bit";
    case Optimizer::TorchaoAdamW8bit: return "torchao.optim.AdamW8bit";
    case Optimizer::TorchaoAdamW4bit: return "torchao.optim.AdamW4bit";
  }
  return "torch.optim.AdamW";
}

std::string optimizer_not_modelled(const Plan& p) {
  if (!optimizer_is_low_bit(p.optimizer)) return "";
  if (p.implementation == models::ModelImpl::Runtime)
    return "the bundled runtime steps torch.optim's AdamW or SGD (implementation runtime)";
  if (p.cpu_offload.params || p.cpu_offload.optimizer)
    return "a low-bit or paged optimizer with CPU offload is not modelled: set cpu_offload false";
  if (optimizer_is_bitsandbytes(p.optimizer) && p.fsdp_version == FsdpVersion::FSDP2)
    return "bitsandbytes' optimizers over FSDP2's DTensor parameters are not modelled: use fsdp_version 1, or "
           "torchao_adamw8bit / torchao_adamw4bit (torchao's low-bit AdamWs step DTensors' local shards)";
  return "";
}

OptimizerStateBytes optimizer_state_bytes(Optimizer o, std::int64_t n, Bytes param_bytes) {
  OptimizerStateBytes s;
  if (n <= 0) return s;
  switch (o) {
    case Optimizer::AdamW:
    case Optimizer::SGD: s.values = n * param_bytes; break;
    case Optimizer::BnbAdamW8bit:
    case Optimizer::BnbPagedAdamW8bit:
    case Optimizer::BnbPagedAdamW: {
      const bool eight = o != Optimizer::BnbPagedAdamW && n >= kBnbMin8bitSize;
      const Bytes values = eight ? n : n * 4;   // uint8 codes, else float32
      if (optimizer_is_paged(o) && n >= kBnbPagedMinNumel) s.paged = values;
      else s.values = values;
      if (eight) s.scales = (n + kBnbBlock - 1) / kBnbBlock * 4;   // absmax: one float32 per block, the last partial
      break;
    }
    case Optimizer::TorchaoAdamW8bit:
    case Optimizer::TorchaoAdamW4bit: {
      const bool four = o == Optimizer::TorchaoAdamW4bit;
      const std::int64_t block = four ? kTorchao4bitBlock : kTorchao8bitBlock;
      if (n >= kTorchaoMinNumel && n % block == 0) {
        s.values = four ? n / 2 : n;
        s.scales = n / block * 4 + (four ? 16 : 256) * 4;   // the scales and the qmap
      } else {
        s.values = n * param_bytes;   // zeros_like(local_p)
      }
      break;
    }
  }
  return s;
}

Bytes optimizer_step_bytes(Optimizer o, std::int64_t n, Bytes param_bytes) {
  if (n <= 0) return 0;
  return 3 * n * param_bytes + 2 * optimizer_state_count(o) * optimizer_state_bytes(o, n, param_bytes).total();
}

Bytes optimizer_state_lower_bound(Optimizer o, std::int64_t n, Bytes param_bytes) {
  if (n <= 0) return 0;
  switch (o) {
    case Optimizer::AdamW:
    case Optimizer::SGD: return n * param_bytes;
    case Optimizer::BnbAdamW8bit: return n;   // at least a code byte per element
    case Optimizer::BnbPagedAdamW:
    case Optimizer::BnbPagedAdamW8bit: return 0;   // a large tensor's values are paged
    case Optimizer::TorchaoAdamW8bit: return n * std::min<Bytes>(1, param_bytes);
    case Optimizer::TorchaoAdamW4bit: return n / 2;
  }
  return 0;
}

}  // namespace fsdpsim::sim

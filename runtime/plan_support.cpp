#include "runtime/plan_support.h"

#include <string>

#include "common/errors.h"

namespace fsdpsim::runtime {

void check_plan_supported(const sim::Plan& plan, RuntimeBackend backend) {
  const bool cpu = backend == RuntimeBackend::Cpu;
  const std::string on = cpu ? " on the CPU runtime" : " on the CUDA runtime";
  // Dtypes: the CPU runtime is fp32 throughout; the CUDA runtime computes in bf16 (fp32 accumulation) and
  // keeps fp32 master weights.
  if (cpu) {
    const std::string fp32 = "fp32 (the CPU runtime computes, communicates and keeps master weights in fp32)";
    if (plan.param_dtype != Dtype::FP32) throw InputError("plan.param_dtype", std::string(dtype_name(plan.param_dtype)), fp32);
    if (plan.reduce_dtype != Dtype::FP32) throw InputError("plan.reduce_dtype", std::string(dtype_name(plan.reduce_dtype)), fp32);
    if (plan.master_weights_dtype != Dtype::FP32)
      throw InputError("plan.master_weights_dtype", std::string(dtype_name(plan.master_weights_dtype)), fp32);
  } else {
    if (plan.param_dtype != Dtype::BF16)
      throw InputError("plan.param_dtype", std::string(dtype_name(plan.param_dtype)),
                       "bf16 (the CUDA runtime computes in bf16 with fp32 accumulation)");
    if (plan.reduce_dtype != Dtype::FP32 && plan.reduce_dtype != Dtype::BF16)
      throw InputError("plan.reduce_dtype", std::string(dtype_name(plan.reduce_dtype)), "fp32 or bf16" + on);
    if (plan.master_weights_dtype != Dtype::FP32)
      throw InputError("plan.master_weights_dtype", std::string(dtype_name(plan.master_weights_dtype)), "fp32" + on);
  }
  if (plan.cpu_offload.params || plan.cpu_offload.optimizer)
    throw InputError("plan.cpu_offload", "true",
                     cpu ? "false: the CPU runtime has no separate device memory to offload from"
                         : "false: CPU offload is not implemented in the CUDA runtime");
  if (plan.fp8_all_gather) throw InputError("plan.fp8_all_gather", "true", "false" + on);
  if (plan.float8 != models::Float8Recipe::None)
    throw InputError("plan.float8", "\"" + models::float8_recipe_name(plan.float8) + "\"",
                     "\"none\"" + on + " (its GEMMs run in " + (cpu ? "fp32" : "bf16") + ", not torchao's float8)");
  if (plan.compile)
    throw InputError("plan.compile", "true",
                     "false" + on + " (it runs its own eager kernels: a compiled step's fused kernels and saved tensors "
                     "have no counterpart in what it measures)");
  if (plan.trainable_fraction < 1.0)
    throw InputError("plan.trainable_fraction", std::to_string(plan.trainable_fraction), "1" + on + " (all parameters train)");
  if (plan.lora.on())
    throw InputError("plan.lora", "{\"rank\": " + std::to_string(plan.lora.rank) + ", ...}",
                     "no lora" + on + " (its blocks have no adapters)");
  if (plan.reshard_after_forward.is_group())
    throw InputError("plan.reshard_after_forward", plan.reshard_after_forward.text(),
                     "true or false" + on + " (an int reshards to a sub-group not implemented here)");
  if (plan.activation_checkpointing.mode == sim::ActivationCheckpointing::Mode::SelectiveOp)
    throw InputError("plan.activation_checkpointing", "selective_op", "none, full or every_k" + on);
  if (plan.cross_entropy != models::LossImpl::Torch)
    throw InputError("plan.cross_entropy", "\"" + models::loss_impl_name(plan.cross_entropy) + "\"",
                     "\"torch\"" + on + " (its loss buffer holds the logits and an fp32 log-softmax, as F.cross_entropy does)");
}

}  // namespace fsdpsim::runtime

#include "runtime/cuda/cuda_rank_runner.h"

#include <string>

#include "common/errors.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/kernels.h"
#include "runtime/model/dims.h"
#include "runtime/plan_support.h"

namespace fsdpsim::runtime::cuda {

void check_cuda_runtime_supports(const models::ModelSpec& m, const sim::Plan& plan) {
  check_plan_supported(plan, RuntimeBackend::Cuda);
  const Dims d = runtime_dims(m, plan.micro_batch, plan.seq_len);
  if (d.C % 2 != 0)   // the fp32 statistics follow the bf16 block input in the activation buffer
    throw InputError("model.hidden", std::to_string(d.C), "an even number on the CUDA runtime");
  if (!attention_supports_head_dim(d.HD))
    throw InputError("model.head_dim", std::to_string(d.HD), "16, 32, 64 or 128 (the CUDA attention kernels' sizes)");
}

CudaRankRunner::CudaRankRunner(const RunConfig& cfg, DeviceCommunicator& comm)
    : Runner(cfg, comm, std::make_unique<CudaDevice>(comm)) {}

void CudaRankRunner::pad_collectives(std::vector<TimeNs> per_op_ns) {
  static_cast<CudaDevice&>(device()).pad_collectives(std::move(per_op_ns), program().ops.size());
}

nlohmann::json CudaRankRunner::device_memory() const { return static_cast<const CudaDevice&>(device()).device_memory(); }

}  // namespace fsdpsim::runtime::cuda

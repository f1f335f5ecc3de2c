// Host memory of CPU offload, and the node's host RAM check (sim/host_memory.h).
#include "sim/host_memory.h"

#include <bit>
#include <cstdint>
#include <cstdio>

#include "program/lower_context.h"
#include "program/optimizer_state.h"

namespace fsdpsim::sim {
namespace {

// CachingHostAllocator block size for a pinned request of `bytes` (PowerOf2Ceil, see the header).
Bytes pinned_block(Bytes bytes) {
  if (bytes <= 0) return 0;
  return static_cast<Bytes>(std::bit_ceil(static_cast<std::uint64_t>(bytes)));
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

std::string gib(Bytes b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", to_gib(b));
  return buf;
}

// FSDP2: the pinned padded chunk of every parameter and the pinned gradient of every trainable one
// (models/trainable.h; a unit known by its count alone: the trainable fraction of its chunk's block).
Bytes fsdp2_pinned(const models::FsdpUnit& u, int N, Bytes bm, const models::TrainableSet& ts, double unit_fraction) {
  Bytes params = 0, grads = 0;
  const bool frozen = unit_fraction <= 0.0;   // plan.frozen_units
  if (u.tensors.empty()) {
    if (u.params > 0) {
      params = pinned_block(ceil_div(u.params, N) * bm);   // one flat tensor: dim0 = numel
      grads = frozen ? 0 : ts.all ? params : static_cast<Bytes>(static_cast<double>(params) * unit_fraction);
    }
  } else {
    for (const auto& t : u.tensors) {
      const std::int64_t dim0 = t.shape.empty() ? 1 : t.shape[0];
      if (dim0 <= 0) continue;
      std::int64_t rest = 1;
      for (std::size_t i = 1; i < t.shape.size(); ++i) rest *= t.shape[i];
      const Bytes block = pinned_block(ceil_div(dim0, N) * rest * bm);   // M6: every rank holds chunks[0]'s size
      params += block;
      if (!frozen && models::tensor_trains(ts, t.name)) grads += block;              // gradients have the chunks' sizes
    }
  }
  return params + grads;
}

}  // namespace

HostMemory host_memory(const models::WrapGraph& graph, const Plan& rp, int gpus_per_node,
                       const models::TrainableSet& ts) {
  HostMemory h;
  h.ranks_per_node = gpus_per_node > 0 ? gpus_per_node : 1;
  if (!rp.cpu_offload.params && !rp.cpu_offload.optimizer) return h;
  const int N = rp.mesh_shard > 0 ? rp.mesh_shard : 1;
  const Bytes bm = dtype_bytes(rp.master_weights_dtype);
  const int states = optimizer_state_count(rp.optimizer);   // exp_avg + exp_avg_sq; SGD momentum
  const bool fsdp1 = rp.fsdp_version == FsdpVersion::FSDP1;
  const std::vector<double> fractions = lowering::unit_trainable_fractions(graph, rp);
  for (std::size_t i = 0; i < graph.units.size(); ++i) {
    const models::FsdpUnit& u = graph.units[i];
    if (u.params == 0) continue;
    const double f = fractions[i];
    const lowering::UnitSizes s =
        fsdp1 ? lowering::fsdp1_unit_sizes(u, N, rp.master_weights_dtype, rp.use_orig_params, ts, f)
              : lowering::fsdp2_unit_sizes(u, N, ts, f);
    h.pageable_per_rank += s.optim * states * bm;
    if (!rp.cpu_offload.params) {
      h.pageable_per_rank += (s.optim + s.shard) * bm;   // the grads copied down and the params to step
    } else if (fsdp1) {
      h.pinned_per_rank += 2 * pinned_block(s.shard * bm);   // _local_shard and _cpu_grad
    } else {
      h.pinned_per_rank += fsdp2_pinned(u, N, bm, ts, f);
    }
  }
  return h;
}

void apply_host_memory(const HostMemory& h, const calibrate::HardwareProfile& hw, const Plan& rp, SimResult& r) {
  r.host_memory_per_node = h.per_node();
  r.host_capacity_per_node = hw.host_memory_per_node();
  const bool activations = rp.activation_offloading != ActivationOffload::None;
  if (!rp.cpu_offload.params && !rp.cpu_offload.optimizer && !activations) return;
  const std::string node = "each node of " + hw.cluster().name + " (" + std::to_string(h.ranks_per_node) + " ranks)";
  const Bytes per_rank = h.pinned_per_rank + h.pageable_per_rank;
  char bw[32];
  std::snprintf(bw, sizeof bw, "%.1f", hw.cpu_optimizer_bytes_per_s() / 1e9);
  if (activations)
    r.notes.push_back("activation offloading: the copies of one micro-batch's forward (each checkpointed block's input "
                      "and rotary tables, every saved tensor of a block without checkpointing, and the loss's tensors "
                      "when the model's forward computes the loss; the final norm's few are left out), pinned in "
                      "power-of-two blocks, count in the host memory per node (" +
                      gib(r.host_memory_per_node) +
                      " GiB, " + std::to_string(h.ranks_per_node) + " ranks x " + gib(per_rank) + " GiB)");
  if (rp.cpu_offload.params || rp.cpu_offload.optimizer) {
    r.notes.push_back("CPU offload: host memory per node " + gib(r.host_memory_per_node) + " GiB (" +
                      std::to_string(h.ranks_per_node) + " ranks x " + gib(per_rank) + " GiB, of which " +
                      gib(h.pinned_per_rank) + " GiB pinned in power-of-two blocks); the CPU optimizer step moves " +
                      std::to_string(calibrate::kCpuAdamBytesPerParam) + " B per parameter (one fused AdamW pass) at " +
                      bw + " GB/s per rank, the node's host memory bandwidth shared by its ranks (PyTorch's default "
                      "for-loop AdamW on CPU makes several passes and is slower)");
  }
  if (r.host_capacity_per_node <= 0) {
    r.notes.push_back("host memory not checked: the profile gives no host memory per node (set host_memory_gib "
                      "in the cluster file)");
    return;
  }
  if (r.host_memory_per_node > r.host_capacity_per_node) {
    r.fits = false;
    r.notes.push_back("does not fit: host memory per node " + gib(r.host_memory_per_node) + " GiB > " +
                      gib(r.host_capacity_per_node) + " GiB host RAM of " + node +
                      " (what every rank of the node offloads: params, grads, optimizer states, activations)");
  }
}

Bytes offloaded_activations_pinned(const models::ModelSpec& m, const Plan& rp) {
  if (rp.activation_offloading == ActivationOffload::None) return 0;
  const lowering::LossMemory loss = lowering::loss_memory(m, rp);
  const lowering::OffloadPacks packs = lowering::offload_packs(m, rp, loss);
  const Bytes input = pinned_block(rp.micro_batch * rp.seq_len * m.hidden * dtype_bytes(rp.param_dtype)) +
                      packs.rope_copied * pinned_block(packs.rope_bytes);
  Bytes pinned = packs.loss ? 2 * pinned_block(loss.saved) + pinned_block(packs.loss_target) : 0;
  for (int l = 0; l < m.n_layers; ++l) {
    // a checkpointed block's input and tables; a block without checkpointing every tensor it saves (their sum,
    // models::block_saved_activation_bytes: the per-tensor power-of-two rounding left out)
    const models::CheckpointMode mode = lowering::layer_checkpoint_mode(rp.activation_checkpointing, l);
    pinned += mode == models::CheckpointMode::None
                  ? models::block_saved_activation_bytes(m, rp.micro_batch, rp.seq_len, rp.param_dtype, mode)
                  : input;
  }
  return pinned;
}

Bytes paged_optimizer_bytes(const models::WrapGraph& graph, const Plan& rp, const models::TrainableSet& ts) {
  if (!optimizer_is_paged(rp.optimizer) || rp.cpu_offload.params || rp.cpu_offload.optimizer) return 0;
  const int N = rp.mesh_shard > 0 ? rp.mesh_shard : 1;
  const Bytes bm = dtype_bytes(rp.master_weights_dtype);
  const bool fsdp1 = rp.fsdp_version == FsdpVersion::FSDP1;
  const std::vector<double> fractions = lowering::unit_trainable_fractions(graph, rp);
  Bytes paged = 0;
  for (std::size_t i = 0; i < graph.units.size(); ++i) {
    const models::FsdpUnit& u = graph.units[i];
    if (u.params == 0) continue;
    const lowering::UnitSizes s = fsdp1 ? lowering::fsdp1_unit_sizes(u, N, rp.master_weights_dtype, rp.use_orig_params, ts, fractions[i])
                                        : lowering::fsdp2_unit_sizes(u, N, ts, fractions[i]);
    for (std::int64_t n : lowering::optimizer_state_tensors(u, rp, N, ts, s.optim))
      paged += optimizer_state_count(rp.optimizer) * optimizer_state_bytes(rp.optimizer, n, bm).paged;
  }
  return paged;
}

}  // namespace fsdpsim::sim

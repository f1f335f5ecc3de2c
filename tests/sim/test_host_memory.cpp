// Host memory of CPU offload (sim/host_memory.h, issue 20 item 3): exact bytes on a hand-built wrap
// graph, and a plan that needs more host RAM than a node has does not fit, with a note naming it.
#include <gtest/gtest.h>

#include <string>

#include "calibrate/hardware_profile.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "sim/host_memory.h"
#include "sim/simulator.h"

namespace fsdpsim::sim {
namespace {

// Two units: the root holds an embedding [10, 4] (40 params); a block holds a weight [6, 3] and a
// bias [5] (23 params).
models::WrapGraph tiny_graph() {
  models::WrapGraph g;
  models::FsdpUnit root;
  root.id = 0;
  root.is_root = true;
  root.params = 40;
  root.tensors = {{"embed.weight", {10, 4}}};
  models::FsdpUnit block;
  block.id = 1;
  block.params = 23;
  block.tensors = {{"block.weight", {6, 3}}, {"block.bias", {5}}};
  g.units = {root, block};
  g.total_params = 63;
  return g;
}

Plan offload_plan(FsdpVersion v, int shard) {
  Plan p;
  p.fsdp_version = v;
  p.mesh_replicate = 1;
  p.mesh_shard = shard;
  p.cpu_offload.params = p.cpu_offload.optimizer = true;   // fp32 master weights, AdamW (2 states)
  return p;
}

TEST(HostMemory, Fsdp2PinnedChunksAndGradsInPowerOfTwoBlocks) {
  // FSDP2, shard 4, fp32: each parameter's padded chunk, ceil(dim0 / 4) rows, pinned, and its grad too.
  //   embed [10, 4]: 3 rows x 4 = 12 numel = 48 B -> 64 B block; its grad another 64
  //   weight [6, 3]: 2 rows x 3 = 6 numel = 24 B -> 32; grad 32
  //   bias [5]:      2 rows     = 2 numel =  8 B ->  8; grad 8
  //   pinned = 2 x (64 + 32 + 8) = 208 B
  //   optimizer states (pageable): (12 + 6 + 2) numel x 2 states x 4 B = 160 B
  const HostMemory h = host_memory(tiny_graph(), offload_plan(FsdpVersion::FSDP2, 4), 8);
  EXPECT_EQ(h.pinned_per_rank, 208);
  EXPECT_EQ(h.pageable_per_rank, 160);
  EXPECT_EQ(h.ranks_per_node, 8);
  EXPECT_EQ(h.per_node(), 8 * 368);
}

TEST(HostMemory, Fsdp1PinnedFlatShardAndCpuGrad) {
  // FSDP1, use_orig_params (16-byte alignment = 4 fp32 elements, flat param padded to a multiple of 4):
  //   root:  40 numel -> shard 10 = 40 B -> 64 B block, twice (_local_shard and _cpu_grad) = 128
  //   block: 18, aligned to 20, + 5 = 25, padded to 28 -> shard 7 = 28 B -> 32, twice = 64
  //   pinned = 192 B; optimizer states: (ceil(40/4) + ceil(23/4)) = 16 numel x 2 x 4 B = 128 B
  const HostMemory h = host_memory(tiny_graph(), offload_plan(FsdpVersion::FSDP1, 4), 8);
  EXPECT_EQ(h.pinned_per_rank, 192);
  EXPECT_EQ(h.pageable_per_rank, 128);
}

TEST(HostMemory, OptimizerOnlyOffloadAndNoOffload) {
  // Optimizer-only offload (not a PyTorch FSDP option), FSDP2 shard 4: unrounded grads (20 numel),
  // params (20 numel) and states (20 x 2): (20 + 20 + 40) x 4 B = 320 B, nothing pinned.
  Plan p = offload_plan(FsdpVersion::FSDP2, 4);
  p.cpu_offload.params = false;
  const HostMemory h = host_memory(tiny_graph(), p, 8);
  EXPECT_EQ(h.pinned_per_rank, 0);
  EXPECT_EQ(h.pageable_per_rank, 320);
  // SGD keeps one state: (20 + 20 + 20) x 4 B.
  p.optimizer = Optimizer::SGD;
  EXPECT_EQ(host_memory(tiny_graph(), p, 8).pageable_per_rank, 240);
  // Without offload nothing of FSDP's lives on the host.
  p.cpu_offload = {};
  EXPECT_EQ(host_memory(tiny_graph(), p, 8).per_node(), 0);
}

calibrate::HardwareProfile h100_node(double host_gib) {
  nlohmann::json c = {{"name", "8xH100-SXM-small-host"}, {"nodes", 1}, {"gpus_per_node", 8}, {"gpu", "H100-SXM"}};
  if (host_gib > 0) c["host_memory_gib"] = host_gib;
  return calibrate::HardwareProfile::for_cluster(calibrate::cluster_from_json(c, "test"));
}

// torchtune's activation offloading, by hand on llama-1b (16 layers, hidden 2048, head_dim 64, vocab 128256), micro-batch
// 2 x 1024 tokens in bf16: a checkpointed layer pins its input (2 x 1024 x 2048 x 2 B = 8 MiB, a power of two) and HF's
// cos and sin (1024 x 64 x 2 B = 128 KiB each); HF's loss in the forward adds the fp32 log-probabilities twice
// (2048 x 128256 x 4 B = 1002 MiB -> 1 GiB blocks) and the target (2048 x 8 B = 16 KiB); the loss outside (false) does
// not; a layer without checkpointing pins what it saves (block_saved_activation_bytes, unrounded).
TEST(HostMemory, ActivationOffloadingPinsWhatTheForwardPacks) {
  const auto m = models::load_model("llama-1b");
  Plan p;
  p.implementation = models::ModelImpl::HF;
  p.micro_batch = 2;
  p.seq_len = 1024;
  p.param_dtype = Dtype::BF16;
  p.activation_checkpointing.mode = ActivationCheckpointing::Mode::Full;
  p.activation_offloading = ActivationOffload::Streams;
  const Bytes layer = (8 << 20) + 2 * (128 << 10);
  const Bytes loss = 2 * kGiB + (16 << 10);
  EXPECT_EQ(offloaded_activations_pinned(m, p), 16 * layer + loss);
  p.loss_in_model_forward = false;
  EXPECT_EQ(offloaded_activations_pinned(m, p), 16 * layer);
  p.activation_checkpointing.mode = ActivationCheckpointing::Mode::None;
  const Bytes saved = models::block_saved_activation_bytes(m, 2, 1024, Dtype::BF16, models::CheckpointMode::None);
  EXPECT_GT(saved, layer);
  EXPECT_EQ(offloaded_activations_pinned(m, p), 16 * saved);
  p.activation_offloading = ActivationOffload::None;
  EXPECT_EQ(offloaded_activations_pinned(m, p), 0);
}

TEST(HostMemory, OverflowingHostRamDoesNotFitAndSaysSo) {
  // llama2-7b, FSDP2 FULL_SHARD over 8 H100s with CPU offload: ~16 B per parameter on the host (fp32
  // params, grads, two AdamW states), ~108 GiB per node: fits the DGX H100's 2 TiB, not a 64 GiB host.
  const auto model = models::load_model("llama2-7b");
  Plan plan;
  plan.cpu_offload.params = plan.cpu_offload.optimizer = true;
  SimOptions o;
  o.record_trace = false;
  const SimResult big = simulate(model, h100_node(0), plan, o);
  EXPECT_TRUE(big.fits);
  EXPECT_EQ(big.host_capacity_per_node, 2048 * kGiB);
  EXPECT_GT(big.host_memory_per_node, 16LL * 6'700'000'000LL);   // at least 16 B x 6.7e9 params
  EXPECT_LT(big.host_memory_per_node, 2 * 16LL * 6'800'000'000LL);  // power-of-two blocks at most double the pinned part

  const SimResult small = simulate(model, h100_node(64), plan, o);
  EXPECT_FALSE(small.fits);
  EXPECT_EQ(small.host_capacity_per_node, 64 * kGiB);
  EXPECT_EQ(small.host_memory_per_node, big.host_memory_per_node);
  EXPECT_EQ(small.peak_total_device, big.peak_total_device);   // the GPU side is the same and fits
  EXPECT_LE(small.peak_total_device, small.capacity);
  std::string note;
  for (const auto& n : small.notes)
    if (n.rfind("does not fit: host memory", 0) == 0) note = n;
  ASSERT_FALSE(note.empty());
  char need[32];
  std::snprintf(need, sizeof need, "%.2f GiB", to_gib(small.host_memory_per_node));
  EXPECT_NE(note.find(need), std::string::npos) << note;
  EXPECT_NE(note.find("64.00 GiB host RAM"), std::string::npos) << note;
  EXPECT_NE(note.find("each node of 8xH100-SXM-small-host (8 ranks)"), std::string::npos) << note;
  // The JSON result carries both figures.
  const auto j = sim_result_to_json(small);
  EXPECT_EQ(j.at("host_memory_per_node_bytes"), small.host_memory_per_node);
  EXPECT_EQ(j.at("host_capacity_per_node_bytes"), 64 * kGiB);
  EXPECT_EQ(j.at("fits"), false);
}

}  // namespace
}  // namespace fsdpsim::sim

# fsdpsim export: PyTorch Lightning, target Lightning >= 2.4 (lightning.pytorch ModelParallelStrategy + fully_shard in configure_model, FSDP2; torch >= 2.6)
# plan: FSDP2 HYBRID_SHARD mesh(2,16) rAF=8 prefetch=2 AC=selective_op mb=4 ga=1 offload fp8-ag
import torch
import lightning as L
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torchao.float8 import Float8LinearConfig, convert_to_float8_training


class LitModel(L.LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model  # your mistral-7b module

    def configure_model(self):
        dp_mesh = self.device_mesh["data_parallel"]
        # float8 training (torchao Float8Linear), converted before sharding; the LM head stays bf16
        convert_to_float8_training(self.model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True), module_filter_fn=lambda mod, fqn: not fqn.endswith("lm_head"))
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        fsdp_kwargs = dict(mesh=dp_mesh, mp_policy=mp_policy, offload_policy=CPUOffloadPolicy())
        blocks = self.model.model.layers  # the MistralDecoderLayer modules
        for i, block in enumerate(blocks):
            # selective (op-level) activation checkpointing: wrap `block` with torchtitan's op-SAC policy here
            fully_shard(block, reshard_after_forward=8, **fsdp_kwargs)
        fully_shard(self.model, **fsdp_kwargs)  # root (embedding, final norm, LM head): kept unsharded after forward
        # explicit prefetch, 2 blocks ahead (more overlap, more reserved memory)
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(list(blocks[i + 1:i + 3]))
            block.set_modules_to_backward_prefetch(list(reversed(blocks[max(0, i - 2):i])))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4)  # your learning rate


strategy = ModelParallelStrategy(data_parallel_size=32, tensor_parallel_size=1)
trainer = L.Trainer(
    accelerator="cuda",
    num_nodes=4,
    devices=8,
    strategy=strategy,
    accumulate_grad_batches=1,
)
# DataLoader(batch_size=4): the micro-batch per GPU, sequences of 2048 tokens
# not expressible here: mesh (2, 16): ModelParallelStrategy has no replicate (HSDP) dimension (Lightning-AI/pytorch-lightning#21059); this export shards over all 32 GPUs - use the raw FSDP2 export for HSDP
# not expressible here: activation_checkpointing=selective_op: raw PyTorch needs a selective-checkpoint policy (torch.utils.checkpoint.create_selective_checkpoint_contexts, as torchtitan's op SAC); not reproduced here

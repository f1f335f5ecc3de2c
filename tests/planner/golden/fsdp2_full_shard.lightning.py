# fsdpsim export: PyTorch Lightning, target Lightning >= 2.4 (lightning.pytorch ModelParallelStrategy + fully_shard in configure_model, FSDP2; torch >= 2.6)
# plan: FSDP2 FULL_SHARD mesh(1,8) rAF=true AC=full mb=2 ga=4 no_sync bf16
import torch
import lightning as L
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper


class LitModel(L.LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model  # your llama3-8b module

    def configure_model(self):
        dp_mesh = self.device_mesh["data_parallel"]
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        fsdp_kwargs = dict(mesh=dp_mesh, mp_policy=mp_policy, offload_policy=OffloadPolicy())
        blocks = self.model.model.layers  # the LlamaDecoderLayer modules
        for i, block in enumerate(blocks):
            blocks[i] = block = checkpoint_wrapper(block)  # activation checkpointing: FSDP(AC(block))
            fully_shard(block, reshard_after_forward=True, **fsdp_kwargs)
        fully_shard(self.model, **fsdp_kwargs)  # root (embedding, final norm, LM head): kept unsharded after forward

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4)  # your learning rate


strategy = ModelParallelStrategy(data_parallel_size=8, tensor_parallel_size=1)
trainer = L.Trainer(
    accelerator="cuda",
    num_nodes=1,
    devices=8,
    strategy=strategy,
    accumulate_grad_batches=4,
)
# DataLoader(batch_size=2): the micro-batch per GPU, sequences of 8192 tokens
# not expressible here: grad_sync=false (no_sync while accumulating): the Trainer reduces every micro-batch under ModelParallelStrategy; call self.model.set_requires_gradient_sync(is_last) in a manual-optimization loop

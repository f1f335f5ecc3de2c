# fsdpsim export: PyTorch Lightning, target Lightning >= 2.6 (lightning.pytorch FSDPStrategy, FSDP1; device_mesh needs torch >= 2.2)
# plan: FSDP1 HYBRID_SHARD mesh(2,8) BACKWARD_POST forward_prefetch AC=every_2 mb=1 ga=8 sync bf16-true
import torch
import lightning as L
from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.fsdp import BackwardPrefetch
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

strategy = FSDPStrategy(
    sharding_strategy="HYBRID_SHARD",
    device_mesh=(2, 8),  # (replicate, shard)
    auto_wrap_policy={LlamaDecoderLayer},
    activation_checkpointing_policy={LlamaDecoderLayer},
    cpu_offload=False,
    backward_prefetch=BackwardPrefetch.BACKWARD_POST,  # forwarded to FullyShardedDataParallel
    forward_prefetch=True,
    limit_all_gathers=True,
    use_orig_params=True,
    state_dict_type="sharded",
)


class LitModel(L.LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model  # your llama3-70b module

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4)  # your learning rate

trainer = L.Trainer(
    accelerator="cuda",
    num_nodes=2,
    devices=8,
    strategy=strategy,
    precision="bf16-true",
    accumulate_grad_batches=8,
)
# DataLoader(batch_size=1): the micro-batch per GPU, sequences of 4096 tokens
# not expressible here: activation_checkpointing=every_2: activation_checkpointing_policy={LlamaDecoderLayer} checkpoints every block; emitted as full checkpointing (less memory, slower than planned)
# not expressible here: grad_sync=true (reduce every micro-batch): the Trainer accumulates inside FSDP's no_sync(); reducing every micro-batch needs a Fabric loop without no_backward_sync

# fsdpsim export: PyTorch Lightning, target Lightning >= 2.4 (lightning.pytorch ModelParallelStrategy + fully_shard in configure_model, FSDP2; torch >= 2.6)
# plan: FSDP2 FULL_SHARD mesh(1,8) rAF=true AC=none mb=2 ga=1 fp8-ag
import torch
import lightning as L
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torchao.float8 import Float8LinearConfig, convert_to_float8_training


class LitModel(L.LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model  # your llama3-8b module

    def configure_model(self):
        dp_mesh = self.device_mesh["data_parallel"]
        # float8 training (torchao Float8Linear), converted before sharding; the LM head stays bf16
        convert_to_float8_training(self.model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True), module_filter_fn=lambda mod, fqn: not fqn.endswith("lm_head"))
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        fsdp_kwargs = dict(mesh=dp_mesh, mp_policy=mp_policy, offload_policy=OffloadPolicy())
        blocks = self.model.model.layers  # the LlamaDecoderLayer modules
        for i, block in enumerate(blocks):
            block.compile()  # torch.compile (inductor) of each block, as torchtitan does
            fully_shard(block, reshard_after_forward={31: False}.get(i, True), **fsdp_kwargs)
        fully_shard(self.model, **fsdp_kwargs)  # root (embedding, final norm, LM head): kept unsharded after forward

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4, fused=True)  # your learning rate


strategy = ModelParallelStrategy(data_parallel_size=8, tensor_parallel_size=1)
trainer = L.Trainer(
    accelerator="cuda",
    num_nodes=1,
    devices=8,
    strategy=strategy,
    accumulate_grad_batches=1,
)
# DataLoader(batch_size=2): the micro-batch per GPU, sequences of 8192 tokens
# launch with PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True" in the environment

# Lightning with "16-mixed": fp32 sharded params, grads and Adam state + fp16 compute (K1).
# fsdpsim: micro_batch=1 seq_len=2048
from lightning.pytorch.strategies import FSDPStrategy
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
from torch.distributed.fsdp import BackwardPrefetch

strategy = FSDPStrategy(
    auto_wrap_policy={LlamaDecoderLayer},
    activation_checkpointing_policy={LlamaDecoderLayer},
    backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
    cpu_offload=False,
)
trainer = Trainer(devices=2, strategy=strategy, precision="16-mixed", accumulate_grad_batches=4)

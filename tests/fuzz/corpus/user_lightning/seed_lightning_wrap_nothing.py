# A Lightning script whose wrap policy names a class the model does not have (LitGPT's `Block`
# on a Hugging Face Llama): FSDP wraps nothing and all-gathers the whole model at once.
# fsdpsim: seq_len=2048
import lightning as L
from lightning.pytorch.strategies import FSDPStrategy
from litgpt.model import Block

strategy = FSDPStrategy(
    sharding_strategy="FULL_SHARD",
    auto_wrap_policy={Block},
    activation_checkpointing_policy={Block},
    state_dict_type="full",
    limit_all_gathers=True,
)
trainer = L.Trainer(accelerator="cuda", devices=8, num_nodes=1, strategy=strategy, precision="bf16-mixed")
loader = DataLoader(dataset, batch_size=1)

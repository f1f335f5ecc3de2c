import lightning as L
from lightning.pytorch.strategies import FSDPStrategy
from bitsandbytes.optim import (PagedAdamW8bit,
)
strategy = FSDPStrategy(auto_wrap_policy={Block})
trainer = L.Trainer(strategy=strategy)
args = dict(optim="adamw_torch_4bit")

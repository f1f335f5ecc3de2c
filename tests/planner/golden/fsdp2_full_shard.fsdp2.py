# fsdpsim export: raw FSDP2 (fully_shard), target PyTorch >= 2.6 (torch.distributed.fsdp.fully_shard)
# plan: FSDP2 FULL_SHARD mesh(1,8) rAF=true AC=full mb=2 ga=4 no_sync bf16
# launch: torchrun --nnodes 1 --nproc_per_node 8 train.py
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

MICRO_BATCH = 2  # sequences per GPU per micro-batch
GRAD_ACCUM = 4  # micro-batches per optimizer step
SEQ_LEN = 8192

model = build_model()  # your llama3-8b module (e.g. on the meta device)
mesh = init_device_mesh("cuda", (8,), mesh_dim_names=("dp_shard",))
mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
fsdp_kwargs = dict(mesh=mesh, mp_policy=mp_policy, offload_policy=OffloadPolicy())
blocks = model.model.layers  # the LlamaDecoderLayer modules
for i, block in enumerate(blocks):
    blocks[i] = block = checkpoint_wrapper(block)  # activation checkpointing: FSDP(AC(block))
    fully_shard(block, reshard_after_forward=True, **fsdp_kwargs)
fully_shard(model, **fsdp_kwargs)  # root (embedding, final norm, LM head): kept unsharded after forward

# training step: 4 micro-batch(es) of 2 sequence(s) x 8192 tokens per GPU
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)  # your learning rate
for micro_batches in loader:  # lists of GRAD_ACCUM micro-batches
    for k, batch in enumerate(micro_batches):
        model.set_requires_gradient_sync(k == GRAD_ACCUM - 1)  # no_sync until the last micro-batch
        loss = model(**batch).loss / GRAD_ACCUM
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()

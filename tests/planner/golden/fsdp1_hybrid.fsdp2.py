# fsdpsim export: raw FSDP2 (fully_shard), target PyTorch >= 2.6 (torch.distributed.fsdp.fully_shard)
# plan: FSDP1 HYBRID_SHARD mesh(2,8) BACKWARD_POST forward_prefetch AC=every_2 mb=1 ga=8 sync bf16-true
# launch: torchrun --nnodes 2 --nproc_per_node 8 train.py
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

MICRO_BATCH = 1  # sequences per GPU per micro-batch
GRAD_ACCUM = 8  # micro-batches per optimizer step
SEQ_LEN = 4096

model = build_model()  # your llama3-70b module (e.g. on the meta device)
mesh = init_device_mesh("cuda", (2, 8), mesh_dim_names=("dp_replicate", "dp_shard"))  # (replicate, shard): HSDP
# pure bf16 training: no fp32 master copy (master_weights_dtype == param_dtype)
model.to(torch.bfloat16)
mp_policy = MixedPrecisionPolicy()
fsdp_kwargs = dict(mesh=mesh, mp_policy=mp_policy, offload_policy=OffloadPolicy())
blocks = model.model.layers  # the LlamaDecoderLayer modules
for i, block in enumerate(blocks):
    if i % 2 == 0:  # activation checkpointing on one block in 2: FSDP(AC(block))
        blocks[i] = block = checkpoint_wrapper(block)
    fully_shard(block, reshard_after_forward=True, **fsdp_kwargs)
fully_shard(model, **fsdp_kwargs)  # root (embedding, final norm, LM head): kept unsharded after forward
for i, block in enumerate(blocks):  # forward_prefetch: the next block, issued early
    block.set_modules_to_forward_prefetch(list(blocks[i + 1:i + 2]))

# training step: 8 micro-batch(es) of 1 sequence(s) x 4096 tokens per GPU
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)  # your learning rate
for micro_batches in loader:  # lists of GRAD_ACCUM micro-batches
    for k, batch in enumerate(micro_batches):
        # reduce-scatter after every micro-batch (the default; less memory than no_sync)
        loss = model(**batch).loss / GRAD_ACCUM
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
# not expressible here: fsdp_version=1: the plan was simulated with FSDP1 semantics; this is its FSDP2 translation (sharding_strategy HYBRID_SHARD -> mesh + reshard_after_forward)
# not expressible here: backward_prefetch=BACKWARD_POST: FSDP2 always prefetches one group ahead in backward (like BACKWARD_PRE)
# not expressible here: forward_prefetch=True: FSDP2 prefetches the next group implicitly; explicit lists are set_modules_to_forward_prefetch

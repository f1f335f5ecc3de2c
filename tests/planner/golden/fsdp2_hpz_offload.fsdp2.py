# fsdpsim export: raw FSDP2 (fully_shard), target PyTorch >= 2.6 (torch.distributed.fsdp.fully_shard)
# plan: FSDP2 HYBRID_SHARD mesh(2,16) rAF=8 prefetch=2 AC=selective_op mb=4 ga=1 offload fp8-ag
# launch: torchrun --nnodes 4 --nproc_per_node 8 train.py
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torchao.float8 import Float8LinearConfig, convert_to_float8_training

MICRO_BATCH = 4  # sequences per GPU per micro-batch
GRAD_ACCUM = 1  # micro-batches per optimizer step
SEQ_LEN = 2048

model = build_model()  # your mistral-7b module (e.g. on the meta device)
mesh = init_device_mesh("cuda", (2, 16), mesh_dim_names=("dp_replicate", "dp_shard"))  # (replicate, shard): HSDP
# float8 training (torchao Float8Linear), converted before sharding; the LM head stays bf16
convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True), module_filter_fn=lambda mod, fqn: not fqn.endswith("lm_head"))
mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
fsdp_kwargs = dict(mesh=mesh, mp_policy=mp_policy, offload_policy=CPUOffloadPolicy())
blocks = model.model.layers  # the MistralDecoderLayer modules
for i, block in enumerate(blocks):
    # selective (op-level) activation checkpointing: wrap `block` with torchtitan's op-SAC policy here
    fully_shard(block, reshard_after_forward=8, **fsdp_kwargs)
fully_shard(model, **fsdp_kwargs)  # root (embedding, final norm, LM head): kept unsharded after forward
# explicit prefetch, 2 blocks ahead (more overlap, more reserved memory)
for i, block in enumerate(blocks):
    block.set_modules_to_forward_prefetch(list(blocks[i + 1:i + 3]))
    block.set_modules_to_backward_prefetch(list(reversed(blocks[max(0, i - 2):i])))

# training step: 1 micro-batch(es) of 4 sequence(s) x 2048 tokens per GPU
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)  # your learning rate
for micro_batches in loader:  # lists of GRAD_ACCUM micro-batches
    for k, batch in enumerate(micro_batches):
        loss = model(**batch).loss / GRAD_ACCUM
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
# not expressible here: activation_checkpointing=selective_op: raw PyTorch needs a selective-checkpoint policy (torch.utils.checkpoint.create_selective_checkpoint_contexts, as torchtitan's op SAC); not reproduced here

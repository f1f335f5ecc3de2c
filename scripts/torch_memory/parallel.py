"""The fake world, the meshes, activation checkpointing, frozen parameters and FSDP1 / FSDP2 wrapping.

World of W ranks on one GPU: PyTorch's fake process group (torch/testing/_internal/distributed/
fake_pg.py, backend "fake", C++ FakeProcessGroup): every collective returns at once with completed
work; shard sizes and every buffer FSDP allocates are those of rank 0 of W. Its collectives copy the
input into the output (all-gather writes each chunk, reduce-scatter copies this rank's chunk), so the
GPU does one local copy where NCCL would communicate. DeviceMesh works on it: a 1-D mesh of the whole
world uses the default (fake) group; a 2-D (replicate, shard) mesh creates its sub-groups with
new_group (torch/distributed/device_mesh.py `_init_process_groups`; test/distributed/test_fake_pg.py
runs FSDP over a 2-D mesh this way). Limits: nothing here measures NCCL's own device buffers (outside
the caching allocator anyway, M15), and c10d's stashing of collective tensors (TORCH_NCCL_AVOID_RECORD_
STREAMS) is ProcessGroupNCCL's, not the fake group's: tensors a real NCCL group would keep alive until
the collective's work completes are freed as soon as the fake work returns.
"""
import functools
import inspect
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn

from . import specs

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INIT_STD = 0.02        # GPT-2 / Llama initializer_range; values do not change memory
# LoRA-like freezing: which weight matrices of a block train first (LoRA's usual targets: q and v,
# then the rest of attention, then the MLP). Name fragments of the recipes' modules.
TRAIN_ORDER = ("q_proj", "v_proj", "qkv", "c_attn", "k_proj", "o_proj", "self_attn.proj", "attn.c_proj",
               "gate_proj", "up_proj", "c_fc", "down_proj", "mlp.c_proj")


def init_fake_world(world):
    from torch.testing._internal.distributed.fake_pg import FakeStore   # registers backend "fake"
    torch.cuda.set_device(0)
    dist.init_process_group(backend="fake", store=FakeStore(), rank=0, world_size=world)


def device_mesh(p):
    from torch.distributed.device_mesh import init_device_mesh
    if p.mesh_replicate == 1:
        return init_device_mesh("cuda", (p.mesh_shard,), mesh_dim_names=("shard",))
    return init_device_mesh("cuda", (p.mesh_replicate, p.mesh_shard), mesh_dim_names=("replicate", "shard"))


def blocks_of(model):
    return model.model.layers if hasattr(model, "model") else model.transformer.h


def unique_params(model):
    """(name, parameter) once per parameter (named_parameters drops the repeats of tied ones)."""
    return list(model.named_parameters())


def freeze_to_fraction(model, fraction):
    """LoRA-like: freezes every parameter, then unfreezes whole weight matrices of the blocks in
    TRAIN_ORDER (each kind in all blocks while it fits, then in evenly spaced blocks) until the
    trainable count is as close to `fraction` of the total as whole matrices allow from below.
    Returns (trainable, total) parameter counts, exact."""
    params = unique_params(model)
    total = sum(p.numel() for _, p in params)
    if fraction >= 1.0:
        return total, total
    for _, p in params:
        p.requires_grad_(False)
    blocks = list(blocks_of(model))
    kinds = []
    for name, p in blocks[0].named_parameters():
        if p.dim() == 2:
            rank = next((i for i, frag in enumerate(TRAIN_ORDER) if frag in name), len(TRAIN_ORDER))
            kinds.append((rank, name, p.numel()))
    target, trainable = fraction * total, 0
    for _, name, size in sorted(kinds):
        room = int((target - trainable) // size)
        if room <= 0:
            continue
        count = min(room, len(blocks))
        for i in _evenly_spaced(len(blocks), count):
            blocks[i].get_parameter(name).requires_grad_(True)
        trainable += count * size
    if trainable == 0:     # below one matrix: train the smallest one of the first block
        _, name, size = min(kinds, key=lambda k: k[2])
        blocks[0].get_parameter(name).requires_grad_(True)
        trainable = size
    return trainable, total


def freeze_units(model, info, frozen_units):
    """plan.frozen_units: every parameter of the named block units stops training ("last_block" is the
    last block). freeze_to_fraction trains block matrices only, so "root" and any unit outside the blocks
    are frozen already; under plan.lora "root" also freezes the LM head's adapters. Returns the trainable
    parameter count after it."""
    blocks = list(blocks_of(model))
    names = specs.block_unit_names(info)
    for layer, block in enumerate(blocks):
        if names.get(layer) in frozen_units or (layer == len(blocks) - 1 and "last_block" in frozen_units):
            for p in block.parameters():
                p.requires_grad_(False)
    if "root" in frozen_units:
        in_blocks = {id(p) for block in blocks for p in block.parameters()}
        for p in model.parameters():
            if id(p) not in in_blocks:
                p.requires_grad_(False)
    return sum(p.numel() for _, p in unique_params(model) if p.requires_grad)


def _evenly_spaced(n, k):
    return sorted({(i * n) // k for i in range(k)})


def checkpointed_layers(p, n_layers):
    ac = p.checkpointing
    if ac.mode == "none":
        return set()
    if ac.mode == "every_k":
        return {i for i in range(n_layers) if i % ac.every_k == 0}
    return set(range(n_layers))


def _sac_save_ops():
    """torchtitan distributed/activation_checkpoint.py `_get_default_save_ops`: functorch's
    compute-intensive ops plus SDPA variants, max, linear, topk and the c10d reduce-scatter."""
    from torch._functorch.partitioners import get_default_op_list
    ops = {op.default for op in get_default_op_list().compute_intensive_ops}
    aten = torch.ops.aten
    for name in ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
                 "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "max", "linear", "topk"):
        if hasattr(aten, name):
            ops.add(getattr(aten, name).default)
    for name in ("reduce_scatter_tensor", "all_to_all_single"):
        if hasattr(torch.ops._c10d_functional, name):
            ops.add(getattr(torch.ops._c10d_functional, name).default)
    return ops


def _sac_context():
    """torchtitan's op-level selective checkpointing policy (SelectiveAC._wrap_block): save the outputs
    of the save ops, except every second matmul (counted separately in forward and recompute)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    save_ops = _sac_save_ops()
    mm_ops = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in mm_ops:
            counts[mode] += 1
        if func in save_ops:
            if func in mm_ops and counts[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def checkpoint_wrapper_fn(mode, early_stop=True):
    """Non-reentrant checkpoint_wrapper (preserve RNG state, default determinism check). torchtitan passes
    early_stop=ac_config.early_stop, False by default (torchtitan/distributed/activation_checkpoint.py):
    its recompute reruns the whole block; torch.utils.checkpoint's own default (HF, litgpt) stops once the
    last saved tensor is recomputed. Fixtures measured before this argument (harness 378723c and older)
    ran torchtitan cases with early_stop=True (tests/fixtures/torch_ops/known_differences.json)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    kwargs = {"checkpoint_impl": CheckpointImpl.NO_REENTRANT, "preserve_rng_state": True, "early_stop": early_stop}
    if mode == "selective_op":
        kwargs["context_fn"] = _sac_context
    return functools.partial(checkpoint_wrapper, **kwargs)


def init_values(name, t):
    """Random weights (normal, std 0.02), norm weights 1, biases 0, LoRA's B 0 (values do not change memory)."""
    if name.endswith("bias") or name.endswith("lora_b"):
        t.zero_()
    elif t.dim() == 1:
        t.fill_(1.0)
    else:
        t.normal_(0.0, INIT_STD)


def make_param_init_fn(device):
    """FSDP1's param_init_fn (called once per module of a unit): materializes the module's own meta
    parameters on `device` and initializes them. to_empty per module would untie shared parameters (LM
    head and embedding): each meta parameter becomes one tensor, put on every module that holds it.

    The memo holds the new parameters weakly: with use_orig_params=False FSDP1 flattens a unit into a new
    FlatParameter and only swaps the modules' attributes for views into it (_flat_param.py
    FlatParamHandle._use_unsharded_views(as_params=False)); the original nn.Parameter objects keep their
    full, unsharded storage for as long as anything references them. A strong memo kept every unit's
    unsharded fp32 weights alive through FSDP's construction, and after it: FSDP's auto-wrap leaves this
    function in a reference cycle (wrap.py _post_order_apply's recursive inner function holds the wrap
    function, whose per-module kwargs hold param_init_fn) that only the cyclic garbage collector frees
    (l1b-fsdp1-lora-r16-qkv-hf, 2026-11-26: 4.6 GiB of original weights alive at step 1; on the H200 a
    gc.collect() after shard_fsdp1 freed them, and this weak memo alone gave the sharded 0.59 GiB and an
    init peak of 2.55 GiB instead of 6.18). A tie whose modules are materialized in one unit (the LM
    head and the embedding, both the root's) is kept while the first module holds the new parameter. `param_init_fn.release()` drops the memo (shard_fsdp1 calls
    it once FSDP is built)."""
    memo = {}     # id(meta parameter) -> (the meta parameter, so that its id is not reused; weakref to the new one)

    def param_init_fn(module):
        for name, param in list(module.named_parameters(recurse=False)):
            if not param.is_meta:
                continue
            entry = memo.get(id(param))
            new = entry[1]() if entry is not None else None
            if new is None:
                new = nn.Parameter(torch.empty_like(param, device=device), requires_grad=param.requires_grad)
                with torch.no_grad():
                    init_values(name, new)
                memo[id(param)] = (param, weakref.ref(new))
            module._parameters[name] = new

    param_init_fn.release = memo.clear
    return param_init_fn


def _mixed_precision_dtypes(p):
    master, param, reduce = DTYPES[p.master_weights_dtype], DTYPES[p.param_dtype], DTYPES[p.reduce_dtype]
    return master, (param if param != master else None), reduce


def _block_raf(p, info, index, n_layers):
    name = specs.block_unit_names(info)[index]
    if name in p.module_overrides:
        return p.module_overrides[name]
    if index == n_layers - 1 and "last_block" in p.module_overrides:
        return p.module_overrides["last_block"]
    return p.reshard_after_forward


def shard_fsdp2(model, p, info):
    """torchtitan's order: checkpoint_wrapper on each block (FSDP(AC(block))), compile per block,
    fully_shard each block, then the root; materialize the shards (to_empty) and initialize them.
    With activation_checkpointing.outside_compile, torchtune's order (lora_finetune_distributed's _setup_model:
    compile_model, then set_activation_checkpointing): each block is compiled first and the eager checkpoint
    wrapper goes around the compiled block."""
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    except ImportError:     # PyTorch 2.4 / 2.5 kept FSDP2 under _composable
        from torch.distributed._composable.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    mesh = device_mesh(p)
    _, param_dtype, reduce_dtype = _mixed_precision_dtypes(p)
    kwargs = {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)}
    if p.offload_params:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    blocks = blocks_of(model)
    n = len(blocks)
    ckpt = checkpointed_layers(p, n)
    compiled_first = p.compile and p.checkpointing.outside_compile
    if compiled_first:
        for block in blocks:
            block.compile(fullgraph=False)
    if p.checkpointing.outside_fsdp:
        model.outside_checkpoint = ckpt
    elif ckpt:
        wrap = checkpoint_wrapper_fn(p.checkpointing.mode, early_stop=p.implementation != "torchtitan")
        for i in sorted(ckpt):
            blocks[i] = wrap(blocks[i])
    if p.compile and not compiled_first:
        for block in blocks:
            block.compile(fullgraph=False)
    if p.auto_wrap_policy == "transformer_block":
        for i, block in enumerate(blocks):
            fully_shard(block, reshard_after_forward=_block_raf(p, info, i, n), **kwargs)
    # The root: PyTorch's default (None: not resharded after forward, F2.6) unless a module override
    # names it.
    param = inspect.signature(fully_shard).parameters.get("reshard_after_forward")
    root_default = True if param is None or param.default is inspect.Parameter.empty else param.default
    fully_shard(model, reshard_after_forward=p.module_overrides.get("root", root_default), **kwargs)
    if p.auto_wrap_policy == "transformer_block":
        _explicit_prefetch(list(blocks), p)
    notes = []
    if getattr(model, "materialized", False):
        return model, notes   # QLoRA: materialized and initialized before quantizing (recipes/adapters.py quantize_base)
    model.to_empty(device="cpu" if p.offload_params else "cuda")
    if retie(model, info):
        notes.append("tied embedding re-tied after to_empty (torchtitan does the same)")
    with torch.no_grad():
        for name, param in unique_params(model):
            init_values(name, param.to_local() if hasattr(param, "to_local") else param)
    return model, notes


def retie(model, info):
    """Ties the embedding to the LM head again where to_empty or sharding gave them apart (torchtitan's
    Decoder.init_states does the same after to_empty). True when it had to."""
    head = getattr(model.lm_head, "base", model.lm_head)      # plan.lora on the head: recipes/adapters.py LoRALinear
    emb = model.model.embed_tokens if hasattr(model, "model") else model.transformer.wte
    if info["model"]["tied_embeddings"] and emb.weight is not head.weight:
        emb.weight = head.weight
        return True
    return False


def _explicit_prefetch(blocks, p):
    """P6: explicit forward prefetch of `prefetch_depth` blocks (forward_prefetch or depth > 1), and
    explicit backward prefetch of as many when depth > 1; depth 1 keeps FSDP2's default backward prefetch."""
    d = p.prefetch_depth
    if p.forward_prefetch or d > 1:
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + d])
    if d > 1:
        for i, block in enumerate(blocks):
            block.set_modules_to_backward_prefetch(list(reversed(blocks[max(0, i - d):i])))


def shard_fsdp1(model, p, info):
    """FullyShardedDataParallel with the transformer-block auto-wrap policy, materialized from the meta
    device by param_init_fn (each unit unsharded, then sharded), then FSDP(checkpoint(block)) by
    apply_activation_checkpointing, the order Lightning and accelerate use."""
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    master, param_dtype, reduce_dtype = _mixed_precision_dtypes(p)
    mp = None
    if param_dtype is not None or reduce_dtype != master:
        mp = MixedPrecision(param_dtype=param_dtype or master, reduce_dtype=reduce_dtype, buffer_dtype=param_dtype or master)
    block_cls = type(blocks_of(model)[0])
    wrapped = {block_cls}
    if p.lora and not p.use_orig_params:
        # one requires_grad per FlatParameter: each block's adapters become a unit of their own inside the
        # block's (lora.check_model admits this with the transformer_block policy only)
        from .recipes import adapters
        adapters.move_to_banks(model)
        wrapped.add(adapters.LoraBank)
    param_init_fn = make_param_init_fn(torch.device("cuda"))
    kwargs = dict(
        sharding_strategy=ShardingStrategy[p.sharding_strategy],
        auto_wrap_policy=ModuleWrapPolicy(wrapped) if p.auto_wrap_policy == "transformer_block" else None,
        mixed_precision=mp, cpu_offload=CPUOffload(offload_params=p.offload_params),
        backward_prefetch=None if p.backward_prefetch == "NONE" else BackwardPrefetch[p.backward_prefetch],
        forward_prefetch=p.forward_prefetch, limit_all_gathers=p.limit_all_gathers, use_orig_params=p.use_orig_params,
        device_id=torch.cuda.current_device(), param_init_fn=param_init_fn)
    if p.sharding_strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        kwargs["device_mesh"] = device_mesh(p)     # (replicate, shard); FSDP1's own default shards per node (F1.15)
    n = len(blocks_of(model))
    ckpt = checkpointed_layers(p, n)
    if p.checkpointing.outside_fsdp:
        model.outside_checkpoint = ckpt
    fsdp = FSDP(model, **kwargs)
    # param_init_fn outlives FSDP's constructor in a reference cycle (see make_param_init_fn): drop its
    # memo so that nothing outside FSDP references a parameter FSDP flattened.
    param_init_fn.release()
    if ckpt and not p.checkpointing.outside_fsdp:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
        apply_activation_checkpointing(fsdp, checkpoint_wrapper_fn=checkpoint_wrapper_fn(p.checkpointing.mode, early_stop=p.implementation != "torchtitan"),
                                       check_fn=lambda m: isinstance(m, block_cls) and m.layer_id in ckpt)
    return fsdp, []


def stream_names(model, fsdp_version):
    """cudaStream_t (as int) -> FSDP's name for it, for the snapshot's blocks (best effort: these are
    private attributes, named as in _fsdp_param_group.py FSDPCommContext and _runtime_utils.py)."""
    names = {torch.cuda.default_stream().cuda_stream: "default", torch.cuda.current_stream().cuda_stream: "default"}
    try:
        if fsdp_version == 2:
            ctx = model._get_fsdp_state()._comm_ctx
            for attr in ("all_gather_copy_in_stream", "all_gather_stream", "reduce_scatter_stream", "all_reduce_stream"):
                s = getattr(ctx, attr, None)
                if s is not None:
                    names.setdefault(s.cuda_stream, attr.replace("_stream", ""))
        else:
            for attr in ("_unshard_stream", "_post_backward_stream", "_pre_unshard_stream", "_all_reduce_stream"):
                s = getattr(model, attr, None)
                if s is not None:
                    names.setdefault(s.cuda_stream, attr.strip("_").replace("_stream", ""))
    except (AttributeError, RuntimeError):
        pass
    return names

"""End-of-init check: the GPU memory the caching allocator holds once the model is sharded, against what
the sharded model and the harness's own tensors account for.

After sharding (and torch.cuda.empty_cache), memory_allocated should be the local shards of the
FlatParameters (FSDP1) or of the DTensor parameters (FSDP2), the buffers, and what the harness allocates
knowingly before step 1 (RoPE tables, the token and label batches). More means something outside FSDP
keeps an unsharded tensor alive: the 2026-11-26 run of l1b-fsdp1-lora-r16-qkv-hf started step 1 with
every original fp32 weight alive (5.20 GiB allocated where 0.58 GiB was the sharded state) because the
harness's param_init_fn memo referenced them (parallel.make_param_init_fn). Less means the accounting
missed a tensor the harness allocates.

Measured on a lent H200 (torch 2.11, 2026-11-26) with the harness that measured that day's fixtures,
this module's walk inlined and run as shard_fsdp1 / shard_fsdp2 returned (before the RoPE tables and
batches exist): FSDP2 cases (l1b-fsdp2-w8-tt, l1b-fsdp2-lora-r16-qkv-tt) matched to the byte; FSDP1
cases (l1b-fsdp1-w8-hf, l1b-fsdp1-hybrid-w64-hf) held 15.97 MiB more at world 8 and 64 alike, and no
CUDA tensor over 1 MiB outside the walk was among the objects Python's gc tracks (something FSDP1 or
c10d holds on the C++ side; not identified), hence the 32 MiB margin; l1b-fsdp1-offload-w8-hf held
none; the old l1b-fsdp1-lora-r16-qkv-hf held 4739 MiB more (every original weight, the adapters and
those 16 MiB).

The pure part (account, compare) needs no PyTorch and is unit-tested on the CPU; cuda_storages walks
the live tensors (duck-typed, so a CPU test can run it on CPU tensors with device="cpu").
"""
ALLOC_ROUND = 512               # the caching allocator rounds every block up to 512 B (CUDACachingAllocator round_size)
MARGIN_BYTES = 32 * 2**20       # slack for what the walk cannot see (FSDP1: 16 MiB, see above)
MARGIN_FRACTION = 0.01          # and for allocator rounding settings (roundup_power2_divisions)


def account(storages, round_to=ALLOC_ROUND):
    """Bytes the allocator should hold for `storages`, (key, nbytes) pairs with one key per storage (its
    data pointer): each storage once, rounded up as the allocator rounds a block; empty ones hold none."""
    seen = {}
    for key, nbytes in storages:
        if nbytes > 0:
            seen[key] = max(nbytes, seen.get(key, 0))
    return sum(-(-n // round_to) * round_to for n in seen.values())


def compare(allocated, expected, margin_bytes=MARGIN_BYTES, margin_fraction=MARGIN_FRACTION):
    """The check's record: allocated and expected bytes, their difference, the margin, and `ok` (the
    difference within the margin either way)."""
    margin = int(margin_bytes + margin_fraction * expected)
    diff = allocated - expected
    return {"allocated_bytes": int(allocated), "expected_bytes": int(expected), "difference_bytes": int(diff),
            "margin_bytes": margin, "ok": abs(diff) <= margin}


def note(check):
    """One line for the fixture's notes when the check failed or could not be done, else None."""
    if check is None or check.get("ok") is True:
        return None
    if check.get("ok") is None:
        return f"init memory check not done: {check.get('error', 'no record')}"
    gib = 2**30
    diff = check["difference_bytes"]
    what = ("more than the sharded model accounts for: a tensor outside FSDP (an unsharded original parameter?) "
            "is alive at step start" if diff > 0 else
            "less than the sharded model accounts for: the check's accounting missed something")
    return (f"init memory check FAILED: {check['allocated_bytes'] / gib:.3f} GiB allocated after sharding, "
            f"{check['expected_bytes'] / gib:.3f} GiB expected (local shards, buffers, harness tensors); "
            f"{abs(diff) / gib:.3f} GiB {what} (margin {check['margin_bytes'] / 2**20:.0f} MiB)")


def _storage(t):
    """(data pointer, bytes) of the storage under tensor `t` (PyTorch 2.x untyped_storage; 1.x storage)."""
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    nbytes = s.nbytes() if hasattr(s, "nbytes") else s.size() * t.element_size()
    return s.data_ptr(), nbytes


def model_tensors(model):
    """Every tensor the sharded model holds: parameters (a DTensor's local shard), buffers, and the
    FlatParameters of FSDP1 units (FullyShardedDataParallel._flat_param; with use_orig_params the
    parameters are views into them, and a shard holding only padding is seen through it alone)."""
    out = []
    for m in model.modules():
        flat = getattr(m, "_flat_param", None) if type(m).__name__ == "FullyShardedDataParallel" else None
        if flat is not None:
            out.append(flat)
    for t in list(model.parameters()) + list(model.buffers()):
        out.append(t.to_local() if hasattr(t, "to_local") else t)
    return out


def leaves(t):
    """The plain tensors under `t`: itself, or for a traceable tensor subclass (torchao's NF4Tensor and
    low-bit optimizer states: `__tensor_flatten__` names their inner tensors; DTensor's local shard) those,
    recursively. A wrapper subclass has no storage of its own."""
    if hasattr(t, "to_local"):
        return leaves(t.to_local())
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is None:
        return [t]
    names, _ = flatten()
    return [leaf for name in names for leaf in leaves(getattr(t, name))]


def cuda_storages(tensors, device="cuda"):
    """(key, nbytes) of the storages under `tensors` (None and non-tensors skipped; subclasses through
    their inner tensors) on `device`'s type."""
    out = []
    for t in tensors:
        for leaf in ([] if t is None else leaves(t)):
            if hasattr(leaf, "device") and leaf.device.type == device:
                out.append(_storage(leaf))
    return out


def harness_tensors(inner, *batches):
    """What the harness allocates on purpose before step 1: the recipe's RoPE tables (plain tensors in
    `inner.rope`, not buffers) and the given batches."""
    rope = getattr(inner, "rope", ()) or ()
    return [t for t in rope if hasattr(t, "device")] + list(batches)

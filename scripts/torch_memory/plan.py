"""fsdpsim plan JSON, checked and resolved for the harness (no PyTorch needed).

The keys are README.md "Plan keys" plus the issue-19 keys the simulator gains in the same change
(NEW_KEYS). The harness must build exactly the configuration the simulator means, so the defaults,
the mesh derivation and the consistency rules follow program/plan.cpp (`parse_plan`, `resolve_plan`,
`effective_strategy`); a rule there that decides what is built is repeated here, with the same field
names in the errors. Keys the harness cannot run on its GPU machine (fp8 without torchao, optimizer-only
offload) are accepted here and refused when a case is run (train.py), naming the field.
"""
import dataclasses
import re

from .common import InputError, show

# Issue 19's keys (implementation recipes, compile, float8, the allocator, the loop, the optimizer, per-module
# settings, frozen units), the last eight of README.md's table.
NEW_KEYS = ("implementation", "compile", "float8", "alloc_conf", "free_logits_before_backward",
            "loss_in_model_forward", "optimizer_impl", "module_overrides", "frozen_units")
README_KEYS = (
    "fsdp_version", "mesh", "sharding_strategy", "reshard_after_forward", "backward_prefetch",
    "forward_prefetch", "limit_all_gathers", "prefetch_depth", "activation_checkpointing", "activation_offloading",
    "param_dtype",
    "reduce_dtype", "master_weights_dtype", "micro_batch", "seq_len", "grad_accum", "grad_sync",
    "cpu_offload", "fp8_all_gather", "trainable_fraction", "optimizer", "auto_wrap_policy", "use_orig_params",
    "cross_entropy", "cross_entropy_chunks") + NEW_KEYS + ("lora",)
PLAN_KEYS = README_KEYS
# plan.lora (program/plan.cpp parse_lora): the canonical targets; "mlp" stands for gate, up, down.
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down", "head")

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NONE")
DTYPES = {"fp32": 4, "float32": 4, "float": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2}
CANONICAL_DTYPE = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
IMPLEMENTATIONS = ("torchtitan", "hf", "litgpt", "fused")
FLOAT8 = ("none", "tensorwise", "rowwise")
OPTIMIZER_IMPLS = ("foreach", "fused")
CROSS_ENTROPY = ("torch", "fused", "fused_linear", "chunked")
DEFAULT_LOSS_CHUNKS = 8     # models/model_spec.h kDefaultLossChunks (torchtune's num_output_chunks)
# PYTORCH_CUDA_ALLOC_CONF options (PyTorch docs/source/notes/cuda.rst "Optimizing memory usage with
# PYTORCH_CUDA_ALLOC_CONF"; c10/cuda/CUDAAllocatorConfig.cpp parses them).
ALLOC_CONF_KEYS = ("backend", "expandable_segments", "max_split_size_mb", "max_non_split_rounding_mb",
                   "garbage_collection_threshold", "roundup_power2_divisions", "release_lock_on_cudamalloc",
                   "pinned_use_cuda_host_register", "pinned_num_register_threads")
# CUDAAllocatorConfig: "max_split_size_mb too small, must be > kLargeBuffer" (kLargeBuffer = 20 MiB).
MIN_MAX_SPLIT_SIZE_MB = 21
MAX_MESH = 1 << 20          # program/plan.cpp kMaxMesh
MAX_PREFETCH_DEPTH = 16     # program/plan.cpp kMaxPrefetchDepth
MAX_TOKENS_PER_MICRO_BATCH = 1 << 31
ACTIVATION_OFFLOADING = ("none", "streams", "sync")


@dataclasses.dataclass
class Checkpointing:
    mode: str = "none"            # none | full | selective_op | every_k
    every_k: int = 1              # every_k: blocks with index % k == 0 are fully checkpointed
    outside_fsdp: bool = False    # checkpoint(FSDP(block)) (HF style, reentrant) instead of FSDP(checkpoint(block))
    outside_compile: bool = False  # checkpoint(compile(block)) (torchtune's order) instead of compile(checkpoint(block))

    def name(self):
        return f"every_{self.every_k}" if self.mode == "every_k" else self.mode


@dataclasses.dataclass
class ResolvedPlan:
    """Every key with its default filled in and the mesh derived (program/plan.cpp resolve_plan)."""
    fsdp_version: int = 2
    mesh_replicate: int = 0
    mesh_shard: int = 0
    sharding_strategy: str = "FULL_SHARD"    # FSDP1: the named one; FSDP2: derived from (rAF, mesh), F2.12
    reshard_after_forward: object = True     # FSDP2: True, False or an int
    backward_prefetch: str = "BACKWARD_PRE"
    forward_prefetch: bool = False
    limit_all_gathers: bool = True
    prefetch_depth: int = 1
    checkpointing: Checkpointing = dataclasses.field(default_factory=Checkpointing)
    param_dtype: str = "bf16"
    reduce_dtype: str = "fp32"
    master_weights_dtype: str = "fp32"
    micro_batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    grad_sync: bool = False
    offload_params: bool = False
    offload_optimizer: bool = False
    fp8_all_gather: bool = False
    trainable_fraction: float = 1.0
    optimizer: str = "adamw"
    auto_wrap_policy: object = "transformer_block"
    use_orig_params: bool = True
    cross_entropy: str = "torch"
    cross_entropy_chunks: int = DEFAULT_LOSS_CHUNKS   # "chunked": torchtune's num_output_chunks
    implementation: str = "torchtitan"
    compile: bool = False
    float8: str = "none"
    alloc_conf: str = ""
    free_logits_before_backward: bool = False
    loss_in_model_forward: bool = None       # None: the recipe's own (HF computes it in its forward)
    optimizer_impl: str = "foreach"          # PyTorch's own choice on CUDA when neither foreach nor fused is set
    module_overrides: dict = dataclasses.field(default_factory=dict)   # unit name -> {"reshard_after_forward": v}
    frozen_units: list = dataclasses.field(default_factory=list)       # units with no trainable parameter
    lora: dict = None                        # {"rank", "targets" (canonical, in LORA_TARGETS order), "dropout"}
    # torchtune's OffloadActivations (use_streams True / False), with every block checkpointed (train.py builds it
    # from torchtune's source, FSDPSIM_TORCHTUNE_PATH)
    activation_offloading: str = "none"


# The simulator's plan.optimizer values (program/plan_keys.cpp): torch.optim's, torchao's low-bit AdamWs
# (torchao/optim/adam.py; the harness imports torchao from a source tree, train.py _torchao), and
# bitsandbytes' (a CUDA library not installed where the harness runs: refused).
TORCH_OPTIMIZERS = ("adamw", "sgd")
TORCHAO_OPTIMIZERS = ("torchao_adamw8bit", "torchao_adamw4bit")
BNB_OPTIMIZERS = ("bnb_adamw8bit", "bnb_paged_adamw", "bnb_paged_adamw8bit")
LOW_BIT_OPTIMIZERS = BNB_OPTIMIZERS + TORCHAO_OPTIMIZERS


def _get(plan, key, kind, default, lo=None, hi=None):
    if key not in plan:
        return default
    v = plan[key]
    field = f"plan.{key}"
    if kind is bool:
        if not isinstance(v, bool):
            raise InputError(field, show(v), "expected true or false")
        return v
    if kind is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(field, show(v), f"expected an integer in [{lo}, {hi}]")
        if not lo <= v <= hi:
            raise InputError(field, show(v), f"expected an integer in [{lo}, {hi}]")
        return v
    if kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise InputError(field, show(v), f"expected a number in [{lo}, {hi}]")
        return float(v)
    if isinstance(kind, tuple):   # an enum
        if not isinstance(v, str) or v not in kind:
            raise InputError(field, show(v), "expected one of " + ", ".join(kind))
        return v
    raise AssertionError(kind)


def _dtype(plan, key, default):
    if key not in plan:
        return default
    v = plan[key]
    if not isinstance(v, str) or v not in DTYPES:
        raise InputError(f"plan.{key}", show(v), "expected fp32, bf16 or fp16")
    return CANONICAL_DTYPE.get(v, v)


def _mesh(v):
    field = "plan.mesh"
    allowed = "expected [replicate, shard] (2 integers) or {replicate, shard}"
    if isinstance(v, list):
        if len(v) != 2:
            raise InputError(field, show(v), allowed)
        v = {"replicate": v[0], "shard": v[1]}
    if not isinstance(v, dict):
        raise InputError(field, show(v), allowed)
    for k in v:
        if k not in ("replicate", "shard"):
            raise InputError(f"{field}.{k}", show(v[k]), "unknown key; expected replicate, shard")
    out = []
    for k in ("replicate", "shard"):
        x = v.get(k, 1)
        if isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_MESH:
            raise InputError(f"{field}.{k}", show(x), f"expected an integer in [1, {MAX_MESH}]")
        out.append(x)
    return out


def _checkpointing(v):
    field = "plan.activation_checkpointing"
    allowed = 'expected "none", "full", "selective_op", "every_<k>" or {mode, every_k, outside_fsdp, outside_compile}'

    def mode_of(s, f):
        if s in ("none", "full", "selective_op", "every_k"):
            return s, 1
        m = re.fullmatch(r"every_([0-9]{1,6})", s) if isinstance(s, str) else None
        if m and int(m.group(1)) >= 1:
            return "every_k", int(m.group(1))
        raise InputError(f, show(s), allowed)

    if isinstance(v, str):
        if v == "every_k":
            raise InputError(field, show(v), 'write every_<k> (e.g. "every_2") or the object form with every_k')
        mode, k = mode_of(v, field)
        return Checkpointing(mode, k, False)
    if not isinstance(v, dict):
        raise InputError(field, show(v), allowed)
    for key in v:
        if key not in ("mode", "every_k", "outside_fsdp", "outside_compile"):
            raise InputError(f"{field}.{key}", show(v[key]),
                             "unknown key; expected mode, every_k, outside_fsdp, outside_compile")
    mode, k = mode_of(v.get("mode", "full"), f"{field}.mode")
    if "every_k" in v:
        k = v["every_k"]
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 999999:
            raise InputError(f"{field}.every_k", show(k), "expected an integer in [1, 999999]")
        if mode != "every_k":
            raise InputError(f"{field}.every_k", show(k), 'only with mode "every_k"')
    flags = []
    for key in ("outside_fsdp", "outside_compile"):
        flag = v.get(key, False)
        if not isinstance(flag, bool):
            raise InputError(f"{field}.{key}", show(flag), "expected true or false")
        flags.append(flag)
    return Checkpointing(mode, k, *flags)


def _offload(v):
    field = "plan.cpu_offload"
    if isinstance(v, bool):
        return v, v
    if not isinstance(v, dict):
        raise InputError(field, show(v), "expected true/false or {params, optimizer}")
    for key in v:
        if key not in ("params", "optimizer"):
            raise InputError(f"{field}.{key}", show(v[key]), "unknown key; expected params, optimizer")
    params = v.get("params", False)
    optimizer = v.get("optimizer", params)
    for key, x in (("params", params), ("optimizer", optimizer)):
        if not isinstance(x, bool):
            raise InputError(f"{field}.{key}", show(x), "expected true or false")
    if params and not optimizer:
        raise InputError(f"{field}.optimizer", "false",
                         "offloading params also offloads the optimizer (CPUOffload / CPUOffloadPolicy run the step on the CPU)")
    return params, optimizer


def _wrap(v):
    field = "plan.auto_wrap_policy"
    allowed = 'expected "transformer_block", "none", {"min_num_params": N} or {"modules": [names]}'
    if isinstance(v, str):
        if v not in ("transformer_block", "none"):
            raise InputError(field, show(v), allowed)
        return v
    if not isinstance(v, dict) or len(v) != 1:
        raise InputError(field, show(v), allowed)
    if "min_num_params" in v:
        n = v["min_num_params"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputError(f"{field}.min_num_params", show(n), "expected a positive integer")
        return dict(v)
    if "modules" in v:
        m = v["modules"]
        if not isinstance(m, list) or not m or not all(isinstance(x, str) and x for x in m):
            raise InputError(f"{field}.modules", show(m), "expected a non-empty array of module names")
        return dict(v)
    raise InputError(field, show(v), allowed)


def parse_alloc_conf(text, field="plan.alloc_conf"):
    """PYTORCH_CUDA_ALLOC_CONF text -> {option: value string}; "" is PyTorch's default allocator."""
    if not isinstance(text, str):
        raise InputError(field, show(text), 'expected a PYTORCH_CUDA_ALLOC_CONF string such as "expandable_segments:True"')
    out = {}
    if not text.strip():
        return out
    for item in text.split(","):
        if ":" not in item:
            raise InputError(field, show(text), f'"{item}" is not option:value')
        key, value = (s.strip() for s in item.split(":", 1))
        if key not in ALLOC_CONF_KEYS:
            raise InputError(field, show(text), f'unknown option "{key}"; PyTorch knows ' + ", ".join(ALLOC_CONF_KEYS))
        if key in out:
            raise InputError(field, show(text), f'option "{key}" given twice')
        if key == "expandable_segments" and value not in ("True", "False"):
            raise InputError(field, show(text), "expandable_segments takes True or False")
        if key == "max_split_size_mb" and (not value.isdigit() or int(value) < MIN_MAX_SPLIT_SIZE_MB):
            raise InputError(field, show(text), "max_split_size_mb takes an integer > 20 (MiB)")
        if key == "backend" and value not in ("native", "cudaMallocAsync"):
            raise InputError(field, show(text), "backend takes native or cudaMallocAsync")
        out[key] = value
    return out


def _overrides(v, fsdp_version):
    field = "plan.module_overrides"
    if not isinstance(v, dict):
        raise InputError(field, show(v), 'expected {"<unit name>": {"reshard_after_forward": ...}}')
    if v and fsdp_version == 1:
        raise InputError(field, show(v), "FSDP2 only (per-module reshard_after_forward is a fully_shard argument)")
    out = {}
    for unit, setting in v.items():
        f = f"{field}.{unit}"
        if not isinstance(setting, dict) or set(setting) != {"reshard_after_forward"}:
            raise InputError(f, show(setting), 'expected {"reshard_after_forward": true | false | int}')
        raf = setting["reshard_after_forward"]
        if not isinstance(raf, bool) and not (isinstance(raf, int) and raf >= 2):
            raise InputError(f"{f}.reshard_after_forward", show(raf), "expected true, false or an integer k > 1")
        out[unit] = raf
    return out


def parse_plan(plan):
    """Checks a plan object (keys, types, ranges, the version rules of program/plan.cpp parse_plan)."""
    if not isinstance(plan, dict):
        raise InputError("plan", show(plan), "expected a JSON object")
    for key in plan:
        if key not in PLAN_KEYS:
            raise InputError(f"plan.{key}", show(plan[key]), "unknown key; plan keys: " + ", ".join(PLAN_KEYS))
    p = ResolvedPlan()
    p.fsdp_version = _get(plan, "fsdp_version", int, 2, 1, 2)
    if "mesh" in plan:
        p.mesh_replicate, p.mesh_shard = _mesh(plan["mesh"])
    raf_given = "reshard_after_forward" in plan
    if raf_given:
        v = plan["reshard_after_forward"]
        if isinstance(v, bool) or (isinstance(v, int) and 2 <= v <= MAX_MESH):
            p.reshard_after_forward = v
        else:
            raise InputError("plan.reshard_after_forward", show(v),
                             "expected true, false or an integer k > 1 that divides the shard size")
    strategy_given = "sharding_strategy" in plan
    p.sharding_strategy = _get(plan, "sharding_strategy", STRATEGIES, "FULL_SHARD")
    if p.fsdp_version == 1:
        if raf_given:
            raise InputError("plan.reshard_after_forward", show(plan["reshard_after_forward"]),
                             "FSDP1 has no reshard_after_forward; use sharding_strategy (SHARD_GRAD_OP = false)")
    elif strategy_given:
        zero2 = p.sharding_strategy in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2")
        implied = p.reshard_after_forward if p.sharding_strategy == "NO_SHARD" else not zero2
        if raf_given and (p.reshard_after_forward is False) != (implied is False):
            raise InputError("plan.sharding_strategy", show(p.sharding_strategy),
                             "contradicts reshard_after_forward (FSDP2: FULL_SHARD/HYBRID_SHARD = true, "
                             "SHARD_GRAD_OP/_HYBRID_SHARD_ZERO2 = false)")
        if not raf_given:
            p.reshard_after_forward = implied
    if "backward_prefetch" in plan:
        v = plan["backward_prefetch"]
        p.backward_prefetch = "NONE" if v is None else _get(plan, "backward_prefetch", PREFETCH, None)
    p.forward_prefetch = _get(plan, "forward_prefetch", bool, False)
    p.limit_all_gathers = _get(plan, "limit_all_gathers", bool, True)
    p.prefetch_depth = _get(plan, "prefetch_depth", int, 1, 1, MAX_PREFETCH_DEPTH)
    if "activation_checkpointing" in plan:
        p.checkpointing = _checkpointing(plan["activation_checkpointing"])
    p.activation_offloading = _get(plan, "activation_offloading", ACTIVATION_OFFLOADING, "none")
    p.param_dtype = _dtype(plan, "param_dtype", "bf16")
    p.reduce_dtype = _dtype(plan, "reduce_dtype", "fp32")
    p.master_weights_dtype = _dtype(plan, "master_weights_dtype", "fp32")
    p.micro_batch = _get(plan, "micro_batch", int, 1, 1, 65536)
    p.seq_len = _get(plan, "seq_len", int, 2048, 1, 1 << 22)
    p.grad_accum = _get(plan, "grad_accum", int, 1, 1, 65536)
    p.grad_sync = _get(plan, "grad_sync", bool, False)
    if "cpu_offload" in plan:
        p.offload_params, p.offload_optimizer = _offload(plan["cpu_offload"])
    p.fp8_all_gather = _get(plan, "fp8_all_gather", bool, False)
    p.trainable_fraction = _get(plan, "trainable_fraction", float, 1.0, 0.0, 1.0)
    if not 0.0 < p.trainable_fraction <= 1.0:
        raise InputError("plan.trainable_fraction", show(plan["trainable_fraction"]),
                         "expected a number in (0, 1] (a fully frozen model does not train)")
    if plan.get("optimizer") in BNB_OPTIMIZERS:
        raise InputError("plan.optimizer", show(plan["optimizer"]),
                         "adamw, sgd, torchao_adamw8bit or torchao_adamw4bit: bitsandbytes (a CUDA library) is not "
                         "installed where the harness runs")
    p.optimizer = _get(plan, "optimizer", TORCH_OPTIMIZERS + TORCHAO_OPTIMIZERS, "adamw")
    if "auto_wrap_policy" in plan:
        p.auto_wrap_policy = _wrap(plan["auto_wrap_policy"])
    p.use_orig_params = _get(plan, "use_orig_params", bool, True)
    p.cross_entropy = _get(plan, "cross_entropy", CROSS_ENTROPY, "torch")
    if "cross_entropy_chunks" in plan:
        p.cross_entropy_chunks = _get(plan, "cross_entropy_chunks", int, DEFAULT_LOSS_CHUNKS, 1, 65536)
        if p.cross_entropy != "chunked":
            raise InputError("plan.cross_entropy_chunks", show(plan["cross_entropy_chunks"]),
                             'only with cross_entropy "chunked" (torchtune\'s num_output_chunks)')
    p.implementation = _get(plan, "implementation", IMPLEMENTATIONS, "torchtitan")
    p.compile = _get(plan, "compile", bool, False)
    p.float8 = _get(plan, "float8", FLOAT8, "none")
    if "alloc_conf" in plan:
        parse_alloc_conf(plan["alloc_conf"])
        p.alloc_conf = plan["alloc_conf"]
    p.free_logits_before_backward = _get(plan, "free_logits_before_backward", bool, False)
    p.loss_in_model_forward = _get(plan, "loss_in_model_forward", bool, None)
    if p.loss_in_model_forward and p.cross_entropy == "chunked":
        raise InputError("plan.loss_in_model_forward", "true",
                         'cross_entropy "chunked" is torchtune\'s chunked output, whose loss the recipe computes on the '
                         "model's output (false)")
    p.optimizer_impl = _get(plan, "optimizer_impl", OPTIMIZER_IMPLS, "foreach")
    if "module_overrides" in plan:
        p.module_overrides = _overrides(plan["module_overrides"], p.fsdp_version)
    if "frozen_units" in plan:
        v = plan["frozen_units"]
        expected = 'expected an array of FSDP unit names (as `fsdpsim model-info` lists them, or "root", "last_block")'
        if not isinstance(v, list):
            raise InputError("plan.frozen_units", show(v), expected)
        for e in v:
            if not isinstance(e, str) or not e:
                raise InputError("plan.frozen_units", show(e), expected)
        p.frozen_units = list(v)
    if "lora" in plan and plan["lora"] is not None:
        p.lora = _lora(plan["lora"])
        if "trainable_fraction" in plan and p.trainable_fraction < 1.0:
            raise InputError("plan.trainable_fraction", show(plan["trainable_fraction"]),
                             "give either lora (the adapters train, nothing else) or trainable_fraction < 1, not both")
    return p


def _lora(v):
    """plan.lora, checked as program/plan.cpp parse_lora checks it (same fields and rules)."""
    field = "plan.lora"
    if not isinstance(v, dict):
        raise InputError(field, show(v), 'expected {"rank": r, "targets": ["q", "v", ...], "dropout": p}')
    for key in v:
        if key not in ("rank", "targets", "dropout", "quantize_base"):
            raise InputError(f"{field}.{key}", show(v[key]), "unknown key; lora keys: rank, targets, dropout, quantize_base")
    quantize = v.get("quantize_base", "none")
    if quantize not in ("none", "nf4"):
        raise InputError(f"{field}.quantize_base", show(quantize),
                         'expected "nf4" (QLoRA: 4-bit NormalFloat base weights) or "none"')
    rank = v.get("rank")
    if rank is None:
        raise InputError(f"{field}.rank", "<missing>", "the adapters' rank, an integer >= 1")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= 65536:
        raise InputError(f"{field}.rank", show(rank), "expected an integer in [1, 65536]")
    dropout = v.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise InputError(f"{field}.dropout", show(dropout), "expected a probability in [0, 1) (1 drops the whole adapter input)")
    targets = v.get("targets")
    what = "expected a non-empty array of targets from: " + ", ".join(LORA_TARGETS) + ", mlp (= gate, up, down)"
    if not isinstance(targets, list) or not targets:
        raise InputError(f"{field}.targets", show(targets) if targets is not None else "<missing>", what)
    on = set()
    for t in targets:
        if t == "mlp":
            on |= {"gate", "up", "down"}
        elif isinstance(t, str) and t in LORA_TARGETS:
            on.add(t)
        else:
            raise InputError(f"{field}.targets", show(t), "unknown LoRA target; " + what)
    return {"rank": rank, "targets": [t for t in LORA_TARGETS if t in on], "dropout": float(dropout),
            "quantize_base": quantize}


def resolve_plan(plan, world, gpus_per_node, units=None):
    """parse_plan, then the mesh and the strategy for `world` GPUs (program/plan.cpp resolve_plan).
    `units`: fsdpsim model-info's unit list, to check module_overrides' names."""
    p = parse_plan(plan)
    fsdp1 = p.fsdp_version == 1
    named = p.sharding_strategy
    hybrid = named in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
    if not p.mesh_replicate:
        if named == "NO_SHARD":
            p.mesh_replicate, p.mesh_shard = world, 1
        elif hybrid:
            gpn = min(gpus_per_node, world)
            if world % gpn:
                raise InputError("plan.mesh", "<derived>", f"HYBRID_SHARD needs the GPU count ({world} GPUs) to be a "
                                 f"multiple of gpus_per_node ({gpus_per_node}); give the mesh explicitly")
            p.mesh_replicate, p.mesh_shard = world // gpn, gpn
        else:
            p.mesh_replicate, p.mesh_shard = 1, world
    mesh = f"({p.mesh_replicate}, {p.mesh_shard})"
    if p.mesh_replicate * p.mesh_shard != world:
        raise InputError("plan.mesh", mesh, f"replicate x shard must equal {world} GPUs")
    if fsdp1:
        if named in ("FULL_SHARD", "SHARD_GRAD_OP") and p.mesh_replicate > 1:
            raise InputError("plan.mesh", mesh, f"{named} shards over all GPUs (replicate must be 1); "
                             "use HYBRID_SHARD or _HYBRID_SHARD_ZERO2 for a 2-D mesh")
        if named == "NO_SHARD" and p.mesh_shard > 1:
            raise InputError("plan.mesh", mesh, f"NO_SHARD replicates on every GPU: the mesh must be ({world}, 1)")
        if hybrid and p.mesh_shard == 1 and world > 1:
            raise InputError("plan.mesh", mesh, f"{named} needs shard > 1 (PyTorch falls back to NO_SHARD, pytorch#154888)")
    else:
        if named == "NO_SHARD" and p.mesh_shard > 1:
            raise InputError("plan.mesh", mesh, f"NO_SHARD is a 1-wide shard dim: the mesh must be ({world}, 1)")
        if named == "SHARD_GRAD_OP" and p.mesh_replicate > 1:
            raise InputError("plan.mesh", mesh, "SHARD_GRAD_OP shards over all GPUs (replicate must be 1); "
                             "use _HYBRID_SHARD_ZERO2 for a 2-D mesh")
        if hybrid and p.mesh_shard == 1 and world > 1:
            raise InputError("plan.mesh", mesh, f"{named} needs shard > 1; a 1-wide shard dim is NO_SHARD")
        _check_int_raf(p.reshard_after_forward, p.mesh_shard, "plan.reshard_after_forward")
        p.sharding_strategy = effective_fsdp2_strategy(p)
    if fsdp1 and p.prefetch_depth > 1:
        raise InputError("plan.prefetch_depth", str(p.prefetch_depth),
                         "1 for FSDP1 (deeper explicit prefetch is FSDP2's set_modules_to_*_prefetch, P6)")
    if not fsdp1 and p.backward_prefetch == "BACKWARD_POST":
        raise InputError("plan.backward_prefetch", '"BACKWARD_POST"', "FSDP2 supports BACKWARD_PRE (its default, F2.7) or NONE")
    if not fsdp1 and not p.use_orig_params:
        raise InputError("plan.use_orig_params", "false", "FSDP1 only (FSDP2 always keeps the original parameters)")
    if p.fp8_all_gather and (fsdp1 or p.param_dtype != "bf16"):
        raise InputError("plan.fp8_all_gather", "true", "needs fsdp_version 2 and param_dtype bf16 (torchao float8, D4)")
    if DTYPES[p.master_weights_dtype] < DTYPES[p.param_dtype] or (
            DTYPES[p.master_weights_dtype] == DTYPES[p.param_dtype] and p.master_weights_dtype != p.param_dtype):
        raise InputError("plan.master_weights_dtype", p.master_weights_dtype,
                         f"must be param_dtype ({p.param_dtype}) or wider (fp32)")
    if fsdp1 and p.offload_params and p.grad_accum > 1 and p.grad_sync:
        raise InputError("plan.cpu_offload", "true", "FSDP1 CPU offload does not support gradient accumulation outside "
                         "no_sync (M11); set grad_sync false")
    ac = p.checkpointing
    if ac.outside_fsdp and ac.mode in ("selective_op", "none"):
        raise InputError("plan.activation_checkpointing.outside_fsdp", "true",
                         "checkpoint(FSDP(block)) is whole-block (reentrant) checkpointing: mode full or every_k")
    if ac.outside_compile:
        field = "plan.activation_checkpointing.outside_compile"
        if not p.compile:
            raise InputError(field, "true", "needs compile true (it orders the checkpoint and torch.compile)")
        if ac.mode in ("selective_op", "none"):
            raise InputError(field, "true", "modelled for whole-block checkpointing (mode full or every_k)")
    if p.activation_offloading != "none":
        field, value = "plan.activation_offloading", show(p.activation_offloading)
        if ac.outside_fsdp:
            raise InputError(field, value, "modelled for FSDP(checkpoint(block)), not checkpoint(FSDP(block)) (outside_fsdp)")
    if p.micro_batch * p.seq_len > MAX_TOKENS_PER_MICRO_BATCH:
        raise InputError("plan.micro_batch", str(p.micro_batch), "micro_batch x seq_len must stay below 2^31 tokens per micro-batch")
    if units is not None:
        names = {u["name"] for u in units} | {"last_block"}
        for unit, raf in p.module_overrides.items():
            if unit not in names:
                raise InputError(f"plan.module_overrides.{unit}", show(unit),
                                 "not a unit of this model; units: " + ", ".join(sorted(names)))
            _check_int_raf(raf, p.mesh_shard, f"plan.module_overrides.{unit}.reshard_after_forward")
    if p.frozen_units and p.trainable_fraction >= 1.0 and not p.lora:
        raise InputError("plan.frozen_units", show(p.frozen_units),
                         "frozen units need trainable_fraction < 1 (the fraction of the whole model that trains) or lora")
    if p.lora and p.implementation == "runtime":
        raise InputError("plan.lora", show(plan["lora"]),
                         "fsdpsim's own runtime has no LoRA adapters (use implementation hf, litgpt, fused or torchtitan)")
    if units is not None:
        names = {u["name"] for u in units} | {"root", "last_block"}
        for unit in p.frozen_units:
            if unit not in names:
                raise InputError("plan.frozen_units", show(unit), "not a unit of this model; units: " + ", ".join(sorted(names)))
    return p


def _check_int_raf(raf, shard, field):
    if not isinstance(raf, bool) and isinstance(raf, int) and (raf >= shard or shard % raf):
        raise InputError(field, str(raf), f"an int must divide the shard size {shard} and lie strictly between 1 and it (F2.4)")


def effective_fsdp2_strategy(p):
    """F2.12: FSDP2 has no strategy enum; a 1-wide shard dim is NO_SHARD, a 2-D mesh HSDP, rAF=False ZeRO-2."""
    if p.mesh_shard == 1:
        return "NO_SHARD"
    zero2 = p.reshard_after_forward is False
    if p.mesh_replicate > 1:
        return "_HYBRID_SHARD_ZERO2" if zero2 else "HYBRID_SHARD"
    return "SHARD_GRAD_OP" if zero2 else "FULL_SHARD"


def explicit_plan(plan):
    """The plan with every issue-19 key written out (fixtures name them, so a later change of the
    simulator's defaults cannot change what a fixture means)."""
    p = parse_plan(plan)
    out = dict(plan)
    for key in NEW_KEYS:
        out.setdefault(key, getattr(p, key))
    return out

"""The plan matrix (scripts/torch_memory_matrix.json): the cases the GPU machine measures, in the order
they run (most informative first), each checked here without PyTorch."""
import os
import re

from . import estimate, lora as loras, plan as plans, specs
from .common import InputError, load_json, require, show

SCHEMA_ID = "fsdpsim.torch_memory_matrix/1"
MATRIX_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch_memory_matrix.json")
GPUS_PER_NODE = 8             # the clusters the fixtures name are nodes of 8 GPUs (fsdpsim's H100/H200 clusters)
MIN_STEPS = 3                 # issue 19: at least 3 steps (the first, with lazily created optimizer state, and 2 steady)
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
CASE_KEYS = ("name", "model", "world", "plan", "why")
# fsdpsim GPU profile of the lent GPU, from torch.cuda.get_device_name (the fixtures' cluster uses it).
GPU_PROFILES = (("H100", "H100-SXM"), ("H200", "H200"), ("B200", "B200"), ("A100-SXM4-80GB", "A100-80GB"),
                ("A100 80GB", "A100-80GB"), ("A100-SXM4-40GB", "A100-40GB"), ("A100", "A100-40GB"))
# The inter-node fabric named for worlds above one node (memory does not depend on it).
INTER_NODE = {"H100-SXM": "IB-NDR400", "H200": "IB-NDR400", "B200": "IB-NDR400", "A100-80GB": "IB-HDR200",
              "A100-40GB": "IB-HDR200"}


def gpu_profile(device_name):
    for needle, profile in GPU_PROFILES:
        if needle in device_name:
            return profile
    raise InputError("gpu", show(device_name), "no fsdpsim GPU profile for this GPU (H100, H200, B200, A100)")


def cluster_name(world, profile, gpus_per_node=GPUS_PER_NODE):
    """fsdpsim's cluster name for `world` GPUs of `profile` (calibrate/cluster.cpp grammar)."""
    if world <= gpus_per_node:
        return f"{world}x{profile}"
    if world % gpus_per_node:
        raise InputError("world", str(world), f"more than one node must be a multiple of {gpus_per_node} GPUs")
    return f"{world // gpus_per_node}x{gpus_per_node}x{profile}-{INTER_NODE[profile]}"


def runnable(p, field="plan"):
    """What the harness cannot build on the GPU machine (PyTorch 2.x without torchao), refused by name."""
    if p.fp8_all_gather:
        raise InputError(f"{field}.fp8_all_gather", "true", "needs torchao's Float8Linear, not installed on the GPU machine")
    if p.float8 != "none":
        raise InputError(f"{field}.float8", show(p.float8), "needs torchao's float8 training, not installed on the GPU machine")
    if p.offload_optimizer and not p.offload_params:
        raise InputError(f"{field}.cpu_offload.optimizer", "true",
                         "PyTorch FSDP has no optimizer-only offload (CPUOffload / CPUOffloadPolicy move params too)")
    if p.auto_wrap_policy not in ("transformer_block", "none"):
        raise InputError(f"{field}.auto_wrap_policy", show(p.auto_wrap_policy),
                         'the harness wraps "transformer_block" (each block + root) or "none" (root only)')
    if p.compile and (p.offload_params or p.fsdp_version == 1):
        raise InputError(f"{field}.compile", "true", "the harness compiles blocks under FSDP2 without CPU offload (torchtitan's setup)")
    if p.fsdp_version == 2 and p.backward_prefetch == "NONE":
        raise InputError(f"{field}.backward_prefetch", '"NONE"',
                         "FSDP2 has no API that turns its default backward prefetch off (an empty "
                         "set_modules_to_backward_prefetch list falls back to the default)")
    if p.activation_offloading != "none" and p.cross_entropy == "fused_linear":
        raise InputError(f"{field}.activation_offloading", show(p.activation_offloading),
                         "the harness computes the fused linear cross-entropy inside the model's forward, inside the "
                         "offloading context; torchtune computes its loss outside it (use cross_entropy torch or chunked)")
    if p.fsdp_version == 1 and not p.use_orig_params and p.trainable_fraction < 1.0:
        raise InputError(f"{field}.use_orig_params", "false",
                         "frozen weight matrices inside a unit need use_orig_params true (FSDP1 flattens a unit into one "
                         "FlatParameter with one requires_grad, M13)")


def check_case(case, index, models_dir=specs.MODELS_DIR):
    field = f"matrix.cases[{index}]"
    if not isinstance(case, dict):
        raise InputError(field, show(case), "expected an object")
    for key in case:
        if key not in CASE_KEYS:
            raise InputError(f"{field}.{key}", show(case[key]), "unknown key; expected " + ", ".join(CASE_KEYS))
    name = require(case, "name", str, field)
    if not NAME.match(name):
        raise InputError(f"{field}.name", show(name), "lower-case letters, digits, '.', '_' and '-' (a file name)")
    field = f"matrix.cases[{index}] ({name})"
    info = specs.load_model_info(require(case, "model", str, field), models_dir, f"{field}.model")
    world = require(case, "world", int, field)
    if world < 1 or (world > GPUS_PER_NODE and world % GPUS_PER_NODE):
        raise InputError(f"{field}.world", str(world), f"1..{GPUS_PER_NODE}, or a multiple of {GPUS_PER_NODE}")
    require(case, "why", str, field)
    try:
        p = plans.resolve_plan(require(case, "plan", dict, field), world, GPUS_PER_NODE, info["units"])
        specs.check_recipe(info["model"], p.implementation)
        runnable(p)
        spec = info["model"]
        loras.check_model(spec, p)
        if p.cross_entropy == "chunked" and spec["model_type"] != "llama":
            raise InputError("plan.cross_entropy", '"chunked"',
                             "torchtune's TransformerDecoder.chunked_output is built in the llama recipe only")
        if spec["positions"] == "learned" and p.seq_len > spec["max_positions"]:
            raise InputError("plan.seq_len", str(p.seq_len), f"at most {spec['max_positions']} (learned positions)")
    except InputError as e:
        raise InputError(f"{field}: {e.field}", e.value, e.allowed) from None
    return info, p


def load_matrix(path=MATRIX_PATH, models_dir=specs.MODELS_DIR):
    """The matrix, checked: [(case, model info, resolved plan)] in run order, and its step count."""
    m = load_json(path, "--matrix")
    if not isinstance(m, dict) or m.get("schema") != SCHEMA_ID:
        raise InputError("matrix.schema", show(m.get("schema") if isinstance(m, dict) else m), f"expected {SCHEMA_ID}")
    steps = require(m, "steps", int, "matrix")
    if steps < MIN_STEPS:
        raise InputError("matrix.steps", str(steps), f"at least {MIN_STEPS} (first step + steady state)")
    cases = require(m, "cases", list, "matrix")
    out, seen = [], set()
    for i, case in enumerate(cases):
        info, p = check_case(case, i, models_dir)
        if case["name"] in seen:
            raise InputError(f"matrix.cases[{i}].name", show(case["name"]), "duplicate case name")
        seen.add(case["name"])
        out.append((case, info, p))
    return out, steps


def estimate_matrix(entries, steps):
    rows = [(case["name"], estimate.estimate_case_seconds(info, p, case["world"], steps)) for case, info, p in entries]
    return rows, round(sum(r["total_s"] for _, r in rows), 1)

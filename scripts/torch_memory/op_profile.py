"""Per-op GPU time of training steps under torch.profiler (issue 20's per-op timing reference): each
CUDA kernel's device time, grouped into the op classes fsdpsim's compute model prices (GEMM, attention,
norm, elementwise, loss, optimizer, copies, reductions). Runs after a case's memory measurement, alone on
the GPU (timings of processes sharing a GPU are not kept), on the fake process group (collectives are
local copies: their kernels are counted under "collective_copy", not as communication time).
"""
import json
import re
import time

from .common import write_json_atomic

# First match wins; kernel names from cuBLAS / CUTLASS / flash-attention / ATen as PyTorch 2.x names them.
CLASSES = (
    ("attention", r"flash|fmha|attention|_efficient_|cudnn.*sdpa|sdpa"),
    ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|tensorop|sm\d+_|ampere_|hopper_|wgmma"),
    ("optimizer", r"multi_tensor|fused_adam|adam|foreach|lerp|_amp_"),
    ("loss", r"softmax|nll_loss|cross_entropy"),
    ("compiled", r"^triton_"),   # inductor's fused kernels (norm, rotary, SwiGLU... fused together)
    ("norm", r"rms|norm"),
    # FSDP2's own copy-in / copy-out kernels (real work in a real run too) ...
    ("fsdp_copy", r"chunk_cat|split_with_sizes|foreach_copy"),
    # ... and the fake process group's collectives, which copy locally where NCCL would communicate
    ("fake_collective", r"memcpy dtod|memcpy|memset|all_gather|reduce_scatter"),
    ("copy", r"copy|cat|index|gather|scatter|fill"),
    ("reduction", r"reduce_kernel|reduce|sum|mean|amax|max"),
    ("elementwise", r"elementwise|vectorized|unrolled|silu|mul|add|pow|rsqrt|exp|neg|where|cos|sin"),
)


def op_class(name):
    low = name.lower()
    for cls, pattern in CLASSES:
        if re.search(pattern, low):
            return cls
    return "other"


# Ranges that are not kernels: record_function annotations (FSDP::all_gather, Optimizer.step#...,
# ProfilerStep#) show up with a device time that is the sum of the kernels inside them.
ANNOTATION = re.compile(r"^(FSDP::|Optimizer\.|ProfilerStep#|## |torch/|CheckpointFunction|<forward op>|autograd::)")


def is_kernel(evt):
    if getattr(evt, "is_user_annotation", False):
        return False
    return not ANNOTATION.search(evt.key)


def _device_us(evt):
    for attr in ("self_device_time_total", "self_cuda_time_total", "device_time_total", "cuda_time_total"):
        v = getattr(evt, attr, None)
        if v:
            return float(v)
    return 0.0


def profile_steps(torch, step_fn, first_step, out_path, context, case, steps=2):
    """One warm-up step, then `steps` steps under the profiler; writes kernel and class totals per step."""
    from torch.profiler import ProfilerActivity, profile
    step_fn(first_step)
    torch.cuda.synchronize()
    unprofiled = []
    for i in range(steps):     # the step's wall time without the profiler's overhead
        t0 = time.perf_counter()
        step_fn(first_step + 1 + i)
        torch.cuda.synchronize()
        unprofiled.append(time.perf_counter() - t0)
    first_step += steps
    walls = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            t0 = time.perf_counter()
            step_fn(first_step + 1 + i)
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
    kernels = {}
    for evt in prof.key_averages():
        dev = str(getattr(evt, "device_type", "")).upper()
        if "CUDA" not in dev:
            continue
        us = _device_us(evt)
        if us <= 0 or not is_kernel(evt):
            continue
        k = kernels.setdefault(evt.key, {"name": evt.key[:200], "class": op_class(evt.key), "count": 0, "us": 0.0})
        k["count"] += int(evt.count)
        k["us"] += us
    classes = {}
    for k in kernels.values():
        c = classes.setdefault(k["class"], {"us_per_step": 0.0, "kernels_per_step": 0.0})
        c["us_per_step"] += k["us"] / steps
        c["kernels_per_step"] += k["count"] / steps
    for c in classes.values():
        c["us_per_step"] = round(c["us_per_step"], 1)
        c["kernels_per_step"] = round(c["kernels_per_step"], 1)
    top = sorted(kernels.values(), key=lambda k: -k["us"])[:400]
    for k in top:
        k["us_per_step"] = round(k.pop("us") / steps, 1)
        k["count_per_step"] = round(k.pop("count") / steps, 1)
    doc = {"what": "device time per training step by op class (torch.profiler, CUDA kernels; record_function ranges left out), fake process group",
           "context": context, "case": case, "profiled_steps": steps,
           "step_wall_s": [round(w, 4) for w in walls],
           "step_wall_unprofiled_s": [round(w, 4) for w in unprofiled],
           "device_busy_us_per_step": round(sum(c["us_per_step"] for c in classes.values()), 1),
           "classes": dict(sorted(classes.items(), key=lambda kv: -kv[1]["us_per_step"])), "top_kernels": top}
    write_json_atomic(out_path, doc)
    return doc

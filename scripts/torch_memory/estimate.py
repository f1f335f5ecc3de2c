"""A rough device-time estimate of one case on one H100, to order the matrix, keep it inside a device
lease and let the runner stop before its time is up. Every constant below is an assumption stated as
such (or a figure measured on the lent H100 and recorded in /work/.library/device/KINDS.md); the runner
prints the measured time next to the estimate, so the constants can be corrected from real runs.
"""

# bf16 dense matrix products reach ~790 TFLOP/s on an 8192^3 product on the lent H100 (KINDS.md); a
# training step with attention, elementwise kernels and FSDP's copies reaches perhaps half of that.
# Assumption, not measured.
EFFECTIVE_BF16_FLOP_PER_S = 3.5e14
# fp32 matmuls without TF32 (PyTorch's default float32_matmul_precision "highest"): H100 SXM fp32 peak
# is 67 TFLOP/s (NVIDIA H100 datasheet); assume ~70% of it.
EFFECTIVE_FP32_FLOP_PER_S = 4.5e13
# Device-to-device copy measured at ~3.0 TB/s counting bytes read and written (KINDS.md, H100).
HBM_BYTES_PER_S = 3.0e12
# Start of a fresh Python process: import torch, CUDA context, fake process group, model on the meta
# device, fully_shard / FSDP wrapping, materializing the shards, and at the end the memory snapshot's
# conversion and the fixture. Assumption.
FIXED_S = 12.0
# torch.compile of one transformer block (all blocks share the compiled code). Measured on the H200
# (2026-11-27, reports/validation/torch-memory-2026-11-27): llama3-70b's compiled LoRA case ran its first step in
# 18.2 s against 2.7 s for the next ones, the whole case in 38-39 s (the estimate was 123 s with 90 here).
COMPILE_S = 20.0
# torchao's low-bit AdamW compiles its per-parameter step (torch.compile(single_param_adam, fullgraph=True,
# dynamic=False): one compilation per distinct local shape and state layout). Measured on the H200 (2026-11-27,
# reports/validation/torch-memory-2026-11-27-torchao): llama-1b's torchao cases took 33-53 s where the rest of
# the estimate gave 12.4 s.
TORCHAO_OPTIMIZER_COMPILE_S = 35.0
# QLoRA: the whole model materialized and quantized to NF4 on the GPU before sharding (to_nf4 per block
# linear). Measured there: llama-1b's eager QLoRA case 14.6 s, llama3-8b's 24.2 s (the rest of the estimate
# 12.4 and 14.4 s).
NF4_QUANTIZE_S = 3.0
# Python hooks of FSDP per unit per forward/backward pass (PT#173680 measured ~1 ms per FSDP2 group).
HOOK_S_PER_UNIT = 1.0e-3
# AdamW on the CPU (CPU offload), parameters per second with foreach on a 16-core host. Assumption.
CPU_ADAMW_PARAMS_PER_S = 3.0e8
# Bytes the loss moves per logit element: the fp32 upcast, log-softmax forward, its backward and the
# nll gradient each read and write a T x V tensor (section 9 of fsdp-semantics.md).
LOSS_BYTES_PER_LOGIT = 40


def estimate_case_seconds(info, plan, world, steps):
    """Estimated wall seconds of one case (process start included). `plan` is a plan.ResolvedPlan and
    `info` the model-info subset of specs.py."""
    m = info["model"]
    tokens = plan.micro_batch * plan.seq_len
    matmul_params = info["params_matmul_active_per_token"]
    # fsdpsim's FLOP convention (models/model_flops.cpp): forward = 2 * matmul params + the attention
    # term 4 * layers * seq * heads * head_dim; causal kernels do about half of the attention term.
    attention_fwd = 4 * m["n_layers"] * plan.seq_len * m["n_heads"] * m["head_dim"] / 2
    forward = (2 * matmul_params + attention_fwd) * tokens
    ac = plan.checkpointing
    recompute = {"none": 0.0, "full": 1.0, "selective_op": 0.5, "every_k": 1.0 / max(ac.every_k, 1)}[ac.mode]
    flops = forward * (3.0 + recompute)
    rate = EFFECTIVE_FP32_FLOP_PER_S if plan.param_dtype == "fp32" else EFFECTIVE_BF16_FLOP_PER_S
    compute_s = flops / rate
    loss_s = 0.0 if plan.cross_entropy == "fused_linear" else tokens * m["vocab_size"] * LOSS_BYTES_PER_LOGIT / HBM_BYTES_PER_S
    units = m["n_layers"] + 1
    # The fake all-gather still copies every shard into the output (torch's FakeProcessGroup), so each
    # all-gather writes the unit's unsharded bytes: 2 per micro-batch (3 with checkpoint(FSDP(block))).
    gathers = 3 if ac.outside_fsdp else 2
    gather_s = gathers * info["params_total"] * 2 / HBM_BYTES_PER_S
    micro_s = compute_s + loss_s + gather_s + 2 * units * HOOK_S_PER_UNIT
    trained = info["params_total"] * plan.trainable_fraction
    if plan.lora:
        from . import lora
        trained = lora.trainable_params(m, plan.implementation, plan.lora)
    local_params = trained / max(plan.mesh_shard, 1)
    if plan.offload_params:
        optimizer_s = local_params / CPU_ADAMW_PARAMS_PER_S
    else:
        # AdamW reads and writes params, grads and two states in fp32: ~32 B per parameter (foreach
        # moves intermediates too: about twice that).
        optimizer_s = local_params * (32 if plan.optimizer_impl == "fused" else 64) / HBM_BYTES_PER_S
    step_s = plan.grad_accum * micro_s + optimizer_s
    fixed = FIXED_S + (COMPILE_S if plan.compile else 0.0)
    if plan.optimizer.startswith("torchao_"):
        fixed += TORCHAO_OPTIMIZER_COMPILE_S
    if plan.lora and plan.lora.get("quantize_base") == "nf4":
        fixed += NF4_QUANTIZE_S
    total = fixed + steps * step_s
    return {"total_s": round(total, 1), "step_s": round(step_s, 2), "fixed_s": fixed}

#!/usr/bin/env python3
"""Summarise a `scripts/gpu-validate.sh run` results folder as Markdown (written to stdout).

Reads device.txt, validate-NAME.json (fsdpsim validate --json), simulate-calibrated-NAME.json,
model-info-MODEL-SEQ.json, torch-NAME.json (scripts/torch_reference.py) and the gtest logs.
MFU here = the model's FLOPs per token (fsdpsim model-info, forward + backward, no recompute)
x tokens of the rank's step / measured step time / the GPU's dense bf16 peak.
"""
import glob
import json
import os
import re
import sys

PEAK = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "B200": 2250e12}


def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def pct(v):
    return "n/a" if v is None else f"{100 * v:+.1f}%"


def gib(b):
    return f"{b / 2**30:.2f}"


def main(out):
    dev = open(os.path.join(out, "device.txt")).read() if os.path.exists(os.path.join(out, "device.txt")) else ""
    gpu = next((l.strip() for l in dev.splitlines() if re.search(r"H100|H200|A100|B200", l) and "," in l), "?")
    peak = next((v for k, v in PEAK.items() if k in gpu), None)
    date = next((l.split(": ", 1)[1] for l in dev.splitlines() if l.startswith("date: ")), "?")
    build = next((l for l in dev.splitlines() if l.startswith("built ")), "?")
    print(f"# CUDA runtime validation on {gpu.split(',')[0]}, {date}\n")
    print(f"- Device (nvidia-smi name, driver, memory, max SM clock): {gpu}")
    print(f"- Build: {build}")
    print(f"- Command: `scripts/gpu-validate.sh run build-cuda/gpu-carry.tar.gz` (each case's own command is the first line of its validate-NAME.log)")
    for log in ("test_kernel_math.log", "test_gpu.log"):
        p = os.path.join(out, log)
        if os.path.exists(p):
            txt = open(p).read()
            res = [l.strip() for l in txt.splitlines() if re.match(r"\[\s+(PASSED|FAILED|SKIPPED)\s+\]", l.strip())]
            print(f"- {log}: " + ("; ".join(res[:6]) if res else "no gtest summary (crashed or timed out?)"))
    prof = load(os.path.join(out, "cuda-profile.json"))
    print(f"- Calibration: {'cuda-profile.json written' if prof else 'FAILED (calibrate.log)'}")
    print()
    print("Errors are (predicted - measured) / measured. Emulated worlds (w8): rank 0 of 8 ranks on this GPU with true shard "
          "sizes; collectives are local copies, so peak memory and compute are real but communication is not: "
          "their step-time error compares a prediction that includes NVLink collectives with a run that has none; "
          "compare the compute column there. Padded rows (--pad-collectives): each collective's local copy is followed "
          "by its predicted duration on its stream.\n")
    print("| case | world | peak alloc GiB pred / meas | err | peak reserved err | step s pred / meas | err | compute s pred / meas | err "
          "| step err, calibrated profile | MFU (measured) | losses |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in sorted(glob.glob(os.path.join(out, "validate-*.json"))):
        name = os.path.basename(p)[len("validate-"):-len(".json")]
        j = load(p)
        if not j:
            print(f"| {name} | | FAILED (validate-{name}.log) |||||||||")
            continue
        c, run = j["comparison"], j["run"]
        pr, me = c["predicted"], c["measured"]
        plan = run["plan"]
        world = run.get("emulated_world") or run.get("ranks")
        cal = load(os.path.join(out, f"simulate-calibrated-{name}.json"))
        cal_err = None
        if cal:
            r = cal.get("result", cal)
            t = r.get("step_time_s")
            if t is not None and me["step_time_s"] > 0:
                cal_err = (t - me["step_time_s"]) / me["step_time_s"]
        mfu = "n/a"
        mi = load(os.path.join(out, f"model-info-{run['model']}-{plan['seq_len']}.json"))
        if mi and peak and me["step_time_s"] > 0:
            tokens = plan["micro_batch"] * plan["seq_len"] * plan.get("grad_accum", 1)
            mfu = f"{100 * mi['flops_per_token_fwdbwd'] * tokens / me['step_time_s'] / peak:.1f}%"
        cerr = None if me["compute_s"] <= 0 else (pr["compute_s"] - me["compute_s"]) / me["compute_s"]
        losses = ", ".join(f"{x:.4f}" for x in j.get("losses", []))
        print(f"| {name} | {world}{' (emulated' + (', padded' if run.get('collectives_padded') else '') + ')' if run.get('emulated_world') else ''} | {gib(pr['peak_allocated_bytes'])} / "
              f"{gib(me['peak_allocated_bytes'])} | {pct(c['peak_allocated_error'])} | {pct(c['peak_reserved_error'])} | "
              f"{pr['step_time_s']:.4f} / {me['step_time_s']:.4f} | {pct(c['step_time_error'])} | "
              f"{pr['compute_s']:.4f} / {me['compute_s']:.4f} | {pct(cerr)} | {pct(cal_err)} | {mfu} | {losses} |")
    refs = sorted(glob.glob(os.path.join(out, "torch-*.json")))
    if refs:
        print("\nPyTorch reference on the same GPU (scripts/torch_reference.py: one GPU, no FSDP, SDPA attention, bf16 "
              "parameters; median of 10 steps after 3 warm-ups):\n")
        print("| reference | model | micro-batch x seq | AC | timed | step s | tokens/s | MFU | peak alloc GiB | torch |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for p in refs:
            t = load(p)
            if not t:
                continue
            print(f"| {os.path.basename(p)[6:-5]} | {t['model']} | {t['micro_batch']} x {t['seq_len']} | "
                  f"{t['activation_checkpointing']} | {t['timed']} | {t['step_time_s_median']:.4f} | {t['tokens_per_s']:.0f} | "
                  f"{100 * t['mfu']:.1f}% | {t['peak_allocated_gib']:.2f} | {t['torch']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

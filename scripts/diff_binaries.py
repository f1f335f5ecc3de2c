#!/usr/bin/env python3
"""Differential check of two fsdpsim binaries (a refactor must not change a single output byte).

Runs `fsdpsim --deterministic simulate --json OUT [--trace TRACE]` with both binaries over N random plans
(every plan key with a spread of values, some invalid on purpose: then both must fail the same way) and
compares the outputs, the context block aside. Usage:

    scripts/diff_binaries.py OLD_BINARY NEW_BINARY [--plans N] [--seed S] [--trace] [--jobs J]
Exit 0 when every output is identical, 1 otherwise (the first differences are printed).
"""
import argparse
import concurrent.futures as cf
import json
import os
import random
import subprocess
import sys
import tempfile

MODELS = ["tiny-llama", "llama-1b", "llama3-8b", "gpt2", "gemma-2b", "mixtral-8x7b", "llama3-70b", "mpt-125m"]
CLUSTERS = ["8xH100-SXM", "2x8xH100-SXM-IB-NDR400", "4x8xA100-40GB-IB-HDR200", "2x8xH100-SXM-ETH-10G", "1xH100-SXM"]


def random_plan(rng):
    one = rng.choice
    j = {}
    fsdp1 = rng.random() < 0.35
    j["fsdp_version"] = 1 if fsdp1 else 2
    if fsdp1:
        j["sharding_strategy"] = one(["FULL_SHARD", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                      "_HYBRID_SHARD_ZERO2"])
        j["backward_prefetch"] = one(["BACKWARD_PRE", "BACKWARD_POST", "NONE"])
        j["forward_prefetch"] = rng.random() < 0.5
        j["limit_all_gathers"] = rng.random() < 0.5
        j["use_orig_params"] = rng.random() < 0.75
    else:
        r = rng.randrange(5)
        if r == 1:
            j["reshard_after_forward"] = False
        if r == 2:
            j["reshard_after_forward"] = one([2, 4, 8])
        if rng.random() < 0.25:
            j["prefetch_depth"] = rng.randint(1, 3)
        if rng.random() < 0.2:
            j["forward_prefetch"] = True
        if rng.random() < 0.15:
            j["sharding_strategy"] = one(["HYBRID_SHARD", "NO_SHARD", "_HYBRID_SHARD_ZERO2"])
        if rng.random() < 0.15:
            j["fp8_all_gather"] = True
    ac = rng.randrange(7)
    if ac == 1:
        j["activation_checkpointing"] = "full"
    if ac == 2:
        j["activation_checkpointing"] = "selective_op"
    if ac == 3:
        j["activation_checkpointing"] = "every_%d" % rng.randint(2, 4)
    if ac == 4:
        j["activation_checkpointing"] = {"mode": "full", "outside_fsdp": True}
    if rng.random() < 0.25:
        j["param_dtype"] = one(["fp32", "fp16", "bf16"])
    if rng.random() < 0.25:
        j["reduce_dtype"] = one(["bf16", "fp16", "fp32"])
    if rng.random() < 0.15:
        j["master_weights_dtype"] = "bf16"
    j["micro_batch"] = rng.randint(1, 4)
    j["seq_len"] = 256 * rng.randint(1, 16)
    j["grad_accum"] = one([1, 1, 2, 3, 4, 8])
    j["grad_sync"] = rng.random() < 0.5
    off = rng.randrange(10)
    if off == 1:
        j["cpu_offload"] = True
    if off == 2:
        j["cpu_offload"] = {"params": False, "optimizer": True}
    if rng.random() < 0.15:
        j["trainable_fraction"] = one([0.01, 0.1, 0.5])
    if rng.random() < 0.2:
        j["optimizer"] = "sgd"
    w = rng.randrange(8)
    if w == 1:
        j["auto_wrap_policy"] = "none"
    if w == 2:
        j["auto_wrap_policy"] = {"min_num_params": one([10**6, 10**8, 10**9])}
    if rng.random() < 0.2:
        j["cross_entropy"] = one(["torch", "fused", "fused_linear"])
    return j


def run(binary, model, cluster, plan, trace, tmp, tag):
    # Each run in its own directory with the same relative file names, so that the command lines (in the
    # outputs' context blocks) are the same for both binaries; the context's binary path and git sha differ.
    cwd = os.path.join(tmp, tag)
    os.makedirs(cwd, exist_ok=True)
    args = [binary, "--deterministic", "simulate", "--model", model, "--cluster", cluster, "--plan",
            json.dumps(plan), "--json", "out.json"]
    if trace:
        args += ["--trace", "trace.json"]
    p = subprocess.run(args, capture_output=True, text=True, cwd=cwd)
    res = {"rc": p.returncode, "stdout": [l for l in p.stdout.split("\n") if not l.startswith("# fsdpsim ")], "stderr": p.stderr}
    for name in ("out.json", "trace.json"):
        path = os.path.join(cwd, name)
        if os.path.exists(path):
            with open(path) as f:
                doc = json.load(f)
            doc.pop("context", None)        # simulate JSON: the context block
            doc.pop("otherData", None)      # trace JSON: the context block
            res[name] = doc
            os.remove(path)
    os.rmdir(cwd)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--plans", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--trace", action="store_true", help="also compare the trace files (every op)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    cases = [(rng.choice(MODELS), rng.choice(CLUSTERS), random_plan(rng)) for _ in range(a.plans)]
    tmp = tempfile.mkdtemp(prefix="fsdpsim-diff-")

    def check(i):
        model, cluster, plan = cases[i]
        x = run(a.old, model, cluster, plan, a.trace, tmp, "old%d" % i)
        y = run(a.new, model, cluster, plan, a.trace, tmp, "new%d" % i)
        return i, x == y, x["rc"]

    bad, ok_runs = [], 0
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        for i, same, rc in ex.map(check, range(len(cases))):
            ok_runs += rc == 0
            if not same:
                bad.append(i)
    print("%d plans (%d simulated, %d rejected by both), %d differ" % (len(cases), ok_runs, len(cases) - ok_runs, len(bad)))
    for i in bad[:10]:
        print("  differs:", cases[i][0], cases[i][1], json.dumps(cases[i][2]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

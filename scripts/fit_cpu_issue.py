#!/usr/bin/env python3
"""Fits the built-in profiles' CPU cost per op (overheads.kernel_launch_ns) on the measured per-op fixtures.

What it fits. fsdpsim's CPU issues op i of a step in cpu_hooks(i) x framework_hook_ns + kernel_launches(i) x
kernel_launch_ns (sim/profile_cost_model.cpp cpu_issue_time). An eager PyTorch step whose GPU work is short is
bound by that CPU time: its wall clock is the CPU's issue time, the GPU waiting. The per-op fixtures
(tests/fixtures/torch_ops/*.ops.json, PyTorch on a lent GPU, fake process group) record the step's wall clock
without the profiler and the GPU's busy time. A fixture is CPU-bound here when its wall clock is at least 1.5x
its GPU busy time; compiled ones are left out (their CPU time is guards and graph launches, not eager ops).

For each CPU-bound fixture the simulator counts the step's launches and hooks: it is run with kernel_launch_ns
= 1 ms and no hook cost, then with framework_hook_ns = 1 ms and no launch cost, and its trace's cpu_issue spans
summed. With framework_hook_ns kept at the profile's value (an assumption the fixtures cannot separate from the
per-op cost: their launch and hook counts are nearly proportional), the least-squares kernel_launch_ns is
    L = sum(launches_i x (wall_i - hooks_i x H)) / sum(launches_i^2).

Usage: scripts/fit_cpu_issue.py [--fsdpsim build/fsdpsim] [--fixtures tests/fixtures/torch_ops] [--check TOL]
Prints each fixture's counts and the fitted value; nothing is written. With --check TOL (the CTest
validation_cpu_issue_fit) it exits 1 unless the built-in profile's kernel_launch_ns is within the relative
tolerance TOL of the fit: a change of the lowering's op counts, or a new fixture, then asks for a refit.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_memory import plan as plans  # noqa: E402

CPU_BOUND = 1.5   # wall clock / GPU busy at or above which a step counts as CPU-bound


def profile_with(fsdpsim, cluster, launch_ns, hook_ns, tmp):
    """The cluster's built-in profile with the two CPU costs replaced, as a file; (path, profile)."""
    out = subprocess.run([fsdpsim, "profile", "show", cluster, "--json"], capture_output=True, text=True, check=True)
    prof = json.loads(out.stdout)
    prof["gpu"]["overheads"]["kernel_launch_ns"]["value"] = launch_ns
    prof["gpu"]["overheads"]["framework_hook_ns"]["value"] = hook_ns
    path = os.path.join(tmp, f"profile-{launch_ns}-{hook_ns}.json")
    with open(path, "w") as f:
        json.dump(prof, f)
    return path, prof


def cpu_issue_us(fsdpsim, case, profile, tmp):
    """The simulated step's CPU issue time (us): the sum of its trace's cpu_issue spans."""
    plan = plans.explicit_plan({k: v for k, v in case["plan"].items() if v is not None})
    trace = os.path.join(tmp, "trace.json")
    subprocess.run([fsdpsim, "simulate", "--model", case["model"], "--cluster", case["cluster"], "--plan",
                    json.dumps(plan), "--profile", profile, "--trace", trace], capture_output=True, text=True, check=True)
    with open(trace) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    return sum(e.get("dur", 0) for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_issue")


def fit_launch_ns(rows, hook_ns):
    """Least-squares kernel_launch_ns (ns) through rows of (name, wall_ms, busy_ms, launches, hooks)."""
    num = den = 0.0
    for _, wall, _, launches, hooks in rows:
        rest_ms = wall - hooks * hook_ns / 1e6
        num += launches * rest_ms
        den += launches * launches
    return 1e6 * num / den


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fsdpsim", default="build/fsdpsim")
    ap.add_argument("--fixtures", default="tests/fixtures/torch_ops")
    ap.add_argument("--check", type=float, metavar="TOL",
                    help="exit 1 unless the profile's kernel_launch_ns is within TOL (relative) of the fit")
    a = ap.parse_args()
    rows, rows_cluster = [], None
    with tempfile.TemporaryDirectory(prefix="fit-cpu-issue-") as tmp:
        for path in sorted(glob.glob(os.path.join(a.fixtures, "*.ops.json"))):
            with open(path) as f:
                fx = json.load(f)
            case = fx["case"]
            walls = fx["step_wall_unprofiled_s"]
            wall_ms = 1e3 * sum(walls) / len(walls)
            busy_ms = fx["device_busy_us_per_step"] / 1e3
            bound = wall_ms >= CPU_BOUND * busy_ms and not case["plan"].get("compile")
            if not bound:
                print(f"{case['name']:40s} wall {wall_ms:7.1f} ms, GPU busy {busy_ms:7.1f} ms: not CPU-bound eager, left out")
                continue
            p_launch, _ = profile_with(a.fsdpsim, case["cluster"], 1_000_000, 0, tmp)
            p_hook, _ = profile_with(a.fsdpsim, case["cluster"], 0, 1_000_000, tmp)
            launches = cpu_issue_us(a.fsdpsim, case, p_launch, tmp) / 1000.0
            hooks = cpu_issue_us(a.fsdpsim, case, p_hook, tmp) / 1000.0
            rows.append((case["name"], wall_ms, busy_ms, launches, hooks))
            rows_cluster = case["cluster"]
    if not rows:
        print("no CPU-bound eager fixture")
        return 1
    out = subprocess.run([a.fsdpsim, "profile", "show", rows_cluster, "--json"], capture_output=True, text=True, check=True)
    overheads = json.loads(out.stdout)["gpu"]["overheads"]
    hook_ns = overheads["framework_hook_ns"]["value"]
    for name, wall, busy, launches, hooks in rows:
        rest_ms = wall - hooks * hook_ns / 1e6
        print(f"{name:40s} wall {wall:7.1f} ms, GPU busy {busy:7.1f} ms: {launches:.0f} launches, {hooks:.0f} hooks "
              f"-> {1e3 * rest_ms / launches:.1f} us per launch alone")
    fit_ns = fit_launch_ns(rows, hook_ns)
    print(f"framework_hook_ns kept at {hook_ns} ns (the {rows_cluster} profile's); least-squares kernel_launch_ns = "
          f"{fit_ns:.0f} ns ({len(rows)} fixtures)")
    if a.check is not None:
        have = overheads["kernel_launch_ns"]["value"]
        off = abs(have - fit_ns) / fit_ns
        print(f"the {rows_cluster} profile's kernel_launch_ns: {have} ns ({100 * off:.1f}% from the fit, tolerance "
              f"{100 * a.check:.1f}%)")
        if off > a.check:
            print("refit: put the fitted value in calibrate/profiles/gpus/*.json (kernel_launch_ns)")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

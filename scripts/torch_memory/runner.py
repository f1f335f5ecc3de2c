"""Runs the matrix: one fresh process per case (PYTORCH_CUDA_ALLOC_CONF is read at CUDA's initialization),
in matrix order, skipping cases whose fixture already exists for the same plan (resume), inside a time
budget (a device call is limited to 10 minutes: the runner starts a case only when its estimate fits the
time left, and stops the case at the budget's end). This process never initializes CUDA: a context here
would take device memory from the cases.
"""
import datetime
import os
import re
import subprocess
import sys
import time

from . import estimate, fixture as fixtures, matrix as matrices
from .common import InputError, write_json_atomic

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch_memory_reference.py")
SMOKE_MATRIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smoke_matrix.json")
SAFETY = 1.5                # a case starts when 1.5 x its estimate fits the time left
CASE_TIMEOUT_FACTOR = 4     # and is stopped after 4 x its estimate (+ CASE_TIMEOUT_EXTRA_S)
CASE_TIMEOUT_EXTRA_S = 60
SMOKE_TIMEOUT_S = 420
TAIL_LINES = 25
# A fault common to every case (a PyTorch API the harness misreads) fails each case in seconds; after this
# many errors in a row the runner stops rather than spend the device lease on the rest.
MAX_ERRORS_IN_A_ROW = 3


def _tail(text, n=TAIL_LINES):
    return "\n".join(text.strip().splitlines()[-n:])


def _case_env(alloc_conf):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)     # the newer name, read first by recent PyTorch
    if alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    return env


def _run(cmd, env, timeout, log_path):
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc = "timeout"
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        out += (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    with open(log_path, "w", encoding="utf-8") as f:
        f.write("+ " + " ".join(cmd) + "\n" + out)
    return rc, out, round(time.monotonic() - t0, 1)


def run_smoke(log_dir, git_sha, timeout=SMOKE_TIMEOUT_S):
    """tiny-llama and GPT-2 through every code path in one process (seconds each): a broken path shows up
    here before the matrix spends minutes on it."""
    out_dir = os.path.join(log_dir, "smoke_fixtures")
    cmd = [sys.executable, SCRIPT, "run-smoke", "--out", out_dir, "--git-sha", git_sha]
    rc, out, seconds = _run(cmd, _case_env(""), timeout, os.path.join(log_dir, "smoke.log"))
    print(_tail(out, 60), flush=True)
    passed = re.search(r"^smoke: (\d+) of (\d+) passed", out, re.M)
    return {"rc": rc, "seconds": seconds, "passed": int(passed.group(1)) if passed else 0}


def run_matrix(matrix_path, fixtures_dir, log_dir, budget_s, git_sha, only=None, smoke=True):
    if budget_s <= 0:
        raise InputError("--budget-s", str(budget_s), "a positive number of seconds")
    entries, steps = matrices.load_matrix(matrix_path)
    names = {case["name"] for case, _, _ in entries}
    for name in only or ():
        if name not in names:
            raise InputError("--only", name, "not a case of the matrix")
    os.makedirs(log_dir, exist_ok=True)
    start = time.monotonic()
    summary = {"matrix": os.path.relpath(matrix_path), "started": datetime.datetime.now(datetime.timezone.utc)
               .strftime("%Y-%m-%dT%H:%M:%SZ"), "budget_s": budget_s, "git_sha": git_sha, "cases": []}
    stopped = None
    if smoke:
        summary["smoke"] = run_smoke(log_dir, git_sha, timeout=min(SMOKE_TIMEOUT_S, budget_s))
        if summary["smoke"]["passed"] == 0:
            stopped = "not started (no smoke case passed: see smoke.log)"
    errors_in_a_row = 0
    for case, info, p in entries:
        name = case["name"]
        if only and name not in only:
            continue
        record = {"name": name}
        summary["cases"].append(record)
        if stopped:
            record["status"] = stopped
            continue
        path = os.path.join(fixtures_dir, f"{name}.json")
        if os.path.exists(path):
            try:
                if fixtures.measured_case_matches(fixtures.read_fixture(path), case):
                    record["status"] = "done earlier"
                    continue
            except InputError as e:
                record["previous_fixture"] = f"unreadable, measured again: {e}"
        est = estimate.estimate_case_seconds(info, p, case["world"], steps)["total_s"]
        record["estimate_s"] = est
        left = budget_s - (time.monotonic() - start)
        if est * SAFETY > left:
            record["status"] = "not started (budget)"
            continue
        cmd = [sys.executable, SCRIPT, "run-case", "--matrix", matrix_path, "--case", name, "--out", fixtures_dir,
               "--git-sha", git_sha, "--steps", str(steps)]
        timeout = max(10.0, min(est * CASE_TIMEOUT_FACTOR + CASE_TIMEOUT_EXTRA_S, left))
        rc, out, seconds = _run(cmd, _case_env(p.alloc_conf), timeout, os.path.join(log_dir, f"{name}.log"))
        record.update(rc=rc, seconds=seconds)
        if rc == 0 and os.path.exists(path):
            record["status"] = fixtures.read_fixture(path)["outcome"]
            errors_in_a_row = 0
        else:
            record["status"] = "error"
            record["tail"] = _tail(out)
            errors_in_a_row += 1
            if errors_in_a_row >= MAX_ERRORS_IN_A_ROW:
                stopped = f"not started ({MAX_ERRORS_IN_A_ROW} errors in a row before it)"
        print(f"torch-memory: {name}: {record['status']} in {seconds} s (estimate {est} s)", flush=True)
    summary["seconds"] = round(time.monotonic() - start, 1)
    pending = [r["name"] for r in summary["cases"] if r.get("status", "").startswith("not started")]
    summary["complete"] = not pending and all(r.get("status") in ("ok", "oom", "done earlier") for r in summary["cases"])
    write_json_atomic(os.path.join(log_dir, "torch_memory_summary.json"), summary)
    _print_summary(summary, pending)
    return summary


def _print_summary(summary, pending):
    print("\ntorch-memory summary (seconds measured / estimated):")
    for r in summary["cases"]:
        print(f"  {r['name']:42s} {r.get('status', '?'):22s} {r.get('seconds', '-')!s:>7} / {r.get('estimate_s', '-')}")
        if r.get("status") == "error":
            print("    " + r["tail"].replace("\n", "\n    "))
    if pending:
        print(f"torch-memory: {len(pending)} case(s) left for the next call (run the same command again): "
              + ", ".join(pending))
    print("torch-memory: matrix complete" if summary["complete"] else "torch-memory: matrix NOT complete", flush=True)

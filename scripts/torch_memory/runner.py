"""Runs the matrix: one fresh process per case (PYTORCH_CUDA_ALLOC_CONF is read at CUDA's initialization),
in matrix order, skipping cases whose fixture already exists for the same plan (resume), inside a time
budget (a device call is limited to 10 minutes: the runner starts a case only when its estimate fits the
time left, and stops the case at the budget's end). This process never initializes CUDA: a context here
would take device memory from the cases.
"""
import datetime
import json
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
# Several cases on one GPU (--jobs): each is given its predicted reserved peak (schedule_hints.json, from
# `fsdpsim simulate`) x HINT_MARGIN + CONTEXT_GIB.
HINTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schedule_hints.json")
HINT_MARGIN = 1.3
CONTEXT_GIB = 2.0
DEFAULT_GPU_GIB = 79.0
POLL_S = 0.2


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


def _gpu_memory_gib():
    """The device's memory from nvidia-smi (this process never initializes CUDA); None if unknown."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        return float(out[0]) / 1024.0 if out else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def load_hints(path=HINTS_PATH):
    """{case: predicted reserved GiB} for packing cases onto one GPU (a scheduling hint only: the fixtures
    never depend on it; a case without a hint runs alone)."""
    if not path or not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return {k: float(v) for k, v in data.get("reserved_gib", {}).items()}


def case_need_gib(hint):
    """Device memory one case's process is given room for next to others: its predicted reserved peak
    plus a margin for a misprediction, and its CUDA context and cuBLAS workspace."""
    return None if hint is None else hint * HINT_MARGIN + CONTEXT_GIB


def run_matrix(matrix_path, fixtures_dir, log_dir, budget_s, git_sha, only=None, smoke=True, jobs=1,
               gpu_gib=None, hints=None, trace=True):
    """jobs == 1: one case at a time in matrix order. jobs > 1: up to `jobs` case processes share the GPU
    while their predicted memory (hints) fits it; a case without a hint, or predicted larger than the GPU,
    runs alone; a case that runs out of memory next to others is measured again alone (an OOM next to other
    processes is not the case's own)."""
    if budget_s <= 0:
        raise InputError("--budget-s", str(budget_s), "a positive number of seconds")
    if jobs < 1:
        raise InputError("--jobs", str(jobs), "at least 1")
    entries, steps = matrices.load_matrix(matrix_path)
    names = {case["name"] for case, _, _ in entries}
    for name in only or ():
        if name not in names:
            raise InputError("--only", name, "not a case of the matrix")
    os.makedirs(log_dir, exist_ok=True)
    start = time.monotonic()
    summary = {"matrix": os.path.relpath(matrix_path), "started": datetime.datetime.now(datetime.timezone.utc)
               .strftime("%Y-%m-%dT%H:%M:%SZ"), "budget_s": budget_s, "git_sha": git_sha, "jobs": jobs, "cases": []}
    stopped = None
    if smoke:
        summary["smoke"] = run_smoke(log_dir, git_sha, timeout=min(SMOKE_TIMEOUT_S, budget_s))
        if summary["smoke"]["passed"] == 0:
            stopped = "not started (no smoke case passed: see smoke.log)"
    hints = load_hints() if hints is None and jobs > 1 else (hints or {})
    if jobs > 1:
        gpu_gib = gpu_gib or _gpu_memory_gib() or DEFAULT_GPU_GIB
        summary["gpu_gib"] = round(gpu_gib, 1)
    queue = []
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
        record["estimate_s"] = estimate.estimate_case_seconds(info, p, case["world"], steps)["total_s"]
        need = case_need_gib(hints.get(name)) if jobs > 1 else None
        alone = jobs == 1 or need is None or need > gpu_gib
        queue.append({"record": record, "case": case, "plan": p, "path": path, "need": need, "alone": alone})
    if jobs > 1:   # cases that run alone first, then the largest first (they pack best)
        queue.sort(key=lambda q: (not q["alone"], -(q["need"] or 0)))
    running, errors_in_a_row = [], 0

    def used():
        return sum(r["need"] or 0 for r in running)

    def can_start(q):
        if not running:
            return True
        if q["alone"] or any(r["alone"] for r in running) or len(running) >= jobs:
            return False
        return used() + q["need"] <= gpu_gib

    def launch(q):
        rec, name = q["record"], q["case"]["name"]
        left = budget_s - (time.monotonic() - start)
        cmd = [sys.executable, SCRIPT, "run-case", "--matrix", matrix_path, "--case", name, "--out", fixtures_dir,
               "--git-sha", git_sha, "--steps", str(steps)] + ([] if trace else ["--no-trace"])
        q["timeout"] = max(10.0, min(rec["estimate_s"] * CASE_TIMEOUT_FACTOR + CASE_TIMEOUT_EXTRA_S, left))
        q["log"] = open(os.path.join(log_dir, f"{name}.log"), "w", encoding="utf-8")
        q["log"].write("+ " + " ".join(cmd) + "\n")
        q["log"].flush()
        q["t0"] = time.monotonic()
        q["beside"] = [r["case"]["name"] for r in running]
        q["proc"] = subprocess.Popen(cmd, env=_case_env(q["plan"].alloc_conf), stdout=q["log"], stderr=subprocess.STDOUT)
        running.append(q)

    def finish(q, rc):
        nonlocal errors_in_a_row, stopped
        q["log"].close()
        rec, name = q["record"], q["case"]["name"]
        seconds = round(time.monotonic() - q["t0"], 1)
        rec.update(rc=rc, seconds=seconds)
        if q["beside"]:
            rec["ran_beside"] = q["beside"]
        with open(os.path.join(log_dir, f"{name}.log"), encoding="utf-8", errors="replace") as f:
            out = f.read()
        if rc == 0 and os.path.exists(q["path"]):
            written = fixtures.read_fixture(q["path"])
            rec["status"] = written["outcome"]
            flagged = [n for n in written.get("notes", []) if n.startswith("init memory check")]
            if flagged:     # train.py: memory after sharding is not what the sharded model accounts for
                rec["init_memory_check"] = flagged[0]
            errors_in_a_row = 0
            if rec["status"] == "oom" and q["beside"] and not q.get("retried"):
                rec["status"] = "oom beside other cases: measured again alone"
                q.update(alone=True, retried=True)
                queue.insert(0, q)
        else:
            rec["status"] = "error"
            rec["tail"] = _tail(out)
            errors_in_a_row += 1
            if errors_in_a_row >= MAX_ERRORS_IN_A_ROW and not stopped:
                stopped = f"not started ({MAX_ERRORS_IN_A_ROW} errors in a row before it)"
        print(f"torch-memory: {name}: {rec['status']} in {seconds} s (estimate {rec['estimate_s']} s)", flush=True)
        if rec.get("init_memory_check"):
            print(f"torch-memory: {name}: {rec['init_memory_check']}", flush=True)

    while queue or running:
        for q in list(running):
            rc = q["proc"].poll()
            if rc is None and time.monotonic() - q["t0"] > q["timeout"]:
                q["proc"].kill()
                q["proc"].wait()
                rc = "timeout"
            if rc is not None:
                running.remove(q)
                finish(q, rc)
        while queue:
            q = queue[0]
            if stopped:
                q["record"]["status"] = stopped
                queue.pop(0)
                continue
            left = budget_s - (time.monotonic() - start)
            if q["record"]["estimate_s"] * SAFETY > left:
                q["record"]["status"] = "not started (budget)"
                queue.pop(0)
                continue
            if not can_start(q):
                # jobs > 1: a later, smaller case may fit beside the running ones
                later = next((r for r in queue[1:] if can_start(r) and
                              r["record"]["estimate_s"] * SAFETY <= left), None) if jobs > 1 and running else None
                if later is None:
                    break
                q = later
            queue.remove(q)
            launch(q)
        if running:
            time.sleep(POLL_S)
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
        if r.get("init_memory_check"):
            print("    " + r["init_memory_check"])
    if pending:
        print(f"torch-memory: {len(pending)} case(s) left for the next call (run the same command again): "
              + ", ".join(pending))
    print("torch-memory: matrix complete" if summary["complete"] else "torch-memory: matrix NOT complete", flush=True)

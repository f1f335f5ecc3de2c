#!/usr/bin/env python3
"""PyTorch's own memory as ground truth for fsdpsim (issue 19).

Builds fsdpsim's models in a framework's recipe, shards them with FSDP1 or FSDP2 over a fake world of W
ranks on one GPU, trains a few steps and writes one fixture per case (tests/fixtures/torch_memory/). The
CTest test_torch_memory_fixtures compares the simulator with every fixture.

  run-matrix   the whole matrix (scripts/torch_memory_matrix.json) with skip/resume and a time budget:
               what scripts/gpu-validate.sh torch-memory runs on a lent GPU
  run-case     one case in this process (PYTORCH_CUDA_ALLOC_CONF must already be the plan's)
  run-smoke    tiny models through every code path in one process
  check-matrix the matrix without PyTorch: plans, models, recipes; --simulate BIN also asks the simulator
  estimate     the matrix's estimated device time per case
  check-fixtures  every fixture of a folder against tests/fixtures/torch_memory/schema.json
  refresh-models  scripts/torch_memory/models/*.json from `fsdpsim model-info --json`

Bad input exits 2 with the field named (as fsdpsim does); a matrix that is not complete exits 1.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_memory import fixture as fixtures, matrix as matrices, plan as plans, runner, specs  # noqa: E402
from torch_memory.common import EXIT_BAD_INPUT, InputError, load_json  # noqa: E402

EXIT_SKIP = 77      # CTest SKIP_RETURN_CODE: the simulator does not accept an issue-19 key yet


def _find_case(matrix_path, name, models_dir):
    entries, steps = matrices.load_matrix(matrix_path, models_dir)
    for case, info, p in entries:
        if case["name"] == name:
            return case, info, p, steps
    raise InputError("--case", json.dumps(name), "not a case of " + os.path.relpath(matrix_path))


def cmd_run_case(a):
    # PYTORCH_CUDA_ALLOC_CONF is read when CUDA initializes: check it before PyTorch is imported.
    case, info, p, steps = _find_case(a.matrix, a.case, a.models_dir)
    from torch_memory import train
    path = train.run_case(case, info, p, a.steps or steps, a.out, a.git_sha, trace=not a.no_trace)
    print(f"torch_memory_reference: wrote {path}")
    return 0


def cmd_run_smoke(a):
    import traceback
    entries, steps = matrices.load_matrix(runner.SMOKE_MATRIX, a.models_dir)
    from torch_memory import train
    failed = []
    for case, info, p in entries:
        if p.alloc_conf != os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            raise InputError(f"smoke case {case['name']}: plan.alloc_conf", repr(p.alloc_conf), "the smoke test runs in one process")
        try:
            path = train.run_case(case, info, p, steps, a.out, a.git_sha)
            print(f"smoke {case['name']}: PASS ({fixtures.read_fixture(path)['outcome']})", flush=True)
        except Exception:   # one broken path must not hide the others
            failed.append(case["name"])
            print(f"smoke {case['name']}: FAIL\n" + "".join(traceback.format_exc().splitlines(True)[-12:]), flush=True)
    print(f"smoke: {len(entries) - len(failed)} of {len(entries)} passed" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def cmd_run_matrix(a):
    only = [s for s in a.only.split(",") if s] if a.only else None
    log_dir = a.log_dir or tempfile.mkdtemp(prefix="torch-memory-")
    summary = runner.run_matrix(a.matrix, a.out, log_dir, a.budget_s, a.git_sha, only=only, smoke=not a.no_smoke,
                                 jobs=a.jobs, gpu_gib=a.gpu_gib, trace=not a.no_trace)
    print(f"torch_memory_reference: logs and torch_memory_summary.json in {log_dir}")
    return 0 if summary["complete"] else 1


def _simulate(fsdpsim, case, json_out=None):
    """`fsdpsim simulate` of one matrix case on the H100 cluster of its world."""
    cmd = [fsdpsim, "simulate", "--model", case["model"], "--cluster", matrices.cluster_name(case["world"], "H100-SXM"),
           "--plan", json.dumps(plans.explicit_plan(case["plan"]))]
    return subprocess.run(cmd + (["--json", json_out] if json_out else []), capture_output=True, text=True)


def cmd_check_matrix(a):
    entries, steps = matrices.load_matrix(a.matrix, a.models_dir)
    print(f"{os.path.relpath(a.matrix)}: {len(entries)} cases, {steps} steps each, every plan valid")
    if not a.simulate:
        return 0
    rejected, failures = [], []
    for case, info, p in entries:
        proc = _simulate(a.simulate, case)
        if proc.returncode == 0:
            continue
        message = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        pending = [k for k in plans.NEW_KEYS if f"plan.{k}" in message]
        if proc.returncode == EXIT_BAD_INPUT and pending:
            rejected.append((case["name"], pending[0], message))
        else:
            failures.append((case["name"], message))
    for name, message in failures:
        print(f"simulate rejects {name}: {message}")
    if failures:
        return 1
    if rejected:
        keys = sorted({k for _, k, _ in rejected})
        print(f"SKIPPED: the simulator does not accept the issue-19 plan key(s) {', '.join(keys)} yet "
              f"({len(rejected)} of {len(entries)} cases; first: {rejected[0][2]}). The round-trip runs once the "
              "lowering lands them.")
        return EXIT_SKIP
    print(f"simulate accepts all {len(entries)} plans")
    return 0


def cmd_profile_ops(a):
    """Per-op timing (issue 20): each case alone in a fresh process, its memory run (no trace) then profiled
    steps; writes OUT/<case>.ops.json. Stops starting cases after --budget-s."""
    import time
    names = [s for s in a.cases.split(",") if s]
    entries = [_find_case(a.matrix, n, a.models_dir) for n in names]
    os.makedirs(a.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="profile-ops-")
    start, failed = time.monotonic(), []
    for case, info, p, steps in entries:
        left = a.budget_s - (time.monotonic() - start)
        if left < 20:
            print(f"profile-ops: {case['name']}: not started (budget)", flush=True)
            failed.append(case["name"])
            continue
        env = dict(runner._case_env(p.alloc_conf), FSDPSIM_TM_PROFILE_OPS=os.path.join(a.out, case["name"] + ".ops.json"))
        cmd = [sys.executable, os.path.abspath(__file__), "run-case", "--matrix", a.matrix, "--case", case["name"],
               "--out", scratch, "--git-sha", a.git_sha, "--steps", "2", "--no-trace"]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=left)
            ok, tail = proc.returncode == 0, (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        except subprocess.TimeoutExpired:
            ok, tail = False, ["timeout"]
        print(f"profile-ops: {case['name']}: {'ok' if ok else 'FAILED'} in {time.monotonic() - t0:.1f} s", flush=True)
        if not ok:
            failed.append(case["name"])
            print("    " + "\n    ".join(tail), flush=True)
    return 1 if failed else 0


def cmd_hints(a):
    entries, _ = matrices.load_matrix(a.matrix, a.models_dir)
    reserved = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sim.json")
        for case, info, p in entries:
            proc = _simulate(a.fsdpsim, case, out)
            if proc.returncode != 0:
                print(f"hints: {case['name']}: simulate exit {proc.returncode}; it will run alone", file=sys.stderr)
                continue
            peak = load_json(out, "simulate output")["result"]["peak_memory_bytes"]
            reserved[case["name"]] = round(peak["reserved"] / 2**30, 2)
    version = subprocess.run([a.fsdpsim, "--version"], capture_output=True, text=True).stdout.strip()
    doc = {"what": "predicted reserved peak (GiB) of each matrix case, used only to pack cases onto one GPU "
                   "(run-matrix --jobs); written by `torch_memory_reference.py hints`",
           "fsdpsim": version, "reserved_gib": reserved}
    from torch_memory.common import write_json_atomic
    write_json_atomic(runner.HINTS_PATH, doc)
    print(f"wrote {len(reserved)} hints into {os.path.relpath(runner.HINTS_PATH)}")
    return 0


def cmd_estimate(a):
    entries, steps = matrices.load_matrix(a.matrix, a.models_dir)
    rows, total = matrices.estimate_matrix(entries, steps)
    for name, r in rows:
        print(f"{name:42s} {r['total_s']:7.1f} s  (step {r['step_s']} s)")
    print(f"total {total:.0f} s = {total / 60:.1f} min estimated on one H100 (assumptions in scripts/torch_memory/estimate.py)")
    return 0


def cmd_check_fixtures(a):
    names = sorted(f for f in os.listdir(a.dir) if f.endswith(".json") and f != "schema.json")
    for f in names:
        fixture = load_json(os.path.join(a.dir, f), f)
        fixtures.validate_fixture(fixture, where=f, require_jsonschema=True)
    print(f"{len(names)} fixture(s) in {a.dir} valid against the schema")
    return 0


def cmd_add_repeats(a):
    changed = fixtures.add_repeats(a.dir, a.runs, a.conditions)
    print(f"added the runs of {a.runs} to {len(changed)} fixture(s): {', '.join(changed) or 'none'}")
    return 0


def cmd_refresh_models(a):
    specs.refresh(a.fsdpsim, a.models_dir)
    print(f"wrote {', '.join(specs.MODELS)} into {a.models_dir}")
    return 0


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    sub = ap.add_subparsers(dest="command", required=True)

    def common(p, matrix=True):
        if matrix:
            p.add_argument("--matrix", default=matrices.MATRIX_PATH, help="the plan matrix (default: %(default)s)")
        p.add_argument("--models-dir", default=specs.MODELS_DIR, help=argparse.SUPPRESS)
        return p

    p = common(sub.add_parser("run-case", help="one case in this process"))
    p.add_argument("--case", required=True)
    p.add_argument("--out", default=fixtures.FIXTURE_DIR, help="fixture folder (default: %(default)s)")
    p.add_argument("--steps", type=int, default=0, help="steps (default: the matrix's)")
    p.add_argument("--git-sha", default="unknown")
    p.add_argument("--no-trace", action="store_true", help="no memory history (the timeline is left out)")
    p.set_defaults(fn=cmd_run_case)
    p = common(sub.add_parser("run-smoke", help="tiny models through every code path"), matrix=False)
    p.add_argument("--out", required=True)
    p.add_argument("--git-sha", default="unknown")
    p.set_defaults(fn=cmd_run_smoke)
    p = common(sub.add_parser("run-matrix", help="the whole matrix with skip/resume and a budget"))
    p.add_argument("--out", default=fixtures.FIXTURE_DIR, help="fixture folder (default: %(default)s)")
    p.add_argument("--log-dir", help="per-case logs and torch_memory_summary.json (default: a new temporary folder)")
    p.add_argument("--budget-s", type=float, default=540.0, help="stop starting cases after this many seconds (default 540)")
    p.add_argument("--git-sha", default="unknown")
    p.add_argument("--only", help="comma-separated case names")
    p.add_argument("--no-smoke", action="store_true")
    p.add_argument("--no-trace", action="store_true",
                   help="no memory history in the cases (no timeline; the CPU runs at its own speed, which FSDP1's "
                        "reserved memory depends on: record_stream frees wait for the GPU)")
    p.add_argument("--jobs", type=int, default=1, help="case processes sharing the GPU, packed by their predicted "
                   "memory (scripts/torch_memory/schedule_hints.json); default 1")
    p.add_argument("--gpu-gib", type=float, help="the GPU's memory for --jobs (default: nvidia-smi's)")
    p.set_defaults(fn=cmd_run_matrix)
    p = common(sub.add_parser("profile-ops", help="per-op GPU time of cases (torch.profiler), one at a time"))
    p.add_argument("--cases", required=True, help="comma-separated case names")
    p.add_argument("--out", required=True, help="folder for <case>.ops.json")
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--git-sha", default="unknown")
    p.set_defaults(fn=cmd_profile_ops)
    p = common(sub.add_parser("hints", help="write schedule_hints.json from `fsdpsim simulate` (for --jobs)"))
    p.add_argument("--fsdpsim", default="build/fsdpsim")
    p.set_defaults(fn=cmd_hints)
    p = common(sub.add_parser("check-matrix", help="validate the matrix (no PyTorch)"))
    p.add_argument("--simulate", metavar="FSDPSIM", help="also run `FSDPSIM simulate` on every plan")
    p.set_defaults(fn=cmd_check_matrix)
    p = common(sub.add_parser("estimate", help="estimated device time"))
    p.set_defaults(fn=cmd_estimate)
    p = sub.add_parser("check-fixtures", help="validate fixtures against the schema (python3-jsonschema)")
    p.add_argument("--dir", default=fixtures.FIXTURE_DIR)
    p.set_defaults(fn=cmd_check_fixtures)
    p = sub.add_parser("add-repeats", help="add other runs of committed cases (a run-matrix --out folder) to their "
                       "fixtures' repeats: the comparison then takes the measured range")
    p.add_argument("--runs", required=True, help="the folder of the other runs' fixtures")
    p.add_argument("--conditions", required=True, help="how they were run (GPU sharing, memory history, ...)")
    p.add_argument("--dir", default=fixtures.FIXTURE_DIR)
    p.set_defaults(fn=cmd_add_repeats)
    p = common(sub.add_parser("refresh-models", help="rewrite the committed model specs"), matrix=False)
    p.add_argument("--fsdpsim", default="build/fsdpsim")
    p.set_defaults(fn=cmd_refresh_models)
    return ap


def main(argv=None):
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except InputError as e:
        print(f"torch_memory_reference: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())

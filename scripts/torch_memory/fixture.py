"""Fixture files: one JSON per measured case, tests/fixtures/torch_memory/<case>.json.

The format is tests/fixtures/torch_memory/schema.json (the single definition; the CTest checks every
committed fixture against it with python3-jsonschema). On the GPU machine jsonschema may be missing:
the writer then checks the keys the C++ reader needs and leaves the full check to the CTest.
"""
import os

from .common import InputError, load_json, show, write_json_atomic

SCHEMA_ID = "fsdpsim.torch_memory_fixture/1"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE_DIR = os.path.join(REPO_ROOT, "tests", "fixtures", "torch_memory")
SCHEMA_PATH = os.path.join(FIXTURE_DIR, "schema.json")
STEADY_FROM_STEP = 2      # steady state: every step after the first (optimizer state exists from step 1 on)
PHASES = ("init", "forward", "loss", "backward", "optimizer", "zero_grad")


def peaks_from_steps(steps):
    """First-step and steady-state peaks (max over steps >= 2) from the per-step records."""
    out = {}
    first = [s for s in steps if s["step"] == 1]
    if first:
        out["first_step"] = {"allocated_bytes": first[0]["peak_allocated_bytes"],
                             "reserved_bytes": first[0]["peak_reserved_bytes"]}
    steady = [s for s in steps if s["step"] >= STEADY_FROM_STEP]
    if steady:
        out["steady_state"] = {"allocated_bytes": max(s["peak_allocated_bytes"] for s in steady),
                               "reserved_bytes": max(s["peak_reserved_bytes"] for s in steady),
                               "steps": [s["step"] for s in steady]}
    return out


def steps_from_phases(phases):
    """Per-step peaks from the per-phase allocator statistics (the phases of a step partition it, so the
    step's peak is the largest phase peak)."""
    steps = {}
    for p in phases:
        if p["step"] < 1:
            continue
        s = steps.setdefault(p["step"], {"step": p["step"], "peak_allocated_bytes": 0, "peak_reserved_bytes": 0})
        s["peak_allocated_bytes"] = max(s["peak_allocated_bytes"], p["peak_allocated_bytes"])
        s["peak_reserved_bytes"] = max(s["peak_reserved_bytes"], p["peak_reserved_bytes"])
    return [steps[k] for k in sorted(steps)]


def build_fixture(context, case, outcome, steps, phases, timeline=None, allocator=None, oom=None):
    fixture = {"context": context, "schema": SCHEMA_ID, "case": case, "outcome": outcome, "steps": steps,
               "phases": phases}   # opens with the context block, as every fsdpsim output does
    peaks = peaks_from_steps(steps)
    if outcome == "ok":
        fixture["peaks"] = peaks
    elif peaks:
        fixture["peaks_before_oom"] = peaks
    if oom is not None:
        fixture["oom"] = oom
    if timeline is not None:
        fixture["timeline"] = timeline
    if allocator is not None:
        fixture["allocator"] = allocator
    return fixture


def _jsonschema():
    try:
        import jsonschema  # noqa: F401 (python3-jsonschema; present where the CTest runs)
        return jsonschema
    except ImportError:
        return None


def validate_fixture(fixture, where="fixture", schema_path=SCHEMA_PATH, require_jsonschema=False):
    """Raises InputError naming the file (`where`) and the field of the first problem."""
    js = _jsonschema()
    if js is None:
        if require_jsonschema:
            raise InputError(where, "<jsonschema>", "python3-jsonschema is missing: apt-get install -y python3-jsonschema")
        _minimal_check(fixture, where)
        return
    schema = load_json(schema_path, "schema")
    errors = sorted(js.Draft7Validator(schema).iter_errors(fixture), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        path = ".".join(str(p) for p in e.absolute_path)
        raise InputError(f"{where}:{path}" if path else where, show(e.instance), e.message)


def _minimal_check(fixture, where):
    if not isinstance(fixture, dict):
        raise InputError(where, show(fixture), "expected a JSON object")
    for key in ("schema", "context", "case", "outcome", "steps", "phases"):
        if key not in fixture:
            raise InputError(f"{where}:{key}", "<missing>", "required")
    if fixture["schema"] != SCHEMA_ID:
        raise InputError(f"{where}:schema", show(fixture["schema"]), f"expected {SCHEMA_ID}")
    if fixture["outcome"] not in ("ok", "oom"):
        raise InputError(f"{where}:outcome", show(fixture["outcome"]), "expected ok or oom")
    for key in ("name", "model", "cluster", "world", "plan"):
        if key not in fixture["case"]:
            raise InputError(f"{where}:case.{key}", "<missing>", "required")
    if fixture["outcome"] == "ok":
        for key in ("first_step", "steady_state"):
            if key not in fixture.get("peaks", {}):
                raise InputError(f"{where}:peaks.{key}", "<missing>", "required when outcome is ok")


def write_fixture(fixture, directory=FIXTURE_DIR):
    name = fixture["case"]["name"]
    path = os.path.join(directory, f"{name}.json")
    validate_fixture(fixture, where=f"{name}.json")
    write_json_atomic(path, fixture)
    return path


def read_fixture(path):
    fixture = load_json(path, os.path.basename(path))
    validate_fixture(fixture, where=os.path.basename(path))
    return fixture


def measured_case_matches(fixture, case):
    """True when a fixture on disk was measured for this matrix case as it stands (same model, world and
    plan): the runner then skips the case (resume)."""
    c = fixture.get("case", {})
    return (c.get("model") == case["model"] and c.get("world") == case["world"]
            and c.get("matrix_plan", c.get("plan")) == case["plan"])


def repeat_entry(run, conditions):
    """What `repeats` keeps of another run of a fixture's case: when, how, where, and its two peaks."""
    ctx = run["context"]
    entry = {"date": ctx["date"], "command": ctx["command"]}
    if "fsdpsim_git_sha" in ctx:
        entry["fsdpsim_git_sha"] = ctx["fsdpsim_git_sha"]
    entry["gpu"] = ctx["gpu"]["name"]
    entry["torch"] = ctx["torch"]["version"]
    entry["conditions"] = conditions
    entry["peaks"] = {k: {"allocated_bytes": run["peaks"][k]["allocated_bytes"],
                          "reserved_bytes": run["peaks"][k]["reserved_bytes"]} for k in ("first_step", "steady_state")}
    return entry


def add_repeats(fixture_dir, runs_dir, conditions):
    """Adds each fixture of `runs_dir` (another run of a committed case) to the `repeats` of the committed
    fixture of the same case in `fixture_dir`. The case, its model spec and its plan must be the ones the
    committed fixture was measured with, and both runs must have completed (outcome ok); a run already
    listed (same date and command) is not added twice. Returns the names of the fixtures changed."""
    if len(conditions) < 10:
        raise InputError("--conditions", show(conditions), "say how these runs were made (10 characters or more)")
    changed = []
    for name in sorted(f for f in os.listdir(runs_dir) if f.endswith(".json") and f != "schema.json"):
        run = read_fixture(os.path.join(runs_dir, name))
        path = os.path.join(fixture_dir, name)
        if not os.path.exists(path):
            raise InputError(f"{runs_dir}/{name}", show(name), "no committed fixture of that case to add it to")
        fixture = read_fixture(path)
        for key in ("model", "model_spec", "world", "plan"):
            if fixture["case"].get(key) != run["case"].get(key):
                raise InputError(f"{name}:case.{key}", show(run["case"].get(key)),
                                 f"the committed fixture was measured with {show(fixture['case'].get(key))}")
        for which, f in (("committed fixture", fixture), ("run", run)):
            if f["outcome"] != "ok":
                raise InputError(f"{name}:outcome", show(f["outcome"]), f"the {which} must have completed (ok)")
        if run["context"]["date"] == fixture["context"]["date"] and run["context"]["command"] == fixture["context"]["command"]:
            continue
        entry = repeat_entry(run, conditions)
        repeats = fixture.get("repeats", [])
        if any(r["date"] == entry["date"] and r["command"] == entry["command"] for r in repeats):
            continue
        fixture["repeats"] = repeats + [entry]
        write_fixture(fixture, fixture_dir)
        changed.append(name)
    return changed

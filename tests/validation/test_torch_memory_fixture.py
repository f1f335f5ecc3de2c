"""The fixture writer and validator (scripts/torch_memory/fixture.py) against the JSON schema
(tests/fixtures/torch_memory/schema.json, python3-jsonschema), and the CLI's argument errors (exit 2
naming the field), without PyTorch."""
import copy
import json
import os
import stat
import tempfile
import unittest

import torch_memory_test_util as util
from torch_memory import fixture as fixtures, matrix as matrices, plan as plans, specs
from torch_memory.common import EXIT_BAD_INPUT, InputError

GiB = 1 << 30


def phase(step, name, peak_a, peak_r, micro=0):
    return {"step": step, "micro": micro, "phase": name, "start_allocated_bytes": 1000, "start_reserved_bytes": 2000,
            "peak_allocated_bytes": peak_a, "peak_reserved_bytes": peak_r}


PHASES = [phase(0, "init", 5 * GiB, 6 * GiB), phase(1, "forward", 7 * GiB, 8 * GiB), phase(1, "backward", 9 * GiB, 10 * GiB),
          phase(2, "forward", 8 * GiB, 12 * GiB), phase(2, "backward", 11 * GiB, 12 * GiB),
          phase(3, "forward", 8 * GiB, 12 * GiB), phase(3, "loss", 10 * GiB, 13 * GiB), phase(3, "backward", 10 * GiB, 12 * GiB)]


def measured_fixture():
    with open(matrices.MATRIX_PATH, encoding="utf-8") as f:
        case_def = json.load(f)["cases"][2]
    info = specs.load_model_info(case_def["model"])
    steps = fixtures.steps_from_phases(PHASES)
    for s in steps:
        s.update(end_allocated_bytes=GiB, end_reserved_bytes=2 * GiB, time_s=0.4, loss=11.9)
    context = {"tool": "test", "date": "2026-11-25T00:00:00Z", "command": "test", "fsdpsim_git_sha": "abc", "python": "3",
               "gpu": {"name": "NVIDIA H100 80GB HBM3", "total_memory_bytes": 85520809984, "driver": "580"},
               "torch": {"version": "2.11.0", "cuda": "13.0"}}
    case = {"name": case_def["name"], "model": case_def["model"], "model_spec": info["model"], "cluster": "8xH100-SXM",
            "world": 8, "gpus_per_node": 8, "mesh": [1, 8], "plan": plans.explicit_plan(case_def["plan"]),
            "matrix_plan": case_def["plan"], "steps": 3, "total_params": info["params_total"],
            "trainable_params": info["params_total"]}
    return fixtures.build_fixture(context, case, "ok", steps, PHASES, allocator={"num_alloc_retries": 0}), case_def


class Peaks(unittest.TestCase):
    def test_steps_from_phases_take_each_steps_largest_phase(self):
        self.assertEqual(fixtures.steps_from_phases(PHASES), [
            {"step": 1, "peak_allocated_bytes": 9 * GiB, "peak_reserved_bytes": 10 * GiB},
            {"step": 2, "peak_allocated_bytes": 11 * GiB, "peak_reserved_bytes": 12 * GiB},
            {"step": 3, "peak_allocated_bytes": 10 * GiB, "peak_reserved_bytes": 13 * GiB}])

    def test_first_step_and_steady_state_are_separate(self):
        peaks = fixtures.peaks_from_steps(fixtures.steps_from_phases(PHASES))
        self.assertEqual(peaks["first_step"], {"allocated_bytes": 9 * GiB, "reserved_bytes": 10 * GiB})
        # steady state: max over steps 2 and 3, each figure on its own
        self.assertEqual(peaks["steady_state"], {"allocated_bytes": 11 * GiB, "reserved_bytes": 13 * GiB, "steps": [2, 3]})


class Validation(unittest.TestCase):
    def validate(self, fixture, where="f.json"):
        fixtures.validate_fixture(fixture, where=where, require_jsonschema=True)

    def test_writer_output_is_valid_and_written_atomically(self):
        fixture, case_def = measured_fixture()
        with tempfile.TemporaryDirectory() as d:
            path = fixtures.write_fixture(fixture, d)
            self.assertEqual(os.path.basename(path), case_def["name"] + ".json")
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o644)
            self.assertEqual(os.listdir(d), [case_def["name"] + ".json"])      # no temporary left behind
            back = fixtures.read_fixture(path)
        self.assertEqual(back, fixture)
        self.assertTrue(fixtures.measured_case_matches(back, case_def))
        changed = dict(case_def, plan=dict(case_def["plan"], micro_batch=2))
        self.assertFalse(fixtures.measured_case_matches(back, changed))

    def test_committed_synthetic_fixtures_are_valid(self):
        d = os.path.join(util.FIXTURE_DIR, "synthetic")
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name)) as f:
                fixture = json.load(f)
            self.validate(fixture, name)
            self.assertTrue(fixture["synthetic"])

    def test_malformed_fixtures_name_the_field(self):
        good, _ = measured_fixture()
        cases = {
            "case": lambda f: f["case"].pop("cluster"),
            "outcome": lambda f: f.update(outcome="maybe"),
            "steps": lambda f: f["steps"].pop(),                     # outcome ok needs 3 steps
            "peaks.steady_state.allocated_bytes": lambda f: f["peaks"]["steady_state"].update(allocated_bytes=-1),
            "phases.1.phase": lambda f: f["phases"][1].update(phase="warmup"),
            "known_miss.metrics.0": lambda f: f.update(known_miss={"reason": "a reason that is long", "metrics": ["speed"]}),
            "case.name": lambda f: f["case"].update(name="Not A File Name"),
            "extra": lambda f: f.update(extra=1),
        }
        for field, spoil in cases.items():
            f = copy.deepcopy(good)
            spoil(f)
            with self.assertRaises(InputError, msg=field) as cm:
                self.validate(f, "bad.json")
            self.assertTrue(cm.exception.field.startswith("bad.json"), cm.exception.field)
            if field != "extra":
                self.assertIn(field, cm.exception.field + " " + str(cm.exception), field)

    def test_synthetic_needs_a_reason_and_oom_needs_its_record(self):
        f, _ = measured_fixture()
        f["synthetic"] = True
        with self.assertRaises(InputError):
            self.validate(f)
        f, _ = measured_fixture()
        f["outcome"] = "oom"
        with self.assertRaises(InputError):
            self.validate(f)

    def test_minimal_check_without_jsonschema(self):
        good, _ = measured_fixture()
        fixtures._minimal_check(good, "f.json")
        bad = copy.deepcopy(good)
        del bad["peaks"]["steady_state"]
        with self.assertRaises(InputError) as cm:
            fixtures._minimal_check(bad, "f.json")
        self.assertEqual(cm.exception.field, "f.json:peaks.steady_state")


class Repeats(unittest.TestCase):
    """add-repeats: another run of a committed case joins its fixture's repeats (peaks, when, how)."""

    def test_another_run_is_added_once_with_its_peaks_and_conditions(self):
        fixture, case_def = measured_fixture()
        run = copy.deepcopy(fixture)
        run["context"].update(date="2026-11-26T19:00:00Z", command="run-case --no-trace")
        run["peaks"]["steady_state"]["reserved_bytes"] = 14 * GiB
        with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as runs:
            fixtures.write_fixture(fixture, d)
            fixtures.write_fixture(run, runs)
            self.assertEqual(fixtures.add_repeats(d, runs, "one case process, no memory history"),
                             [case_def["name"] + ".json"])
            self.assertEqual(fixtures.add_repeats(d, runs, "one case process, no memory history"), [])  # once
            back = fixtures.read_fixture(os.path.join(d, case_def["name"] + ".json"))
        self.assertEqual(len(back["repeats"]), 1)
        r = back["repeats"][0]
        self.assertEqual((r["date"], r["command"], r["gpu"], r["torch"], r["conditions"]),
                         ("2026-11-26T19:00:00Z", "run-case --no-trace", "NVIDIA H100 80GB HBM3", "2.11.0",
                          "one case process, no memory history"))
        self.assertEqual(r["peaks"]["steady_state"], {"allocated_bytes": 11 * GiB, "reserved_bytes": 14 * GiB})
        self.assertEqual(back["peaks"], fixture["peaks"])     # the fixture's own run is unchanged

    def test_a_run_of_another_plan_or_without_a_fixture_is_refused(self):
        fixture, case_def = measured_fixture()
        other = copy.deepcopy(fixture)
        other["case"]["plan"]["micro_batch"] = 7
        other["context"]["date"] = "later"
        with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as runs:
            fixtures.write_fixture(other, runs)
            with self.assertRaises(InputError) as e:     # no committed fixture of that case
                fixtures.add_repeats(d, runs, "one case process, no memory history")
            self.assertIn(case_def["name"], str(e.exception))
            fixtures.write_fixture(fixture, d)
            with self.assertRaises(InputError) as e:
                fixtures.add_repeats(d, runs, "one case process, no memory history")
            self.assertIn("case.plan", str(e.exception))
            with self.assertRaises(InputError) as e:
                fixtures.add_repeats(d, runs, "short")
            self.assertIn("--conditions", str(e.exception))


class CommandLine(unittest.TestCase):
    """Bad arguments exit 2 and name the field, before PyTorch is imported."""

    def assertBadInput(self, args, field, env=None):
        r = util.run_cli(*args, env=env)
        self.assertEqual(r.returncode, EXIT_BAD_INPUT, r.stdout + r.stderr)
        self.assertIn(field, r.stderr)

    def test_argument_errors(self):
        self.assertBadInput(["run-case"], "--case")
        self.assertBadInput(["run-case", "--case", "no-such-case"], "--case")
        self.assertBadInput(["check-matrix", "--matrix", "/nonexistent.json"], "--matrix")
        self.assertBadInput(["run-matrix", "--budget-s", "-5"], "--budget-s")
        self.assertBadInput(["run-matrix", "--only", "no-such-case"], "--only")
        self.assertBadInput(["no-such-command"], "invalid choice")

    def test_a_bad_matrix_names_case_and_field(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"schema": matrices.SCHEMA_ID, "steps": 3, "cases": [
                {"name": "x", "model": "llama-1b", "world": 8, "why": "t", "plan": {"seq_len": -1}}]}, f)
        try:
            self.assertBadInput(["check-matrix", "--matrix", f.name], "matrix.cases[0] (x): plan.seq_len")
        finally:
            os.unlink(f.name)

    def test_run_case_refuses_a_process_with_the_wrong_allocator_settings(self):
        # l1b-fsdp2-w8-tt wants expandable_segments:True; without it in the environment the case is refused
        # (PYTORCH_CUDA_ALLOC_CONF is read once, when CUDA starts).
        self.assertBadInput(["run-case", "--case", "l1b-fsdp2-w8-tt"], "plan.alloc_conf")

    def test_estimate_prints_a_total(self):
        r = util.run_cli("estimate")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout.splitlines()[-1], r"^total \d+ s = [\d.]+ min estimated on one H100")


if __name__ == "__main__":
    unittest.main()

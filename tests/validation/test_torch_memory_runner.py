"""The matrix runner (scripts/torch_memory/runner.py) with a stand-in for the per-case process: the order,
the budget, resume, the allocator setting of each case's process, error capture and the summary. The
stand-in writes a fixture for one case and fails another, as a GPU run would."""
import json
import os
import sys
import tempfile
import unittest
from unittest import mock

import torch_memory_test_util as util
from torch_memory import fixture as fixtures, runner

STAND_IN = r'''
import json, os, sys
sys.path.insert(0, os.environ["TM_SCRIPTS"])
from torch_memory import fixture as fixtures, plan as plans
args = sys.argv[1:]
if args[0] == "run-smoke":
    passed = int(os.environ.get("TM_SMOKE_PASSED", "15"))
    print(f"smoke: {passed} of 15 passed")
    sys.exit(0 if passed == 15 else 1)
name, out = args[args.index("--case") + 1], args[args.index("--out") + 1]
if name != "l1b-fsdp2-w8-tt":
    print("Traceback (most recent call last):\nRuntimeError: boom in " + name, file=sys.stderr)
    sys.exit(1)
with open(os.environ["TM_MATRIX"]) as f:
    case = next(c for c in json.load(f)["cases"] if c["name"] == name)
with open(os.environ["TM_SYNTHETIC"]) as f:
    fx = json.load(f)
del fx["synthetic"], fx["synthetic_reason"]
fx["case"].update(name=name, plan=plans.explicit_plan(case["plan"]), matrix_plan=case["plan"])
fx["context"]["pytorch_cuda_alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "<unset>")
if os.environ.get("TM_INIT_NOTE"):
    fx["notes"] = fx.get("notes", []) + [os.environ["TM_INIT_NOTE"]]
if "--no-trace" in args:
    fx["notes"] = fx.get("notes", []) + ["run-case --no-trace"]
fixtures.write_fixture(fx, out)
'''


class Runner(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.stand_in = os.path.join(self.tmp.name, "stand_in.py")
        with open(self.stand_in, "w") as f:
            f.write(STAND_IN)
        self.fixtures_dir = os.path.join(self.tmp.name, "fixtures")
        os.makedirs(self.fixtures_dir)
        os.environ.update(TM_SCRIPTS=util.SCRIPTS, TM_MATRIX=runner.matrices.MATRIX_PATH,
                          TM_SYNTHETIC=os.path.join(util.FIXTURE_DIR, "synthetic", "synthetic-miss.json"))
        patcher = mock.patch.object(runner, "SCRIPT", self.stand_in)
        patcher.start()
        self.addCleanup(patcher.stop)

    def run_matrix(self, budget_s=600, only=("l1b-fsdp2-w8-tt", "l1b-fsdp1-w8-hf"), smoke=False, logs="logs", **kw):
        log_dir = os.path.join(self.tmp.name, logs)
        return runner.run_matrix(runner.matrices.MATRIX_PATH, self.fixtures_dir, log_dir, budget_s, "abc",
                                 only=list(only), smoke=smoke, **kw), log_dir

    def test_jobs_pack_cases_by_predicted_memory(self):
        only = ["l1b-fsdp2-w8-tt", "l1b-fsdp1-w8-hf", "l1b-fsdp1-shard-grad-op-w8-hf"]
        # 10 + 10 GiB fit a 30 GiB GPU beside each other (x1.3 + 2 each); the case without a hint runs alone.
        hints = {"l1b-fsdp2-w8-tt": 10.0, "l1b-fsdp1-w8-hf": 10.0}
        summary, _ = self.run_matrix(only=only, jobs=3, gpu_gib=35.0, hints=hints)
        status = {r["name"]: r["status"] for r in summary["cases"]}
        self.assertEqual(status, {"l1b-fsdp2-w8-tt": "ok", "l1b-fsdp1-w8-hf": "error",
                                  "l1b-fsdp1-shard-grad-op-w8-hf": "error"})
        beside = {r["name"]: r.get("ran_beside", []) for r in summary["cases"]}
        self.assertEqual(beside["l1b-fsdp1-shard-grad-op-w8-hf"], [])      # no hint: alone, first
        self.assertEqual(sorted(beside["l1b-fsdp2-w8-tt"] + beside["l1b-fsdp1-w8-hf"]), ["l1b-fsdp2-w8-tt"])
        self.assertEqual(summary["jobs"], 3)
        # 2 x 15 GiB (x1.3 + 2 = 21.5 each) do not fit 35 GiB together: one after the other.
        summary, _ = self.run_matrix(only=only[1:], jobs=3, gpu_gib=35.0, logs="logs2",
                                     hints={n: 15.0 for n in only})
        self.assertTrue(all(not r.get("ran_beside") for r in summary["cases"]))

    def test_no_trace_reaches_every_case(self):
        self.run_matrix(only=["l1b-fsdp2-w8-tt"], trace=False)
        fx = fixtures.read_fixture(os.path.join(self.fixtures_dir, "l1b-fsdp2-w8-tt.json"))
        self.assertIn("run-case --no-trace", fx.get("notes", []))
        os.remove(os.path.join(self.fixtures_dir, "l1b-fsdp2-w8-tt.json"))
        self.run_matrix(only=["l1b-fsdp2-w8-tt"], logs="logs2")
        fx = fixtures.read_fixture(os.path.join(self.fixtures_dir, "l1b-fsdp2-w8-tt.json"))
        self.assertNotIn("run-case --no-trace", fx.get("notes", []))

    def test_bad_jobs(self):
        with self.assertRaises(runner.InputError):
            self.run_matrix(jobs=0)

    def test_runs_records_errors_and_resumes(self):
        summary, log_dir = self.run_matrix(smoke=True)
        self.assertEqual(summary["smoke"]["rc"], 0)
        status = {r["name"]: r["status"] for r in summary["cases"]}
        self.assertEqual(status, {"l1b-fsdp2-w8-tt": "ok", "l1b-fsdp1-w8-hf": "error"})
        failed = next(r for r in summary["cases"] if r["name"] == "l1b-fsdp1-w8-hf")
        self.assertIn("RuntimeError: boom in l1b-fsdp1-w8-hf", failed["tail"])
        self.assertFalse(summary["complete"])
        with open(os.path.join(log_dir, "torch_memory_summary.json")) as f:
            self.assertEqual(json.load(f)["cases"], summary["cases"])
        self.assertTrue(os.path.exists(os.path.join(log_dir, "l1b-fsdp1-w8-hf.log")))
        # Each case's process gets the plan's allocator settings (l1b-fsdp2-w8-tt: torchtitan's).
        written = fixtures.read_fixture(os.path.join(self.fixtures_dir, "l1b-fsdp2-w8-tt.json"))
        self.assertEqual(written["context"]["pytorch_cuda_alloc_conf"], "expandable_segments:True")
        # A second call skips what is measured and tries the rest again.
        summary, _ = self.run_matrix(logs="logs2")
        self.assertEqual({r["name"]: r["status"] for r in summary["cases"]},
                         {"l1b-fsdp2-w8-tt": "done earlier", "l1b-fsdp1-w8-hf": "error"})

    def test_a_failed_init_memory_check_is_in_the_summary(self):
        note = "init memory check FAILED: 5.205 GiB allocated after sharding, 0.580 GiB expected"
        with mock.patch.dict(os.environ, {"TM_INIT_NOTE": note}):
            summary, _ = self.run_matrix(only=["l1b-fsdp2-w8-tt"])
        (rec,) = summary["cases"]
        self.assertEqual((rec["status"], rec["init_memory_check"]), ("ok", note))

    def test_a_changed_plan_is_measured_again(self):
        self.run_matrix(only=["l1b-fsdp2-w8-tt"])
        path = os.path.join(self.fixtures_dir, "l1b-fsdp2-w8-tt.json")
        with open(path) as f:
            fx = json.load(f)
        fx["case"]["matrix_plan"]["micro_batch"] = 7
        with open(path, "w") as f:
            json.dump(fx, f)
        summary, _ = self.run_matrix(only=["l1b-fsdp2-w8-tt"], logs="logs2")
        self.assertEqual(summary["cases"][0]["status"], "ok")
        self.assertTrue(summary["complete"])

    def test_errors_in_a_row_stop_the_run(self):
        only = ["l1b-fsdp2-w8-tt", "l1b-fsdp1-w8-hf", "l1b-fsdp1-shard-grad-op-w8-hf", "l1b-fsdp2-shard-grad-op-w8-tt",
                "l1b-fsdp1-no-shard-w8-hf"]
        summary, _ = self.run_matrix(only=only)
        self.assertEqual([r["status"] for r in summary["cases"]],
                         ["ok", "error", "error", "error", "not started (3 errors in a row before it)"])

    def test_no_passing_smoke_case_stops_the_run(self):
        with mock.patch.dict(os.environ, {"TM_SMOKE_PASSED": "0"}):
            summary, _ = self.run_matrix(smoke=True)
        self.assertEqual(summary["smoke"]["passed"], 0)
        self.assertTrue(all(r["status"].startswith("not started (no smoke case passed") for r in summary["cases"]))
        self.assertEqual(os.listdir(self.fixtures_dir), [])

    def test_the_budget_holds_cases_back(self):
        summary, _ = self.run_matrix(budget_s=1)
        self.assertEqual({r["status"] for r in summary["cases"]}, {"not started (budget)"})
        self.assertFalse(summary["complete"])
        self.assertEqual(os.listdir(self.fixtures_dir), [])


if __name__ == "__main__":
    sys.exit(unittest.main())

"""torchtune's activation offloading in the torch-memory harness (scripts/torch_memory/offload.py, plan.py,
matrix.py), without PyTorch: the plan rules, the matrix cases, the source lookup and the stand-in modules."""
import json
import os
import sys
import tempfile
import unittest

import torch_memory_test_util as util
from torch_memory import matrix as matrices
from torch_memory import offload
from torch_memory import plan as plans
from torch_memory.common import InputError


class OffloadPlans(unittest.TestCase):
    def field_of(self, plan):
        with self.assertRaises(InputError) as cm:
            matrices.runnable(plans.resolve_plan(plan, 8, 8))
        return cm.exception.field

    def test_read_as_the_simulator_reads_it(self):
        self.assertEqual(plans.parse_plan({}).activation_offloading, "none")
        for v in ("streams", "sync"):
            p = plans.resolve_plan({"activation_checkpointing": "full", "activation_offloading": v}, 8, 8)
            self.assertEqual(p.activation_offloading, v)
        # program/plan.cpp's rules: any checkpointing mode but checkpoint(FSDP(block)) (the harness builds no
        # implementation "runtime" at all)
        for plan in ({"activation_offloading": "streams"},
                     {"activation_offloading": "sync", "activation_checkpointing": "selective_op"},
                     {"activation_offloading": "streams", "activation_checkpointing": "every_2"}):
            self.assertEqual(plans.resolve_plan(plan, 8, 8).activation_offloading, plan["activation_offloading"])
        for plan in ({"activation_offloading": "streams",
                      "activation_checkpointing": {"mode": "full", "outside_fsdp": True}},
                     {"activation_offloading": True}, {"activation_offloading": "cpu"}):
            self.assertEqual(self.field_of(plan), "plan.activation_offloading", plan)
        # the harness computes a fused linear loss inside the offloaded forward: refused (torchtune's is outside)
        self.assertEqual(self.field_of({"activation_checkpointing": "full", "activation_offloading": "streams",
                                        "cross_entropy": "fused_linear"}), "plan.activation_offloading")

    def test_matrix_cases_pair_with_their_siblings(self):
        with open(f"{util.SOURCE_DIR}/scripts/torch_memory_matrix.json", encoding="utf-8") as f:
            cases = {c["name"]: c for c in json.load(f)["cases"]}
        on = cases["l3-8b-fsdp2-ac-mb2-s8192-hf-offload"]["plan"]
        off = dict(cases["l3-8b-fsdp2-ac-mb2-s8192-hf"]["plan"])
        off["activation_offloading"] = "streams"
        self.assertEqual(on, off)   # the same plan but for the offloading
        modes = {c["plan"].get("activation_offloading") for c in cases.values()}
        self.assertLessEqual({"streams", "sync"}, modes)


class OffloadSource(unittest.TestCase):
    def test_the_source_tree_is_required_and_named(self):
        p = plans.resolve_plan({"activation_checkpointing": "full", "activation_offloading": "streams"}, 8, 8)
        old = os.environ.pop("FSDPSIM_TORCHTUNE_PATH", None)
        try:
            with self.assertRaises(InputError) as cm:
                offload.source_path(p)
            self.assertEqual(cm.exception.field, "plan.activation_offloading")
            self.assertIn("FSDPSIM_TORCHTUNE_PATH", cm.exception.allowed)
            with tempfile.TemporaryDirectory() as d:
                os.environ["FSDPSIM_TORCHTUNE_PATH"] = d
                with self.assertRaises(InputError):
                    offload.source_path(p)   # a tree without the file
                path = os.path.join(d, offload.SOURCE)
                os.makedirs(os.path.dirname(path))
                open(path, "w").close()
                self.assertEqual(offload.source_path(p), path)
        finally:
            os.environ.pop("FSDPSIM_TORCHTUNE_PATH", None)
            if old is not None:
                os.environ["FSDPSIM_TORCHTUNE_PATH"] = old

    def test_stand_ins_cover_what_the_file_imports_beyond_offloading(self):
        s = offload.stand_ins(None)
        # torchtune's own package is never installed where the harness runs: always stood in
        self.assertTrue(hasattr(s["torchtune.modules"], "TiedLinear"))
        self.assertEqual(s["torchtune.utils"].get_logger("DEBUG").name, "torchtune")
        if "psutil" in s:
            self.assertEqual(s["psutil"].virtual_memory().percent, 0.0)
        if "torchao.quantization" in s:
            self.assertTrue(hasattr(s["torchao.quantization"], "NF4Tensor"))
        self.assertNotIn("torchtune", sys.modules)


if __name__ == "__main__":
    unittest.main()

"""scripts/torch_memory/trace_segments.py on a hand-written allocator history: cudaMalloc'ed segments and an
expandable segment's page maps, the layout before an event, and the live blocks at a step's peak."""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

import torch_memory_test_util as util  # noqa: F401  (puts scripts/ on sys.path)
from torch_memory import trace_segments

MIB = 2 ** 20
ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "oom", "marker"]
A, FR, FC, SA, SF, MAP, UNMAP, OOM, MARK = range(len(ACTIONS))
BASE = 0x100000000


def history():
    # One 4 MiB initial segment on the default stream holding a live 2 MiB block, apart from an expandable
    # segment whose pages are mapped in two pieces (20 MiB, then 40 MiB right after them) for a 16 MiB and a
    # 32 MiB tensor; the 16 MiB one is freed and a side stream's 2 MiB segment made (step 1: five phases).
    e = [[MARK, 0, 0, 0],
         [MAP, BASE + 64 * MIB, 20 * MIB, 0], [A, BASE + 64 * MIB, 16 * MIB, 0],
         [MAP, BASE + 84 * MIB, 40 * MIB, 0], [A, BASE + 84 * MIB, 32 * MIB, 0],
         [MARK, 0, 0, 0],
         [FR, BASE + 64 * MIB, 16 * MIB, 0], [FC, BASE + 64 * MIB, 16 * MIB, 0],
         [SA, BASE + 0x10000000, 2 * MIB, 1], [A, BASE + 0x10000000, 2 * MIB, 1],
         [MARK, 0, 0, 0], [MARK, 0, 0, 0], [MARK, 0, 0, 0]]
    return {"schema": "fsdpsim.torch_alloc_trace/1", "actions": ACTIONS, "streams": ["default", "side"],
            "initial_segments": [{"stream": 0, "size": 4 * MIB, "address": BASE, "blocks": [[2 * MIB, 1], [2 * MIB, 0]]}],
            "events": e}


class TraceSegments(unittest.TestCase):
    def run_tool(self, *args):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(history(), f)
            out = io.StringIO()
            argv = sys.argv
            sys.argv = ["trace_segments.py", path, *args]
            try:
                with contextlib.redirect_stdout(out):
                    trace_segments.main()
            finally:
                sys.argv = argv
            return out.getvalue()

    def test_maps_count_as_reserved_and_name_the_request(self):
        out = self.run_tool()
        self.assertIn("MAP", out)
        self.assertIn("20.00 MiB", out)
        self.assertIn("for alloc 16777216", out)
        self.assertIn("40.00 MiB", out)
        self.assertIn(f"end: allocated {2 * MIB + 32 * MIB + 2 * MIB} reserved {(4 + 20 + 40 + 2) * MIB}", out)

    def test_layout_merges_the_maps_of_one_segment(self):
        # before event 7 (the free of the 16 MiB block): 4 MiB initial segment and the 60 MiB of maps
        out = self.run_tool("--layout", "7")
        self.assertIn("default segment of 4.0 MiB: [2.0 small] | FREE 2.0", out)
        self.assertIn("default segment of 60.0 MiB: 16.0 | FREE 4.0 | 32.0 | FREE 8.0", out)
        out = self.run_tool("--layout", "8")
        self.assertIn("default segment of 60.0 MiB: FREE 20.0 | 32.0 | FREE 8.0", out)

    def test_peak_lists_the_live_blocks(self):
        out = self.run_tool("--peak", "1")
        self.assertIn(f"peak allocated {2 * MIB + 16 * MIB + 32 * MIB} at event 4", out)
        self.assertIn("33554432 x1", out)
        self.assertIn("16777216 x1", out)
        with self.assertRaises(SystemExit):
            self.run_tool("--peak", "2")


if __name__ == "__main__":
    unittest.main()

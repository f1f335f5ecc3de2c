"""The memory-snapshot reduction (scripts/torch_memory/snapshot.py) on a hand-built snapshot in PyTorch's
torch.cuda.memory._snapshot() format, every figure counted by hand below."""
import unittest

import torch_memory_test_util  # noqa: F401 (sets sys.path)
from torch_memory import snapshot as snapshots

MIB = 1 << 20
MARKER = 1531
MARKER_FN = "_fsdpsim_phase_marker"
RS = 7                 # a side stream's cudaStream_t, named "reduce_scatter" below
MARKER_FRAMES = [{"filename": "/repo/scripts/torch_memory/train.py", "line": 40, "name": MARKER_FN}]
LLAMA_FRAMES = [{"filename": "/repo/scripts/torch_memory/recipes/llama.py", "line": 10, "name": "forward"},
                {"filename": "/repo/scripts/torch_memory/train.py", "line": 200, "name": "_train_step"}]
FSDP_FRAMES = [{"filename": "/usr/lib/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "line": 200,
                "name": "foreach_reduce"}]
LOSS_FRAMES = [{"filename": "/repo/scripts/torch_memory/train.py", "line": 210, "name": "_train_step"},
               {"filename": "/repo/scripts/torch_memory/recipes/losses.py", "line": 30, "name": "hf_loss"}]


def e(action, addr=0, size=0, stream=0, frames=None, **extra):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "frames": frames or [], **extra}


def marker(addr):
    return [e("alloc", addr, MARKER, frames=MARKER_FRAMES), e("free_requested", addr, MARKER, frames=MARKER_FRAMES),
            e("free_completed", addr, MARKER)]


BASELINE = {"allocated": 4096, "reserved": 2 * MIB}     # two 2048 B blocks in a 2 MiB segment before recording
LABELS = [{"step": 1, "micro": 0, "phase": "forward"}, {"step": 1, "micro": 0, "phase": "backward"},
          {"step": 2, "micro": 0, "phase": "forward"}, {"step": 2, "micro": 0, "phase": "backward"}]
TRACE = (
    [e("segment_alloc", 0x10000000, 20 * MIB)]                       # reserved 2 + 20 = 22 MiB
    + marker(0x1)                                                    # step 1 forward
    + [e("alloc", 0x100, 1000, frames=LLAMA_FRAMES),                 # 1000 -> 1024 B: allocated 5120
       e("alloc", 0x200, 3 * MIB)]                                   # allocated 3150848
    + marker(0x2)                                                    # step 1 backward
    + [e("segment_alloc", 0x20000000, 8 * MIB, RS),                  # reserved 30 MiB
       e("alloc", 0x300, 6 * MIB + 1, RS, FSDP_FRAMES),              # 6291457 -> 6291968: allocated 9442816
       e("free_requested", 0x200, 3 * MIB), e("free_completed", 0x200, 3 * MIB),   # 6297088
       e("free_requested", 0x9999, 2000)]                            # a block from before recording: 2048 -> 6295040
    + marker(0x3)                                                    # step 2 forward
    + [e("segment_map", 0x30000000, 2 * MIB),                        # expandable segment grows: 32 MiB
       e("alloc", 0x400, 7 * MIB, frames=LOSS_FRAMES),               # allocated 13635072: the peak
       e("oom", 0, 1 << 30, device_free=12345),
       e("free_requested", 0x400, 7 * MIB),                          # 6295040
       e("segment_unmap", 0x30000000, 2 * MIB)]                      # 30 MiB
    + marker(0x4)                                                    # step 2 backward
    + [e("free_requested", 0x100, 1000)]                             # 6294016
)
# What the allocator holds at the end (the snapshot's `segments`): consistent with the trace.
SEGMENTS = [
    {"address": 0x1000, "total_size": 2 * MIB, "stream": 0, "segment_type": "large", "allocated_size": 2048,
     "active_size": 2048, "blocks": [{"size": 2048, "requested_size": 2000, "state": "active_allocated", "frames": []},
                                     {"size": 2 * MIB - 2048, "requested_size": 0, "state": "inactive", "frames": []}]},
    {"address": 0x10000000, "total_size": 20 * MIB, "stream": 0, "segment_type": "large", "allocated_size": 0,
     "active_size": 0, "blocks": [{"size": 20 * MIB, "requested_size": 0, "state": "inactive", "frames": []}]},
    {"address": 0x20000000, "total_size": 8 * MIB, "stream": RS, "segment_type": "large", "allocated_size": 6291968,
     "active_size": 6291968, "blocks": [{"size": 6291968, "requested_size": 6291457, "state": "active_allocated",
                                         "frames": FSDP_FRAMES},
                                        {"size": 8 * MIB - 6291968, "requested_size": 0, "state": "inactive", "frames": []}]},
]
SNAPSHOT = {"segments": SEGMENTS, "device_traces": [TRACE]}


def reduce(snapshot=SNAPSHOT, labels=LABELS, **kw):
    return snapshots.reduce_snapshot(snapshot, labels, BASELINE, MARKER, MARKER_FN, {RS: "reduce_scatter"}, **kw)


class Reduction(unittest.TestCase):
    def test_synthetic_snapshot_is_consistent(self):
        # The hand-built snapshot obeys the format's accounting: reserved = sum of segments, allocated =
        # sum of active_allocated blocks; the replay must end on the same figures.
        r = reduce()
        self.assertEqual(r["end"]["reserved"], sum(s["total_size"] for s in SEGMENTS))
        self.assertEqual(r["end"]["allocated"],
                         sum(b["size"] for s in SEGMENTS for b in s["blocks"] if b["state"] == "active_allocated"))
        self.assertEqual(r["end"], {"allocated": 6294016, "reserved": 30 * MIB})
        self.assertEqual(r["entries"], len(TRACE))
        self.assertFalse(r["truncated"])

    def test_phases(self):
        r = reduce()
        got = [(p["step"], p["phase"], p["start"], p["max_allocated"], p["max_reserved"], p["end"]) for p in r["phases"]]
        self.assertEqual(got, [
            (1, "forward", [4096, 22 * MIB], [3150848, 22 * MIB], 22 * MIB, [3150848, 22 * MIB]),
            (1, "backward", [3150848, 22 * MIB], [9442816, 30 * MIB], 30 * MIB, [6295040, 30 * MIB]),
            (2, "forward", [6295040, 30 * MIB], [13635072, 32 * MIB], 32 * MIB, [6295040, 30 * MIB]),
            (2, "backward", [6295040, 30 * MIB], [6295040, 30 * MIB], 30 * MIB, [6294016, 30 * MIB]),
        ])

    def test_peak_and_blocks_alive_there(self):
        peak = reduce()["peak"]
        self.assertEqual((peak["step"], peak["phase"]), (2, "forward"))
        self.assertEqual((peak["allocated_bytes"], peak["reserved_bytes"]), (13635072, 32 * MIB))
        # alive: 1024 (0x100) + 6291968 (0x300) + 7340032 (0x400) recorded, 2048 from before recording
        self.assertEqual(peak["live_blocks"], 3)
        self.assertEqual(peak["before_recording_bytes"], 2048)
        self.assertEqual(peak["by_stream_bytes"], {"default": 1024 + 7 * MIB, "reduce_scatter": 6291968})
        self.assertEqual(peak["largest_blocks"], [
            {"size": 7 * MIB, "stream": "default", "frame": "losses.py:30 hf_loss"},
            {"size": 6291968, "stream": "reduce_scatter", "frame": "_fully_shard/_fsdp_collectives.py:200 foreach_reduce"},
            {"size": 1024, "stream": "default", "frame": "llama.py:10 forward"}])

    def test_oom_entries(self):
        self.assertEqual(reduce()["ooms"], [{"requested_bytes": 1 << 30, "device_free_bytes": 12345,
                                             "step": 2, "micro": 0, "phase": "forward"}])

    def test_the_steady_state_peak_is_preferred(self):
        # Step 1 peaks higher (10 MiB) than step 2 (1 MiB): the reported peak is step 2's.
        trace = marker(0x1) + [e("alloc", 0x10, 10 * MIB), e("free_requested", 0x10, 10 * MIB)] + marker(0x2) \
            + [e("alloc", 0x20, MIB)]
        labels = [{"step": 1, "micro": 0, "phase": "forward"}, {"step": 2, "micro": 0, "phase": "forward"}]
        peak = reduce({"segments": [], "device_traces": [trace]}, labels)["peak"]
        self.assertEqual((peak["step"], peak["allocated_bytes"]), (2, 4096 + MIB))
        peak = reduce({"segments": [], "device_traces": [trace]}, labels, steady_from_step=3)["peak"]
        self.assertEqual((peak["step"], peak["allocated_bytes"]), (1, 4096 + 10 * MIB))

    def test_a_same_sized_tensor_from_elsewhere_is_no_marker(self):
        trace = marker(0x1) + [e("alloc", 0x50, MARKER, frames=LLAMA_FRAMES)]
        r = reduce({"segments": [], "device_traces": [trace]}, LABELS[:1])
        self.assertEqual(r["end"]["allocated"], 4096 + 1536)

    def test_marker_count_must_match_the_labels(self):
        with self.assertRaisesRegex(ValueError, "more phase markers"):
            reduce(labels=LABELS[:3])
        with self.assertRaisesRegex(ValueError, "truncated"):
            reduce(labels=LABELS + [{"step": 3, "micro": 0, "phase": "forward"}])

    def test_truncation_is_reported(self):
        self.assertTrue(reduce(max_entries=len(TRACE))["truncated"])

    def test_block_rounding(self):
        self.assertEqual([snapshots.round_block(n) for n in (1, 511, 512, 513, 1531)], [512, 512, 512, 1024, 1536])

    def test_frame_descriptions(self):
        self.assertEqual(snapshots.describe_frames([]), "(no Python frame: autograd engine thread or C++)")
        self.assertEqual(snapshots.describe_frames(LOSS_FRAMES), "losses.py:30 hf_loss")
        other = [{"filename": "/usr/lib/python3/site.py", "line": 1, "name": "main"}]
        self.assertEqual(snapshots.describe_frames(other), "python3/site.py:1 main")
        self.assertEqual(snapshots.stream_name(0, {}), "default")
        self.assertEqual(snapshots.stream_name(0x7f, {}), "stream 0x7f")


if __name__ == "__main__":
    unittest.main()


class CompactAllocatorTrace(unittest.TestCase):
    """What a caching-allocator replay reads: the segments at the start, then action, address, size, stream."""

    def test_initial_segments_events_and_markers(self):
        initial = {"segments": [
            {"device": 0, "address": 0x9000, "total_size": 2 * MIB, "stream": 0,
             "blocks": [{"size": 2048, "state": "active_allocated"}, {"size": 2048, "state": "active_allocated"},
                        {"size": 2 * MIB - 4096, "state": "inactive"}]},
            {"device": 1, "address": 0x1, "total_size": 2 * MIB, "stream": 0, "blocks": []}]}
        got = snapshots.compact_allocator_trace(initial, SNAPSHOT, {RS: "reduce_scatter"}, 0, MARKER, MARKER_FN)
        self.assertEqual(got["schema"], "fsdpsim.torch_alloc_trace/1")
        self.assertEqual(got["initial_segments"], [{"stream": 0, "size": 2 * MIB, "address": 0x9000,
                                                    "blocks": [[2048, 1], [2048, 1], [2 * MIB - 4096, 0]]}])
        self.assertEqual(got["streams"], ["default", "reduce_scatter"])
        actions = got["actions"]
        ev = [(actions[a], addr, size, got["streams"][s]) for a, addr, size, s in got["events"]]
        self.assertEqual(ev[0], ("segment_alloc", 0x10000000, 20 * MIB, "default"))
        self.assertEqual(ev[1], ("marker", 0x1, 0, "default"))          # the marker's own free entries dropped
        self.assertEqual(ev[2], ("alloc", 0x100, 1000, "default"))      # the request, not the rounded block
        self.assertEqual(sum(1 for x in ev if x[0] == "marker"), len(LABELS))
        rs = [x for x in ev if x[3] == "reduce_scatter"]
        self.assertEqual(rs[0], ("segment_alloc", 0x20000000, 8 * MIB, "reduce_scatter"))
        self.assertEqual(rs[1], ("alloc", 0x300, 6 * MIB + 1, "reduce_scatter"))
        # every non-marker entry of the trace that carries bytes is kept, in order
        marker_addrs = {x["addr"] for x in TRACE if x["action"] == "alloc" and x["frames"] == MARKER_FRAMES}
        kept = [x for x in TRACE if x["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc",
                                                   "segment_free", "segment_map", "segment_unmap", "oom")
                and x["addr"] not in marker_addrs]
        self.assertEqual(len(ev) - len(LABELS), len(kept))

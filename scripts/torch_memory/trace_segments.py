#!/usr/bin/env python3
"""Replays a compact allocator history (snapshot.compact_allocator_trace, reports/.../alloc-traces.tar.gz)
and prints, per phase, the segments PyTorch's caching allocator cudaMalloc'ed, or the pages it mapped onto
an expandable segment (size, stream, and the request that caused it) with allocated/reserved at that moment. The simulator's side: build/tests/validation/sim_segments
(the same list from fsdpsim's program and allocator model), to find the first segment where they part ways.

    python3 scripts/torch_memory/trace_segments.py TRACE.alloc-trace.json.gz [--fixture FIXTURE.json]
        [--allocs [--phase N ...] [--min-mib X]] [--frees]

--allocs also prints every alloc/free of a phase (size, stream, address) for a closer look; --frees counts,
per stream, the frees whose block was reusable at once (free_completed before the next allocation) and those
that waited on a record_stream event (free_completed only after later allocations): how far the CPU ran ahead
of the GPU where FSDP1 frees a side-stream block the compute stream still uses."""
import argparse
import gzip
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--fixture", help="the fixture, for the phase labels (else phase numbers)")
    ap.add_argument("--allocs", action="store_true", help="print every alloc and free too")
    ap.add_argument("--phase", type=int, action="append", help="with --allocs: only these phase numbers")
    ap.add_argument("--min-mib", type=float, default=0.0, help="with --allocs: only requests >= this size")
    ap.add_argument("--frees", action="store_true", help="count immediate and deferred (record_stream) frees per stream")
    a = ap.parse_args()
    opener = gzip.open if a.trace.endswith(".gz") else open
    with opener(a.trace, "rt") as f:
        t = json.load(f)
    labels = None
    if a.fixture:
        with open(a.fixture) as f:
            fx = json.load(f)
        labels = [f"s{p['step']}.{p['phase']}" for p in fx["phases"]]
    acts = t["actions"]
    streams = t["streams"]
    reserved = sum(s["size"] for s in t["initial_segments"])
    allocated = sum(b[0] for s in t["initial_segments"] for b in s["blocks"] if b[1])
    print(f"initial: {len(t['initial_segments'])} segments, reserved {reserved} allocated {allocated}")
    for s in t["initial_segments"]:
        live = [b[0] for b in s["blocks"] if b[1]]
        print(f"   seg {s['size']:>13} {streams[s['stream']]:<20} live blocks {live}")
    phase = 0
    live = {}          # addr -> (size, stream)
    pending_seg = None
    def name(p):
        if labels and p < len(labels):
            return labels[p]
        return f"phase{p}"
    print(f"== {name(phase)}")
    for i, (ai, addr, size, si) in enumerate(t["events"]):
        act = acts[ai]
        show = a.allocs and (not a.phase or phase in a.phase) and size >= a.min_mib * 2**20
        if act == "marker":
            phase += 1
            print(f"== {name(phase)}  allocated {allocated} reserved {reserved}")
            continue
        if act in ("segment_alloc", "segment_map"):
            # segment_map: expandable segments map more pages onto the stream's one segment (counted as
            # reserved like a new segment; several maps before one alloc are summed)
            reserved += size
            kind = "SEGMENT" if act == "segment_alloc" else "MAP    "
            if pending_seg is not None and pending_seg[4] == kind:
                pending_seg = (pending_seg[0], pending_seg[1] + size, streams[si], addr, kind)
            else:
                pending_seg = (i, size, streams[si], addr, kind)
            continue
        if act in ("segment_free", "segment_unmap"):
            reserved -= size
            print(f"   [{i}] {'SEGMENT FREE' if act == 'segment_free' else 'UNMAP'} {size} {streams[si]}")
            continue
        if act == "alloc":
            allocated += size
            live[addr] = (size, si)
            if pending_seg is not None:
                j, ssize, sname, saddr, kind = pending_seg
                print(f"   [{j}] {kind} {ssize:>13} ({ssize/2**20:9.2f} MiB) {sname:<20} for alloc {size} "
                      f"({size/2**20:.2f} MiB) -> allocated {allocated} reserved {reserved}")
                pending_seg = None
            elif show:
                print(f"      [{i}] alloc {size:>12} {streams[si]:<18} @{addr:#x} -> alloc {allocated}")
            continue
        if act == "free_completed":
            allocated -= size
            live.pop(addr, None)
            if show:
                print(f"      [{i}] free  {size:>12} {streams[si]:<18} @{addr:#x} -> alloc {allocated}")
            continue
    print(f"end: allocated {allocated} reserved {reserved}")
    if a.frees:
        free_summary(t)


def free_summary(t):
    """Per stream: frees completed before the next allocation (immediate) and later (deferred: the block waited on
    an event of another stream, record_stream), with the median number of allocations a deferred one waited."""
    acts, streams = t["actions"], t["streams"]
    requested = {}      # addr -> (allocations so far, stream)
    allocs = 0
    counts = {}
    for ai, addr, size, si in t["events"]:
        act = acts[ai]
        if act == "alloc":
            allocs += 1
        elif act == "free_requested":
            requested[addr] = (allocs, si)
        elif act == "free_completed" and addr in requested:
            at, stream = requested.pop(addr)
            c = counts.setdefault(streams[stream], {"immediate": 0, "deferred": []})
            if allocs == at:
                c["immediate"] += 1
            else:
                c["deferred"].append(allocs - at)
    for name, c in counts.items():
        d = sorted(c["deferred"])
        median = d[len(d) // 2] if d else 0
        print(f"frees on {name}: {c['immediate']} immediate, {len(d)} deferred (median {median} allocations later)")


if __name__ == "__main__":
    main()

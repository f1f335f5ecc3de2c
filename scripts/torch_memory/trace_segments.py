#!/usr/bin/env python3
"""Replays a compact allocator history (snapshot.compact_allocator_trace, reports/.../alloc-traces.tar.gz)
and prints, per phase, the segments PyTorch's caching allocator cudaMalloc'ed, or the pages it mapped onto
an expandable segment (size, stream, and the request that caused it) with allocated/reserved at that moment. The simulator's side: build/tests/validation/sim_segments
(the same list from fsdpsim's program and allocator model), to find the first segment where they part ways.

    python3 scripts/torch_memory/trace_segments.py TRACE.alloc-trace.json.gz [--fixture FIXTURE.json]
        [--allocs [--phase N ...] [--min-mib X]] [--frees] [--layout EVENT] [--peak STEP]

--allocs also prints every alloc/free of a phase (size, stream, address) for a closer look; --frees counts,
per stream, the frees whose block was reusable at once (free_completed before the next allocation) and those
that waited on a record_stream event (free_completed only after later allocations): how far the CPU ran ahead
of the GPU where FSDP1 frees a side-stream block the compute stream still uses. --layout EVENT prints each
stream's segments just before an event, --peak STEP the live blocks at a step's peak (the simulator's side of
both: sim_segments --layout / --peak)."""
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
    ap.add_argument("--layout", type=int, metavar="EVENT",
                    help="only the layout of each stream's segments just before event EVENT (sim_segments --layout)")
    ap.add_argument("--peak", type=int, metavar="STEP",
                    help="only the live blocks at step STEP's peak of allocated bytes (sim_segments --peak)")
    a = ap.parse_args()
    opener = gzip.open if a.trace.endswith(".gz") else open
    with opener(a.trace, "rt") as f:
        t = json.load(f)
    phases = None
    if a.fixture:
        with open(a.fixture) as f:
            phases = json.load(f)["phases"]
    if a.layout is not None:
        print_layout(t, a.layout)
        return
    if a.peak is not None:
        print_peak(t, a.peak, [p["step"] for p in phases] if phases else None)
        return
    labels = [f"s{p['step']}.{p['phase']}" for p in phases] if phases else None
    acts = t["actions"]
    streams = t["streams"]
    initial_live, initial_segments = _initial_live(t)
    reserved = sum(size for _, size, _ in initial_segments)
    allocated = sum(size for size, _ in initial_live.values())
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


MIB = 2 ** 20


def _initial_live(t):
    """addr -> (size, stream) of the blocks live in the initial segments, and the segments as (addr, size, stream)."""
    live, segments = {}, []
    for seg in t["initial_segments"]:
        addr = seg["address"]
        segments.append((seg["address"], seg["size"], seg["stream"]))
        for size, used in seg["blocks"]:
            if used:
                live[addr] = (size, seg["stream"])
            addr += size
    return live, segments


def _runs(segments):
    """Mapped ranges of one stream merged where they touch (an expandable segment grows by maps at its end)."""
    out = []
    for addr, size in sorted(segments):
        if out and out[-1][0] + out[-1][1] == addr:
            out[-1][1] += size
        else:
            out.append([addr, size])
    return out


def print_layout(t, before):
    """Each stream's segments (maps of an expandable segment merged) just before event `before`, in address
    order: blocks of 8 MiB and more, free ranges of 2 MiB and more, the rest summed in brackets (the format of
    build/tests/validation/sim_segments --layout)."""
    acts, streams = t["actions"], t["streams"]
    live, segments = _initial_live(t)
    for ai, addr, size, si in t["events"][:max(0, before)]:
        act = acts[ai]
        if act in ("segment_alloc", "segment_map"):
            segments.append((addr, size, si))
        elif act in ("segment_free", "segment_unmap"):
            segments = [x for x in segments if x[0] != addr]
        elif act == "alloc":
            live[addr] = (size, si)
        elif act == "free_completed":
            live.pop(addr, None)
    for si, name in enumerate(streams):
        for base, size in _runs([(a, n) for a, n, s in segments if s == si]):
            items, pos = [], base
            for addr in sorted(x for x in live if base <= x < base + size and live[x][1] == si):
                if addr > pos:
                    items.append(("free", addr - pos))
                items.append(("live", live[addr][0]))
                pos = addr + live[addr][0]
            if pos < base + size:
                items.append(("free", base + size - pos))
            parts, small = [], 0
            for kind, n in items:
                if n >= 8 * MIB or (kind == "free" and n >= 2 * MIB):
                    if small:
                        parts.append(f"[{small / MIB:.1f} small]")
                        small = 0
                    parts.append(f"{'FREE ' if kind == 'free' else ''}{n / MIB:.1f}")
                else:
                    small += n
            if small:
                parts.append(f"[{small / MIB:.1f} small]")
            print(f"{name} segment of {size / MIB:.1f} MiB: " + " | ".join(parts))


def print_peak(t, step, phase_steps=None):
    """The live blocks at step `step`'s peak of allocated bytes, grouped by size and stream (>= 4 MiB in all).
    Phase k starts at the k-th marker; `phase_steps` (the fixture's phases' steps; phase 0 is init) says which
    phases are the step's, else five phases per step (forward, loss, backward, optimizer, zero_grad)."""
    acts, streams = t["actions"], t["streams"]
    markers = [i for i, e in enumerate(t["events"]) if acts[e[0]] == "marker"]
    if phase_steps is None:
        phase_steps = [0] + [1 + k // 5 for k in range(len(markers))]
    mine = [k for k, st in enumerate(phase_steps) if st == step and 1 <= k <= len(markers)]
    if not mine:
        raise SystemExit(f"trace_segments: --peak {step}: no phase of that step in the trace")
    lo = markers[mine[0] - 1]
    hi = markers[mine[-1]] if mine[-1] < len(markers) else len(t["events"])
    live, _ = _initial_live(t)
    allocated = sum(n for n, _ in live.values())
    best, at, best_live = -1, -1, {}
    for i, (ai, addr, size, si) in enumerate(t["events"][:hi]):
        act = acts[ai]
        if act == "alloc":
            live[addr] = (size, si)
            allocated += size
            if lo < i < hi and allocated > best:
                best, at, best_live = allocated, i, dict(live)
        elif act == "free_completed" and addr in live:
            allocated -= live.pop(addr)[0]
    print(f"step {step}: peak allocated {best} at event {at}; live blocks:")
    groups = {}
    for size, si in best_live.values():
        groups[(size, si)] = groups.get((size, si), 0) + 1
    for (size, si), n in sorted(groups.items(), key=lambda kv: -kv[0][0] * kv[1]):
        if size * n >= 4 * MIB:
            print(f"  {size:>12} x{n:<4} {streams[si]:<20} {size * n / MIB:10.1f} MiB")


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

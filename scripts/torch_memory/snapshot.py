"""Reduces a CUDA memory snapshot (torch.cuda.memory._snapshot()) to a compact timeline.

The snapshot format is PyTorch's (torch/cuda/memory.py `_snapshot` docstring): `segments` (what the
caching allocator holds now) and `device_traces[device]`, the history recorded by
`_record_memory_history`, one entry per allocator action:
  alloc / free_requested / free_completed     a block handed out / given back by a tensor / reusable
  segment_alloc / segment_free                cudaMalloc / cudaFree of a whole segment
  segment_map / segment_unmap                 expandable segments growing / shrinking
  oom, snapshot, annotate                     events without bytes.
How the bytes are counted (c10/cuda/CUDACachingAllocator.cpp, `malloc` and `free`):
  * allocated_bytes grows by the block's size at `alloc` and drops at `free_requested` (a block freed
    while other streams still use it, record_stream, stops counting as allocated at once);
  * the `alloc` entry carries the *requested* size (orig_size) while allocated_bytes counts the block
    (rounded to 512 B, `round_size`, and for large blocks possibly the unsplit rest of a cached block,
    at most 1 MiB, `should_split`). The replay below rounds to 512 B, so its allocated figure can sit a
    little below the allocator's; the exact per-phase peaks come from the allocator's own statistics
    (train.py), the trace is for *where* the peak is and *what* is alive there;
  * reserved bytes change only by segment_alloc/segment_free/segment_map/segment_unmap, whose size is the
    segment's (mapped) size: the replay of reserved is exact.
Phases are marked in the trace by the harness (train.py `PhaseRecorder`): at every phase boundary on the
main thread it allocates and frees one small "marker" tensor of a known size from a function of a known
name; the k-th marker opens the k-th phase label. Markers are left out of the byte counts.
"""

KMIN_BLOCK = 512          # CUDACachingAllocator kMinBlockSize: every block is a multiple of 512 B
LARGEST_BLOCKS = 12       # blocks listed at the peak

_GROWS = ("segment_alloc", "segment_map")
_SHRINKS = ("segment_free", "segment_unmap")


def round_block(size):
    """`round_size` of the caching allocator (without roundup_power2_divisions, which the harness never sets)."""
    if size < KMIN_BLOCK:
        return KMIN_BLOCK
    return KMIN_BLOCK * ((size + KMIN_BLOCK - 1) // KMIN_BLOCK)


def describe_frames(frames):
    """Where a block was allocated, in a few words. Snapshot frames are innermost first. Prefers the
    harness's model and loss code, then PyTorch's FSDP, optimizer, autograd and checkpoint code."""
    if not frames:
        return "(no Python frame: autograd engine thread or C++)"

    def rank(f):
        path = f.get("filename", "")
        if "torch_memory/recipes" in path:
            return 0
        if any(s in path for s in ("distributed/fsdp", "torch/optim", "utils/checkpoint", "_composable")):
            return 1
        if "torch_memory" in path:
            return 2
        return 3

    best = min(range(len(frames)), key=lambda i: (rank(frames[i]), i))
    f = frames[best]
    parts = f.get("filename", "?").replace("\\", "/").split("/")
    short = "/".join(parts[-2:]) if rank(f) != 0 else parts[-1]
    return f"{short}:{f.get('line', '?')} {f.get('name', '?')}"


def stream_name(stream, names):
    if stream in names:
        return names[stream]
    return "default" if stream == 0 else f"stream 0x{stream:x}"


def _is_marker(entry, marker_size, marker_function):
    if entry.get("action") != "alloc" or entry.get("size") != marker_size:
        return False
    frames = entry.get("frames") or []
    return not frames or any(f.get("name") == marker_function for f in frames)


def reduce_snapshot(snapshot, labels, baseline, marker_size, marker_function, stream_names=None, device=0,
                    max_entries=None, steady_from_step=2):
    """The timeline of one recorded run.

    snapshot: the `_snapshot()` dict; labels: one dict per marker, in order ({"step", "micro", "phase"});
    baseline: {"allocated": bytes, "reserved": bytes} when recording began (tensors allocated before the
    history are only known by these totals); stream_names: {cudaStream_t as int: name}.
    Returns {"phases": [...], "peak": {...}, "end": {...}, "entries": n, "truncated": bool, "ooms": [...]}.
    """
    stream_names = stream_names or {}
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    state = {"allocated": int(baseline["allocated"]), "reserved": int(baseline["reserved"])}
    live = {}               # addr -> (block bytes, stream, frames) of blocks allocated while recording
    markers = set()
    label_index = -1
    phases = []
    current = _open_phase({"step": 0, "micro": 0, "phase": "setup"}, state)
    ooms = []
    best = {"any": None, "steady": None}   # the trace's peak over all steps / over the steady-state steps

    for index, e in enumerate(trace):
        action = e.get("action")
        if action == "alloc" and _is_marker(e, marker_size, marker_function):
            markers.add(e.get("addr"))
            label_index += 1
            if label_index >= len(labels):
                raise ValueError(f"trace has more phase markers than labels ({len(labels)})")
            phases.append(_close_phase(current, state))
            current = _open_phase(labels[label_index], state)
            continue
        if action == "alloc":
            size = round_block(int(e.get("size", 0)))
            live[e.get("addr")] = (size, e.get("stream", 0), e.get("frames") or [])
            state["allocated"] += size
        elif action == "free_requested":
            addr = e.get("addr")
            if addr in markers:
                markers.discard(addr)
                continue
            block = live.pop(addr, None)
            state["allocated"] -= block[0] if block else round_block(int(e.get("size", 0)))
        elif action in _GROWS:
            state["reserved"] += int(e.get("size", 0))
        elif action in _SHRINKS:
            state["reserved"] -= int(e.get("size", 0))
        elif action == "oom":
            ooms.append({"requested_bytes": int(e.get("size", 0)), "device_free_bytes": int(e.get("device_free", 0)),
                         **{k: current[k] for k in ("step", "micro", "phase")}})
            continue
        else:
            continue
        _update_phase(current, state)
        for key in ("any", "steady") if current["step"] >= steady_from_step else ("any",):
            if best[key] is None or state["allocated"] > best[key]["allocated"]:
                best[key] = {"allocated": state["allocated"], "reserved": state["reserved"], "index": index,
                             "label": {k: current[k] for k in ("step", "micro", "phase")}}
    phases.append(_close_phase(current, state))
    peak = best["steady"] or best["any"]
    if label_index + 1 != len(labels):
        raise ValueError(f"trace has {label_index + 1} phase markers, the run emitted {len(labels)}: the history "
                         "was truncated or markers were not recorded")
    return {
        "method": "replay of torch.cuda.memory._snapshot() device trace; allocated = live requested sizes "
                  "rounded to 512 B (may sit below allocated_bytes by unsplit block rests); reserved exact",
        "entries": len(trace),
        "truncated": max_entries is not None and len(trace) >= max_entries,
        "phases": [p for p in phases if p["phase"] != "setup" or p["max_allocated"][0] != p["start"][0]],
        "peak": _peak_detail(trace, peak, marker_size, marker_function, stream_names) if peak else None,
        "end": dict(state),
        "ooms": ooms,
    }


def _open_phase(label, state):
    a, r = state["allocated"], state["reserved"]
    return {"step": label["step"], "micro": label.get("micro", 0), "phase": label["phase"],
            "start": [a, r], "max_allocated": [a, r], "max_reserved": r, "end": [a, r]}


def _update_phase(p, state):
    a, r = state["allocated"], state["reserved"]
    if a > p["max_allocated"][0]:
        p["max_allocated"] = [a, r]
    p["max_reserved"] = max(p["max_reserved"], r)


def _close_phase(p, state):
    p["end"] = [state["allocated"], state["reserved"]]
    return p


def _peak_detail(trace, best, marker_size, marker_function, stream_names):
    """Replays the trace again up to the peak's entry and lists what is alive there."""
    live = {}
    for e in trace[:best["index"] + 1]:
        action = e.get("action")
        if action == "alloc" and not _is_marker(e, marker_size, marker_function):
            live[e.get("addr")] = (round_block(int(e.get("size", 0))), e.get("stream", 0), e.get("frames") or [])
        elif action == "free_requested":
            live.pop(e.get("addr"), None)
    by_stream = {}
    for size, stream, _ in live.values():
        name = stream_name(stream, stream_names)
        by_stream[name] = by_stream.get(name, 0) + size
    blocks = sorted(live.values(), key=lambda b: -b[0])[:LARGEST_BLOCKS]
    recorded = sum(b[0] for b in live.values())
    return {**best["label"], "allocated_bytes": best["allocated"], "reserved_bytes": best["reserved"],
            "before_recording_bytes": best["allocated"] - recorded,
            "live_blocks": len(live), "by_stream_bytes": by_stream,
            "largest_blocks": [{"size": s, "stream": stream_name(st, stream_names), "frame": describe_frames(fr)}
                               for s, st, fr in blocks]}


# ---- the allocator's own history, for replaying it through fsdpsim's allocator model -------------------
# `compact_allocator_trace` keeps what a caching-allocator replay needs and nothing else: the segments and
# blocks that existed when recording began (the snapshot taken just before `_record_memory_history`) and,
# per trace entry, the action, the block's address, the size and the stream. The `alloc` size is the
# request (orig_size), as the allocator received it; segment and free sizes are blocks'. Markers (phase
# boundaries) are kept as "marker" entries so a replay can tell the phases apart. Frames are left out.
ALLOC_TRACE_SCHEMA = "fsdpsim.torch_alloc_trace/1"
_TRACE_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
                  "segment_unmap", "oom")


def _stream_index(stream, streams, names):
    key = stream_name(stream, names)
    if key not in streams:
        streams.append(key)
    return streams.index(key)


def compact_allocator_trace(initial_snapshot, snapshot, stream_names=None, device=0, marker_size=None,
                            marker_function=None):
    """{"schema", "streams": [name], "initial_segments": [{"stream", "size", "blocks": [[size, allocated]]}],
    "actions": [name], "events": [[action index, addr, size, stream index]]}; a marker is action "marker"."""
    names = stream_names or {}
    streams = []
    segments = []
    for seg in initial_snapshot.get("segments") or []:
        if seg.get("device", device) != device:
            continue
        blocks = [[int(b.get("size", 0)), 1 if b.get("state") == "active_allocated" else 0]
                  for b in seg.get("blocks") or []]
        segments.append({"stream": _stream_index(seg.get("stream", 0), streams, names),
                         "size": int(seg.get("total_size", 0)), "address": int(seg.get("address", 0)),
                         "blocks": blocks})
    segments.sort(key=lambda s: s["address"])
    actions = list(_TRACE_ACTIONS) + ["marker"]
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    markers = set()
    events = []
    for entry in trace:
        action = entry.get("action")
        addr = entry.get("addr", 0)
        if marker_size is not None and action == "alloc" and _is_marker(entry, marker_size, marker_function):
            markers.add(addr)
            events.append([actions.index("marker"), addr, 0, 0])
            continue
        if action in ("free_requested", "free_completed") and addr in markers:
            if action == "free_completed":
                markers.discard(addr)
            continue
        if action not in _TRACE_ACTIONS:
            continue
        events.append([actions.index(action), addr, int(entry.get("size", 0)),
                       _stream_index(entry.get("stream", 0), streams, names)])
    return {"schema": ALLOC_TRACE_SCHEMA, "streams": streams, "initial_segments": segments, "actions": actions,
            "events": events}

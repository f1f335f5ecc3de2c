"""One case on the GPU: build, shard, train `steps` steps, measure, write the fixture.

The training step is the frameworks' loop reduced to what allocates memory: forward, the loss, backward
(FSDP1 no_sync / FSDP2 set_requires_gradient_sync(False) on micro-batches that do not sync), the
optimizer step and zero_grad(set_to_none=True). The step's function returns after backward, so logits
kept for backward (free_logits_before_backward false, as most loops) are freed then; with true they are
deleted before backward() as torchtitan's train step does (`del pred`).

Measurements (all from the caching allocator, c10/cuda/CUDACachingAllocator.cpp):
  * per phase (forward, loss, backward per micro-batch; optimizer; zero_grad): memory_allocated and
    memory_reserved at its start, max_memory_allocated / max_memory_reserved over it (peaks are reset at
    every boundary; the phases partition the step, so a step's peak is its largest phase peak). The
    allocator's statistics move when the CPU issues an allocation or a free, so they are exact at
    any point of the Python program;
  * the memory history (torch.cuda.memory._record_memory_history, Python frames of allocations) from the
    first step on, reduced by snapshot.py to a timeline and the blocks alive at the peak;
  * with FSDPSIM_TM_ALLOC_TRACE=DIR, the allocator's whole history besides (the segments when recording
    began, then every action: snapshot.compact_allocator_trace) in DIR/<case>.alloc-trace.json.gz, so that
    a reserved-memory miss can be traced to the first cudaMalloc where fsdpsim's allocator model and
    PyTorch's part ways.
After initialization the cache is emptied (torch.cuda.empty_cache) so step 1 starts from the sharded
state only, as the simulator does; FSDP1's unit-by-unit materialization would otherwise leave freed
unsharded blocks cached.
"""
import datetime
import gc
import os
import platform
import shlex
import socket
import subprocess
import sys
import time

from . import fixture as fixtures, init_check, lora as loras, matrix as matrices, offload as offloads, plan as plans, snapshot as snapshots, specs
from .common import InputError, show

MARKER_BYTES = 1531                 # an odd size no tensor of the recipes requests (rounds to one 1536 B block)
MARKER_FUNCTION = "_fsdpsim_phase_marker"
MAX_HISTORY_ENTRIES = 4_000_000     # a 3-step llama3-8b run records tens of thousands


def _fsdpsim_phase_marker(torch):
    marker = torch.empty(MARKER_BYTES, dtype=torch.uint8, device="cuda")
    del marker


class PhaseRecorder:
    """Phase boundaries on the main thread: closes the open phase with the allocator's peaks since its
    start, leaves a marker allocation in the memory history, resets the peaks and opens the next."""

    def __init__(self, torch, trace):
        self.torch, self.trace = torch, trace
        self.labels, self.phases, self.current = [], [], None
        self.step = self.micro = 0

    def start(self, phase):
        self._close()
        if self.trace:
            _fsdpsim_phase_marker(self.torch)
            self.labels.append({"step": self.step, "micro": self.micro, "phase": phase})
        cuda = self.torch.cuda
        cuda.reset_peak_memory_stats()
        self.current = {"step": self.step, "micro": self.micro, "phase": phase,
                        "start_allocated_bytes": cuda.memory_allocated(), "start_reserved_bytes": cuda.memory_reserved()}

    def close(self):
        self._close()
        self.current = None

    def _close(self):
        if self.current is None:
            return
        cuda = self.torch.cuda
        self.current.update(peak_allocated_bytes=cuda.max_memory_allocated(), peak_reserved_bytes=cuda.max_memory_reserved(),
                            end_allocated_bytes=cuda.memory_allocated(), end_reserved_bytes=cuda.memory_reserved())
        self.phases.append(self.current)
        self.current = None


def _driver_version():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def context_block(torch, git_sha):
    props = torch.cuda.get_device_properties(0)
    return {
        "tool": "scripts/torch_memory_reference.py",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable)] + sys.argv),
        "fsdpsim_git_sha": git_sha,
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "gpu": {"name": torch.cuda.get_device_name(0), "total_memory_bytes": int(props.total_memory),
                "driver": _driver_version(), "capability": f"{props.major}.{props.minor}"},
        "torch": {"version": torch.__version__, "cuda": torch.version.cuda,
                  "cudnn": str(torch.backends.cudnn.version())},
        "fake_process_group": "torch.testing._internal.distributed.fake_pg.FakeStore, backend \"fake\", rank 0",
        "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }


def needs_torchao(p):
    return p.optimizer in plans.TORCHAO_OPTIMIZERS or bool(p.lora and p.lora.get("quantize_base") == "nf4")


def import_torchao(p):
    """torchao for the plans that need it (torchao_adamw8bit / 4bit, QLoRA's NF4 weights). The GPU machine has
    PyTorch but no torchao and no network: FSDPSIM_TORCHAO_PATH names a torchao source tree (its Python files
    only: torchao's C++ extensions are not built, TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1; the optimizers and
    NF4Tensor are written in Python), FSDPSIM_TORCHAO_SOURCE what it is (e.g. pytorch/ao@<commit>).
    Returns the fixture's context entry."""
    path = os.environ.get("FSDPSIM_TORCHAO_PATH", "")
    if path:
        sys.path.insert(0, path)
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    try:
        import torchao
    except ImportError as e:
        field, value = (("plan.optimizer", p.optimizer) if p.optimizer in plans.TORCHAO_OPTIMIZERS
                        else ("plan.lora.quantize_base", "nf4"))
        raise InputError(field, show(value), f"needs torchao, which does not import here ({e}); set FSDPSIM_TORCHAO_PATH "
                         "to a torchao source tree") from None
    return {"version": getattr(torchao, "__version__", "unknown"), "path": os.path.dirname(torchao.__file__),
            "source": os.environ.get("FSDPSIM_TORCHAO_SOURCE", "unknown"), "cpp_extensions": "not loaded"}


def check_alloc_conf(p):
    """PYTORCH_CUDA_ALLOC_CONF is read once, at CUDA's initialization: the process must have been started
    with the plan's (runner.py sets it for each case's fresh process)."""
    have = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if plans.parse_alloc_conf(have, "PYTORCH_CUDA_ALLOC_CONF") != plans.parse_alloc_conf(p.alloc_conf):
        raise InputError("plan.alloc_conf", repr(p.alloc_conf),
                         f"this process was started with PYTORCH_CUDA_ALLOC_CONF={have!r}; run the case in a fresh "
                         "process with the plan's value (run-case does that)")


def expected_params(info, p):
    """(total, trainable) as the simulator counts them: the model, plus plan.lora's adapters (models/
    trainable.cpp lora_trainable_set: total includes them, only they train; trainable None when the plan's
    trainable_fraction or frozen_units decide it)."""
    total = info["params_total"]
    if not p.lora:
        return total, None
    adapters = loras.trainable_params(info["model"], p.implementation, p.lora)
    return total + adapters, None if p.frozen_units else adapters


def run_case(case, info, p, steps, out_dir, git_sha, trace=True, gpus_per_node=matrices.GPUS_PER_NODE):
    """Runs one matrix case and writes its fixture; returns the fixture's path. OOM is an outcome."""
    matrices.runnable(p)
    specs.check_recipe(info["model"], p.implementation)
    loras.check_model(info["model"], p)
    check_alloc_conf(p)
    import torch
    from . import parallel, recipes
    from .recipes import losses

    if not torch.cuda.is_available():
        raise RuntimeError("torch_memory: no CUDA device")
    context = context_block(torch, git_sha)
    if needs_torchao(p):
        context["torchao"] = import_torchao(p)
    offload_module = None
    if p.activation_offloading != "none":
        offload_module, context["torchtune_activation_offloading"] = offloads.load(torch, p)
    profile = matrices.gpu_profile(context["gpu"]["name"])
    recorder = PhaseRecorder(torch, trace)
    notes, oom, model, optimizer, init_memory = [], None, None, None, None
    trainable = total = 0
    parallel.init_fake_world(case["world"])
    try:
        init = {"step": 0, "micro": 0, "phase": "init", "start_allocated_bytes": torch.cuda.memory_allocated(),
                "start_reserved_bytes": torch.cuda.memory_reserved()}
        try:
            model = recipes.build_model(info, p, parallel.DTYPES[p.master_weights_dtype], recorder.start)
            if p.lora:
                from .recipes import adapters
                trainable, total = adapters.apply_lora(model, info["model"], p)
                if p.lora.get("quantize_base") == "nf4":
                    quantized = adapters.quantize_base(model, parallel.init_values, lambda m: parallel.retie(m, info))
                    notes.append(f"lora.quantize_base nf4: {quantized} block linears hold torchao NF4Tensor weights "
                                 "(quantized whole on the GPU, then sharded by fully_shard)")
            else:
                trainable, total = parallel.freeze_to_fraction(model, p.trainable_fraction)
            if p.frozen_units:
                trainable = parallel.freeze_units(model, info, p.frozen_units)
            want_total, want_trainable = expected_params(info, p)
            if total != want_total or want_trainable not in (None, trainable):
                raise RuntimeError(f"the {p.implementation} recipe built {total} parameters ({trainable} trainable), "
                                   f"fsdpsim counts {want_total} ({want_trainable}) for {info['model']['name']}")
            # a frozen embedding's output does not require grad; reentrant checkpointing needs it to (HF
            # enable_input_require_grads)
            model.input_requires_grad = (p.trainable_fraction < 1.0 or bool(p.lora)) and p.checkpointing.outside_fsdp
            shard = parallel.shard_fsdp2 if p.fsdp_version == 2 else parallel.shard_fsdp1
            model, shard_notes = shard(model, p, info)
            notes += shard_notes
            inner = model.module if p.fsdp_version == 1 else model
            inner.setup_rope(torch.device("cuda"), p.seq_len, parallel.DTYPES[p.param_dtype])
            optimizer = _optimizer(torch, model, p, notes)
            vocab = info["model"]["vocab_size"]
            tokens = torch.randint(0, vocab, (p.micro_batch, p.seq_len), device="cuda")
            labels = torch.randint(0, vocab, (p.micro_batch, p.seq_len), device="cuda")
            loss_fn = None if inner.loss_inside else losses.loss_fn(p.implementation, p.cross_entropy)
            if offload_module is not None:
                inner.offload_ctx = offloads.context(offload_module, model, p)
                notes.append(f"activation_offloading {p.activation_offloading}: torchtune's OffloadActivations around "
                             "the model's forward, the lm_head under NoOpManager")
            torch.cuda.synchronize()
            init.update(peak_allocated_bytes=torch.cuda.max_memory_allocated(),
                        peak_reserved_bytes=torch.cuda.max_memory_reserved())
            torch.cuda.empty_cache()
            init.update(end_allocated_bytes=torch.cuda.memory_allocated(), end_reserved_bytes=torch.cuda.memory_reserved())
            init_memory = _init_memory_check(torch, model, inner, optimizer, tokens, labels, init["end_allocated_bytes"])
            init_note = init_check.note(init_memory)
            if init_note:
                notes.append(init_note)
                print(f"torch_memory: {case['name']}: {init_note}", file=sys.stderr, flush=True)
        except torch.OutOfMemoryError as e:
            oom = {"step": 0, "micro": 0, "phase": "init", "message": str(e).strip().splitlines()[0][:400]}
            init.update(peak_allocated_bytes=torch.cuda.max_memory_allocated(), peak_reserved_bytes=torch.cuda.max_memory_reserved(),
                        end_allocated_bytes=torch.cuda.memory_allocated(), end_reserved_bytes=torch.cuda.memory_reserved())
        recorder.phases.append(init)

        baseline = {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}
        step_info, snapshot = {}, None
        # FSDPSIM_TM_ALLOC_TRACE=DIR: also write the allocator's whole history (the segments when recording
        # began, then every allocator action) as DIR/<case>.alloc-trace.json.gz, for replaying it through
        # fsdpsim's caching-allocator model (snapshot.compact_allocator_trace).
        alloc_trace_dir = os.environ.get("FSDPSIM_TM_ALLOC_TRACE") if trace else None
        initial_snapshot = torch.cuda.memory._snapshot() if alloc_trace_dir else None
        if oom is None:
            if trace:
                torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                         max_entries=MAX_HISTORY_ENTRIES)
            try:
                for step in range(1, steps + 1):
                    step_info[step] = _train_step(torch, model, optimizer, p, tokens, labels, loss_fn, recorder, step)
            except torch.OutOfMemoryError as e:
                oom = {"step": recorder.step, "micro": recorder.micro,
                       "phase": recorder.current["phase"] if recorder.current else "unknown",
                       "message": str(e).strip().splitlines()[0][:400]}
                recorder.close()
            if trace:
                snapshot = torch.cuda.memory._snapshot()
                torch.cuda.memory._record_memory_history(enabled=None)
        if alloc_trace_dir and snapshot is not None:
            _write_alloc_trace(alloc_trace_dir, case, context, initial_snapshot, snapshot, model, p)
        fixture = _assemble(torch, case, info, p, steps, context, profile, gpus_per_node, recorder, step_info,
                            trainable, total, oom, notes, snapshot, baseline, model, init_memory)
        path = fixtures.write_fixture(fixture, out_dir)
        ops_path = os.environ.get("FSDPSIM_TM_PROFILE_OPS")
        if ops_path and oom is None:
            from . import op_profile
            op_profile.profile_steps(torch, lambda s: _train_step(torch, model, optimizer, p, tokens, labels, loss_fn,
                                                                  recorder, s),
                                     steps + 1, ops_path, context, run_case_record_of(fixture))
        return path
    finally:
        model = optimizer = None
        gc.collect()
        torch.cuda.empty_cache()
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


def run_case_record_of(fixture):
    return {k: fixture["case"][k] for k in ("name", "model", "cluster", "world", "plan") if k in fixture["case"]}


def _init_memory_check(torch, model, inner, optimizer, tokens, labels, allocated):
    """init_check: memory_allocated after sharding against the sharded model's local shards and buffers,
    the RoPE tables, the batches and any optimizer state (none yet for AdamW / SGD). A failed walk is
    recorded as such, never fails the case."""
    try:
        state = [t for s in optimizer.state.values() for t in s.values()] if optimizer is not None else []
        tensors = init_check.model_tensors(model) + init_check.harness_tensors(inner, tokens, labels) + state
        expected = init_check.account(init_check.cuda_storages(tensors))
    except (AttributeError, RuntimeError, TypeError) as e:
        return {"ok": None, "error": f"{type(e).__name__}: {e}"[:300]}
    return init_check.compare(allocated, expected)


def _optimizer(torch, model, p, notes):
    params = [q for q in model.parameters() if q.requires_grad]
    impl = {"fused": True} if p.optimizer_impl == "fused" else {"foreach": True}
    if p.offload_params and p.optimizer_impl == "fused":
        impl = {"foreach": True}
        notes.append("cpu_offload: the optimizer steps on the CPU with foreach (fused is CUDA-only in PyTorch's AdamW)")
    if p.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9, **impl)
    if p.optimizer in plans.TORCHAO_OPTIMIZERS:
        # torchao/optim/adam.py: state created at the first step, quantized per block where a (local) tensor
        # has >= 4096 elements in whole blocks; the step is one torch.compile'd function per parameter.
        from torchao.optim import AdamW4bit, AdamW8bit
        cls = AdamW8bit if p.optimizer == "torchao_adamw8bit" else AdamW4bit
        notes.append(f"optimizer {p.optimizer}: torchao.optim.{cls.__name__} (optimizer_impl does not apply)")
        return cls(params, lr=1e-5)
    return torch.optim.AdamW(params, lr=1e-5, **impl)


def _train_step(torch, model, optimizer, p, tokens, labels, loss_fn, recorder, step):
    import contextlib
    t0 = time.perf_counter()
    recorder.step = step
    loss_value = None
    for micro in range(p.grad_accum):
        recorder.micro = micro
        sync = micro == p.grad_accum - 1 or p.grad_sync
        no_sync = contextlib.nullcontext()
        if p.fsdp_version == 1 and not sync:
            no_sync = model.no_sync()
        elif p.fsdp_version == 2:
            model.set_requires_gradient_sync(sync)
        with no_sync:
            recorder.start("forward")
            with getattr(getattr(model, "module", model), "offload_ctx", None) or contextlib.nullcontext():
                logits, loss = model(tokens, labels)
            if loss is None:
                recorder.start("loss")
                loss = loss_fn(logits, labels)
            if p.free_logits_before_backward:
                logits = None
            if p.grad_accum > 1:
                loss = loss / p.grad_accum
            recorder.start("backward")
            loss.backward()
            loss_value = loss.detach()
            logits = loss = None
    recorder.micro = 0
    recorder.start("optimizer")
    optimizer.step()
    recorder.start("zero_grad")
    optimizer.zero_grad(set_to_none=True)
    recorder.close()
    torch.cuda.synchronize()
    return {"time_s": round(time.perf_counter() - t0, 3), "loss": float(loss_value.float().item())}


def _write_alloc_trace(out_dir, case, context, initial_snapshot, snapshot, model, p):
    """DIR/<case>.alloc-trace.json.gz: the context block, then snapshot.compact_allocator_trace."""
    import gzip
    import json
    import torch
    from . import parallel
    names = parallel.stream_names(model, p.fsdp_version) if model is not None else {}
    doc = {"context": context, "case": case["name"],
           **snapshots.compact_allocator_trace(initial_snapshot, snapshot, names, torch.cuda.current_device(),
                                               MARKER_BYTES, MARKER_FUNCTION)}
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, case["name"] + ".alloc-trace.json.gz")
    tmp = path + ".tmp"
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, path)        # written atomically, as every output


def _assemble(torch, case, info, p, steps, context, profile, gpus_per_node, recorder, step_info, trainable, total,
              oom, notes, snapshot, baseline, model, init_memory=None):
    completed = set(step_info)
    step_records = []
    for s in fixtures.steps_from_phases(recorder.phases):
        if s["step"] not in completed:
            continue
        last = [ph for ph in recorder.phases if ph["step"] == s["step"]][-1]
        s.update(end_allocated_bytes=last["end_allocated_bytes"], end_reserved_bytes=last["end_reserved_bytes"],
                 **step_info[s["step"]])
        step_records.append(s)
    plan_as_run = plans.explicit_plan(case["plan"])
    if p.trainable_fraction < 1.0:
        plan_as_run["trainable_fraction"] = round(trainable / total, 6)
    run_case_record = {
        "name": case["name"], "why": case.get("why", ""), "model": info["model"]["name"], "model_spec": info["model"],
        "cluster": matrices.cluster_name(case["world"], profile, gpus_per_node), "world": case["world"],
        "gpus_per_node": gpus_per_node, "mesh": [p.mesh_replicate, p.mesh_shard], "plan": plan_as_run,
        "matrix_plan": case["plan"], "steps": steps, "total_params": total, "trainable_params": trainable}
    if p.trainable_fraction < 1.0:
        run_case_record["requested_trainable_fraction"] = p.trainable_fraction
    stats = torch.cuda.memory_stats()
    allocator = {"empty_cache_after_init": True,
                 **{k: int(stats.get(k, 0)) for k in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")}}
    if init_memory is not None:
        allocator["init_memory_check"] = init_memory
    timeline = None
    if snapshot is not None:
        from . import parallel
        names = parallel.stream_names(model, p.fsdp_version) if model is not None else {}
        try:
            timeline = snapshots.reduce_snapshot(snapshot, recorder.labels, baseline, MARKER_BYTES, MARKER_FUNCTION,
                                                 names, device=torch.cuda.current_device(),
                                                 max_entries=MAX_HISTORY_ENTRIES)
            timeline["replay_vs_allocator_bytes"] = {
                "allocated": timeline["end"]["allocated"] - torch.cuda.memory_allocated(),
                "reserved": timeline["end"]["reserved"] - torch.cuda.memory_reserved()}
        except (ValueError, KeyError, IndexError) as e:
            notes.append(f"memory history not reduced: {e}")
    fixture = fixtures.build_fixture(context, run_case_record, "oom" if oom else "ok", step_records,
                                     recorder.phases, timeline, allocator, oom)
    if notes:
        fixture["notes"] = notes
    return fixture

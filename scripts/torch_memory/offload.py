"""torchtune's activation offloading for the harness (plan.activation_offloading; the simulator's model:
program/lower_walk.cpp "activation offloading").

The GPU machine has PyTorch but no torchtune and no network. FSDPSIM_TORCHTUNE_PATH names a torchtune source tree
(at least torchtune/training/_activation_offloading.py, e.g. `git archive HEAD torchtune/training` of a
pytorch/torchtune snapshot), FSDPSIM_TORCHTUNE_SOURCE what it is (e.g. pytorch/torchtune@<commit>). The file is
executed as it is, its imports that do not concern offloading stood in for where they do not import: torchtune's
package (TiedLinear, get_logger), torchao (NF4Tensor, only named in an error path), psutil (the host-memory warning).
The context is built as torchtune's recipes build it (training.get_act_offloading_ctx_manager): OffloadActivations
around the model's forward, and a NoOpManager around the output projection, here the model's lm_head.
"""
import contextlib
import importlib.util
import logging
import os
import sys
import types

from .common import InputError, show

SOURCE = "torchtune/training/_activation_offloading.py"


def _stand_in(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


def _importable(name):
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def stand_ins(torch):
    """The modules the offloading file imports that are not there, by name (pure: tested without PyTorch when
    `torch` is None)."""
    out = {}
    if not _importable("psutil"):
        out["psutil"] = _stand_in("psutil", virtual_memory=lambda: types.SimpleNamespace(percent=0.0))
    if not _importable("torchao"):
        base = torch.Tensor if torch is not None else object
        out["torchao"] = _stand_in("torchao", __version__="0")
        out["torchao.quantization"] = _stand_in("torchao.quantization", NF4Tensor=type("NF4Tensor", (base,), {}))
    out["torchtune"] = _stand_in("torchtune")
    out["torchtune.modules"] = _stand_in("torchtune.modules", TiedLinear=type("TiedLinear", (), {}))
    out["torchtune.utils"] = _stand_in("torchtune.utils", get_logger=lambda level="INFO": logging.getLogger("torchtune"))
    return out


def source_path(p):
    """The offloading file under FSDPSIM_TORCHTUNE_PATH, or an InputError naming the plan's field."""
    root = os.environ.get("FSDPSIM_TORCHTUNE_PATH", "")
    path = os.path.join(root, SOURCE)
    if not root or not os.path.isfile(path):
        raise InputError("plan.activation_offloading", show(p.activation_offloading),
                         f"needs torchtune's {SOURCE}: set FSDPSIM_TORCHTUNE_PATH to a torchtune source tree "
                         f"(not found: {path or SOURCE})")
    return path


def load(torch, p):
    """torchtune's offloading module, and the fixture's context entry."""
    path = source_path(p)
    saved = {}
    for name, module in stand_ins(torch).items():
        saved[name] = sys.modules.get(name)
        sys.modules[name] = module
    try:
        spec = importlib.util.spec_from_file_location("fsdpsim_torchtune_activation_offloading", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module, {"path": path, "source": os.environ.get("FSDPSIM_TORCHTUNE_SOURCE", "unknown"),
                    "use_streams": p.activation_offloading == "streams"}


def context(module, model, p):
    """OffloadActivations for the model's forward, the output projection under NoOpManager (as
    get_act_offloading_ctx_manager does for torchtune's `model.output`)."""
    if p.activation_offloading == "none":
        return contextlib.nullcontext()
    ctx = module.OffloadActivations(use_streams=p.activation_offloading == "streams")
    inner = getattr(model, "module", model)
    head = getattr(inner, "lm_head", None)
    if head is None:
        raise RuntimeError("activation offloading: the model has no lm_head to keep out of the offloading")
    noop = module.NoOpManager()
    head.register_forward_pre_hook(lambda *args: noop.__enter__())
    head.register_forward_hook(lambda *args: noop.__exit__(), always_call=True)
    return ctx

"""The ModelSpecs the harness builds, as fsdpsim itself prints them.

`fsdpsim model-info --model M --json` is the source; its model, units and parameter counts are kept in
scripts/torch_memory/models/<M>.json so the GPU machine, which has PyTorch but no fsdpsim build, builds
exactly fsdpsim's model. The CTest validation_torch_memory_specs regenerates them with build/fsdpsim and
fails if a committed copy is stale (refresh: `torch_memory_reference.py refresh-models`).
"""
import json
import os
import subprocess

from .common import InputError, load_json, show, write_json_atomic

MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
# Zoo models of the matrix (llama3-70b: torchtune's 70B LoRA row, gt0449, at W=8); tiny-llama is the smoke test's (each code path in seconds).
MODELS = ("llama-1b", "llama3-8b", "llama3-70b", "gpt2", "tiny-llama")
# Which implementation recipes build which model family (recipes/).
RECIPES_BY_TYPE = {"llama": ("torchtitan", "hf", "litgpt", "fused"), "gpt2": ("hf", "fused")}
# model-info keys kept beside the model itself (the estimate and the built-model check use them).
KEPT_KEYS = ("params_total", "params_per_block", "params_embedding", "params_lm_head", "params_final_norm",
             "params_matmul_active_per_token")


def model_info_subset(info):
    """The part of `fsdpsim model-info --json` the harness keeps (no context block: it changes every run)."""
    out = {"model": info["model"]}
    for key in KEPT_KEYS:
        out[key] = info[key]
    out["units"] = [{"name": u["name"], "is_root": u["is_root"], "layers": u["layers"], "params": u["params"]}
                    for u in info["units"]]
    return out


def run_model_info(fsdpsim, name):
    """`fsdpsim model-info --model NAME --json`, parsed."""
    proc = subprocess.run([fsdpsim, "model-info", "--model", name, "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise InputError("--fsdpsim", show(fsdpsim), f"model-info --model {name} failed: {proc.stderr.strip()[:300]}")
    return json.loads(proc.stdout)


def refresh(fsdpsim, models_dir=MODELS_DIR, names=MODELS):
    for name in names:
        write_json_atomic(os.path.join(models_dir, f"{name}.json"), model_info_subset(run_model_info(fsdpsim, name)))


def load_model_info(name, models_dir=MODELS_DIR, field="model"):
    if name not in MODELS:
        raise InputError(field, show(name), "expected one of " + ", ".join(MODELS))
    info = load_json(os.path.join(models_dir, f"{name}.json"), field)
    for key in ("model", "units") + KEPT_KEYS:
        if key not in info:
            raise InputError(f"{field} ({name}.json).{key}", "<missing>", "regenerate with refresh-models")
    return info


def check_recipe(model, implementation, field="plan.implementation"):
    allowed = RECIPES_BY_TYPE.get(model["model_type"])
    if allowed is None:
        raise InputError("model", show(model["name"]), "the harness builds llama and gpt2 models")
    if implementation not in allowed:
        raise InputError(field, show(implementation),
                         f"{model['model_type']} models are built in the recipes " + ", ".join(allowed))


def block_unit_names(info):
    """Unit name of each transformer block, by layer index (model.layers.N / transformer.h.N)."""
    names = {}
    for u in info["units"]:
        if not u["is_root"] and len(u["layers"]) == 1:
            names[u["layers"][0]] = u["name"]
    return names

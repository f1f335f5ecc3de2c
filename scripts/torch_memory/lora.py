"""plan.lora for the harness, without PyTorch: which modules of a recipe's model get adapters, the adapter
matrices' shapes, the trainable count, and the plans the harness refuses.

The shapes follow the simulator (models/trainable.cpp `lora_adapters`, program/lower_context.cpp
`lora_shape`): an A of (rank, in) and a B of (out, rank) beside each targeted linear of every block, and
of the LM head when "head" is targeted; base weights frozen, only the adapters train. A fused q/k/v
matrix takes one pair over the whole matrix (GPT-2's c_attn), except litgpt's LoRAQKVLinear: one A of (rank x #enabled parts, in) and one B of (the
enabled parts' widths summed, rank). recipes/adapters.py builds them.

Each entry of block_adapters / head_adapters:
  kind    "linear": a LoRALinear around the base module at `module` (an nn.Linear or GPT-2's Conv1D);
          "qkv_parts": litgpt's grouped adapter around the fused qkv linear at `module`, `parts` the
          enabled (name, width) pairs in q, k, v order;
  module  the path inside the block (or in the model, for the head);
  base    the simulator's Weight of the adapted matrix (Q, K, V, QKV, Out, Gate, Up, Fc, Down, LmHead);
  a, b    (rows, cols) of A and B as nn.Parameter stores them.
"""
from .common import InputError, show

# Alpha of the adapter path's scale alpha / rank. The simulator assumes none (memory and FLOPs do not
# depend on it); 2 x rank is torchtune's and litgpt's usual ratio (lora_alpha 16 at rank 8).
ALPHA_PER_RANK = 2.0


def _recipe_qkv(spec, implementation):
    """How the simulator holds q/k/v for this recipe (models/block_recipes.cpp recipe_for, block_matrices):
    "separate", "fused" (one matrix, one pair) or "litgpt" (LoRAQKVLinear)."""
    if implementation == "litgpt":
        return "litgpt"
    if spec["model_type"] in ("gpt2", "mpt"):
        return "fused"
    return "separate"


def _plain_mlp(spec):
    return spec["mlp"] != "swiglu"


def check_model(spec, p):
    """program/lower_context.cpp lora_shape's model-dependent rules, then what the harness does not build."""
    lora = p.lora
    if not lora:
        return
    for t in lora["targets"]:
        if spec.get("n_experts") and t in ("gate", "up", "down"):
            raise InputError("plan.lora.targets", show(t), "LoRA on a mixture-of-experts MLP is not modelled (adapt q, k, v, o or head)")
        if t == "gate" and _plain_mlp(spec):
            raise InputError("plan.lora.targets", '"gate"', "this model's MLP has no gate projection (a plain MLP: use up and down)")
    smallest = min(spec["hidden"], spec["head_dim"] * min(spec["n_heads"], spec["n_kv_heads"]))
    if any(t in ("gate", "up", "down") for t in lora["targets"]):
        smallest = min(smallest, spec["ffn_hidden"])
    if lora["rank"] > smallest:
        raise InputError("plan.lora.rank", str(lora["rank"]),
                         f"above the smallest dimension of an adapted matrix ({smallest}): a low-rank update needs rank <= min(in, out)")
    if lora.get("quantize_base") == "nf4":
        _check_nf4(spec, p)
    head = "head" in lora["targets"]
    if head and p.cross_entropy == "fused_linear":
        raise InputError("plan.lora.targets", '"head"',
                         "the fused linear cross-entropy takes the LM head's weight alone (no adapter path); "
                         "use cross_entropy torch, or no head target")
    if p.fsdp_version == 1 and not p.use_orig_params:
        # FlatParamHandle._validate_tensors_to_flatten: one requires_grad per FlatParameter. The harness
        # gives each block's adapters a FlatParameter of their own (recipes/adapters.py LoraBank), as the
        # simulator models it (fsdp1_unit_sizes); it has no such unit for the root's head adapters.
        if head:
            raise InputError("plan.lora.targets", '"head"',
                             "with FSDP1 use_orig_params false the harness flattens the adapters apart per transformer block "
                             "only; adapt the head with use_orig_params true or FSDP2")
        if p.auto_wrap_policy != "transformer_block":
            raise InputError("plan.auto_wrap_policy", show(p.auto_wrap_policy),
                             "LoRA with FSDP1 use_orig_params false needs the transformer_block policy (the adapters of each "
                             "block get a FlatParameter of their own)")


NF4_QUANTUM = 64 * 256     # models/nf4.h kNf4Quantum: to_nf4's block size x scaler block size


def _check_nf4(spec, p):
    """QLoRA's rules: the simulator's (program/lower_context.cpp lora_shape and the NF4 shard sizes), then
    what the harness builds (torchao's NF4Tensor under FSDP2; bitsandbytes' FSDP1 layout is not installed)."""
    field = "plan.lora.quantize_base"
    if p.fsdp_version != 2:
        raise InputError(field, '"nf4"', "under FSDP1 the simulator models bitsandbytes' Params4bit, which is not installed "
                                         "where the harness runs; measure QLoRA with fsdp_version 2 (torchao's NF4Tensor)")
    if p.master_weights_dtype != p.param_dtype:
        raise InputError(field, '"nf4"', "QLoRA trains in the compute dtype: set master_weights_dtype to the param_dtype")
    if p.float8 != "none" or p.fp8_all_gather:
        raise InputError(field, '"nf4"', "float8 compute or all-gathers do not apply to NF4 base weights")
    if p.offload_params or p.offload_optimizer:
        raise InputError(field, '"nf4"', "CPU offload of torchao's NF4 base weights under FSDP2 is not modelled")
    if spec["model_type"] in ("gpt2", "mpt") or p.implementation == "litgpt":
        raise InputError(field, '"nf4"', "the harness quantizes separate nn.Linear q, k, v, o and MLP projections "
                                         "(torchtune's llama): use a llama-family model with the hf or torchtitan recipe")
    shards = p.mesh_shard or 1
    h, a, g, d, f = spec["hidden"], spec["n_heads"], spec["n_kv_heads"], spec["head_dim"], spec["ffn_hidden"]
    for name, rows, cols in (("q", a * d, h), ("k", g * d, h), ("o", h, a * d), ("up", f, h), ("down", h, f)):
        if rows % shards or (rows * cols // shards) % NF4_QUANTUM:
            raise InputError(field, '"nf4"', f"the {name} projection ({rows} x {cols}) does not split into {shards} NF4 "
                                             f"shards of whole rows and whole {NF4_QUANTUM}-element blocks (torchao's nf4_split)")


def block_adapters(spec, implementation, lora):
    """The adapters of one block, in the block's linear order (models/trainable.cpp lora_adapters)."""
    if not lora:
        return []
    r, on = lora["rank"], set(lora["targets"])
    h, a, g, d, f = spec["hidden"], spec["n_heads"], spec["n_kv_heads"], spec["head_dim"], spec["ffn_hidden"]
    gpt2 = spec["model_type"] == "gpt2"
    out = []

    def pair(kind, module, base, n_in, n_out, **extra):
        out.append({"kind": kind, "module": module, "base": base, "a": (r, n_in), "b": (n_out, r), **extra})

    qkv = _recipe_qkv(spec, implementation)
    widths = (("q", a * d), ("k", g * d), ("v", g * d))
    if on & {"q", "k", "v"}:
        if qkv == "litgpt":
            parts = [(n, w) for n, w in widths if n in on]
            out.append({"kind": "qkv_parts", "module": "self_attn.qkv", "base": "QKV", "a": (r * len(parts), h),
                        "b": (sum(w for _, w in parts), r), "parts": parts})
        elif qkv == "fused":
            pair("linear", "attn.c_attn", "QKV", h, (a + 2 * g) * d)
        else:
            for n, w in widths:
                if n in on:
                    pair("linear", f"self_attn.{n}_proj", n.upper(), h, w)
    if "o" in on:
        module = "attn.c_proj" if gpt2 else "self_attn.proj" if implementation == "litgpt" else "self_attn.o_proj"
        pair("linear", module, "Out", a * d, h)
    if _plain_mlp(spec):
        if "up" in on:
            pair("linear", "mlp.c_fc", "Fc", h, f)
    else:
        if "gate" in on:
            pair("linear", "mlp.gate_proj", "Gate", h, f)
        if "up" in on:
            pair("linear", "mlp.up_proj", "Up", h, f)
    if "down" in on:
        pair("linear", "mlp.c_proj" if gpt2 else "mlp.down_proj", "Down", f, h)
    return out


def head_adapters(spec, lora):
    if not lora or "head" not in lora["targets"]:
        return []
    r = lora["rank"]
    return [{"kind": "linear", "module": "lm_head", "base": "LmHead", "a": (r, spec["hidden"]), "b": (spec["vocab_size"], r)}]


def adapter_numel(adapters):
    return sum(x["a"][0] * x["a"][1] + x["b"][0] * x["b"][1] for x in adapters)


def trainable_params(spec, implementation, lora):
    """models/trainable.cpp lora_trainable_set's `trainable`: every block's adapters and the head's."""
    return spec["n_layers"] * adapter_numel(block_adapters(spec, implementation, lora)) + adapter_numel(head_adapters(spec, lora))

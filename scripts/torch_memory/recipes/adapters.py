"""LoRA adapters (plan.lora) on a recipe's model, as torch_memory/lora.py lists them (the simulator's
models/trainable.cpp `lora_adapters`).

Every parameter of the model is frozen, then each targeted module of every block (and the LM head when
"head" is targeted) gets an adapter pair: lora_a (rank, in), random, and lora_b (out, rank), zero (PEFT
peft/tuners/lora/layer.py LoraLayer.reset_lora_parameters; litgpt and torchtune also start B at zero), both
trainable. The adapter path is base(x) + lora_b(lora_a(dropout(x))) * (alpha / rank), with nn.Dropout
only when the plan's dropout is above 0 (the simulator's LoraShape.dropout). The pair is the wrapper's own
parameters, registered before its base module, so named_parameters (and FSDP1's flattening) lists them
first, as litgpt's LoRALinear does (the simulator's fsdp1_unit_sizes places them before the base weight).

QLoRA (plan.lora.quantize_base "nf4", FSDP2 only): quantize_base materializes the model on the GPU, initializes
it, and turns every block's nn.Linear (adapted or not) into an NF4Linear, torchtune's FrozenNF4Linear
(torchtune/modules/low_precision/nf4_linear.py at 30b8519, and peft/lora.py LoRALinear with quantize_base):
the weight a torchao NF4Tensor (to_nf4, block 64, scaler block 256) held as a frozen nn.Parameter, the forward
torchao's linear_nf4 (dequantize into the compute dtype, F.linear; the backward dequantizes again). The
simulator's tensor_nf4 (models/trainable.cpp) quantizes the same set: the blocks' linears, not the embedding
or the LM head. torchtune quantizes a full weight and then shards it (load_from_full_model_state_dict); the
harness does the same: fully_shard splits each NF4Tensor by rows (torchao's nf4_split).

FSDP1 without use_orig_params flattens each unit into FlatParameters of one requires_grad
(FlatParamHandle._validate_tensors_to_flatten): move_to_banks gives each block's adapters a module of their
own, LoraBank, wrapped by FSDP1 apart from the frozen block (the simulator's "one more FlatParameter of
this unit holding its adapters", program/lower_context.cpp fsdp1_unit_sizes; torchtune's lora_fsdp_wrap_policy
wraps the adapters apart too, per adapter linear).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import lora as loras


def _dims(base):
    """(in, out) of an nn.Linear (weight [out, in]) or GPT-2's Conv1D (weight [in, out])."""
    if isinstance(base, nn.Linear):
        return base.in_features, base.out_features
    return base.weight.shape[0], base.weight.shape[1]


class Adapted(nn.Module):
    """One adapter pair. `adapter()` returns (A, B): the module's own parameters, or after move_to_banks
    the block's LoraBank's (read through the block at call time: FSDP1 puts its unsharded views there)."""

    def _init_adapter(self, a_shape, b_shape, dropout, scaling, like):
        self.lora_a = nn.Parameter(torch.empty(*a_shape, device=like.device, dtype=like.dtype))
        self.lora_b = nn.Parameter(torch.empty(*b_shape, device=like.device, dtype=like.dtype))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None   # p = 0: no op at all (LoraShape.dropout)
        self.scaling = scaling
        self.bank = None                 # (block, key) after move_to_banks

    def adapter(self):
        if self.bank is None:
            return self.lora_a, self.lora_b
        block, key = self.bank
        bank = block.lora_bank           # FSDP(LoraBank) forwards attribute reads to the wrapped module
        return getattr(bank, key + "__lora_a"), getattr(bank, key + "__lora_b")

    def adapter_input(self, x):
        return x if self.dropout is None else self.dropout(x)


class LoRALinear(Adapted):
    """base(x) + B(A(dropout(x))) * scaling around an nn.Linear or Conv1D (PEFT Linear.forward's sum)."""

    def __init__(self, base, rank, dropout, scaling):
        super().__init__()
        n_in, n_out = _dims(base)
        self._init_adapter((rank, n_in), (n_out, rank), dropout, scaling, base.weight)
        self.base = base

    def forward(self, x):
        a, b = self.adapter()
        return self.base(x) + F.linear(F.linear(self.adapter_input(x), a), b) * self.scaling


class LoRAQKVParts(Adapted):
    """litgpt's fused-qkv adapter (litgpt/lora.py LoRAQKVLinear at 01e39f5; the same order at 8641822) and
    the simulator's recipe for it (models/block_recipes.cpp lora): one A of (rank x n, in) for the n enabled
    parts of q, k, v and one B of the enabled parts' widths by rank. The forward in litgpt's order: the
    pretrained linear first; A; B as a conv1d of kernel 1 over A's transposed output (LoRAQKVLinear.conv1d:
    one grouped conv1d when every head has its own k and v, else the input chunked per part, one conv1d each
    and a torch.cat); zero_pad where a part is not enabled (a full-width tensor of zeros, the update's
    transpose reshaped (a copy), index_copy out of place with the enabled parts' columns); the product by the
    scaling; the sum with the pretrained output. `after_a` and `after_b` are locals until the forward returns.
    The columns are this harness's q | k | v layout (recipes/llama.py FusedQKV); litgpt interleaves them per
    query group, which changes no tensor's size. (Until 2026-11-29 the harness ran the adapter before the
    pretrained linear and built the update by per-part linears and a cat: the first cuBLAS workspace of
    l1b-fsdp1-orig-lora-r8-qv-litgpt then landed elsewhere, and with it its steady step's segments.)"""

    def __init__(self, base, rank, dropout, scaling, parts, layout, grouped):
        super().__init__()
        n_in, _ = _dims(base)
        self._init_adapter((rank * len(parts), n_in), (sum(w for _, w in parts), rank), dropout, scaling, base.weight)
        self.base = base
        self.widths = [w for _, w in parts]
        self.grouped = grouped          # n_head == n_query_groups: one grouped conv1d
        starts, at = {}, 0
        for name, width in layout:
            starts[name] = (at, width)
            at += width
        self.out_features = at
        self.lora_ind = [c for n, _ in parts for c in range(starts[n][0], starts[n][0] + starts[n][1])]

    def conv1d(self, inp, weight):
        if self.grouped:
            return F.conv1d(inp, weight, groups=len(self.widths))
        return torch.cat([F.conv1d(a, b) for a, b in zip(inp.chunk(len(self.widths), dim=1), weight.split(self.widths))],
                         dim=1)

    def zero_pad(self, u):
        if sum(self.widths) == self.out_features:
            return u
        u = u.transpose(0, 1)
        result = u.new_zeros((*u.shape[:-1], self.out_features)).view(-1, self.out_features)
        result = result.index_copy(1, torch.tensor(self.lora_ind, device=result.device), u.reshape(-1, sum(self.widths)))
        return result.view((*u.shape[:-1], self.out_features)).transpose(0, 1)

    def forward(self, x):
        pretrained = self.base(x)
        a, b = self.adapter()
        after_a = F.linear(self.adapter_input(x), a)
        after_b = self.conv1d(after_a.transpose(-2, -1), b.unsqueeze(-1)).transpose(-2, -1)
        lora = self.zero_pad(after_b) * self.scaling
        return pretrained + lora


class LoraBank(nn.Module):
    """The adapters of one block as one module, for FSDP1 without use_orig_params. The block runs its body
    through the bank (forward(fn, *args) = fn(*args)): FSDP's pre-forward unshards the adapters' FlatParameter
    for the whole block, and the pre-backward hook FSDP registers on the block's output unshards it again
    before the block's backward."""

    def forward(self, fn, *args):
        return fn(*args)


def blocks_of(model):
    return model.model.layers if hasattr(model, "model") else model.transformer.h


def _swap(parent, path, make):
    owner, _, name = path.rpartition(".")
    holder = parent.get_submodule(owner) if owner else parent
    wrapper = make(getattr(holder, name))
    setattr(holder, name, wrapper)
    return wrapper


def _attach(parent, entry, lora, scaling):
    rank, dropout = lora["rank"], lora["dropout"]
    if entry["kind"] == "linear":
        made = _swap(parent, entry["module"], lambda base: LoRALinear(base, rank, dropout, scaling))
    elif entry["kind"] == "qkv_parts":
        widths = _litgpt_widths(parent)
        layout = list(zip("qkv", widths))
        grouped = widths[0] == widths[1]
        made = _swap(parent, entry["module"],
                     lambda base: LoRAQKVParts(base, rank, dropout, scaling, entry["parts"], layout, grouped))
    else:
        raise AssertionError(entry["kind"])
    shapes = (tuple(made.lora_a.shape), tuple(made.lora_b.shape))
    if shapes != (tuple(entry["a"]), tuple(entry["b"])):
        raise RuntimeError(f"LoRA on {entry['module']}: built A {shapes[0]}, B {shapes[1]}; the simulator's are "
                           f"A {tuple(entry['a'])}, B {tuple(entry['b'])}")


def _litgpt_widths(block):
    attn = block.get_submodule("self_attn")
    return attn.n_heads * attn.head_dim, attn.n_kv_heads * attn.head_dim, attn.n_kv_heads * attn.head_dim


def apply_lora(model, spec, p):
    """Freezes the model and adds plan.lora's adapters. Returns (trainable, total) parameter counts."""
    for param in model.parameters():
        param.requires_grad_(False)
    scaling = loras.ALPHA_PER_RANK          # alpha / rank with alpha = ALPHA_PER_RANK x rank
    entries = loras.block_adapters(spec, p.implementation, p.lora)
    for block in blocks_of(model):
        for entry in entries:
            _attach(block, entry, p.lora, scaling)
    for entry in loras.head_adapters(spec, p.lora):
        _attach(model, entry, p.lora, scaling)
    params = list(model.parameters())       # a tied weight once
    return sum(q.numel() for q in params if q.requires_grad), sum(q.numel() for q in params)


class NF4Linear(nn.Module):
    """A frozen linear whose weight is a torchao NF4Tensor (torchtune's FrozenNF4Linear; no bias: llama's
    linears have none, and the harness quantizes nothing else)."""

    def __init__(self, base, to_nf4, linear_nf4):
        super().__init__()
        if base.bias is not None:
            raise RuntimeError("NF4Linear: a biased linear (the harness quantizes llama-family block linears only)")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = nn.Parameter(to_nf4(base.weight.detach()), requires_grad=False)
        self._linear_nf4 = linear_nf4

    def forward(self, x):
        return self._linear_nf4(x, self.weight)


def quantize_base(model, init_values, tie):
    """plan.lora.quantize_base "nf4": materialize the meta model on the GPU, `init_values(name, tensor)` every
    parameter, `tie(model)` what to_empty may have untied, then swap each block's nn.Linear (the adapted ones'
    bases too) for an NF4Linear. Returns the number of weights quantized. torchao comes from
    FSDPSIM_TORCHAO_PATH's source tree (train.py import_torchao)."""
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4, to_nf4
    model.to_empty(device="cuda")
    tie(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            init_values(name, param)
    count = 0
    for block in blocks_of(model):
        for path, module in list(block.named_modules()):
            if type(module) is nn.Linear:
                _swap(block, path, lambda base: NF4Linear(base, to_nf4, linear_nf4))
                count += 1
    model.materialized = True
    torch.cuda.empty_cache()
    return count


def move_to_banks(model):
    """FSDP1 without use_orig_params: each block's adapter parameters move into a LoraBank registered as
    the block's `lora_bank` (parameter names: the adapter module's path with "__", then lora_a / lora_b)."""
    for block in blocks_of(model):
        bank = LoraBank()
        for path, module in block.named_modules():
            if isinstance(module, Adapted):
                key = path.replace(".", "__")
                bank.register_parameter(key + "__lora_a", module._parameters.pop("lora_a"))
                bank.register_parameter(key + "__lora_b", module._parameters.pop("lora_b"))
                module.bank = (block, key)
        if len(bank._parameters):
            block.lora_bank = bank

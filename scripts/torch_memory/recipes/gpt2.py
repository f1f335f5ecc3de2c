"""GPT-2 (fsdpsim model_type gpt2) as transformers' modeling_gpt2.py builds it: LayerNorm, learned
positions, Conv1D projections (weight [in, out], addmm) with a fused c_attn, gelu_new, tied LM head and
the spec's dropout (fsdpsim resid_dropout / embd_dropout / attn_dropout: GPT2Config's resid_pdrop,
embd_pdrop, attn_pdrop, 0.1 each by default), which training keeps on (nn.Dropout saves a bool mask).
The fused recipe uses PyTorch's native tanh GELU and, with cross_entropy fused_linear, Liger's fused
linear cross-entropy (ops.py). Module names are HF's (transformer.h.N = fsdpsim's unit names)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from . import losses, ops


def dropout_of(spec, key):
    """The spec's dropout probability (fsdpsim's ModelSpec field); specs written before the field: 0.1,
    GPT2Config's default, which these recipes ran with."""
    return float(spec.get(key, 0.1))

LAYER_NORM_EPS = 1e-5    # GPT2Config layer_norm_epsilon


class Conv1D(nn.Module):
    """transformers pytorch_utils.Conv1D: y = addmm(bias, x.view(-1, nx), weight).view(..., nf)."""

    def __init__(self, nf, nx, dtype):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf, device="meta", dtype=dtype))
        self.bias = nn.Parameter(torch.empty(nf, device="meta", dtype=dtype))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


def gelu_new(x):
    """transformers activations.NewGELUActivation, in Python ops (each intermediate saved by autograd)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, spec, dtype):
        super().__init__()
        d = spec["hidden"]
        self.head_dim, self.split_size = spec["head_dim"], d
        self.c_attn = Conv1D(3 * d, d, dtype)
        self.c_proj = Conv1D(d, d, dtype)
        self.resid_dropout = nn.Dropout(dropout_of(spec, "resid_dropout"))
        self.attn_dropout = dropout_of(spec, "attn_dropout")

    def forward(self, x):
        q, k, v = self.c_attn(x).split(self.split_size, dim=2)          # views of the fused qkv output
        shape = (*q.shape[:-1], -1, self.head_dim)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))     # B H S hd
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.attn_dropout if self.training else 0.0,
                                             scale=self.head_dim ** -0.5, is_causal=True)
        out = out.transpose(1, 2).contiguous()                            # sdpa_attention_forward
        out = out.reshape(*out.shape[:-2], -1).contiguous()
        return self.resid_dropout(self.c_proj(out))


class GPT2MLP(nn.Module):
    def __init__(self, spec, recipe, dtype):
        super().__init__()
        self.c_fc = Conv1D(spec["ffn_hidden"], spec["hidden"], dtype)
        self.c_proj = Conv1D(spec["hidden"], spec["ffn_hidden"], dtype)
        self.act = gelu_new if recipe == "hf" else (lambda t: F.gelu(t, approximate="tanh"))
        self.dropout = nn.Dropout(dropout_of(spec, "resid_dropout"))

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class GPT2Block(nn.Module):
    def __init__(self, spec, recipe, dtype, layer_id):
        super().__init__()
        d = spec["hidden"]
        self.layer_id = layer_id
        self.ln_1 = nn.LayerNorm(d, eps=LAYER_NORM_EPS, device="meta", dtype=dtype)
        self.attn = GPT2Attention(spec, dtype)
        self.ln_2 = nn.LayerNorm(d, eps=LAYER_NORM_EPS, device="meta", dtype=dtype)
        self.mlp = GPT2MLP(spec, recipe, dtype)

    def forward(self, x):
        bank = self._modules.get("lora_bank")     # FSDP1 LoRA without use_orig_params (recipes/adapters.py)
        return self._body(x) if bank is None else bank(self._body, x)

    def _body(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, spec, recipe, dtype):
        super().__init__()
        d = spec["hidden"]
        self.wte = nn.Embedding(spec["vocab_size"], d, device="meta", dtype=dtype)
        self.wpe = nn.Embedding(spec["max_positions"], d, device="meta", dtype=dtype)
        self.drop = nn.Dropout(dropout_of(spec, "embd_dropout"))
        self.h = nn.ModuleList(GPT2Block(spec, recipe, dtype, i) for i in range(spec["n_layers"]))
        self.ln_f = nn.LayerNorm(d, eps=LAYER_NORM_EPS, device="meta", dtype=dtype)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, spec, plan, dtype, phase_hook):
        super().__init__()
        if spec["positions"] != "learned" or spec["norm"] != "layernorm":
            raise ValueError(f"the GPT-2 recipe builds learned positions and LayerNorm, not {spec['name']}")
        self.spec, self.recipe, self.cross_entropy = spec, plan.implementation, plan.cross_entropy
        self.phase_hook = phase_hook
        self.transformer = GPT2Model(spec, self.recipe, dtype)
        self.lm_head = nn.Linear(spec["hidden"], spec["vocab_size"], bias=False, device="meta", dtype=dtype)
        if spec["tied_embeddings"]:
            self.lm_head.weight = self.transformer.wte.weight
        self.outside_checkpoint = set()
        self.input_requires_grad = False
        # GPT2LMHeadModel.forward computes the loss (and Liger patches it there); loss_in_model_forward false: the loop
        # does, on the logits (not with the fused linear loss, which needs the head's weight)
        self.loss_inside = plan.loss_in_model_forward is not False or plan.cross_entropy == "fused_linear"

    def setup_rope(self, device, seq_len, compute_dtype):
        if seq_len > self.spec["max_positions"]:
            raise ValueError(f"seq_len {seq_len} exceeds GPT-2's {self.spec['max_positions']} learned positions")

    def forward(self, tokens, labels):
        t = self.transformer
        positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
        h = t.drop(t.wte(tokens) + t.wpe(positions))
        if self.input_requires_grad and not h.requires_grad:
            h.requires_grad_(True)
        for i, block in enumerate(t.h):
            h = checkpoint(block, h, use_reentrant=True) if i in self.outside_checkpoint else block(h)
        h = t.ln_f(h)
        if self.cross_entropy == "fused_linear":
            self.phase_hook("loss")
            return None, ops.FusedLinearCrossEntropy.apply(h.flatten(0, 1), self.lm_head.weight, labels.flatten())
        logits = self.lm_head(h)
        if not self.loss_inside:
            return logits, None
        self.phase_hook("loss")
        return logits, losses.loss_fn("hf", self.cross_entropy)(logits, labels)

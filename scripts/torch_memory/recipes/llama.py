"""Llama-family models (fsdpsim model_type llama) in four recipes.

Module names follow Hugging Face's (model.embed_tokens, model.layers.N, model.norm, lm_head) in every
recipe, so fsdpsim's unit names (`model-info`: root, model.layers.N) name the same modules; the names do
not change what autograd saves. Shapes in comments: B micro-batch, S sequence, D hidden, H query heads,
KV key/value heads, hd head dim, F ffn hidden, V vocabulary.
"""
import inspect
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from . import losses, ops

_TORCHTITAN_SDPA_BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
_SDPA_SET_PRIORITY = "set_priority" in inspect.signature(sdpa_kernel).parameters

NORM_EPS = 1e-5          # Llama 3's rms_norm_eps (meta-llama config.json); not in the ModelSpec
ROPE_THETA = 500000.0    # Llama 3's rope_theta; the value does not change any tensor's size


class LlamaRMSNorm(nn.Module):
    """transformers LlamaRMSNorm, unfused: saves the fp32 input (pow, mul), the rsqrt and the
    normalized tensor cast back (weight multiply)."""

    def __init__(self, dim, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, device="meta", dtype=dtype))

    def forward(self, x):
        input_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + NORM_EPS)
        return self.weight * x.to(input_dtype)


class LitRMSNorm(nn.Module):
    """litgpt/model.py RMSNorm: fp32 input, mean of x*x, x * rsqrt, times the fp32 weight, cast back."""

    def __init__(self, dim, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, device="meta", dtype=dtype))

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        norm_x = torch.mean(x * x, dim=-1, keepdim=True)
        x_normed = x * torch.rsqrt(norm_x + NORM_EPS)
        return (x_normed * self.weight.float()).to(dtype=dtype)


def make_norm(recipe, dim, dtype):
    if recipe == "hf":
        return LlamaRMSNorm(dim, dtype)
    if recipe == "litgpt":
        return LitRMSNorm(dim, dtype)
    # torchtitan uses nn.RMSNorm (torchtitan/models/common/nn_modules.py). F.rms_norm dispatches to the
    # fused kernel _fused_rms_norm on CUDA when weight and input dtypes agree (aten/src/ATen/native/
    # layer_norm.cpp rms_norm_symint), which saves the input and an fp32 rstd per row -- what Liger's
    # RMSNorm saves too, so the fused recipe uses it as well.
    return nn.RMSNorm(dim, eps=NORM_EPS, device="meta", dtype=dtype)


def _linear(i, o, dtype, bias=False):
    return nn.Linear(i, o, bias=bias, device="meta", dtype=dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class SeparateQKV(nn.Module):
    """q/k/v/o projections as torchtitan (wq, wk, wv, wo) and HF (q_proj, ...) have them."""

    def __init__(self, spec, recipe, dtype):
        super().__init__()
        d, h, kv, hd = spec["hidden"], spec["n_heads"], spec["n_kv_heads"], spec["head_dim"]
        self.recipe, self.n_heads, self.n_kv_heads, self.head_dim = recipe, h, kv, hd
        self.q_proj = _linear(d, h * hd, dtype, spec["qkv_bias"])
        self.k_proj = _linear(d, kv * hd, dtype, spec["qkv_bias"])
        self.v_proj = _linear(d, kv * hd, dtype, spec["qkv_bias"])
        self.o_proj = _linear(h * hd, d, dtype, spec["out_bias"])

    def forward(self, x, *rope):
        if self.recipe == "torchtitan":
            return self._torchtitan(x, rope[0])
        return self._hf(x, rope[0], rope[1])

    def _torchtitan(self, x, freqs_cis):
        # torchtitan models/common/attention.py GQAttention + rope.py ComplexRoPE + ScaledDotProductAttention
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        xq = xq.view(bs, seqlen, -1, self.head_dim)                       # B S H hd
        xk = xk.view(bs, seqlen, -1, self.head_dim)                       # B S KV hd
        xv = xv.view(bs, seqlen, -1, self.head_dim)
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))   # fp32 copies of q, k
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs = freqs_cis[:seqlen].view(1, seqlen, 1, -1)
        xq = torch.view_as_real(xq_ * freqs).flatten(3).type_as(xq)
        xk = torch.view_as_real(xk_ * freqs).flatten(3).type_as(xk)
        with _torchtitan_sdpa_backends():   # entered in the traced code, as torchtitan does (compile traces it)
            out = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2),
                                                 is_causal=True, enable_gqa=self.n_heads > self.n_kv_heads)
        out = out.transpose(1, 2).contiguous()                            # B S H hd, a copy
        return self.o_proj(out.view(bs, seqlen, -1))

    def _hf(self, x, cos, sin):
        # transformers modeling_llama.py LlamaAttention.forward + integrations/sdpa_attention.py; the
        # fused recipe rotates with ops.Rotary (saves cos and sin only, as Liger's rope)
        input_shape = x.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_proj(x).view(hidden_shape).transpose(1, 2)              # B H S hd (view)
        k = self.k_proj(x).view(hidden_shape).transpose(1, 2)
        v = self.v_proj(x).view(hidden_shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        if self.recipe == "fused":
            q, k = ops.Rotary.apply(q, k, cos, sin)
        else:
            q = (q * cos) + (rotate_half(q) * sin)
            k = (k * cos) + (rotate_half(k) * sin)
        # use_gqa_in_sdpa: torch >= 2.5 and no attention mask -> enable_gqa instead of repeat_kv
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, scale=self.head_dim ** -0.5,
                                             is_causal=True, enable_gqa=True)
        out = out.transpose(1, 2).contiguous()                            # B S H hd, a copy
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out)


class FusedQKV(nn.Module):
    """litgpt CausalSelfAttention: one qkv linear, split into views, RoPE, repeat_interleave of K and V
    to the query heads (litgpt does not use enable_gqa), SDPA, reshape (a copy) and proj."""

    def __init__(self, spec, dtype):
        super().__init__()
        d, h, kv, hd = spec["hidden"], spec["n_heads"], spec["n_kv_heads"], spec["head_dim"]
        self.n_heads, self.n_kv_heads, self.head_dim = h, kv, hd
        self.qkv = _linear(d, (h + 2 * kv) * hd, dtype, spec["qkv_bias"])
        self.proj = _linear(h * hd, d, dtype, spec["out_bias"])

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h, kv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.qkv(x)                                                 # B T (H + 2 KV) hd
        q, k, v = qkv.split((h * hd, kv * hd, kv * hd), dim=-1)
        q = q.view(B, T, h, hd).transpose(1, 2)
        k = k.view(B, T, kv, hd).transpose(1, 2)
        v = v.view(B, T, kv, hd).transpose(1, 2)
        q = torch.cat((_lit_apply_rope(q, cos, sin), q[..., hd:]), dim=-1)   # rope_n_elem = hd: the cat copies
        k = torch.cat((_lit_apply_rope(k, cos, sin), k[..., hd:]), dim=-1)
        if kv != h:
            k = k.repeat_interleave(h // kv, dim=1)                        # B H T hd, materialized
            v = v.repeat_interleave(h // kv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, scale=1.0 / math.sqrt(hd),
                                           is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, h * hd)                       # a copy (not contiguous)
        return self.proj(y)


def _lit_apply_rope(x, cos, sin):
    """litgpt/model.py apply_rope: cos/sin (1, T, hd) viewed to broadcast over the heads."""
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    new_shape = cos.shape[0:1] + (1,) * (x.dim() - cos.dim()) + cos.shape[1:]
    cos, sin = cos.view(*new_shape), sin.view(*new_shape)
    return ((x * cos) + (rotated * sin)).to(dtype=x.dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)): torchtitan FeedForward (w2, w1, w3), HF LlamaMLP, litgpt LLaMAMLP
    (proj, fc_1, fc_2) all run these ops; the fused recipe multiplies with ops.SiLUMul (Liger's SwiGLU)."""

    def __init__(self, spec, recipe, dtype):
        super().__init__()
        d, f, bias = spec["hidden"], spec["ffn_hidden"], spec["mlp_bias"]
        self.fused = recipe == "fused"
        self.gate_proj = _linear(d, f, dtype, bias)
        self.up_proj = _linear(d, f, dtype, bias)
        self.down_proj = _linear(f, d, dtype, bias)

    def forward(self, x):
        if self.fused:
            return self.down_proj(ops.SiLUMul.apply(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, spec, recipe, dtype, layer_id):
        super().__init__()
        if spec["mlp"] != "swiglu" or spec["norm"] != "rmsnorm" or spec["n_experts"]:
            raise ValueError(f"the llama recipes build dense SwiGLU/RMSNorm models, not {spec['name']}")
        self.layer_id = layer_id
        # Registration order is named_parameters' order: what FSDP1 flattens a block in (so where the shard
        # boundaries fall among its parameters) and what FSDP2 makes each parameter's shard in. litgpt's Block
        # registers norm_1, attn, norm_2, mlp; transformers' LlamaDecoderLayer self_attn, mlp, input_layernorm,
        # post_attention_layernorm, and torchtitan's TransformerBlock attention, feed_forward, attention_norm,
        # ffn_norm: the norms last (fsdpsim's models/module_tree.cpp builds the same orders). (Until 2026-11-29
        # every recipe registered litgpt's order.)
        if recipe == "litgpt":
            self.input_layernorm = make_norm(recipe, spec["hidden"], dtype)
            self.self_attn = FusedQKV(spec, dtype)
            self.post_attention_layernorm = make_norm(recipe, spec["hidden"], dtype)
            self.mlp = SwiGLU(spec, recipe, dtype)
        else:
            self.self_attn = SeparateQKV(spec, recipe, dtype)
            self.mlp = SwiGLU(spec, recipe, dtype)
            self.input_layernorm = make_norm(recipe, spec["hidden"], dtype)
            self.post_attention_layernorm = make_norm(recipe, spec["hidden"], dtype)

    def forward(self, x, *rope):
        bank = self._modules.get("lora_bank")     # FSDP1 LoRA without use_orig_params (recipes/adapters.py)
        return self._body(x, *rope) if bank is None else bank(self._body, x, *rope)

    def _body(self, x, *rope):
        # torchtitan: h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)); HF and
        # litgpt write the same two residual adds.
        h = x + self.self_attn(self.input_layernorm(x), *rope)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, spec, recipe, dtype):
        super().__init__()
        self.embed_tokens = nn.Embedding(spec["vocab_size"], spec["hidden"], device="meta", dtype=dtype)
        self.layers = nn.ModuleList(LlamaDecoderLayer(spec, recipe, dtype, i) for i in range(spec["n_layers"]))
        self.norm = make_norm(recipe, spec["hidden"], dtype)


class LlamaForCausalLM(nn.Module):
    def __init__(self, spec, plan, dtype, phase_hook):
        super().__init__()
        self.spec, self.recipe, self.cross_entropy = spec, plan.implementation, plan.cross_entropy
        self.phase_hook = phase_hook
        self.model = LlamaModel(spec, self.recipe, dtype)
        self.lm_head = _linear(spec["hidden"], spec["vocab_size"], dtype)
        if spec["tied_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.outside_checkpoint = set()     # layer ids run as checkpoint(FSDP(block)) (parallel.py)
        self.input_requires_grad = False    # HF enable_input_require_grads, for reentrant checkpointing
        self.rope = ()                      # set by setup_rope on the device (plain tensors, not buffers)
        # HF computes the loss inside LlamaForCausalLM.forward; Liger's fused linear cross-entropy needs
        # the head's weight, so it is computed there too. torchtitan and litgpt compute it outside.
        # torchtune's chunked output is followed by its loss in the recipe, outside the model.
        self.loss_inside = (self.recipe == "hf" and self.cross_entropy != "chunked") or self.cross_entropy == "fused_linear"
        if plan.loss_in_model_forward is not None and self.cross_entropy != "fused_linear":
            self.loss_inside = plan.loss_in_model_forward   # (the fused one needs the head's weight: always inside)
        self.loss_chunks = plan.cross_entropy_chunks

    def setup_rope(self, device, seq_len, compute_dtype):
        hd = self.spec["head_dim"]
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
        t = torch.arange(seq_len, device=device, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)                                 # S hd/2
        if self.recipe == "torchtitan":
            self.rope = (torch.polar(torch.ones_like(freqs), freqs),)   # complex64 freqs_cis
        elif self.recipe == "litgpt":
            # litgpt's rope cache (build_rope_cache) in the compute dtype, as under Fabric's bf16-true
            # precision, which converts the model's buffers with it.
            emb = torch.cat((freqs, freqs), dim=-1)
            self.rope = (emb.cos().to(compute_dtype).unsqueeze(0), emb.sin().to(compute_dtype).unsqueeze(0))
        else:
            self.rope = ("hf", inv_freq)

    def _rope_args(self, h):
        if self.rope and isinstance(self.rope[0], str):
            # HF LlamaRotaryEmbedding.forward, once per model forward: fp32 cos/sin cast to the hidden
            # states' dtype, shape 1 S hd
            inv_freq = self.rope[1]
            pos = torch.arange(h.shape[1], device=h.device, dtype=torch.float32)
            freqs = torch.outer(pos, inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos().to(h.dtype).unsqueeze(0), emb.sin().to(h.dtype).unsqueeze(0)
        return self.rope

    def forward(self, tokens, labels):
        h = self.model.embed_tokens(tokens)
        if self.input_requires_grad and not h.requires_grad:
            h.requires_grad_(True)
        rope = self._rope_args(h)
        for i, layer in enumerate(self.model.layers):
            if i in self.outside_checkpoint:
                # HF's former gradient checkpointing around the FSDP-wrapped layer: reentrant (A2)
                h = checkpoint(layer, h, *rope, use_reentrant=True)
            else:
                h = layer(h, *rope)
        h = self.model.norm(h)
        if self.cross_entropy == "fused_linear":
            self.phase_hook("loss")
            return None, ops.FusedLinearCrossEntropy.apply(h.flatten(0, 1), self.lm_head.weight, labels.flatten())
        if self.cross_entropy == "chunked":
            # torchtune/modules/transformer.py TransformerDecoder.chunked_output: the output projection of
            # each sequence chunk, a list of [B, S/n, V] logits in the compute dtype
            return [self.lm_head(c) for c in h.chunk(self.loss_chunks, dim=1)], None
        logits = self.lm_head(h)                                          # B S V in the compute dtype
        if self.loss_inside:
            self.phase_hook("loss")
            return logits, losses.loss_fn(self.recipe, self.cross_entropy)(logits, labels)
        return logits, None


def _torchtitan_sdpa_backends():
    """torchtitan's ScaledDotProductAttention: `with sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, MATH],
    set_priority=True)` around the call. Returned as sdpa_kernel's own context manager, which dynamo traces
    (2026-11-27: a wrapper class here made dynamo break the compiled torchtitan block's graph four times, at its
    __enter__; torchtitan has no such wrapper)."""
    if _SDPA_SET_PRIORITY:
        return sdpa_kernel(_TORCHTITAN_SDPA_BACKENDS, set_priority=True)
    return sdpa_kernel(_TORCHTITAN_SDPA_BACKENDS)     # PyTorch before set_priority
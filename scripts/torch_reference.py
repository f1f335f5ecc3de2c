#!/usr/bin/env python3
"""PyTorch reference for the CUDA runtime's validation (issue #8): time the same llama-shaped model's
training step with PyTorch on one GPU, so the bundled runtime's MFU can be compared with what PyTorch
reaches on the same GPU and shapes.

Input: `fsdpsim model-info --model M --json --seq-len S --micro-batch B` (the model's dimensions and its
FLOPs per token in fsdpsim's convention). The model is built from those dimensions with PyTorch's own
modules: bf16 parameters, RMSNorm, rotary GQA attention through F.scaled_dot_product_attention (flash /
memory-efficient kernels, causal), SwiGLU MLP, untied or tied LM head, torch cross-entropy.

What is timed: forward + backward + fused AdamW on the bf16 parameters (one GPU, no FSDP, no
communication, no fp32 master copy); with --no-optimizer forward + backward only. MFU = flops_per_token_fwdbwd (x 4/3 with full checkpointing, the recompute) * tokens / time / peak.
Prints one JSON object (and writes it with --json).
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotary(seq, head_dim, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    f = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return torch.cos(f), torch.sin(f)


def apply_rotary(x, cos, sin):   # x: B, H, S, D (half-split layout, as Hugging Face's llama)
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d].float(), x[..., d:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        C, H, KV, D, F_ = m["hidden"], m["n_heads"], m["n_kv_heads"], m["head_dim"], m["ffn_hidden"]
        self.H, self.KV, self.D = H, KV, D
        self.n1, self.n2 = RMSNorm(C), RMSNorm(C)
        self.q = nn.Linear(C, H * D, bias=False)
        self.kv = nn.Linear(C, 2 * KV * D, bias=False)
        self.o = nn.Linear(H * D, C, bias=False)
        self.gate_up = nn.Linear(C, 2 * F_, bias=False)
        self.down = nn.Linear(F_, C, bias=False)

    def forward(self, x, cos, sin):
        B, S, C = x.shape
        h = self.n1(x)
        q = self.q(h).view(B, S, self.H, self.D).transpose(1, 2)
        k, v = self.kv(h).view(B, S, 2, self.KV, self.D).permute(2, 0, 3, 1, 4)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.KV != self.H)
        x = x + self.o(a.transpose(1, 2).reshape(B, S, self.H * self.D))
        g, u = self.gate_up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Model(nn.Module):
    def __init__(self, m, theta, ac):
        super().__init__()
        self.m, self.theta, self.ac = m, theta, ac
        self.emb = nn.Embedding(m["vocab_size"], m["hidden"])
        self.blocks = nn.ModuleList(Block(m) for _ in range(m["n_layers"]))
        self.norm = RMSNorm(m["hidden"])
        self.head = nn.Linear(m["hidden"], m["vocab_size"], bias=False)
        if m["tied_embeddings"]:
            self.head.weight = self.emb.weight

    def forward(self, tokens, targets):
        cos, sin = rotary(tokens.shape[1], self.m["head_dim"], self.theta, tokens.device)
        x = self.emb(tokens)
        for b in self.blocks:
            x = checkpoint(b, x, cos, sin, use_reentrant=False) if self.ac else b(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-info", required=True, help="fsdpsim model-info --json output")
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--ac", action="store_true", help="full activation checkpointing of every block")
    ap.add_argument("--no-optimizer", action="store_true", help="time forward + backward only")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="dense bf16 peak of the GPU (H100 SXM: 989.4)")
    ap.add_argument("--json", help="write the result here too")
    a = ap.parse_args()
    info = json.load(open(a.model_info))
    m = info["model"]
    if not torch.cuda.is_available():
        print("torch_reference: no CUDA device", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = Model(m, a.rope_theta, a.ac).to(dev, dtype=torch.bfloat16)
    opt = None if a.no_optimizer else torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    B, S = a.micro_batch, a.seq_len
    tokens = torch.randint(0, m["vocab_size"], (B, S), device=dev)
    targets = torch.randint(0, m["vocab_size"], (B, S), device=dev)

    def step():
        loss = model(tokens, targets)
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    times.sort()
    med = times[len(times) // 2]
    tokens_per_step = B * S
    flops = info["flops_per_token_fwdbwd"] * tokens_per_step
    recompute = info["flops_per_token_fwd"] * tokens_per_step if a.ac else 0.0
    out = {
        "tool": "scripts/torch_reference.py",
        "command": " ".join(sys.argv),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "model": m["name"],
        "micro_batch": B,
        "seq_len": S,
        "activation_checkpointing": "full" if a.ac else "none",
        "timed": "forward+backward" + ("" if opt is None else "+AdamW(fused, bf16 params)"),
        "steps": a.steps,
        "step_time_s_median": med,
        "step_time_s_min": times[0],
        "tokens_per_s": tokens_per_step / med,
        "mfu": flops / med / (a.peak_tflops * 1e12),
        "hfu": (flops + recompute) / med / (a.peak_tflops * 1e12),
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "losses": losses[:3],
        "flops_convention": info.get("flops_convention"),
    }
    if not all(math.isfinite(x) for x in losses):
        out["error"] = "non-finite loss"
    s = json.dumps(out, indent=1)
    print(s)
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            f.write(s + "\n")
        import os
        os.replace(a.json + ".tmp", a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

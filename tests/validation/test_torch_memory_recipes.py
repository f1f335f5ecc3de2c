"""The harness's models and autograd functions on the CPU, where some PyTorch is installed (skipped, exit
77, where none is: the GPU machine runs them for real).

What runs here: every recipe builds fsdpsim's parameter count, trains a step (forward, loss, backward)
and gives every trainable parameter a gradient; the fused recipe's autograd functions match plain
autograd (values and gradients, float64); the LoRA-like freezing reaches its target; plan.lora's adapters
have the simulator's count and alone get gradients. Not here: FSDP, the
fake process group, CUDA memory (the GPU machine's run). PyTorch older than 2.4 lacks a few APIs the
recipes call; for this CPU check only they are stood in for by plain reference code (SDPA as softmax
attention, nn.RMSNorm as its formula, torch.nn.attention.sdpa_kernel as a no-op), installed only where
missing.
"""
import math
import sys
import types
import unittest

import torch_memory_test_util  # noqa: F401 (sets sys.path)

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("SKIPPED: PyTorch is not installed (python3-torch); the GPU machine runs the recipes")
    sys.exit(77)

from torch_memory import plan as plans, specs  # noqa: E402


def _install_stand_ins():
    if not hasattr(F, "scaled_dot_product_attention"):
        def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            if enable_gqa and k.shape[-3] != q.shape[-3]:
                k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
                v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
            s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
            if is_causal:
                n = q.shape[-2]
                s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            return torch.softmax(s, dim=-1) @ v
        F.scaled_dot_product_attention = sdpa
    if not hasattr(nn, "RMSNorm"):
        class RMSNorm(nn.Module):
            def __init__(self, dim, eps=None, device=None, dtype=None):
                super().__init__()
                self.eps = eps if eps is not None else torch.finfo(torch.float32).eps
                self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))

            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        nn.RMSNorm = RMSNorm
    try:
        __import__("torch.nn.attention")
    except ImportError:
        import contextlib
        mod = types.ModuleType("torch.nn.attention")
        mod.SDPBackend = types.SimpleNamespace(CUDNN_ATTENTION=0, FLASH_ATTENTION=1, MATH=2)
        mod.sdpa_kernel = lambda backends, set_priority=False: contextlib.nullcontext()
        sys.modules["torch.nn.attention"] = mod
        nn.attention = mod


_install_stand_ins()
from torch_memory import lora as loras, parallel, recipes  # noqa: E402
from torch_memory.recipes import adapters, losses, ops  # noqa: E402

VOCAB_TINY = 4096


# GPT-2's structure at a size the CPU trains in a moment (the zoo's gpt2 is counted on the meta device).
TINY_GPT2 = {"vocab_size": 512, "hidden": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "head_dim": 16,
             "ffn_hidden": 256, "max_positions": 128}


def model_info(model_name):
    if model_name == "tiny-gpt2":
        info = specs.load_model_info("gpt2")
        return {**info, "model": {**info["model"], **TINY_GPT2, "name": "tiny-gpt2"}}
    return specs.load_model_info(model_name)


def build(model_name, implementation, cross_entropy="torch", fraction=1.0, seq=32, materialize=True):
    info = model_info(model_name)
    p = plans.parse_plan({"implementation": implementation, "cross_entropy": cross_entropy,
                          "trainable_fraction": fraction, "param_dtype": "fp32"})
    phases = []
    model = recipes.build_model(info, p, torch.float32, phases.append)
    trainable, total = parallel.freeze_to_fraction(model, fraction)
    if materialize:
        init = parallel.make_param_init_fn(torch.device("cpu"))
        for m in model.modules():
            init(m)
        model.setup_rope(torch.device("cpu"), seq, torch.float32)
    return info, p, model, trainable, total, phases


def train_once(model, p, vocab, seq=32, batch=2):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch, seq), generator=g)
    labels = torch.randint(0, vocab, (batch, seq), generator=g)
    logits, loss = model(tokens, labels)
    if loss is None:
        loss = losses.loss_fn(p.implementation, p.cross_entropy)(logits, labels)
    loss.backward()
    return loss


class Recipes(unittest.TestCase):
    def test_parameter_counts_are_fsdpsims(self):
        for model_name in specs.MODELS:
            for implementation in specs.RECIPES_BY_TYPE[specs.load_model_info(model_name)["model"]["model_type"]]:
                with self.subTest(model=model_name, implementation=implementation):
                    info, _, model, trainable, total, _ = build(model_name, implementation, materialize=False)
                    self.assertEqual(total, info["params_total"])
                    self.assertEqual(trainable, total)

    def check(self, model_name, implementation, cross_entropy="torch"):
        info, p, model, trainable, total, phases = build(model_name, implementation, cross_entropy)
        self.assertEqual(trainable, total)
        if info["model"]["tied_embeddings"]:
            embedding = model.transformer.wte if hasattr(model, "transformer") else model.model.embed_tokens
            self.assertIs(model.lm_head.weight, embedding.weight, "the tied head stays tied after materializing")
        loss = train_once(model, p, info["model"]["vocab_size"])
        # random init with std 0.02: the loss is close to ln(V)
        self.assertTrue(math.isfinite(loss.item()))
        self.assertLess(abs(loss.item() - math.log(info["model"]["vocab_size"])), 1.0)
        for name, param in model.named_parameters():
            self.assertIsNotNone(param.grad, f"{implementation}: {name} got no gradient")
        self.assertEqual(phases, ["loss"] if model.loss_inside else [])

    def test_llama_recipes(self):
        for implementation in ("torchtitan", "hf", "litgpt", "fused"):
            with self.subTest(implementation=implementation):
                self.check("tiny-llama", implementation)
        self.check("tiny-llama", "fused", "fused_linear")
        self.check("tiny-llama", "torchtitan", "fused")

    def test_llama_blocks_register_their_modules_as_each_framework(self):
        """named_parameters' order inside a block: FSDP1 flattens in it, FSDP2 makes the shards in it."""
        want = {"litgpt": ["input_layernorm", "self_attn", "post_attention_layernorm", "mlp"]}
        for implementation in ("torchtitan", "hf", "litgpt", "fused"):
            with self.subTest(implementation=implementation):
                _, _, model, _, _, _ = build("tiny-llama", implementation, materialize=False)
                block = model.model.layers[0]
                self.assertEqual([n for n, _ in block.named_children()],
                                 want.get(implementation, ["self_attn", "mlp", "input_layernorm",
                                                           "post_attention_layernorm"]))
                names = [n for n, _ in block.named_parameters()]
                norms = [i for i, n in enumerate(names) if "layernorm" in n]
                if implementation == "litgpt":
                    self.assertEqual(norms[0], 0)
                else:
                    self.assertEqual(norms, [len(names) - 2, len(names) - 1])

    def test_gpt2_recipes(self):
        self.check("tiny-gpt2", "hf")
        self.check("tiny-gpt2", "fused", "fused_linear")

    def test_outside_checkpointing_runs_reentrant(self):
        info, p, model, _, _, _ = build("tiny-llama", "hf")
        model.outside_checkpoint = {0, 2}
        loss = train_once(model, p, VOCAB_TINY)
        self.assertTrue(math.isfinite(loss.item()))
        self.assertIsNotNone(model.model.layers[0].mlp.down_proj.weight.grad)

    def test_freezing_reaches_its_target(self):
        for fraction in (0.01, 0.05, 0.2):
            info, p, model, trainable, total, _ = build("tiny-llama", "hf", fraction=fraction)
            counted = sum(q.numel() for q in model.parameters() if q.requires_grad)
            self.assertEqual(trainable, counted)
            self.assertLessEqual(trainable, fraction * total)
            smallest = min(q.numel() for q in model.model.layers[0].parameters() if q.dim() == 2)
            self.assertGreater(trainable, fraction * total - 2 * smallest * len(model.model.layers), fraction)
            self.assertFalse(model.model.embed_tokens.weight.requires_grad)
        _, _, model, trainable, total, _ = build("tiny-llama", "hf", fraction=1e-6)
        self.assertGreater(trainable, 0, "below one matrix, the smallest one trains")


def build_lora(model_name, implementation, lora, materialize=True, seq=32, **plan):
    info = model_info(model_name)
    p = plans.parse_plan({"implementation": implementation, "param_dtype": "fp32", "lora": lora, **plan})
    model = recipes.build_model(info, p, torch.float32, lambda phase: None)
    trainable, total = adapters.apply_lora(model, info["model"], p)
    if materialize:
        init = parallel.make_param_init_fn(torch.device("cpu"))
        for m in model.modules():
            init(m)
        model.setup_rope(torch.device("cpu"), seq, torch.float32)
    return info, p, model, trainable, total


class LoRA(unittest.TestCase):
    """plan.lora's adapters (recipes/adapters.py) on the CPU: the simulator's counts, gradients for the
    adapters only, and the FSDP1 bank layout (no FSDP here: the GPU machine runs that)."""

    TARGETS = (["q", "k", "v"], ["q", "v"], ["o", "mlp", "head"], ["q", "k", "v", "o", "mlp", "head"])

    def test_counts_are_the_simulators(self):
        for model_name in specs.MODELS:
            info = specs.load_model_info(model_name)
            for implementation in specs.RECIPES_BY_TYPE[info["model"]["model_type"]]:
                for targets in self.TARGETS:
                    if info["model"]["mlp"] != "swiglu" and "mlp" in targets:
                        targets = [t if t != "mlp" else "up" for t in targets] + ["down"]
                    with self.subTest(model=model_name, implementation=implementation, targets=targets):
                        lora = {"rank": 8, "targets": targets}
                        _, p, model, trainable, total = build_lora(model_name, implementation, lora, materialize=False)
                        want = loras.trainable_params(info["model"], implementation, p.lora)
                        self.assertEqual(trainable, want)
                        self.assertEqual(total, info["params_total"] + want)
                        names = [n for n, q in model.named_parameters() if q.requires_grad]
                        self.assertTrue(names and all(n.endswith(("lora_a", "lora_b")) for n in names), names)

    def check_training(self, model, p, vocab):
        with torch.no_grad():      # B starts at zero (A's gradient would be zero): give it values
            for name, param in model.named_parameters():
                if name.endswith("lora_b"):
                    self.assertEqual(param.abs().sum().item(), 0.0, name)
                    param.normal_(0.0, 0.02)
        loss = train_once(model, p, vocab)
        self.assertTrue(math.isfinite(loss.item()))
        for name, param in model.named_parameters():
            if "lora_" in name:
                self.assertIsNotNone(param.grad, name)
                self.assertGreater(param.grad.abs().sum().item(), 0.0, name)
            else:
                self.assertIsNone(param.grad, name)

    def test_only_the_adapters_train(self):
        for implementation in ("torchtitan", "hf", "litgpt", "fused"):
            for targets in (["q", "v", "o", "mlp", "head"], ["k"]):
                with self.subTest(implementation=implementation, targets=targets):
                    info, p, model, _, _ = build_lora("tiny-llama", implementation, {"rank": 4, "targets": targets, "dropout": 0.1})
                    self.check_training(model, p, VOCAB_TINY)
        info, p, model, _, _ = build_lora("tiny-gpt2", "hf", {"rank": 4, "targets": ["q", "o", "up", "down", "head"]})
        self.check_training(model, p, info["model"]["vocab_size"])

    def test_dropout_only_when_asked(self):
        _, _, model, _, _ = build_lora("tiny-llama", "hf", {"rank": 4, "targets": ["q"]}, materialize=False)
        self.assertIsNone(model.model.layers[0].self_attn.q_proj.dropout)
        _, _, model, _, _ = build_lora("tiny-llama", "hf", {"rank": 4, "targets": ["q"], "dropout": 0.05}, materialize=False)
        self.assertEqual(model.model.layers[0].self_attn.q_proj.dropout.p, 0.05)

    def test_litgpt_update_lands_on_its_parts(self):
        _, _, model, _, _ = build_lora("tiny-llama", "litgpt", {"rank": 4, "targets": ["k"]})
        qkv = model.model.layers[0].self_attn.qkv
        with torch.no_grad():
            qkv.lora_b.normal_()
        x = torch.randn(2, 3, 256)
        delta = qkv(x) - qkv.base(x)
        q_width, kv_width = 8 * 32, 4 * 32
        self.assertEqual(delta[..., :q_width].abs().sum().item(), 0.0)
        self.assertGreater(delta[..., q_width:q_width + kv_width].abs().sum().item(), 0.0)
        self.assertEqual(delta[..., q_width + kv_width:].abs().sum().item(), 0.0)

    def test_litgpt_runs_the_pretrained_linear_first(self):
        # litgpt's LoRAQKVLinear.forward: `pretrained = self.linear(x)` before A (the order sets where the first
        # cuBLAS workspace lands in PyTorch's allocator: l1b-fsdp1-orig-lora-r8-qv-litgpt's known miss)
        _, _, model, _, _ = build_lora("tiny-llama", "litgpt", {"rank": 4, "targets": ["q", "v"]})
        qkv = model.model.layers[0].self_attn.qkv
        order, linear = [], F.linear

        def recording(x, w, *rest, **kw):
            order.append("pretrained" if w is qkv.base.weight else "A" if w is qkv.lora_a else "other")
            return linear(x, w, *rest, **kw)
        F.linear = recording
        try:
            qkv(torch.randn(2, 3, 256))
        finally:
            F.linear = linear
        self.assertEqual(order, ["pretrained", "A"])

    def test_litgpt_conv1d_and_zero_pad_give_each_parts_update(self):
        # one grouped conv1d (as many k, v heads as q heads) or one conv1d per part and a cat (grouped-query
        # attention): either way each enabled part's columns get its A rows' output times its rows of B, and the
        # parts not enabled zeros
        from torch_memory.recipes import adapters
        for widths, parts, grouped in (((16, 16, 16), ("q", "v"), True), ((16, 8, 8), ("q", "v"), False),
                                       ((16, 8, 8), ("k",), False), ((16, 16, 16), ("q", "k", "v"), True)):
            layout = list(zip("qkv", widths))
            base = nn.Linear(12, sum(widths), bias=False)
            enabled = [(n, w) for n, w in layout if n in parts]
            m = adapters.LoRAQKVParts(base, 2, 0.0, 0.5, enabled, layout, grouped)
            with torch.no_grad():
                m.lora_a.normal_()
                m.lora_b.normal_()
            x = torch.randn(3, 5, 12)
            got = m(x) - base(x)
            groups = F.linear(x, m.lora_a).split(2, dim=-1)
            rows = m.lora_b.split([w for _, w in enabled], dim=0)
            update = {n: F.linear(g, r) * 0.5 for (n, _), g, r in zip(enabled, groups, rows)}
            want = torch.cat([update[n] if n in update else torch.zeros(3, 5, w) for n, w in layout], dim=-1)
            self.assertTrue(torch.allclose(got, want, atol=1e-5), (widths, parts))

    def test_tied_head_stays_tied(self):
        _, _, model, _, _ = build_lora("tiny-gpt2", "hf", {"rank": 4, "targets": ["head"]})
        self.assertIs(model.lm_head.base.weight, model.transformer.wte.weight)

    def test_fsdp1_bank_holds_each_blocks_adapters(self):
        for model_name, implementation in (("tiny-llama", "torchtitan"), ("tiny-llama", "litgpt"), ("tiny-gpt2", "fused")):
            with self.subTest(model=model_name, implementation=implementation):
                lora = {"rank": 4, "targets": ["q", "k", "v", "o", "up", "down"]}
                info, p, model, trainable, _ = build_lora(model_name, implementation, lora, materialize=False,
                                                          fsdp_version=1, use_orig_params=False)
                adapters.move_to_banks(model)
                for block in adapters.blocks_of(model):
                    bank = block.lora_bank
                    self.assertEqual(sum(q.numel() for q in bank.parameters()), trainable // len(adapters.blocks_of(model)))
                    outside = [n for n, q in block.named_parameters() if not n.startswith("lora_bank.")]
                    self.assertFalse(any(block.get_parameter(n).requires_grad for n in outside))
                init = parallel.make_param_init_fn(torch.device("cpu"))
                for m in model.modules():
                    init(m)
                model.setup_rope(torch.device("cpu"), 32, torch.float32)
                self.check_training(model, p, info["model"]["vocab_size"])


class FusedFunctions(unittest.TestCase):
    """Each autograd function of ops.py against plain autograd, in float64."""

    def setUp(self):
        torch.manual_seed(0)

    def gradcheck(self, fn, inputs):
        """gradcheck re-runs one graph and reuses its grad_outputs: in-place backward off (ops.py)."""
        ops.IN_PLACE_BACKWARD = False
        try:
            return torch.autograd.gradcheck(fn, inputs)
        finally:
            ops.IN_PLACE_BACKWARD = True

    def test_silu_mul(self):
        a = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
        b = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
        self.assertTrue(self.gradcheck(ops.SiLUMul.apply, (a, b)))
        torch.testing.assert_close(ops.SiLUMul.apply(a, b), F.silu(a) * b)

    def test_silu_mul_backward_writes_into_its_saved_inputs(self):
        # As Liger's kernel: da and db are a and b (the gate and up outputs), no new tensor of their size,
        # chunk by chunk (a chunk smaller than the rows here); gradients as plain autograd's.
        x = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
        wg = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
        wu = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
        dout = torch.randn(7, 6, dtype=torch.float64)
        ref = torch.autograd.grad((F.silu(x @ wg.t()) * (x @ wu.t()) * dout).sum(), (x, wg, wu))
        seen = {}

        def keep(name):
            def hook(g):
                seen[name] = g.data_ptr()
            return hook
        old_chunk = ops.SiLUMul.CHUNK_ELEMS
        ops.SiLUMul.CHUNK_ELEMS = 12        # 2 rows of 6 per chunk
        try:
            gate, up = x @ wg.t(), x @ wu.t()
            ptrs = {"gate": gate.data_ptr(), "up": up.data_ptr()}
            gate.register_hook(keep("gate"))
            up.register_hook(keep("up"))
            got = torch.autograd.grad((ops.SiLUMul.apply(gate, up) * dout).sum(), (x, wg, wu))
        finally:
            ops.SiLUMul.CHUNK_ELEMS = old_chunk
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r)
        self.assertEqual(seen, ptrs)

    def test_rotary(self):
        q = torch.randn(2, 3, 4, 8, dtype=torch.float64, requires_grad=True)
        k = torch.randn(2, 1, 4, 8, dtype=torch.float64, requires_grad=True)
        ang = torch.randn(1, 1, 4, 8, dtype=torch.float64)
        cos, sin = ang.cos(), ang.sin()
        self.assertTrue(self.gradcheck(lambda q, k: ops.Rotary.apply(q, k, cos, sin), (q, k)))
        from torch_memory.recipes.llama import rotate_half
        torch.testing.assert_close(ops.Rotary.apply(q, k, cos, sin)[0], q * cos + rotate_half(q) * sin)

    def test_rotary_backward_rotates_the_incoming_gradients_in_place(self):
        # The harness's layout: q, k are B H S hd views of B S H hd; the gradients come back in place.
        from torch_memory.recipes.llama import rotate_half
        qs = torch.randn(2, 4, 3, 8, dtype=torch.float64, requires_grad=True)     # B S H hd
        ks = torch.randn(2, 4, 1, 8, dtype=torch.float64, requires_grad=True)
        ang = torch.randn(2, 1, 4, 8, dtype=torch.float64)
        cos, sin = ang.cos(), ang.sin()
        dq = torch.randn(2, 3, 4, 8, dtype=torch.float64)
        dk = torch.randn(2, 1, 4, 8, dtype=torch.float64)
        q, k = qs.transpose(1, 2), ks.transpose(1, 2)
        ref = torch.autograd.grad(((q * cos + rotate_half(q) * sin) * dq).sum() + ((k * cos + rotate_half(k) * sin) * dk).sum(),
                                  (qs, ks))
        rq, rk = ops.Rotary.apply(q, k, cos, sin)
        got_ptr = []

        class Probe(torch.autograd.Function):   # hands Rotary a gradient buffer whose address is known
            @staticmethod
            def forward(ctx, t):
                return t.view_as(t)

            @staticmethod
            def backward(ctx, g):
                got_ptr.append(g.data_ptr())
                return g
        got = torch.autograd.grad((Probe.apply(rq) * dq).sum() + (rk * dk).sum(), (qs, ks))
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r)
        self.assertEqual(len(got_ptr), 1)
        self.assertEqual(got[0].data_ptr(), got_ptr[0])   # dq was rotated where it lay

    def test_fused_cross_entropy(self):
        logits = torch.randn(7, 11, dtype=torch.float64, requires_grad=True)
        target = torch.tensor([1, 0, ops.IGNORE_INDEX, 10, 3, 3, 5])
        ref = F.cross_entropy(logits, target, ignore_index=ops.IGNORE_INDEX)
        torch.testing.assert_close(ops.FusedCrossEntropy.apply(logits, target), ref)
        self.assertTrue(torch.autograd.gradcheck(lambda x: ops.FusedCrossEntropy.apply(x, target), (logits,)))

    def test_fused_linear_cross_entropy(self):
        x = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
        w = torch.randn(13, 4, dtype=torch.float64, requires_grad=True)
        target = torch.tensor([1, 0, ops.IGNORE_INDEX, 12, 3, 3, 5, 7, 8])
        ref = F.cross_entropy(x @ w.t(), target, ignore_index=ops.IGNORE_INDEX)
        torch.testing.assert_close(ops.FusedLinearCrossEntropy.apply(x, w, target), ref)
        # Its gradients are computed in the forward (Liger's way); gradcheck's finite differences still apply.
        self.assertTrue(torch.autograd.gradcheck(lambda x, w: ops.FusedLinearCrossEntropy.apply(x, w, target), (x, w)))

    def test_fused_linear_cross_entropy_keeps_liger_transients(self):
        # As Liger's: per chunk only the chunk's logits in the compute dtype (they become its gradient in
        # place); the fp32 math runs in blocks of ROW_ELEMS elements (2 rows of 13 here), never over a chunk.
        # Values and gradients as plain autograd's.
        x = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
        w = torch.randn(13, 4, dtype=torch.float64, requires_grad=True)
        target = torch.tensor([1, 0, ops.IGNORE_INDEX, 12, 3, 3, 5, 7, 8])
        ref_loss = F.cross_entropy(x @ w.t(), target, ignore_index=ops.IGNORE_INDEX)
        ref = torch.autograd.grad(ref_loss, (x, w))
        old_rows = ops.FusedLinearCrossEntropy.ROW_ELEMS
        ops.FusedLinearCrossEntropy.ROW_ELEMS = 26
        try:
            loss = ops.FusedLinearCrossEntropy.apply(x, w, target)
            got = torch.autograd.grad(loss, (x, w))
            torch.testing.assert_close(loss, ref_loss)
            for g, r in zip(got, ref):
                torch.testing.assert_close(g, r)
            # In bf16 (the training dtype), no fp32 tensor larger than one row block (2 x 13) is created.
            try:
                from torch.utils._python_dispatch import TorchDispatchMode
            except ImportError:
                return
            largest = []

            class Sizes(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    out = func(*args, **(kwargs or {}))
                    for o in out if isinstance(out, (tuple, list)) else (out,):
                        if isinstance(o, torch.Tensor) and o.dtype == torch.float32:
                            largest.append(o.numel())
                    return out
            xb, wb = x.detach().to(torch.bfloat16), w.detach().to(torch.bfloat16)
            with Sizes():
                ops.FusedLinearCrossEntropy.apply(xb, wb, target)
            self.assertLessEqual(max(largest), 26)
        finally:
            ops.FusedLinearCrossEntropy.ROW_ELEMS = old_rows

    def test_recipe_losses_agree_on_unshifted_labels(self):
        logits = torch.randn(2, 6, 11, dtype=torch.float64)
        labels = torch.randint(0, 11, (2, 6))
        ref = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        # torchtitan's loss upcasts with .float() (fp32 even for float64 input)
        torch.testing.assert_close(losses.torchtitan_loss(logits, labels).double(), ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(losses.litgpt_loss(logits, labels), ref)
        torch.testing.assert_close(losses.fused_loss(logits, labels), ref)
        # HF shifts: position t predicts label t+1; the last position is ignored (and it upcasts with .float())
        shifted = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        torch.testing.assert_close(losses.hf_loss(logits, labels).double(), shifted, rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    unittest.main()

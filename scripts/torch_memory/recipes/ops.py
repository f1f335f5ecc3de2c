"""Autograd functions with the saved-tensor behaviour of fused kernels, in plain PyTorch ops.

The GPU machine has no Liger-Kernel, flash-attn or Triton kernels of ours, so the "fused" recipe and the
fused losses are written here. What each function *saves for backward* is what the fused kernel saves
(the steady memory between forward and backward); the transients inside one call can be larger than
the kernel's, which keeps its fp32 math in registers -- said next to each function.
"""
import torch
import torch.nn.functional as F

IGNORE_INDEX = -100            # PyTorch's F.cross_entropy default, HF's and litgpt's ignore index
# Rows per chunk of the fused cross-entropy's fp32 work: chunk x V x 4 bytes stays near 256 MiB.
CE_CHUNK_BYTES = 256 << 20
# Liger's SwiGLU and RoPE backward kernels write their gradients over tensors they own (the saved
# inputs, the incoming gradients), which keeps the backward from allocating tensors of the activations'
# size; SiLUMul and Rotary do the same while this is True (training). gradcheck re-runs one graph and
# reuses its grad_outputs buffer, which in-place gradients would corrupt: the unit tests turn it off
# for gradcheck and check the in-place path against the out-of-place one.
IN_PLACE_BACKWARD = True


def _acc(t):
    """The kernels' accumulation dtype: fp32 for bf16/fp16/fp32 inputs (float64 stays float64, which
    lets the tests check gradients numerically)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _next_power_of_2(n):
    return 1 << (max(n, 1) - 1).bit_length()


class SiLUMul(torch.autograd.Function):
    """silu(a) * b saving only a and b, as Liger's LigerSiLUMulFunction (liger_kernel/ops/swiglu.py):
    backward recomputes silu(a) and writes da into a and db into b (its kernel keeps the math in
    registers), so the backward allocates nothing of a's size. Here the math runs in row chunks of
    CHUNK_ELEMS elements (fp32 temporaries of that size only) and the results go into a and b in place,
    as Liger's; unfused, autograd would also save silu(a) for the product's backward.
    When a or b is a leaf (a caller's own tensor), or IN_PLACE_BACKWARD is off, the gradients are new
    tensors. Like Liger's, the in-place backward cannot run twice on one graph (retain_graph): the saved
    tensors' version check refuses it."""

    CHUNK_ELEMS = 1 << 22      # 16 MiB of fp32 per temporary

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        out = F.silu(a)
        return out.mul_(b)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        in_place = IN_PLACE_BACKWARD and not (a.is_leaf or b.is_leaf) and a.is_contiguous() and b.is_contiguous()
        da, db = (a, b) if in_place else (torch.empty_like(a), torch.empty_like(b))
        cols = a.shape[-1]
        a2, b2, da2, db2 = (t.view(-1, cols) for t in (a, b, da, db))
        dc2 = dc.reshape(-1, cols)
        rows = max(1, SiLUMul.CHUNK_ELEMS // max(cols, 1))
        for s in range(0, a2.shape[0], rows):
            ac, bc, dcc = (_acc(t[s:s + rows]) for t in (a2, b2, dc2))
            sig = torch.sigmoid(ac)
            silu_a = ac * sig
            # d silu(a)/da = sig * (1 + a * (1 - sig)) = sig + silu(a) * (1 - sig)
            grad_a = dcc * bc * (sig + silu_a * (1 - sig))
            db2[s:s + rows].copy_(dcc * silu_a)     # b is read above, before it is overwritten
            da2[s:s + rows].copy_(grad_a)
        return da, db


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_half_transposed(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, -x1), dim=-1)


class Rotary(torch.autograd.Function):
    """RoPE (rotate-half convention) saving only cos and sin, as Liger's LigerRopeFunction
    (liger_kernel/ops/rope.py), whose kernel rotates q and k in place. Here q and k get new outputs
    and the inputs are dropped, which leaves the same tensors alive after the call. Backward, as
    Liger's, rotates the incoming gradients in place (one temporary of one head's size at a time),
    see IN_PLACE_BACKWARD."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin

    @staticmethod
    def _rotate_back(g, cos, sin):
        # In place (IN_PLACE_BACKWARD) when g is dense (B H S hd, possibly a transposed view of B S H hd,
        # as SDPA's backward returns it; the harness's q and k feed SDPA only, so dq and dk are not shared).
        dense = g.is_contiguous() or (g.dim() == 4 and g.transpose(1, 2).is_contiguous())
        out = g if (IN_PLACE_BACKWARD and dense) else g.clone()
        if out.dim() != 4:
            rot = _rotate_half_transposed(out * sin)
            out.mul_(cos).add_(rot)
            return out
        for h in range(out.shape[1]):
            gh = out[:, h:h + 1]
            cs = cos if cos.shape[1] == 1 else cos[:, h:h + 1]
            sn = sin if sin.shape[1] == 1 else sin[:, h:h + 1]
            rot = _rotate_half_transposed(gh * sn)     # read before gh is overwritten
            gh.mul_(cs).add_(rot)
        return out

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        return Rotary._rotate_back(dq, cos, sin), Rotary._rotate_back(dk, cos, sin), None, None


class FusedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over logits [T, V] saving the logits and a per-row fp32 log-sum-exp, as
    flash-attn's CrossEntropyLoss (flash_attn/ops/triton/cross_entropy.py; llm-foundry's default):
    no fp32 copy of the logits and no saved log-probabilities. Backward writes the gradient into a new
    tensor of the logits' dtype (inplace_backward=False, the default). Transient: one fp32 chunk of
    rows (CE_CHUNK_BYTES) where the kernel keeps its math in registers."""

    @staticmethod
    def forward(ctx, logits, target):
        rows, vocab = logits.shape
        chunk = max(1, CE_CHUNK_BYTES // (4 * vocab))
        lse = torch.empty(rows, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
        for s in range(0, rows, chunk):
            lse[s:s + chunk] = torch.logsumexp(_acc(logits[s:s + chunk]), dim=-1)
        valid = target != IGNORE_INDEX
        picked = _acc(logits.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1))
        count = valid.sum().clamp(min=1)
        loss = ((lse - picked) * valid).sum() / count
        ctx.save_for_backward(logits, lse, target, count)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        logits, lse, target, count = ctx.saved_tensors
        rows, vocab = logits.shape
        chunk = max(1, CE_CHUNK_BYTES // (4 * vocab))
        grad = torch.empty_like(logits)
        scale = grad_loss / count
        for s in range(0, rows, chunk):
            p = (_acc(logits[s:s + chunk]) - lse[s:s + chunk, None]).exp_()   # a new tensor: logits are saved
            t = target[s:s + chunk]
            valid = (t != IGNORE_INDEX).unsqueeze(1)
            p.scatter_add_(1, t.clamp(min=0).unsqueeze(1), -valid.to(p.dtype))
            grad[s:s + chunk] = p.mul_(valid).mul_(scale)
        return grad, None


class FusedLinearCrossEntropy(torch.autograd.Function):
    """The LM head and the mean cross-entropy fused over chunks of tokens, as Liger's
    LigerFusedLinearCrossEntropyFunction (liger_kernel/ops/fused_linear_cross_entropy.py): the full
    logits never exist; the forward computes the input's and the weight's gradients chunk by chunk and
    saves only those (grad_input [T, h], grad_weight like the weight, in its dtype). Chunk size as
    Liger's: next_power_of_2(ceil(T / ceil(V / h))) tokens. Transient, as Liger's: each chunk's logits in
    the compute dtype, which become the chunk's logit gradient in place (Liger's liger_cross_entropy_kernel
    computes the log-sum-exp and the gradient row by row in registers and writes the gradient over the
    logits). Here that math runs in fp32 blocks of ROW_ELEMS elements (whole rows), so no chunk-sized fp32
    tensor exists: an fp32 copy of the chunk and logsumexp's chunk-sized temporary would add 2 x chunk x V
    x 4 bytes that Liger does not allocate (the fixtures measured before 2026-11-26 with this function,
    l1b-fsdp2-w512-fused, gpt2-fsdp2-w8-fused and l3-8b-fsdp2-ac-mb2-s8192-fused, hold them: 2 x 512 x
    128256 x 4 B = 0.49 GiB at l1b-fsdp2-w512-fused's measured peak, which is this forward)."""

    ROW_ELEMS = 1 << 22        # 16 MiB of fp32 per temporary

    @staticmethod
    def forward(ctx, x, weight, target):
        tokens, hidden = x.shape
        vocab = weight.shape[0]
        chunk = _next_power_of_2(-(-tokens // -(-vocab // hidden)))
        rows = max(1, FusedLinearCrossEntropy.ROW_ELEMS // max(vocab, 1))
        grad_input = torch.zeros_like(x)
        grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
        valid_all = target != IGNORE_INDEX
        count = valid_all.sum().clamp(min=1)
        loss = torch.zeros((), dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
        for s in range(0, tokens, chunk):
            xc = x[s:s + chunk]
            logits = xc @ weight.t()                       # chunk x V in the compute dtype (Liger's logits_chunk)
            for r in range(0, logits.shape[0], rows):
                e = min(r + rows, logits.shape[0])
                t = target[s + r:s + e]
                valid = valid_all[s + r:s + e]
                lr = logits[r:e]
                lf = _acc(lr)
                lse = torch.logsumexp(lf, dim=-1)
                picked = lf.gather(1, t.clamp(min=0).unsqueeze(1)).squeeze(1)
                loss += ((lse - picked) * valid).sum()
                lf.sub_(lse.unsqueeze(1)).exp_()
                lf.scatter_add_(1, t.clamp(min=0).unsqueeze(1), -valid.unsqueeze(1).to(lf.dtype))
                lf.mul_(valid.unsqueeze(1)).div_(count)
                lr.copy_(lf)                               # the gradient over the logits, in place
                del lf
            grad_input[s:s + chunk] = logits @ weight
            if grad_weight is not None:
                grad_weight.addmm_(logits.t(), xc)
            del logits
        ctx.save_for_backward(grad_input, grad_weight)
        return loss / count

    @staticmethod
    def backward(ctx, grad_loss):
        grad_input, grad_weight = ctx.saved_tensors
        # Liger skips the multiply when the incoming gradient is 1 (a plain loss.backward()).
        if not torch.equal(grad_loss, torch.ones_like(grad_loss)):
            grad_input = grad_input * grad_loss
            grad_weight = grad_weight * grad_loss if grad_weight is not None else None
        return grad_input, grad_weight, None

"""The loss as each recipe computes it from the logits (plan key cross_entropy = "torch"), or a fused
loss (cross_entropy = "fused": ops.FusedCrossEntropy), or torchtune's chunked output and loss (cross_entropy =
"chunked": the model returns a list of logits chunks). "fused_linear" never materializes logits and is
computed inside the model's forward (ops.FusedLinearCrossEntropy)."""
import torch
import torch.nn.functional as F

from .ops import IGNORE_INDEX, FusedCrossEntropy

# litgpt/utils.py chunked_cross_entropy: chunk_size defaults to 128 rows (litgpt pretrain calls it so).
LITGPT_CHUNK_ROWS = 128


def torchtitan_loss(pred, labels):
    """torchtitan/components/loss.py cross_entropy_loss: fp32 upcast of pred [T, V], sum reduction; the
    trainer divides by the global token count."""
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum",
                           ignore_index=IGNORE_INDEX) / labels.numel()


def hf_loss(logits, labels):
    """transformers/loss/loss_utils.py ForCausalLMLoss: upcast, labels padded by one ignore_index and
    shifted (a contiguous copy), flattened, mean cross-entropy (num_items_in_batch None)."""
    vocab = logits.shape[-1]
    logits = logits.float()
    labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)
    shift_labels = labels[..., 1:].contiguous()
    return F.cross_entropy(logits.view(-1, vocab), shift_labels.view(-1), ignore_index=IGNORE_INDEX)


def litgpt_loss(logits, targets):
    """litgpt/utils.py chunked_cross_entropy(logits, targets) with lm_head not chunked: the logits (in the
    compute dtype, no upcast) split into chunks of 128 rows, each chunk's cross-entropy kept per row,
    summed and divided by the non-ignored count."""
    logits = logits.reshape(-1, logits.size(-1))
    targets = targets.reshape(-1)
    chunks = [F.cross_entropy(lc, tc, ignore_index=IGNORE_INDEX, reduction="none")
              for lc, tc in zip(logits.split(LITGPT_CHUNK_ROWS), targets.split(LITGPT_CHUNK_ROWS))]
    non_masked = (targets != IGNORE_INDEX).sum()
    return torch.cat(chunks).sum() / non_masked.maximum(torch.ones_like(non_masked))


def torchtune_chunked_loss(logits, labels):
    """torchtune/modules/loss/ce_chunked_output_loss.py CEWithChunkedOutputLoss: `logits` is the list that
    TransformerDecoder.chunked_output makes (one [B, S/n, V] tensor per sequence chunk, compute dtype); the
    labels are split the same way, each chunk upcast to fp32 on its own and summed, the total divided by the
    non-ignored count (the recipe's shifted labels: the harness's labels are already the targets)."""
    total = (labels != IGNORE_INDEX).sum()
    loss = 0.0
    for lc, tc in zip(logits, labels.chunk(len(logits), dim=1)):
        loss = loss + F.cross_entropy(lc.reshape(-1, lc.size(-1)).float(), tc.reshape(-1),
                                      ignore_index=IGNORE_INDEX, reduction="sum")
    return loss / total


def fused_loss(logits, labels):
    return FusedCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


RECIPE_LOSS = {"torchtitan": torchtitan_loss, "hf": hf_loss, "litgpt": litgpt_loss, "fused": torchtitan_loss}


def loss_fn(implementation, cross_entropy):
    """The loss computed outside the model (None for fused_linear, which the model computes)."""
    if cross_entropy == "fused_linear":
        return None
    if cross_entropy == "fused":
        return fused_loss
    if cross_entropy == "chunked":
        return torchtune_chunked_loss
    return RECIPE_LOSS[implementation]

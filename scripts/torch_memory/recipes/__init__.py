"""The models the harness trains, built from fsdpsim's ModelSpec in a framework's implementation recipe.

Each recipe follows its framework's code at the tensor level (what autograd saves is what the memory
depends on: norms, RoPE, K/V repetition, reshapes, the loss), written for this harness:
  torchtitan  pytorch/torchtitan b5bcd76 (2026-08): torchtitan/models/llama3 + models/common
  hf          huggingface/transformers 5.x: models/llama/modeling_llama.py, integrations/sdpa_attention.py,
              loss/loss_utils.py; models/gpt2/modeling_gpt2.py for GPT-2
  litgpt      Lightning-AI/litgpt 2685705 (2026-06): litgpt/model.py, litgpt/utils.py chunked_cross_entropy
  fused       what Liger-Kernel's patches promise, without Liger (not installed on the GPU machine):
              ops.py's autograd functions save what Liger's kernels save (see there).
Every module is created on the meta device; parallel.py materializes the shards.
"""
from ..common import InputError, show
from . import gpt2, llama


def build_model(info, plan, dtype, phase_hook):
    """The recipe's model for fsdpsim's ModelSpec `info["model"]` on the meta device, parameters in
    `dtype` (the master weights). `phase_hook(name)` is called where the loss starts when the recipe
    computes it inside forward (HF, Liger-style fused linear cross-entropy)."""
    spec = info["model"]
    # Parallel-residual blocks, partial RoPE and a biased LM head (phi, gpt_neox) have no recipe here yet:
    # building them as llama blocks would measure another model.
    rope = spec.get("rotary_dim", spec["head_dim"])
    if spec.get("parallel_residual") or spec.get("lm_head_bias") or (spec["positions"] == "rotary" and rope != spec["head_dim"]):
        raise InputError("model.model_type", show(spec["model_type"]),
                         "a llama-family or GPT-2 model (parallel-residual / partial-rotary blocks are not written in the harness)")
    if spec["model_type"] == "gpt2":
        return gpt2.GPT2LMHeadModel(spec, plan, dtype, phase_hook)
    return llama.LlamaForCausalLM(spec, plan, dtype, phase_hook)

"""Selective activation checkpointing (``--selective-checkpointing``): which of a checkpointed block's forward
results autograd keeps, and which it computes again in backward.

torch's ``create_selective_checkpoint_contexts`` with the policy torchtitan's op-level selective checkpointing uses
(its ``_save_list`` and "only save the output of every second mm", pytorch/torchtitan
``torchtitan/models/llama3/infra/parallelize.py``): the output of the 1st, 3rd, ... matrix multiply of a block and
of its attention kernel are saved; everything else (the 2nd, 4th ... matmul, norms, activations, rotary) is
recomputed from them and the block's input. Per token of a Llama block that keeps q (h_q), v (h_kv), the MLP's gate
(f), its down projection (h) and the attention output (h_q) beside the input (h); of a GPT-2 block (HF ``Conv1D``:
``addmm``, fused qkv) qkv (3 h) and the MLP's first projection (4 h) with the attention output and the input.
``perf.memory`` counts the same.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

ATTENTION_OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
"""The fused attention kernels whose outputs are saved (the math fallback is recomputed op by op)."""


def _ops(names: tuple[str, ...]) -> set:
    aten = torch.ops.aten
    return {getattr(aten, name).default for name in names if hasattr(aten, name)}


MATMULS = _ops(("mm", "addmm"))
SAVED = MATMULS | _ops(ATTENTION_OPS)


def selective_context():
    """A fresh pair of checkpoint contexts for one block (torch calls it at each checkpointed forward), counting
    its matmuls apart in forward and in the recompute so both save the same ones."""
    counts = {False: 0, True: 0}

    def policy(ctx, func, *args, **kwargs):
        if func in MATMULS:
            counts[ctx.is_recompute] += 1
            if counts[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in SAVED else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)

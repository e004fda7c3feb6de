"""Model FLOPs per sample: counted from layer shapes (CNNs) or from the transformer formula (GPT-2).

Conventions, shared by every workload:
- A multiply-accumulate is 2 FLOPs; only matrix work counts (convolutions, linear layers,
  attention score and value products). Norms, activations, pooling, softmax and the optimizer are
  left out: they are a few percent at most, and ``torch.utils.flop_counter.FlopCounterMode`` (the
  reference the tests compare against) leaves them out too.
- Training = forward + backward = 3 x forward, the backward pass computing both the input and the
  weight gradient of every matmul (Kaplan et al. 2020, "Scaling Laws for Neural Language Models",
  section 2.1; Chowdhery et al. 2022, "PaLM", appendix B). The first layer's input gradient is not
  needed in reality, so the counter may read a little lower (~2% on ResNet-18 at 224 x 224).
- *Model* FLOPs, as in PaLM's MFU: activation checkpointing recomputes the forward pass, but that
  recomputation is not counted; MFU stays comparable across memory-saving choices.
  ``gpt2_hardware_flops_per_token`` gives the recomputing count (an extra forward) for reference.
- Attention, the term that grows with the sequence: per layer and token the score product Q K^T and
  the value product A V, 2 x (heads x head width) x T FLOPs each forward, 12 x L x (heads x head width)
  x T for training (PaLM's 12 L H Q T). Causal masking does not halve it here: the whole T x T score
  matrix is counted, though only its lower half is useful work and a kernel that skips masked blocks
  (FlashAttention, whose own benchmark counts causal attention at half) does about half. That is PaLM's
  convention (appendix B) and torchtitan's (``get_dense_model_nparams_and_flops``: "we follow the
  convention and do not account for sparsity in causal attention"), and ``FlopCounterMode`` counts the
  same (its SDPA formulas take the whole matrix, ``is_causal`` or not; torch's math kernel computes all
  of it and masks after), so ds_bench's MFU compares with theirs and its formulas with the counter.
  Megatron-LM's ``num_floating_point_operations`` (``megatron/training/training.py``) now halves it
  ("causal mask (only half of the mask is non-zero)"; Narayanan et al. 2021 counted it whole): at long
  sequences ds_bench's MFU reads above Megatron-LM's for the same run by (6 N + 12 L H Q T) / (6 N + 6 L
  H Q T), 1.07 for Llama 3.1 8B at 4,096 tokens, 1.36 at 32,768, 1.70 at 131,072 (attention 13%, 53%,
  82% of its FLOPs). ``tests/test_flops.py`` checks the term against the counter at 128 and 2,048
  tokens, where it is 1% and 14% of a tiny model's FLOPs, through torch's math SDPA kernel: the counter
  has no formula for the fused CPU kernel (``_scaled_dot_product_flash_attention_for_cpu``, torch 2.13)
  and counts no attention there at all.

Run ``python -m ds_bench.workloads`` for the GPT-2 figures at the standard sizes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

TRAIN_FACTOR = 3  # forward 1x + backward 2x (input and weight gradients)


def layer_forward_flops(model: nn.Module, forward_one: Callable[[], object]) -> float:
    """Forward FLOPs of ``forward_one()`` (one sample), summed over Conv2d and Linear layers by shape.

    Conv2d: 2 x (C_in / groups) x k_h x k_w per output element (C_out x H_out x W_out of them);
    Linear: 2 x in_features per output element. Hooks read the output shapes of a real forward in
    eval mode without gradients, so BatchNorm statistics and the training state are left untouched.
    """
    total = 0.0

    def hook(module: nn.Module, _inputs, output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Conv2d):
            k_h, k_w = module.kernel_size
            macs_per_out = module.in_channels // module.groups * k_h * k_w
        else:
            macs_per_out = module.in_features
        total += 2.0 * macs_per_out * output.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            forward_one()
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return total


def gpt2_matmul_params(n_layer: int, d_model: int, d_ff: int, vocab: int) -> int:
    """N of the 6N term: weights that multiply every token's activations.

    Per block: attention q, k, v and output projections 4 d^2, MLP 2 d d_ff; plus the LM head V d
    (GPT-2 ties it to the token embedding, so it is a parameter once but a matmul per token). Not
    counted: the embedding lookups (wte, wpe: gathers, no arithmetic), biases and LayerNorms
    (element-wise, ~0.1%). This is Kaplan's non-embedding N (12 L d^2 for d_ff = 4d) plus the head.
    """
    return n_layer * (4 * d_model * d_model + 2 * d_model * d_ff) + vocab * d_model


def gpt2_flops_per_token(n_layer: int, d_model: int, d_ff: int, vocab: int, seq_len: int) -> float:
    """Training model FLOPs per token: 6 N + 12 L d T (PaLM, Chowdhery et al. 2022, appendix B).

    6 N: forward 2 N (one multiply-add per weight) x 3 for training. 12 L d T: per layer the score
    product Q K^T and the value product A V each cost 2 d T per token forward (d = heads x head
    width, T = sequence length), 4 L d T forward, x 3 for training. The full T x T score matrix is
    counted, causal mask or not: the useful work (and FlashAttention's) is half of the 12 L d T term,
    Megatron-LM's current formula halves it, PaLM, torchtitan and ``FlopCounterMode`` do not (module
    docstring, "Attention").
    """
    return 6.0 * gpt2_matmul_params(n_layer, d_model, d_ff, vocab) + 12.0 * n_layer * d_model * seq_len


def gpt2_hardware_flops_per_token(n_layer: int, d_model: int, d_ff: int, vocab: int, seq_len: int) -> float:
    """With activation checkpointing of every block: model FLOPs + one more forward of the blocks.

    PaLM (appendix B) counts checkpointing as an extra forward pass (8 N + 16 L d T when all of N
    is recomputed). HF GPT-2 checkpoints the transformer blocks only, so the recomputation is the
    blocks' forward, 2 N_blocks + 4 L d T per token; the LM head (V d) is not recomputed.
    """
    blocks = gpt2_matmul_params(n_layer, d_model, d_ff, vocab) - vocab * d_model
    recompute = 2.0 * blocks + 4.0 * n_layer * d_model * seq_len
    return gpt2_flops_per_token(n_layer, d_model, d_ff, vocab, seq_len) + recompute

"""The loss's memory: the [tokens x vocabulary] tensors one rank holds at the loss's peak, by how the loss is
computed (pure). The one formula ``perf.memory`` (plan) and ``perf.seq_memory`` (capacity's sequence search) use.

    loss bytes = tokens x vocabulary x bytes per element,   tokens = all the rank's, or one tile's

Bytes per element, by implementation (``LOSSES``):
- **upcast**: HF's ``ForCausalLMLoss`` and ds_bench's own loss (``ds_bench.engines.tiling._cross_entropy_sum``)
  upcast the logits (``logits.float()``) and take ``log_softmax``, whose fp32 output autograd keeps; backward
  begins with the activations all held and makes the fp32 gradient of the log-probabilities and, from both, the
  fp32 gradient of the logits: three fp32 tensors, 12 bytes, in either precision (forward's logits + upcast +
  log-probabilities, 2 + 4 + 4 in bf16 and 4 + 4 in fp32, are less).
- **fused**: a fused cross-entropy kernel on the logits in the compute precision (flash-attn's
  ``flash_attn.losses.cross_entropy.CrossEntropyLoss``, llm-foundry's default ``loss_fn: fused_crossentropy``;
  Liger's ``LigerCrossEntropyLoss``): it keeps the logits and a per-token log-sum-exp, and its backward writes
  the logits' gradient, one tensor of the same type: 2 E bytes (4 in bf16).
- **tiled** (``--tiled-loss``, DeepSpeed's ``TiledFusedLogitsLoss``): the upcast loss over one tile of tokens at
  a time (``engines.tiling.loss_tiles``: at most ``LOSS_TILE_BYTES`` of fp32 logits), each tile's backward done
  in forward, so the term stops growing once a tile is full.
"""

from __future__ import annotations

import math

from ds_bench.perf.states import ELEMENT_BYTES

LOSS_ELEMENT_BYTES = 12
"""Bytes per [token x vocabulary] element the upcast loss holds at its peak (module docstring)."""

LOSSES = ("upcast", "fused")
"""How an untiled loss is computed (module docstring); ``--tiled-loss`` tiles the upcast one."""


def element_bytes(loss: str, precision: str) -> int:
    """Bytes per [token x vocabulary] element at the loss's peak (module docstring)."""
    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r}: expected one of {', '.join(LOSSES)}")
    return LOSS_ELEMENT_BYTES if loss == "upcast" else 2 * ELEMENT_BYTES[precision]


def loss_bytes(tokens: int, vocab: int, precision: str, loss: str = "upcast", tiled: bool = False) -> int:
    """The loss's tensors one rank holds at its peak, for ``tokens`` of its own over a ``vocab`` of its own (the
    whole vocabulary, or a tensor-parallel rank's share of it)."""
    if tiled:
        tokens = math.ceil(tokens / loss_tiles(tokens, vocab))
        loss = "upcast"
    return tokens * vocab * element_bytes(loss, precision)


def loss_tiles(tokens: int, vocab: int) -> int:
    """How many tiles ``--tiled-loss`` cuts a rank's tokens into (``ds_bench.engines.tiling.loss_tiles``, imported
    when called: that module imports torch, which a dry run need not)."""
    from ds_bench.engines.tiling import loss_tiles as tiles

    return tiles(tokens, vocab)

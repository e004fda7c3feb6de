"""ALST's memory options for long sequences (Bekman et al. 2025, arXiv 2506.13996, sections 3.2-3.3), through
DeepSpeed's own autograd functions (``deepspeed/runtime/sequence_parallel/ulysses_sp.py``), and the token loss
every sharded or tiled run computes.

- ``--tiled-mlp`` (``tile_mlps``): each block's MLP runs as ``TiledMLP`` over ``ceil(tokens / hidden)`` tiles of
  the sequence (ALST's choice: a tile as long as the model is wide), without keeping the tiles' intermediate
  activations; backward recomputes each tile's forward. Peak memory of the MLP: one tile's intermediate
  (tile x intermediate width) instead of the sequence's, for one more MLP forward per step. Every rank has
  the same slice length, so the tile count agrees across ranks (ZeRO-3 gathers weights per tile: a rank
  with another count would hang its peers).
- ``--tiled-loss`` (``token_sum``): the LM head and the cross entropy run as ``TiledFusedLogitsLoss`` over tiles
  of at most ``LOSS_TILE_BYTES`` of fp32 logits, each tile's backward done inside the forward, so no
  [tokens x vocabulary] logits tensor (nor its gradient) is ever whole. Without it, the logits of the
  rank's tokens and their fp32 copy are (``perf.peak_memory`` counts them).
- ``--checkpoint-offload`` (``checkpoint_offload``, with ``--activation-checkpointing``): DeepSpeed's
  ``CheckpointHiddenStatesOffload``, saved-tensor hooks that copy each checkpointed block's input to pinned
  host memory on a side stream in forward and back in backward, so a GPU holds one block's input at a time
  instead of every block's. Entered around each micro-step's forward and backward (it syncs and clears on
  exit). GPU ranks only: the legality table refuses it on CPU ranks, where DeepSpeed never offloads.
"""

from __future__ import annotations

import contextlib
import math
import types

import torch

LOSS_TILE_BYTES = 256 * 2**20
"""Most fp32 logits one loss tile holds (ALST's reference code uses 1 GiB tiles on 80 GB GPUs; a quarter of
that keeps tiles useful on the capped CPU ranks of the test bed too)."""


def tile_mlps(model: torch.nn.Module) -> int:
    """Run every block's ``mlp`` (HF's name in Llama and GPT-2) as DeepSpeed's ``TiledMLP``; how many were
    tiled. Per instance: the class's ``forward`` stays as it was for any other model in the process."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    mlps = [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == "mlp"]
    for mlp in mlps:
        plain = type(mlp).forward

        def tiled(self, x, plain=plain):
            shards = max(1, math.ceil(x.shape[-2] / x.shape[-1]))
            return TiledMLP.apply(_on_contiguous(plain), self, x, shards, list(self.parameters()))

        mlp.forward = types.MethodType(tiled, mlp)
    return len(mlps)


def _on_contiguous(forward):
    """``forward`` on a contiguous copy of its input: TiledMLP cuts the sequence dimension of [batch, tokens, h], so
    with a micro-batch above 1 each tile is a strided view, which GPT-2's ``Conv1D`` (``x.view(-1, h)``) refuses
    ("view size is not compatible with input tensor's size and stride"); Llama's ``nn.Linear`` takes it as is. The
    copy is one tile's."""

    def run(self, x):
        return forward(self, x.contiguous())

    return run


def checkpoint_offload():
    """A fresh offload context for one micro-step's forward and backward (DeepSpeed's defaults: pinned buffers,
    a side stream, the last block's input kept on the device for the first backward)."""
    from deepspeed.runtime.activation_checkpointing.offload_activations import (
        get_checkpoint_hidden_states_offloading_ctx_manager,
    )

    return get_checkpoint_hidden_states_offloading_ctx_manager()


def token_sum(engine, batch: dict, weight: float, tiled: bool) -> torch.Tensor:
    """This rank's cross entropy summed over its tokens (``batch``: ``input_ids``, ``position_ids``,
    ``shift_labels``), times ``weight`` (what the gradient of each token's loss is, see
    ``sequence_parallel.group_loss``). ``tiled``: ``engine`` holds a ``TiledLossModel`` (``with_tiled_loss``), and
    the weight goes inside it: its tiles' weight gradients are taken in forward, before anything outside could
    scale them."""
    inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    labels = batch["shift_labels"]
    if not tiled:
        logits = engine(**inputs, use_cache=False, return_dict=True).logits
        return _cross_entropy_sum(logits, labels) * weight
    k = engine.gradient_accumulation_steps() if hasattr(engine, "gradient_accumulation_steps") else 1
    return engine(**inputs, shift_labels=labels, weight=weight, accumulation=k)


def with_tiled_loss(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` (an HF causal LM) wrapped so that its forward is the tiled loss (``TiledLossModel``): what
    ``deepspeed.initialize`` gets with ``--tiled-loss``, so the loss runs inside the engine's forward and its
    bookkeeping (ZeRO's micro-step and gradient-accumulation state, the backward prologue) sees it."""
    return TiledLossModel(model)


class TiledLossModel(torch.nn.Module):
    """An HF causal LM whose forward returns its tiled, weighted token sum (``token_sum``); ``model`` is the HF
    model (its parameters' names gain a ``model.`` prefix)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids, position_ids, shift_labels, weight: float, accumulation: int = 1) -> torch.Tensor:
        hidden = self.model.base_model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                                       return_dict=True).last_hidden_state
        head = self.model.get_output_embeddings()
        # The tiles' weight gradients are taken in forward with an incoming gradient of 1, while DeepSpeed's
        # backward divides the loss by the accumulation steps k (scale_wrt_gas), which only reaches the hidden
        # states' gradient: so the tiles compute weight / k and the result is multiplied back by k (measured:
        # without it the head's gradient is k times too large at k = 2, the losses off by 2e-3 at step 8).
        k = accumulation
        with _whole(head.weight):
            return k * _tiled_loss_sum(self.model, hidden, shift_labels, head,
                                       lambda x, y: _cross_entropy_sum(torch.nn.functional.linear(x, head.weight), y)
                                       * (weight / k))


def _whole(weight: torch.Tensor):
    """The head's weight whole for every tile under ZeRO-3 (a no-op otherwise): gathered once, unless it is
    already (a tied head: the embedding's forward gathered it, and ZeRO-3 still holds it for that module). The
    tiles multiply by it directly, not through the module: ZeRO-3's module hooks keep each call's output alive
    for their backward bookkeeping, which would keep every tile's logits (measured: no saving at ZeRO-3
    through the module)."""
    if not hasattr(weight, "ds_id"):
        return contextlib.nullcontext()
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    if weight.ds_status == ZeroParamStatus.AVAILABLE:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([weight], modifier_rank=None)


def _tiled_loss_sum(model, hidden, labels, head, tile_loss) -> torch.Tensor:
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss

    shards = loss_tiles(labels.numel(), head.weight.shape[0])
    tied = head.weight is model.get_input_embeddings().weight
    with _held_back(head.weight) if tied else contextlib.nullcontext():
        return TiledFusedLogitsLoss.apply(lambda _, x, y: tile_loss(x, y), model, hidden, labels, None, shards,
                                          [] if tied else [head.weight], "sum")


@contextlib.contextmanager
def _held_back(weight: torch.Tensor):
    """A tied head's weight gets the embedding's gradient later, in backward. DeepSpeed lets ZeRO reduce a tiled
    weight once the last tile is done (``ds_grad_is_ready``), and ZeRO-3 then copies, not adds, a second reduction
    in the same micro-step (stage3.py, micro_step_id 0): the head's share would be lost (measured: SP=2 left SP=1's
    losses at ZeRO-3). So the tiles are given no weight to reduce and it is held back while they run: reduced
    once, with the embedding's share, in backward."""
    weight.ds_grad_is_ready = False
    try:
        yield
    finally:
        weight.ds_grad_is_ready = True


def loss_tiles(tokens: int, vocab: int) -> int:
    """Tiles of at most ``LOSS_TILE_BYTES`` fp32 logits over ``tokens`` x ``vocab`` (pure)."""
    return max(1, math.ceil(tokens * vocab * 4 / LOSS_TILE_BYTES))


def _cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                             ignore_index=-100, reduction="sum")


def whole_sequences(batches):
    """``--tiled-loss`` without Ulysses: each batch whole, in the sliced form the token loss takes (one slice of the
    whole sequence: ``sequence_parallel.shard`` with S = 1)."""
    from ds_bench.engines.degrees.sequence_parallel import shard_batches

    return shard_batches(batches, 0, 1)

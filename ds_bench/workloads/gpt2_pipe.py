"""GPT-2 as a DeepSpeed ``PipelineModule``: the layers of ``GPT2LMHeadModel`` as a sequence of ``LayerSpec``s,
so each rank builds only the layers of its own pipeline stage (no rank builds the whole model first).

Layers, in order (each a ``LayerSpec``; the computation is HF GPT-2's, layer for layer):

    0       TokenEmbedding     ids -> wte(ids)            TiedLayerSpec key "wte"
    1       PositionEmbedding  h -> h + wpe(0..T-1)
    2..L+1  GPT2BlockPipe      HF ``GPT2Block`` (causal SDPA attention, no mask passed: causal by ``is_causal``)
    L+2     FinalNorm          ln_f
    L+3     TokenEmbedding     h -> h wte^T (the LM head) TiedLayerSpec key "wte", ``forward_fn=lm_logits``

The input embedding and the LM head are one tied weight (``TiedLayerSpec`` with the same key): the
stages holding either keep a copy, DeepSpeed broadcasts the first stage's at build and all-reduces the
two stages' gradients before each optimizer step (``PipelineEngine._exec_reduce_tied_grads``), so the
weight is updated once with the sum of both uses' gradients, as in the tied HF model. The token and
position embeddings are two layers so that the head's stage holds only the token matrix it multiplies.

Initialisation is the plain model's (``ds_bench.workloads.hf_init``): once this rank's layers are built,
each parameter is drawn from the generator of (``--seed``, its name in ``GPT2LMHeadModel``: ``hf_name``
maps layer 2 + i to ``transformer.h.i``, the tied embedding to ``transformer.wte``), so a layer's weights
do not depend on which stage builds it, and every P starts from the weights the plain HF model with the
same seed starts from (HF GPT-2's scheme: normal(0, 0.02), the residual ``c_proj`` at 0.02 / sqrt(2 L),
LayerNorms at 1 and 0).

Loss (``causal_lm_loss``): HF's causal-LM cross-entropy: logits in fp32, position t predicts token t+1,
the mean over the B (T - 1) predicted tokens. A batch is ``(input_ids, input_ids)``: the first stage
reads the inputs, the last the labels. ``--activation-checkpointing`` recomputes each block
(``activation_checkpoint_interval=1``, blocks only: as HF checkpoints them). The class is not named
``GPT2ModelPipe``: DeepSpeed's engine gives that name a special case (an attention mask between stages).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from torch import nn
from transformers.models.gpt2.modeling_gpt2 import GPT2Block

from ds_bench.workloads import hf_init

FIRST_BLOCK = 2  # layer index of block 0
TIED_KEY = "wte"


class TokenEmbedding(nn.Embedding):
    """``wte``: the input embedding, and (through ``lm_logits``) the LM head."""


class PositionEmbedding(nn.Module):
    """``wpe``, added to the token embeddings: h + wpe(0..T-1)."""

    def __init__(self, positions: int, width: int):
        super().__init__()
        self.wpe = nn.Embedding(positions, width)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.wpe(torch.arange(hidden.shape[1], device=hidden.device))


class GPT2BlockPipe(GPT2Block):
    """HF ``GPT2Block``, one tensor in and out."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = super().forward(hidden)
        return out[0] if isinstance(out, tuple) else out  # transformers <= 5.0 returned (hidden, ...)


class FinalNorm(nn.LayerNorm):
    """``ln_f``."""


class GPT2Pipeline(PipelineModule):
    """``PipelineModule`` whose ``parameters`` partitioning counts each layer on the meta device (DeepSpeed
    builds every layer once on every rank to count it: at 13B that is 26 GB per rank, for a number)."""

    def __init__(self, layers, n_blocks: int, **kwargs):
        self.n_blocks = n_blocks
        super().__init__(layers, **kwargs)

    def _count_layer_params(self):
        with torch.device("meta"):
            return super()._count_layer_params()

    def stage_layout(self) -> dict:
        """This rank's stage: its layer range, the blocks it holds, its parameters (``params``: a tied copy
        included; ``unique_params``: without the copy DeepSpeed marks ``ds_pipe_replicated``, so the stages'
        unique parameters add up to the model's)."""
        start, stop = int(self._local_start), int(self._local_stop)  # numpy integers under some partitionings
        blocks = [i - FIRST_BLOCK for i in range(start, stop) if FIRST_BLOCK <= i < FIRST_BLOCK + self.n_blocks]
        params = list(self.parameters())
        return {"stage": self.stage_id, "layers": [start, stop], "blocks": [blocks[0], blocks[-1]] if blocks else [],
                "n_blocks": len(blocks), "params": sum(p.numel() for p in params),
                "unique_params": sum(p.numel() for p in params if not getattr(p, "ds_pipe_replicated", False))}


def lm_logits(embedding: TokenEmbedding, hidden: torch.Tensor) -> torch.Tensor:
    """The tied LM head: h wte^T."""
    return F.linear(hidden, embedding.weight)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF's ``ForCausalLMLoss`` without padding: fp32 cross-entropy of logits[:, t] against labels[:, t + 1]."""
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, vocab), labels[:, 1:].reshape(-1))


def layer_specs(config) -> list:
    """The module docstring's layers for a ``GPT2Config``."""
    config = copy.deepcopy(config)
    config._attn_implementation = config._attn_implementation or "sdpa"  # --attn; no mask passed (is_causal)
    width = config.n_embd
    return [TiedLayerSpec(TIED_KEY, TokenEmbedding, config.vocab_size, width),
            LayerSpec(PositionEmbedding, config.n_positions, width),
            *[LayerSpec(GPT2BlockPipe, config, i) for i in range(config.n_layer)],
            LayerSpec(FinalNorm, width, eps=config.layer_norm_epsilon),
            TiedLayerSpec(TIED_KEY, TokenEmbedding, config.vocab_size, width, forward_fn=lm_logits)]


def hf_name(name: str, n_blocks: int) -> str:
    """The name in ``GPT2LMHeadModel`` of a module of the ``PipelineModule`` (``tied_modules.wte``, ``1.wpe``,
    ``2.attn.c_proj`` .. : layer index first), for ``hf_init.initialize``."""
    head, dot, rest = name.partition(".")
    if head == "tied_modules":
        return "transformer." + rest
    index = int(head)
    if index == 1:
        return "transformer" + dot + rest
    if FIRST_BLOCK <= index < FIRST_BLOCK + n_blocks:
        return f"transformer.h.{index - FIRST_BLOCK}" + dot + rest
    if index == FIRST_BLOCK + n_blocks:
        return "transformer.ln_f" + dot + rest
    raise ValueError(f"no GPT-2 layer {name!r} in a pipeline of {n_blocks} blocks")


def build_pipeline(config, stages: int, partition: str, seed: int, checkpointing: bool,
                   weight_std: Callable[[str], float]) -> GPT2Pipeline:
    """This rank's stage of GPT-2 (the process group must be joined: the module makes its groups), its
    weights those of the HF model of ``seed`` (module docstring)."""
    pipe = GPT2Pipeline(layer_specs(config), n_blocks=config.n_layer, num_stages=stages, loss_fn=causal_lm_loss,
                        partition_method=partition, activation_checkpoint_interval=1 if checkpointing else 0,
                        checkpointable_layers=[GPT2BlockPipe.__name__])
    hf_init.initialize(pipe, seed, weight_std, lambda name: hf_name(name, config.n_layer))
    return pipe


"""DeepSpeed-Ulysses sequence parallelism (ALST, Bekman et al. 2025, arXiv 2506.13996): the layout of a
``--sequence-parallel S`` run, checked before joining, how a batch is split over a group, the loss over it,
and what ``deepspeed.initialize`` gets.

Ulysses (Jacobs et al. 2023, arXiv 2309.14509) gives each of the S ranks of a group T/S consecutive tokens
of every sequence. Outside attention every layer is token-wise, so a rank computes its slice alone; around
attention an all-to-all trades the slices of all heads for all tokens of H/S heads (q, k and v: 3), attention
runs on whole sequences, and one more all-to-all trades back (4 per layer in forward, 4 in backward:
``ds_bench.measure.layout_comm`` counts them). DeepSpeed's HF integration
(``UlyssesSPAttentionHF.register_with_transformers``) wraps the model's attention implementation (sdpa or
flash_attention_2: eager's 4-D mask is refused by the legality table) and returns the ``mpu`` whose groups
``deepspeed.initialize`` uses. So S must divide the attention heads, and the KV heads must divide S or be
divisible by it (fewer KV heads than S are replicated: ``kv_replication_factor``).

Layout: S sequence-parallel x D data-parallel ranks, D = world size / S; a group is S consecutive ranks
(``parallel_state_sp.initialize_sequence_parallel``) reading its data-parallel replica's batch (``rank // S``
of D), each rank keeping its slice (``shard``). Batch arithmetic in ds_bench's terms: tokens per step =
micro-batch x accumulation x D x sequence; DeepSpeed agrees: with ``sequence_parallel_size`` its config counts
train_batch_size = micro-batch x accumulation x world size / S (``deepspeed/runtime/config.py``), the
sequences of a step, which is the global batch ds_bench already gives it.

AutoSP (``--sp-path autosp``; deepspeed >= 0.18.9, ``compile/passes/sp_compile.py``) is the same split made by a
compiler pass: every rank of a group is given the replica's whole batch (``shard`` marks it), its inputs are marked
dynamic along the sequence (``prepare_autosp_inputs``), and the compiled graph keeps each rank's T/S tokens and
inserts the all-to-alls around ``scaled_dot_product_attention``. HF's loss then runs inside each rank's slice: the
labels are shifted within the slice, so the last position of every slice but the last loses its target (S - 1 of the
T - 1 per sequence), and the loss is the mean over each slice's own T/S - 1 targets (docs/options.md#autosp).

The loss (``group_loss``): each rank sums the cross entropy of its slice's tokens (labels shifted before the
split, the last position -100); the step's loss is the group's sum over the sequence's T-1 predicted tokens,
the same number SP=1's mean gives. The gradient each rank back-propagates is its own sum over those tokens,
times ``gradient_scale``: deepspeed 0.19.8 averages gradients over data-parallel replicas under ZeRO 0-2 but
divides ZeRO-3's by every rank of the group too (measured, SGD, 2 ranks: SP=2 matches SP=1 to 1e-6 with scale
1 at stages 0-2 and S at stage 3, and misses it by the factor otherwise).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch

from ds_bench.config.deepspeed import prepare as ds_config
from ds_bench.engines.degrees.mesh import DegreePlan, register
from ds_bench.errors import UserError

IGNORE = -100
"""The label of a position with no next token (HF's ignore_index)."""


@dataclass(frozen=True)
class SequenceParallelPlan(DegreePlan):
    field: ClassVar[str] = "sequence_parallel"
    shards_batches: ClassVar[bool] = True

    size: int
    """S: ranks that share each sequence (``sequence_parallel_size``)."""
    data_parallel_size: int
    """D = world size / S."""
    zero_stage: int = 0
    path: str = ""
    """``--sp-path``: empty for Ulysses; ``autosp`` for DeepSpeed's AutoSP compiler pass (module docstring)."""

    @property
    def comm_timed(self) -> bool:
        """Ulysses' all-to-alls are timed (``measure.layout_comm``); AutoSP's run inside the compiled graph."""
        return self.path != "autosp"

    def record_settings(self) -> dict:
        return {"path": self.path} if self.path else {}

    def group_rank(self, rank: int) -> int:
        return rank % self.size

    @property
    def gradient_scale(self) -> int:
        """What each rank's token sum is multiplied by before backward (module docstring)."""
        return self.size if self.zero_stage == 3 else 1

    def with_config(self, ds_cfg: dict) -> SequenceParallelPlan:
        return with_stage(self, ds_config.zero_stage(ds_cfg))

    def deepspeed_config(self, ds_cfg: dict) -> dict:
        return deepspeed_config(self, ds_cfg)

    def mpu(self, model, micro_batch: int, workload):
        if self.path == "autosp":
            return causal_sdpa(model)
        return register_attention(self, model, micro_batch, workload.seq_len)

    def shard(self, batches: Iterator[dict], rank: int) -> Iterator[dict]:
        if self.path == "autosp":
            return ({**batch, "autosp": True} for batch in batches)
        return shard_batches(batches, self.group_rank(rank), self.size, self.gradient_scale)

    def verdict_terms(self, workload, micro_batch: int, comm: dict | None, build: dict) -> dict:
        """Ulysses' all-to-alls of q, k, v and the attention output."""
        return {"sequence_parallel": self.size,
                "sp_all_to_all_elements": workload.sequence_parallel_all_to_all_elements(micro_batch, self.size)}


@register("sequence_parallel")
def _from_run(cfg, workload, world_size: int, local_world_size: int | None) -> SequenceParallelPlan | None:
    if cfg.sequence_parallel is None:
        return None
    heads, kv_heads = workload.attention_heads
    plan = resolve(cfg.sequence_parallel, world_size, heads, kv_heads, workload.seq_len)
    return dataclasses.replace(plan, path=getattr(cfg, "sp_path", None) or "") if plan is not None else None


def resolve(size: int | None, world_size: int, heads: int, kv_heads: int, seq_len: int) -> SequenceParallelPlan | None:
    """The layout of ``--sequence-parallel`` on ``world_size`` ranks of a model with ``heads`` attention heads
    and ``kv_heads`` KV heads (pure); None without it. What needs no model (the world size, the sequence, the
    engine, other degrees) the legality table has refused already."""
    if size is None:
        return None
    if heads % size:
        raise UserError(f"--sequence-parallel {size} does not divide the model's {heads} attention heads: Ulysses "
                        "gives every rank of a group an equal share of the heads")
    if kv_heads % size and size % kv_heads:
        raise UserError(f"--sequence-parallel {size} with the model's {kv_heads} KV heads: Ulysses needs the KV heads "
                        "to divide S (they are replicated) or S to divide them")
    if seq_len % size:
        raise UserError(f"--sequence-parallel {size} does not divide --seq-len {seq_len}")
    return SequenceParallelPlan(size, world_size // size)


def with_stage(sp: SequenceParallelPlan, zero_stage: int) -> SequenceParallelPlan:
    """The plan once the config's ZeRO stage is known (it sets ``gradient_scale``)."""
    return dataclasses.replace(sp, zero_stage=zero_stage)


def ulysses(sp: SequenceParallelPlan | None) -> bool:
    """Whether Ulysses runs: ``--sequence-parallel 1`` engages the rules and the sharded batches, and no
    all-to-all; ``--sp-path autosp`` shards inside the compiled graph instead."""
    return sp is not None and sp.size > 1 and sp.path != "autosp"


def deepspeed_config(sp: SequenceParallelPlan | None, ds_cfg: dict) -> dict:
    """The config ``deepspeed.initialize`` gets (pure): ``sequence_parallel_size`` with Ulysses or AutoSP (whose
    pass reads the group's size from it; ``--sp-path autosp`` wrote its ``compile`` section already)."""
    if sp is None or sp.size <= 1:
        return ds_cfg
    return {**ds_cfg, "sequence_parallel_size": sp.size}


def register_attention(sp: SequenceParallelPlan | None, model: torch.nn.Module, micro_batch: int, seq_len: int):
    """Wrap ``model``'s attention in Ulysses (after joining, before ``deepspeed.initialize``); the ``mpu`` it
    returns, or None without sequence parallelism."""
    if not ulysses(sp):
        return None
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    # deepspeed 0.17.0-0.18.1 name the sequence length max_length; 0.18.2 renamed it seq_length
    length = "seq_length" if "seq_length" in inspect.signature(UlyssesSPAttentionHF.register_with_transformers).parameters \
        else "max_length"
    return UlyssesSPAttentionHF.register_with_transformers(
        model, core_attn_implementation=model.config._attn_implementation, sequence_parallel_size=sp.size,
        micro_batch_size=micro_batch, seq_length_is_variable=True, **{length: seq_len})


CAUSAL_SDPA = "ds_bench_causal_sdpa"
"""HF's sdpa attention under a name with no mask function: the model passes no mask and sdpa is causal by
``is_causal`` (AutoSP's path)."""


def causal_sdpa(model: torch.nn.Module) -> None:
    """Give ``model`` sdpa attention without a mask tensor (before ``deepspeed.initialize``; no ``mpu``). Under
    ``torch.compile`` transformers 5 builds the full T x T causal mask (it skips it for ``is_causal`` only when not
    tracing, before torch 2.14), which AutoSP's pass cannot shard ('expand: attempting to expand a dimension of
    length s -> s//2'); an attention name without a mask function makes ``create_causal_mask`` return None."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register(CAUSAL_SDPA, sdpa_attention_forward)
    model.set_attn_implementation(CAUSAL_SDPA)
    return None


def shard(input_ids: torch.Tensor, group_rank: int, size: int, gradient_scale: int = 1) -> dict:
    """One rank's slice of a ``[batch, T]`` token batch (pure): its ``input_ids``, their ``position_ids`` in
    the whole sequence, their ``shift_labels`` (the next token, shifted before the split; ``IGNORE`` after
    the last); and, for the loss, ``tokens`` (the predicted tokens of the whole batch, what the loss is
    averaged over), ``gradient_scale`` and ``group_size`` (S), as Python integers: they stay on the host, so
    reading them never waits for the device."""
    batch, length = input_ids.shape
    labels = torch.cat([input_ids[:, 1:], torch.full((batch, 1), IGNORE, dtype=input_ids.dtype)], dim=1)
    positions = torch.arange(length).unsqueeze(0).expand(batch, length)
    width = length // size
    part = slice(group_rank * width, (group_rank + 1) * width)
    return {"input_ids": input_ids[:, part].contiguous(), "position_ids": positions[:, part].contiguous(),
            "shift_labels": labels[:, part].contiguous(), "tokens": batch * (length - 1),
            "gradient_scale": gradient_scale, "group_size": size}


def shard_batches(batches: Iterator[dict], group_rank: int, size: int, gradient_scale: int = 1) -> Iterator[dict]:
    """``shard`` of every batch of a replica's stream."""
    for batch in batches:
        yield shard(batch["input_ids"], group_rank, size, gradient_scale)


def token_weight(batch: dict) -> float:
    """What each token's cross entropy is multiplied by on this rank: ``gradient_scale / tokens``."""
    return batch["gradient_scale"] / batch["tokens"]


def group_loss(weighted_sum: torch.Tensor, batch: dict) -> torch.Tensor:
    """The loss of a sharded batch from this rank's token sum times ``token_weight`` (module docstring): its
    gradient is that; its value is the mean over the whole sequence's tokens (the group's sums all-reduced,
    outside autograd), the same on every rank of the group."""
    total = weighted_sum.detach() / batch["gradient_scale"]
    if batch["group_size"] > 1:
        import deepspeed.comm as dist
        from deepspeed.runtime.sequence_parallel import parallel_state_sp

        dist.all_reduce(total, group=parallel_state_sp.get_sequence_parallel_group())
    return weighted_sum + (total - weighted_sum).detach()


def group_mean(term: torch.Tensor, batch: dict) -> torch.Tensor:
    """A per-rank loss term (the MoE layers' aux loss, of this rank's slice) as the mean over the group: its
    gradient is ``term`` x ``gradient_scale`` / S (DeepSpeed sums the group's gradients, ``group_loss``), its value
    the group's mean (all-reduced outside autograd), the same on every rank of the group. A batch not sharded over
    a group (``--tiled-loss`` alone, S = 1): ``term``."""
    size = batch.get("group_size", 1)
    if size == 1:
        return term
    import deepspeed.comm as dist
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    weighted = term * (batch["gradient_scale"] / size)
    mean = term.detach() / size
    dist.all_reduce(mean, group=parallel_state_sp.get_sequence_parallel_group())
    return weighted + (mean - weighted).detach()

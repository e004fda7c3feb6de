"""A sequence length's peak memory per rank, predicted from probes of the same layout at other lengths
(``ds-bench capacity --scale seq``; pure).

    peak(T) = baseline + states(T) + fixed + per_token x tokens(T) + loss(T)

- **tokens(T)** = micro-batch x T / S: the tokens one rank computes; with S-way Ulysses each rank holds
  a slice of every sequence outside attention, and inside it all T tokens of H/S heads, which is as many
  activations (``ds_bench.engines.degrees.sequence_parallel``).
- **states(T)**: the model states, ``perf.states.model_states_bytes`` (the caller's): they do not change
  with the sequence, except GPT-2's learned positions past 1,024 (its member at T counts them).
- **loss(T)**: the cross entropy's [tokens x vocabulary] tensors, the one term that is not per token in
  every layout: ``perf.loss_memory.loss_bytes`` of ds_bench's own loss (upcast, 12 bytes per element), or of one
  tile with ``--tiled-loss``, where it stops growing once a tile is full.
- **per_token** and **fixed**, from the probes that ran ok (``calibrate``): with one, per_token = (peak -
  baseline - states - loss) / tokens and fixed = 0, which counts the step's fixed cost as per-token memory and
  so over-predicts longer sequences (``perf.peak_memory``: 1.2-1.8x along micro-batches); with two or more, the
  slope between the two longest (what is left once states and loss are taken out) and its intercept, as the
  sweep's two-micro-batch calibration. Attention whose memory grows as T^2 (``--attn eager``; on CPUs, sdpa's
  math kernel) makes longer sequences need more than the line: the two longest probes keep the line local.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ds_bench.config.layout import Layout
from ds_bench.perf import loss_memory


@dataclass(frozen=True)
class SeqProbe:
    """What one ok probe of a layout measured, and its model states (``perf.states.model_states_bytes``)."""

    seq_len: int
    peak_bytes: int
    baseline_bytes: int
    states_bytes: int


@dataclass(frozen=True)
class SeqCalibration:
    baseline_bytes: int
    bytes_per_token: float
    fixed_bytes: int = 0
    source: str = ""
    """The lengths it was measured at."""


def tokens_per_rank(layout: Layout, seq_len: int) -> int:
    return layout.micro_batch * seq_len // layout.sequence_parallel


def loss_bytes(layout: Layout, seq_len: int, vocab: int) -> int:
    """The loss's tensors one rank of ds_bench's run holds at its peak (``perf.loss_memory``: its upcast loss, of
    all its tokens or of one tile with ``--tiled-loss``)."""
    return loss_memory.loss_bytes(tokens_per_rank(layout, seq_len), vocab, layout.precision, "upcast",
                                  layout.tiled_loss)


def calibrate(probes: list[SeqProbe], layout: Layout, vocab: int) -> SeqCalibration | None:
    """From the ok probes of ``layout`` (any order): the two longest, or the one; None without any."""
    if not probes:
        return None
    last = sorted(probes, key=lambda p: p.seq_len)[-2:]
    above = [p.peak_bytes - p.baseline_bytes - p.states_bytes - loss_bytes(layout, p.seq_len, vocab) for p in last]
    tokens = [tokens_per_rank(layout, p.seq_len) for p in last]
    source = ", ".join(f"seq {p.seq_len}" for p in last)
    if len(last) == 1 or tokens[0] == tokens[1]:
        return SeqCalibration(last[-1].baseline_bytes, max(0.0, above[-1] / tokens[-1]), source=source)
    slope = max(0.0, (above[1] - above[0]) / (tokens[1] - tokens[0]))
    fixed = max(0, int(above[0] - slope * tokens[0]))
    return SeqCalibration(last[0].baseline_bytes, slope, fixed, source)


def predict_peak(calibration: SeqCalibration | None, layout: Layout, seq_len: int, vocab: int,
                 states_bytes: int) -> int | None:
    """Peak memory of one rank of ``layout`` at ``seq_len``, in bytes; None without a calibration."""
    if calibration is None:
        return None
    per_token = calibration.bytes_per_token * tokens_per_rank(layout, seq_len)
    return int(calibration.baseline_bytes + states_bytes + calibration.fixed_bytes + math.ceil(per_token)
               + loss_bytes(layout, seq_len, vocab))

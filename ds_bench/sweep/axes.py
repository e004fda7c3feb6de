"""The sweep's axes read from its flags (pure but for the base config's values): each axis's values, else the base
config's own one (``derive.axes_of``); the micro-batches (``auto``: None); the ``--point`` points beyond the grid,
once per stack of the axis."""

from __future__ import annotations

import argparse
import dataclasses

from ds_bench.config.layout import ATTENTION, ENGINES, OFFLOADS, PRECISIONS, Layout, parse_key
from ds_bench.config.parsers import parse_list
from ds_bench.config.study_flags import degrees_of, switches_of
from ds_bench.errors import UserError
from ds_bench.sweep.common_args import seq_axis


def parse_micro_batches(text: str | None, base_value: int | None) -> tuple[int, ...] | None:
    if text is None:
        return (base_value,) if base_value else None
    if text.strip() == "auto":
        return None
    return parse_list("--micro-batch", text, kind=int)


def axes_of_sweep(args: argparse.Namespace, base: dict, bf16_native: bool, notes: list[str]) -> dict:
    """Every axis from its flag, else the base config's own value; a CPU without native bf16 sweeps
    fp32 unless ``--precision`` says otherwise (and ``notes`` says so)."""
    from ds_bench.config.deepspeed.derive import axes_of

    axes = axes_of(base)
    precision_text = args.precision
    if precision_text is None and axes["precision"] == "bf16" and not bf16_native:
        precision_text = "fp32"
        notes.append("the compute nodes' CPU has no native bf16 known (torch would emulate it, ~9x slower): "
                     "sweeping fp32; measure bf16 anyway with --precision bf16")
    return dict(
        stages=parse_list("--stages", args.stages, allowed=(0, 1, 2, 3), kind=int) if args.stages else (axes["stage"],),
        offloads=parse_list("--offload", args.offload, allowed=OFFLOADS) if args.offload else (axes["offload"],),
        precisions=parse_list("--precision", precision_text, allowed=PRECISIONS) if precision_text else (axes["precision"],),
        micro_batches=parse_micro_batches(args.micro_batch, axes["micro_batch"]),
        grad_accums=parse_list("--grad-accum", args.grad_accum, kind=int) if args.grad_accum else (axes["grad_accum"],),
        engines=parse_list("--engines", args.engines, allowed=ENGINES) if args.engines else ("deepspeed",),
        degrees=degrees_of(args),
        attns=parse_list("--attn", args.attn, allowed=ATTENTION) if args.attn else ("",),
        compiles=tuple(v == "on" for v in parse_list("--compile", args.compile, allowed=("off", "on")))
        if args.compile else (False,),
        switches=switches_of(args), seq_lens=seq_axis(args.seq_len))


def extra_points(texts, spec) -> tuple[Layout, ...]:
    defaults = Layout(spec.stages[0], spec.offloads[0], spec.precisions[0],
                     (spec.micro_batches or (0,))[0], spec.grad_accums[0])
    out = []
    for text in texts:
        try:
            point = parse_key(text, defaults)
        except ValueError as e:
            raise UserError(f"--point {text!r}: {e}") from None
        out += [dataclasses.replace(point, stack=stack.label) for stack in spec.stacks] if not point.stack else [point]
    return tuple(out)

"""The grids of ``Layout``s: the one generator of the studies' points (a sweep's or a capacity search's families)
and of ``plan``'s candidates (``ds_bench.perf.space``) (pure), which points a study skips and why
(``skip_reason``) and a study left with none, refused (``runnable``), and ``--micro-batch auto``'s search.

Engines (``ds_bench.engines``): DeepSpeed points span every stage and offload; DDP is one family
per precision and accumulation (stage 0, no offload: it replicates); FSDP takes the sweep's stages
2 and 3 (3 when it has neither) and offload none or all (``ds_bench.engines.torch_settings``); the parallel
degrees and the memory switches (Ulysses, AutoTP, a pipeline, ALST's tiling) are DeepSpeed points' only. A
DeepSpeed point's key has no engine word, so ledgers written before the engine axis still match.
"""

from __future__ import annotations

import itertools

from ds_bench.config import legality
from ds_bench.config.layout import DEGREES, SWITCHES, Layout
from ds_bench.config.legality import Where
from ds_bench.errors import UserError


def families(stages, offloads, precisions, grad_accums, engines=("deepspeed",), degrees: dict | None = None,
             attns=("",), compiles=(False,), switches: dict | None = None, seq_lens=(0,),
             every_engine_alike: bool = False) -> list[Layout]:
    """One layout per family (micro-batch 0, a placeholder), engine by engine, in axis order; ``degrees``
    maps a ``DEGREES`` field to its values (``{"pipeline_stages": (1, 2)}``) and ``switches`` a ``SWITCHES`` field
    to its (``{"tiled_mlp": (False, True)}``), both used beyond 1 / off only by DeepSpeed (its pipeline engine,
    AutoTP, Ulysses, ALST's tiling); ``seq_lens``: each family's ``Layout.seq_len`` (0: the run's own).
    ``every_engine_alike``: every engine takes every stage, offload, degree and switch, for ``plan``, which says
    why the legality table refuses what an engine does not run (``perf.space``); the studies skip them."""
    out: list[Layout] = []
    for engine in engines:
        e_stages, e_offloads = (tuple(stages), tuple(offloads)) if every_engine_alike else engine_axes(
            engine, stages, offloads)
        own = every_engine_alike or engine == "deepspeed"
        values = [(degrees or {}).get(d.field, (1,)) if own else (1,) for d in DEGREES]
        toggles = [(switches or {}).get(w.field, (w.off,)) if own else (w.off,) for w in SWITCHES]
        n = len(DEGREES)
        for combo in itertools.product(*values, e_stages, e_offloads, precisions, grad_accums, attns, compiles,
                                       *toggles, seq_lens):
            s, o, p, g, a, c = combo[n:n + 6]
            out.append(Layout(s, o, p, 0, g, engine, attn=a, compile=c, seq_len=combo[-1],
                              **dict(zip((d.field for d in DEGREES), combo[:n])),
                              **dict(zip((w.field for w in SWITCHES), combo[n + 6:-1]))))
    return out


def engine_axes(engine: str, stages, offloads) -> tuple[tuple, tuple]:
    """The stages and offloads an engine has of the sweep's (module docstring)."""
    if engine == "ddp":
        return (0,), ("none",)
    if engine == "fsdp":
        return (tuple(s for s in stages if s in (2, 3)) or (3,)), (tuple(o for o in offloads if o != "optimizer") or ("none",))
    return tuple(stages), tuple(offloads)


def grid(stages, offloads, precisions, micro_batches, grad_accums, engines=("deepspeed",), degrees: dict | None = None,
         attns=("",), compiles=(False,), switches: dict | None = None, seq_lens=(0,)) -> list[Layout]:
    """The full grid for explicit micro-batches, family by family, micro-batches ascending."""
    return [f.with_micro_batch(m) for f in families(stages, offloads, precisions, grad_accums, engines, degrees,
                                                    attns, compiles, switches, seq_lens)
            for m in sorted(micro_batches)]


def study_where(spec, world_size: int) -> Where:
    """Where a study's points run: its ranks, its device, and the run options its ``--`` tail sets for every
    job (a ``--breakdown`` there, say, refuses every pipeline point: ``config.legality``)."""
    from ds_bench.config.study_flags import run_flags_of

    flags = run_flags_of(spec.workload, spec.run_args)
    return Where(world_size, spec.device_type, legality.run_options(flags), legality.engaged(flags), spec.workload)


def skip_reason(point: Layout, where: Where) -> str | None:
    """Why a study does not run ``point``: the legality table's sentence (``ds_bench.config.legality``),
    or a DDP point beyond the one a precision needs (DDP replicates: every stage runs as ZeRO-0 would)."""
    reason = legality.violation(point, where)
    if reason is None and point.engine == "ddp" and point.stage != 0:
        reason = "DDP replicates everything: one point per precision, z0 off=none"
    return reason


def runnable(points, where: Where, what: str) -> list[Layout]:
    """The ``points`` a study can run at ``where`` (``skip_reason`` None), in order; the others it skips, saying
    why. When none is left the study is bad input, refused before anything is launched: a ``UserError`` (exit 2),
    one line with each distinct reason (each names its flag: ``--sequence-parallel 3 does not divide the world
    size 2: ...``). ``what`` names the points: ``layout``, ``point``."""
    reasons = [skip_reason(p, where) for p in points]
    if points and all(reasons):
        ranks = "" if where.world_size is None else f" at {where.world_size} rank(s)"
        raise UserError(f"no {what} of this study can run{ranks}: " + "; ".join(dict.fromkeys(reasons)))
    return [p for p, why in zip(points, reasons) if why is None]


def next_auto_micro_batch(results: dict[int, str], limit: int) -> int | None:
    """``--micro-batch auto`` for one family: the next micro-batch to try, or None when the search
    is over. ``results`` maps each micro-batch tried to ``fits`` or ``oom`` (anything that did not
    fit, including predicted not to fit). Doubling from 1 until the first oom (or ``limit``), then
    bisecting between the largest that fit and the smallest that did not (pure)."""
    if not results:
        return 1
    fits = [m for m, r in results.items() if r == "fits"]
    too_big = [m for m, r in results.items() if r != "fits"]
    largest_fit = max(fits, default=0)
    smallest_oom = min(too_big, default=None)
    if smallest_oom is None:
        nxt = largest_fit * 2
        return nxt if nxt <= limit else None
    if smallest_oom <= largest_fit + 1:
        return None
    return (largest_fit + smallest_oom) // 2 if largest_fit else (1 if 1 not in results else None)

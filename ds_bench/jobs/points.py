"""The sweep's points: one configuration each (engine, ZeRO stage, offload, precision, micro-batch,
gradient accumulation), as pure values with a stable text key. The key names a point in records,
log files and tables, and is what a resumed sweep matches finished points on.

Engines (``ds_bench.engines``): DeepSpeed points span every stage and offload; DDP is one family
per precision and accumulation (stage 0, no offload: it replicates); FSDP takes the sweep's stages
2 and 3 (3 when it has neither) and offload none or all (``ds_bench.engines.torch_settings``). A DeepSpeed
point's key has no engine word, so ledgers written before the engine axis still match.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import asdict, dataclass

from ds_bench.config.run_checks import ATTENTION, ENGINES

OFFLOADS = ("none", "optimizer", "all")
"""``optimizer``: ``offload_optimizer`` to CPU (ZeRO-Offload); ``all``: optimizer and parameters
(ZeRO-Infinity to CPU memory, stage 3 only)."""
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True, order=True)
class Point:
    stage: int
    offload: str
    precision: str
    micro_batch: int
    grad_accum: int = 1
    engine: str = "deepspeed"
    pipeline_stages: int = 1
    """DeepSpeed pipeline stages (``--pipeline-stages``); 1: no pipeline. Data-parallel degree = ranks / this."""
    attn: str = ""
    """``--attn`` of the run (``ATTENTION``); empty: the workload's default."""
    compile: bool = False
    """``--compile`` of the run."""
    tensor_parallel: int = 1
    """DeepSpeed AutoTP degree (``--tensor-parallel``); 1: none. Data-parallel degree = ranks / this."""

    @property
    def model_parallel(self) -> int:
        """Ranks one data-parallel replica spans: pipeline stages x tensor-parallel ranks."""
        return self.pipeline_stages * self.tensor_parallel

    @property
    def key(self) -> str:
        return self._label(f" mbs={self.micro_batch}")

    @property
    def family(self) -> tuple:
        """Every point that differs only in micro-batch: one line of the throughput plot and one
        ``--micro-batch auto`` search."""
        return (self.stage, self.offload, self.precision, self.grad_accum, self.engine, self.pipeline_stages,
                self.attn, self.compile, self.tensor_parallel)

    def family_label(self) -> str:
        return self._label("")

    def _label(self, micro_batch: str) -> str:
        engine = "" if self.engine == "deepspeed" else f"{self.engine} "
        engine += f"pp{self.pipeline_stages} " if self.pipeline_stages > 1 else ""
        engine += f"tp{self.tensor_parallel} " if self.tensor_parallel > 1 else ""
        return f"{engine}z{self.stage} off={self.offload} {self.precision}{micro_batch}" + (
            f" ga={self.grad_accum}" if self.grad_accum != 1 else "") + (
            f" attn={self.attn}" if self.attn else "") + (" compile" if self.compile else "")

    def run_flags(self) -> list[str]:
        """The ``ds-bench run`` flags of this point's options beyond its DeepSpeed config."""
        return ((["--pipeline-stages", str(self.pipeline_stages)] if self.pipeline_stages > 1 else [])
                + (["--tensor-parallel", str(self.tensor_parallel)] if self.tensor_parallel > 1 else [])
                + (["--attn", self.attn] if self.attn else []) + (["--compile"] if self.compile else []))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Point:
        return cls(int(d["stage"]), str(d["offload"]), str(d["precision"]), int(d["micro_batch"]),
                   int(d.get("grad_accum", 1)), str(d.get("engine", "deepspeed")), int(d.get("pipeline_stages", 1)),
                   str(d.get("attn", "")), bool(d.get("compile", False)), int(d.get("tensor_parallel", 1)))

    def with_micro_batch(self, micro_batch: int) -> Point:
        return dataclasses.replace(self, micro_batch=micro_batch)


def parse_key(text: str, defaults: Point) -> Point:
    """``[ddp|fsdp] z2 off=optimizer fp32 mbs=128 ga=4`` (any part left out: ``defaults``'s; no engine
    word: DeepSpeed) -> Point (pure). Raises ValueError naming the part it does not understand."""
    fields = defaults.to_dict() | {"engine": "deepspeed"}
    for part in text.split():
        name, _, value = part.partition("=")
        if not value and part in ENGINES:
            fields["engine"] = part
        elif not value and part[:1] == "z" and part[1:].isdigit() and int(part[1:]) in range(4):
            fields["stage"] = int(part[1:])
        elif not value and part in PRECISIONS:
            fields["precision"] = part
        elif name == "off" and value in OFFLOADS:
            fields["offload"] = value
        elif not value and part[:2] == "pp" and part[2:].isdigit() and int(part[2:]) > 0:
            fields["pipeline_stages"] = int(part[2:])
        elif not value and part[:2] == "tp" and part[2:].isdigit() and int(part[2:]) > 0:
            fields["tensor_parallel"] = int(part[2:])
        elif name == "attn" and value in ATTENTION:
            fields["attn"] = value
        elif part == "compile":
            fields["compile"] = True
        elif name in ("mbs", "ga") and value.isdigit() and int(value) > 0:
            fields["micro_batch" if name == "mbs" else "grad_accum"] = int(value)
        else:
            raise ValueError(f"{part!r} is not {'|'.join(ENGINES[1:])}, z0..z3, ppN, tpN, off={'|'.join(OFFLOADS)}, "
                             f"{'|'.join(PRECISIONS)}, mbs=N, ga=N, attn={'|'.join(ATTENTION)} or compile")
    if fields["micro_batch"] < 1:
        raise ValueError("a point needs a micro-batch: mbs=N")
    return Point.from_dict(fields)


def families(stages, offloads, precisions, grad_accums, engines=("deepspeed",), pipelines=(1,), attns=("",),
             compiles=(False,), tensor_parallels=(1,)) -> list[Point]:
    """One point per family (micro-batch 0, a placeholder), engine by engine, in axis order; pipeline
    stages and tensor-parallel degrees beyond 1 only for DeepSpeed (its pipeline engine, AutoTP)."""
    out: list[Point] = []
    for engine in engines:
        e_stages, e_offloads = engine_axes(engine, stages, offloads)
        e_pipes, e_tps = (pipelines, tensor_parallels) if engine == "deepspeed" else ((1,), (1,))
        out += [Point(s, o, p, 0, g, engine, pp, a, c, tp) for pp, tp, s, o, p, g, a, c in
                itertools.product(e_pipes, e_tps, e_stages, e_offloads, precisions, grad_accums, attns, compiles)]
    return out


def engine_axes(engine: str, stages, offloads) -> tuple[tuple, tuple]:
    """The stages and offloads an engine has of the sweep's (module docstring)."""
    if engine == "ddp":
        return (0,), ("none",)
    if engine == "fsdp":
        return (tuple(s for s in stages if s in (2, 3)) or (3,)), (tuple(o for o in offloads if o != "optimizer") or ("none",))
    return tuple(stages), tuple(offloads)


def grid(stages, offloads, precisions, micro_batches, grad_accums, engines=("deepspeed",),
         pipelines=(1,), attns=("",), compiles=(False,), tensor_parallels=(1,)) -> list[Point]:
    """The full grid for explicit micro-batches, family by family, micro-batches ascending."""
    return [f.with_micro_batch(m) for f in families(stages, offloads, precisions, grad_accums, engines, pipelines,
                                                    attns, compiles, tensor_parallels)
            for m in sorted(micro_batches)]


def invalid_reason(point: Point, device_type: str, world_size: int | None = None) -> str | None:
    """Why DeepSpeed cannot run this combination (on ``world_size`` ranks, when given), or None.
    ``ds_config.prepare`` and the run's own checks are the full check; these are the combinations a
    grid produces by construction, named in the sweep's own terms."""
    pp, tp = point.pipeline_stages, point.tensor_parallel
    if tp > 1 and point.engine != "deepspeed":
        return f"{point.engine.upper()} has no tensor parallelism here: it is DeepSpeed's AutoTP"
    if tp > 1 and pp > 1:
        return "AutoTP does not combine with DeepSpeed's pipeline engine (DeepSpeed #7147)"
    if tp > 1 and point.compile:
        return "--compile with tensor parallelism is not measured yet"
    if world_size is not None and world_size % tp:
        return f"tensor-parallel degree {tp} does not divide the {world_size} ranks"
    if pp > 1 and point.engine != "deepspeed":
        return f"{point.engine.upper()} has no pipeline: pipeline stages are DeepSpeed's engine"
    if pp > 1 and point.stage > 1:
        return f"a pipeline ({pp} stages) takes ZeRO stage 0 or 1 only (DeepSpeed's pipeline engine)"
    if pp > 1 and point.offload != "none":
        return f"a pipeline ({pp} stages) cannot offload: it takes ZeRO stage 0 or 1 only"
    if pp > 1 and point.compile:
        return f"a pipeline ({pp} stages) runs eager: --compile with a pipeline is not measured yet"
    if pp > 1 and point.attn == "eager":
        return f"a pipeline ({pp} stages) gives its blocks no attention mask: attn=eager cannot run causally"
    if world_size is not None and world_size % pp:
        return f"{pp} pipeline stages do not divide the {world_size} ranks"
    if point.engine == "ddp" and (point.stage, point.offload) != (0, "none"):
        return "DDP replicates everything: one point per precision, z0 off=none"
    if point.engine == "fsdp" and point.stage < 2:
        return "FSDP always shards parameters and gradients: stage 2 or 3"
    if point.engine == "fsdp" and point.offload == "optimizer":
        return "FSDP offloads parameters and optimizer together: off=all (stage 3)"
    if point.offload != "none" and point.stage == 0:
        return "offload needs ZeRO stage 1, 2 or 3"
    if point.offload == "all" and point.stage != 3:
        return "parameter offload needs ZeRO stage 3"
    if point.precision == "fp16" and device_type == "cpu":
        return "fp16 needs a GPU (DeepSpeed's CPU accelerator has no fp16)"
    return None


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

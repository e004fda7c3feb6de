"""The ``Layout``: how one model is trained on a set of ranks, as one frozen value.

A layout is the engine (DeepSpeed, DDP or FSDP), the ZeRO stage, what is offloaded, the precision,
the micro-batch and gradient accumulation, the parallel degrees (``DEGREES``: pipeline stages,
tensor-, sequence- and expert-parallel ranks), the attention kernel, the compile switch, the run switches
(``SWITCHES``, ``config.run_switches``: ALST's tiled MLP and tiled loss, the optimizer, the master-state precision,
the sequence-parallel path, DeepCompile) and, where a study varies them, the sequence
length and the software stack (``ds_bench.config.stacks``: the DeepSpeed, PyTorch and transformers it runs on). ``ds-bench run``'s flags
produce one (``from_run``); a sweep point, a capacity layout and a scaling study's configuration are
one. Its ``key`` (``[ddp|fsdp] [pp2] [tp2] [sp2] [ep2] z1 off=none bf16 mbs=4 [ga=2] [seq=N] [attn=X] [compile]
[tiled-mlp] [tiled-loss] [opt=muon] [states=bf16] [sp-path=autosp] [deepcompile] [stack=ds0.18.4]``) names it
in records, logs and tables and is what a resumed study matches finished work on; ``label`` adds the
data-parallel degree once the world size is known (``pp2 dp1 z1 off=none bf16 mbs=4``). Both are written by
``_label`` alone.

The parallel degrees are not fields of their own: a layout holds them as ``parallel`` pairs (the degrees above
1, in ``DEGREES`` order) and reads each as an attribute (``layout.tensor_parallel``, 1 where unset); its
constructor takes them as keywords. Adding a parallel degree is a module in ``ds_bench.config.degrees``; the
key, the flags, the records and the studies read ``DEGREES`` and take the new axis as they are.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ds_bench.config.degrees import DEGREES
from ds_bench.config.degrees.protocol import with_degree_keywords
from ds_bench.config.run_switches import SWITCHES

ENGINES = ("deepspeed", "ddp", "fsdp")
"""What can train the model (``--engine``), from the same DeepSpeed config (``ds_bench.engines``)."""
ATTENTION = ("sdpa", "eager", "flash_attention_2")
"""``--attn``: HF transformers' attention implementations (``attn_implementation``); sdpa is
``F.scaled_dot_product_attention`` (flash / memory-efficient kernels where the device has them)."""
OFFLOADS = ("none", "optimizer", "all", "zenflow")
"""``optimizer``: ``offload_optimizer`` to CPU (ZeRO-Offload); ``all``: optimizer and parameters
(ZeRO-Infinity to CPU memory, stage 3 only); ``zenflow``: the optimizer offloaded with ZeRO's ZenFlow (its most
important gradient columns stepped on the device every step, the rest on the CPU every few, overlapped)."""
PRECISIONS = ("fp32", "bf16", "fp16")


@with_degree_keywords(unset=1)
@dataclass(frozen=True, order=True)
class Layout:
    stage: int
    offload: str
    precision: str
    micro_batch: int
    grad_accum: int = 1
    engine: str = "deepspeed"
    attn: str = ""
    """``--attn`` of the run (``ATTENTION``); empty: the workload's default."""
    compile: bool = False
    """``--compile`` of the run."""
    tiled_mlp: bool = False
    """``--tiled-mlp`` of the run (``SWITCHES``)."""
    tiled_loss: bool = False
    """``--tiled-loss`` of the run (``SWITCHES``)."""
    optimizer: str = ""
    """``--optimizer`` of the run (``adamw``, ``muon``); empty: the config's own."""
    master_states: str = ""
    """``--master-states`` of the run (``fp32``, ``bf16``, ``bf16-weights``); empty: the config's own."""
    sp_path: str = ""
    """``--sp-path autosp``; empty: Ulysses (where ``--sequence-parallel`` is used)."""
    deepcompile: bool = False
    """``--deepcompile`` of the run."""
    seq_len: int = 0
    """``--seq-len`` where a study varies it (a sweep's ``--seq-len 1024,4096``); 0: the run's own."""
    stack: str = ""
    """A study's stack axis (``ds_bench.config.stacks.Stack.label``: ``ds0.18.4``): the versions its job runs
    with; empty: the study's own environment. ``ds-bench run`` takes no flag for it: the job's Python is it."""
    parallel: tuple[tuple[str, int], ...] = ()
    """The parallel degrees above 1 (``DEGREES``), ``(field, size)`` in registry order; read them as attributes
    (``layout.pipeline_stages``: DeepSpeed pipeline stages, ``tensor_parallel``: the AutoTP degree,
    ``sequence_parallel``: the Ulysses degree, ``expert_parallel``: ranks each block's experts are sharded over)."""

    @property
    def model_parallel(self) -> int:
        """Ranks one data-parallel replica spans: the product of the degrees that split a replica."""
        return math.prod(getattr(self, d.field) for d in DEGREES if d.splits_replica)

    def degrees(self) -> dict[str, int]:
        """Each parallel degree above 1, by field name."""
        return dict(self.parallel)

    @property
    def sequence_multiple(self) -> int:
        """What a sequence length must be a multiple of: the product of the degrees that slice each sequence
        (``Degree.divides_sequence``)."""
        return math.prod(getattr(self, d.field) for d in DEGREES if d.divides_sequence)

    def data_parallel(self, world_size: int) -> int:
        return world_size // self.model_parallel

    @property
    def key(self) -> str:
        return self._label(f" mbs={self.micro_batch}")

    def label(self, data_parallel: int) -> str:
        """The key with the data-parallel degree (``data_parallel(world_size)``): ``pp2 dp1 z1 off=none ...``."""
        words = self.key.split()
        at = next(i for i, w in enumerate(words) if w[:1] == "z" and w[1:].isdigit())
        return " ".join([*words[:at], f"dp{data_parallel}", *words[at:]])

    @property
    def family(self) -> tuple:
        """Every layout that differs only in micro-batch: one line of the throughput plot and one
        ``--micro-batch auto`` search."""
        return dataclasses.astuple(self.with_micro_batch(0))

    def family_label(self) -> str:
        return self._label("")

    def _label(self, micro_batch: str) -> str:
        head = "" if self.engine == "deepspeed" else f"{self.engine} "
        head += "".join(f"{d.word}{getattr(self, d.field)} " for d in DEGREES if getattr(self, d.field) > 1)
        return f"{head}z{self.stage} off={self.offload} {self.precision}{micro_batch}" + (
            f" ga={self.grad_accum}" if self.grad_accum != 1 else "") + (
            f" seq={self.seq_len}" if self.seq_len else "") + (
            f" attn={self.attn}" if self.attn else "") + (" compile" if self.compile else "") + "".join(
            f" {s.key_word(getattr(self, s.field))}" for s in SWITCHES if getattr(self, s.field)) + (
            f" stack={self.stack}" if self.stack else "")

    def run_flags(self) -> list[str]:
        """The ``ds-bench run`` flags of this layout's options beyond its DeepSpeed config."""
        out = [a for d in DEGREES if getattr(self, d.field) > 1 for a in (d.flag, str(getattr(self, d.field)))]
        return out + (["--seq-len", str(self.seq_len)] if self.seq_len else []) + (
            ["--attn", self.attn] if self.attn else []) + (["--compile"] if self.compile else []) + [
            a for s in SWITCHES for a in s.run_flags(getattr(self, s.field))]

    def to_dict(self) -> dict:
        """Every field, each registered degree by its own name (1 where unset): a record's ``point`` and ``layout``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "parallel"}
        return out | {d.field: getattr(self, d.field) for d in DEGREES}

    @classmethod
    def from_dict(cls, d: dict) -> Layout:
        """From a record's ``point`` (fields written before an axis existed take its default)."""
        kinds = {f.name: f for f in dataclasses.fields(cls) if f.name != "parallel"}
        values = {name: _as(kinds[name], d[name]) for name in kinds if name in d}
        return cls(**values, **{g: int(d[g]) for g in DEGREES.fields() if g in d})

    def with_micro_batch(self, micro_batch: int) -> Layout:
        return dataclasses.replace(self, micro_batch=micro_batch)


def _as(f: dataclasses.Field, value):
    kind = {"int": int, "str": str, "bool": bool}[f.type if isinstance(f.type, str) else f.type.__name__]
    return kind(value)


def parse_key(text: str, defaults: Layout) -> Layout:
    """``[ddp|fsdp] z2 off=optimizer fp32 mbs=128 ga=4 [tiled-mlp]`` (any part left out: ``defaults``'s; no engine
    word: DeepSpeed) -> Layout (pure). Raises ValueError naming the part it does not understand."""
    fields = defaults.to_dict() | {"engine": "deepspeed"}
    by_word = {d.word: d.field for d in DEGREES}
    for part in text.split():
        name, _, value = part.partition("=")
        word = part.rstrip("0123456789")
        if not value and part in ENGINES:
            fields["engine"] = part
        elif not value and part[:1] == "z" and part[1:].isdigit() and int(part[1:]) in range(4):
            fields["stage"] = int(part[1:])
        elif not value and part in PRECISIONS:
            fields["precision"] = part
        elif name == "off" and value in OFFLOADS:
            fields["offload"] = value
        elif not value and word in by_word and part[len(word):].isdigit() and int(part[len(word):]) > 0:
            fields[by_word[word]] = int(part[len(word):])
        elif name == "attn" and value in ATTENTION:
            fields["attn"] = value
        elif part == "compile":
            fields["compile"] = True
        elif switched := next(((s, v) for s in SWITCHES if (v := s.parse_word(part)) is not None), None):
            fields[switched[0].field] = switched[1]
        elif name == "stack" and value:
            fields["stack"] = value
        elif name in ("mbs", "ga", "seq") and value.isdigit() and int(value) > 0:
            fields[{"mbs": "micro_batch", "ga": "grad_accum", "seq": "seq_len"}[name]] = int(value)
        else:
            degrees = ", ".join(f"{d.word}N" for d in DEGREES)
            raise ValueError(f"{part!r} is not {'|'.join(ENGINES[1:])}, z0..z3, {degrees}, off={'|'.join(OFFLOADS)}, "
                             f"{'|'.join(PRECISIONS)}, mbs=N, ga=N, seq=N, attn={'|'.join(ATTENTION)}, compile, "
                             f"{', '.join(_switch_words())}, stack=LABEL")
    if fields["micro_batch"] < 1:
        raise ValueError("a point needs a micro-batch: mbs=N")
    return Layout.from_dict(fields)


def _switch_words() -> list[str]:
    return [s.word if not s.choices else f"{s.word}={'|'.join(s.choices)}" for s in SWITCHES]


def from_run(cfg, ds_axes: dict) -> Layout:
    """The layout of one ``ds-bench run``: ``cfg`` a ``RunConfig``, ``ds_axes`` its DeepSpeed config's
    stage, offload, precision, micro-batch and accumulation (``ds_bench.config.deepspeed.derive.axes_of``), and the
    switches it holds (``switches``: each switch's flag where given, else the config's value)."""
    degrees = {d.field: getattr(cfg, d.field, None) or 1 for d in DEGREES}
    switches = {s.field: s.value_of(cfg) or ds_axes.get("switches", {}).get(s.field, s.off) for s in SWITCHES}
    return Layout(stage=ds_axes["stage"], offload=ds_axes["offload"], precision=ds_axes["precision"],
                  micro_batch=getattr(cfg, "micro_batch", None) or ds_axes["micro_batch"] or 0,
                  grad_accum=ds_axes["grad_accum"], engine=getattr(cfg, "engine", None) or "deepspeed",
                  attn=getattr(cfg, "attn", None) or "", compile=bool(getattr(cfg, "compile", False)), **degrees,
                  **switches)

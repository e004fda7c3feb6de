"""The protocol every parallel degree implements, and the one registry of them (``DEGREES``).

A degree is one module under ``ds_bench.config.degrees`` filling one ``Degree``: its ``Layout`` field and key word,
its ``ds-bench run`` flag (and the studies' list flag of the same name), whether it splits a data-parallel
replica, the refusals every degree has in the same shape (an engine only DeepSpeed has, ``--compile``, dividing
the ranks, dividing the sequence, run options its engine does not take yet), its own refusals, its collective's
name in the record, and how ``plan`` enumerates its values. Everything that would otherwise name a degree by
hand -- run's flags, the legality table, the record's per-degree map, the summary, compare's key, expectations,
the studies' axes and plan's candidates -- loops over ``DEGREES``. Adding a degree is adding a module and one
``DEGREES.register`` line (``ds_bench.config.degrees``); a test can add one for its own duration
(``DEGREES.added``).

What a degree does at run time (process groups, batch sharding, its DeepSpeed section) is its engine module's,
``ds_bench.engines.<field>``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ds_bench.errors import UserError

DEEPSPEED = "deepspeed 0.19.8"
"""The DeepSpeed version the refusals' sources were verified with."""


def installed_deepspeed() -> str:
    """The installed DeepSpeed in ``DEEPSPEED``'s words (its package metadata: nothing imported), for a rule that
    holds off the verified version."""
    from importlib import metadata

    try:
        return f"deepspeed {metadata.version('deepspeed')}"
    except metadata.PackageNotFoundError:
        return "no deepspeed"

CANDIDATES = ("node", "world", "layers", "experts")
"""How ``plan`` enumerates a degree's values at N ranks: divisors of the ranks per node (a group inside one
node's fast links), of the world, of the world no deeper than the model's layers, or of the world that divide
the model's experts."""


@dataclass(frozen=True)
class DegreeRule:
    """One refusal a degree owns, in the legality table's terms (``ds_bench.config.legality_rules.Rule``):
    ``refused(layout, where)``, the sentence (``str.format``-ed with the layout's fields and ``world_size``), its
    source and an example layout's fields beyond the table's base (stage 1, no offload, fp32, micro-batch 2)."""

    name: str
    refused: Callable
    message: str
    source: str
    example: dict
    options: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Degree:
    """One parallel degree of a layout: its size 1 means "not used"."""

    field: str
    """The ``Layout``'s, ``RunConfig``'s and the record's name of it (``tensor_parallel``)."""
    word: str
    """The key's word: ``tp`` -> ``tp2``."""
    flag: str
    """Its ``ds-bench run`` flag, and the studies' axis flag of the same name (a list there: ``1,2``)."""
    metavar: str
    help: str
    """``ds-bench run --help``'s text of the flag."""
    what: str
    """How the studies' help and the docs name it."""
    called: str
    """Its short name in the legality table's rule names (``AutoTP`` -> "AutoTP and compile")."""
    splits_replica: bool
    """The ranks of one data-parallel replica are this degree's (data-parallel degree = world / product)."""
    named: str
    """How a refusal names it, ``str.format``-ed with the layout's fields: ``--tensor-parallel {tensor_parallel}``."""
    deepspeed_only: str
    """Why another engine is refused it (after ``--engine X with <named>: ``)."""
    deepspeed_only_source: str
    divides_world: str
    """Why its size must divide the ranks (after ``<flag> N does not divide the world size W: ``)."""
    compile: str = ""
    """Why ``--compile`` is refused with it (after ``--compile with <named>: ``); empty: it compiles."""
    compile_named: str = ""
    """How the compile refusal names it, where not ``named``."""
    divides_sequence: str = ""
    """The source of "its size divides ``--seq-len``" (each rank holds an equal slice); empty: no such rule."""
    engaged_under_deepspeed_only: bool = False
    """Its engine, used at size 1 (``Where.engaged``), is in use only under ``--engine deepspeed``."""
    unmeasured_options: tuple[tuple[str, str, str, str], ...] = (
        ("breakdown", "--breakdown", "not measured yet", "not measured yet"),
        ("checkpoint", "--checkpoint", "not measured yet", "not measured yet"),
        ("resume", "--resume", "not measured yet", "not measured yet"))
    """Run options its engine does not take: (``RunConfig`` field, flag, why, source)."""
    rules: tuple[DegreeRule, ...] = ()
    """Its own refusals beyond the shared shapes (checked before them)."""
    comm: str = ""
    """The name of its own collectives (``tp_all_reduce``): their timer in a rank's report
    (``ds_bench.measure.layout_comm``) and their key in the comm-bound verdict's bus bytes (``ds_bench.perf.bus_bytes``);
    the record's block of the degree holds their ``comm`` (``ds_bench.record.run_blocks.DegreeComm``). Empty: it has
    none of its own."""
    candidates: str = "world"
    """``plan``'s values at N ranks (``CANDIDATES``)."""
    summary: Callable[[int, dict], str] | None = None
    """The run summary's words for its record block: ``(size, settings) -> str`` (``ep2: 2 of 4 experts per rank
    ...``); None: its key word and size, then its settings as ``key value``."""
    own_flags: Callable[[object], None] | None = None
    """Checks the flags that belong to it beyond its size (a ``RunConfig``, or a study's run flags; ``UserError``)."""
    engaged_by: Callable[[object], bool] | None = None
    """Whether a run's (or study's) flags use its engine even at size 1 (a moe run: DeepSpeed's MoE layer)."""

    def check_flags(self, cfg) -> None:
        """Its size is a positive integer where given, then its own flags (``own_flags``); ``UserError`` naming the
        flag."""
        value = getattr(cfg, self.field)
        if value is not None and value < 1:
            raise UserError(f"{self.flag} must be a positive integer, got {value}")
        if self.own_flags is not None:
            self.own_flags(cfg)

    def engaged(self, flags) -> bool:
        """Its engine is in use by ``flags`` (a ``RunConfig`` or a study's run flags): its flag given, or
        ``engaged_by``."""
        return getattr(flags, self.field, None) is not None or bool(self.engaged_by and self.engaged_by(flags))

    def size(self, layout) -> int:
        return getattr(layout, self.field)

    def active(self, layout, where) -> bool:
        """Its engine is in use: size above 1, or engaged at 1 (``--pipeline-stages 1``: a one-stage pipeline)."""
        engaged = self.field in where.engaged and (not self.engaged_under_deepspeed_only or layout.engine == "deepspeed")
        return self.size(layout) > 1 or engaged


class Registry:
    """The parallel degrees in key order; iterated at call time, so a degree added later is seen everywhere."""

    def __init__(self) -> None:
        self._degrees: list[Degree] = []

    def register(self, degree: Degree) -> Degree:
        if degree.candidates not in CANDIDATES:
            raise ValueError(f"degree {degree.field}: candidates {degree.candidates!r}, expected one of {CANDIDATES}")
        if any(d.field == degree.field or d.word == degree.word or d.flag == degree.flag for d in self._degrees):
            raise ValueError(f"degree {degree.field} ({degree.word}, {degree.flag}) is registered already")
        self._degrees.append(degree)
        return degree

    @contextlib.contextmanager
    def added(self, degree: Degree) -> Iterator[Degree]:
        """``degree`` registered for the ``with`` block only (tests)."""
        self.register(degree)
        try:
            yield degree
        finally:
            self._degrees.remove(degree)

    def __iter__(self) -> Iterator[Degree]:
        return iter(tuple(self._degrees))

    def __len__(self) -> int:
        return len(self._degrees)

    def __getitem__(self, field_name: str) -> Degree:
        for d in self._degrees:
            if d.field == field_name:
                return d
        raise KeyError(field_name)

    def fields(self) -> tuple[str, ...]:
        return tuple(d.field for d in self._degrees)


DEGREES = Registry()
"""Every parallel degree beyond data parallelism, in key order (``ds_bench.config.degrees`` registers them)."""


def active(field_name: str, layout, where) -> bool:
    """``DEGREES[field_name].active``: for rules that name two degrees."""
    return DEGREES[field_name].active(layout, where)


def fold_degrees(kwargs: dict, current: tuple, keep: Callable[[object], bool]) -> tuple[tuple[str, object], ...]:
    """A value's ``parallel`` pairs from its current ones and the degree keywords in ``kwargs`` (popped), in
    registry order, the values ``keep`` accepts only. Raises TypeError on a keyword no degree has."""
    values = dict(current)
    for name in [k for k in kwargs if k in DEGREES.fields()]:
        values[name] = kwargs.pop(name)
    unknown = set(values) - set(DEGREES.fields())
    if unknown:
        raise TypeError(f"no parallel degree named {', '.join(sorted(unknown))}")
    return tuple((f, values[f]) for f in DEGREES.fields() if f in values and keep(values[f]))


def with_degree_keywords(unset):
    """Class decorator for a frozen dataclass with a ``parallel`` field (pairs of degree field and value): its
    constructor takes each registered degree as a keyword (``Layout(..., tensor_parallel=2)``), and reading a
    degree's field gives its value, ``unset`` where the pairs have none. ``dataclasses.replace`` works alike."""

    def decorate(cls):
        generated = cls.__init__

        def __init__(self, *args, **kwargs):
            current = kwargs.pop("parallel", ())
            generated(self, *args, parallel=fold_degrees(kwargs, current, lambda v: v != unset), **kwargs)

        def __getattr__(self, name):
            if name.startswith("__") or name not in DEGREES.fields():
                raise AttributeError(f"{cls.__name__!r} object has no attribute {name!r}")
            return dict(object.__getattribute__(self, "parallel")).get(name, unset)

        cls.__init__, cls.__getattr__ = __init__, __getattr__
        return cls

    return decorate

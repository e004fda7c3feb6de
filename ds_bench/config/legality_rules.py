"""The legality table's vocabulary and its parallel-layout rules: ``Where`` a layout would run, a ``Rule``,
the predicates the rules share, and the rules every registered parallel degree gets in the same shapes (another
engine, ``--compile``, dividing the ranks and the sequence, run options its engine does not take yet) beside its
own (``ds_bench.config.degrees``). ``ds_bench.config.legality`` puts them in the one table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ds_bench.config.degrees import DEGREES, Degree, DegreeRule, active
from ds_bench.config.degrees.protocol import DEEPSPEED
from ds_bench.config.degrees.pairs import PAIR_RULES
from ds_bench.config.layout import SWITCHES, Layout
from ds_bench.config.switches import Switch



@dataclass(frozen=True)
class Where:
    """What a layout's legality depends on beyond itself."""

    world_size: int | None = None
    """Ranks of the job; None: not known yet (the divisibility rules wait)."""
    device_type: str = "cpu"
    run_options: frozenset[str] = frozenset()
    """``RunConfig`` fields a run sets beyond its layout (``RUN_OPTIONS``)."""
    engaged: frozenset[str] = frozenset()
    """Degrees whose engine a run uses even at 1 (``--pipeline-stages 1``: a one-stage pipeline module)."""
    workload: str = ""
    """The workload the layout trains (a rule on a release reads it: ``config.stack_rules``); empty: not known."""
    versions: tuple[tuple[str, str], ...] = ()
    """The package versions the layout runs with where a study's stack axis names them (``config.stacks.Stack``);
    a package not named: this environment's (``config.stacks.version_in``)."""


@dataclass(frozen=True)
class Rule:
    name: str
    refused: Callable[[Layout, Where], bool]
    message: str
    """One sentence, ``str.format``-ed with the layout's fields and ``world_size``."""
    source: str
    example: Layout
    """A layout this rule refuses (tests and docs)."""
    example_options: frozenset[str] = field(default_factory=frozenset)

    def says(self, layout: Layout, where: Where) -> str:
        return self.message.format(world_size=where.world_size, tiles=_tiles(layout), degrees=_degrees(layout, where),
                                   **layout.to_dict())


def _ex(**fields) -> Layout:
    return Layout(**{"stage": 1, "offload": "none", "precision": "fp32", "micro_batch": 2, **fields})


def _pp(l: Layout, w: Where) -> bool:
    return active("pipeline_stages", l, w)


def _tp(l: Layout, w: Where) -> bool:
    return active("tensor_parallel", l, w)


def _tiled(l: Layout) -> bool:
    return l.tiled_mlp or l.tiled_loss


def _tiles(l: Layout) -> str:
    return " ".join(s.option for s in SWITCHES if s.long_context and getattr(l, s.field))


def _degrees(l: Layout, w: Where) -> str:
    return " ".join(f"{d.flag} {d.size(l)}" for d in DEGREES if d.active(l, w))


def _rule(spec: DegreeRule) -> Rule:
    return Rule(spec.name, spec.refused, spec.message, spec.source, _ex(**spec.example), spec.options)


def degree_rules(d: Degree) -> tuple[Rule, ...]:
    """A degree's refusals in the table's order: another engine, its own rules, ``--compile``, ranks (and the
    sequence) its size does not divide. The shapes are the same for every degree; the words are the degree's."""
    size = "{" + d.field + "}"
    rules = [Rule(f"{d.called} is DeepSpeed's", lambda l, w: d.active(l, w) and l.engine != "deepspeed",
                  f"--engine {{engine}} with {d.named}: {d.deepspeed_only}", d.deepspeed_only_source,
                  _ex(engine="ddp", stage=0, **{d.field: 2})),
             *(_rule(r) for r in d.rules)]
    if d.compile:
        rules.append(Rule(f"{d.called} and compile", lambda l, w: d.active(l, w) and l.compile,
                          f"--compile with {d.compile_named or d.named}: {d.compile}", "not measured yet",
                          _ex(compile=True, **{d.field: 2})))
    rules.append(Rule(f"{d.word.upper()} degree divides the ranks", lambda l, w: d.active(l, w) and w.world_size is not None
                      and w.world_size % d.size(l) != 0,
                      f"{d.flag} {size} does not divide the world size {{world_size}}: {d.divides_world}", "arithmetic",
                      _ex(**{d.field: 3})))
    if d.divides_sequence:
        rules.append(Rule(f"{d.word.upper()} degree divides the sequence", lambda l, w: d.active(l, w) and l.seq_len % d.size(l) != 0,
                          f"{d.flag} {size} does not divide --seq-len {{seq_len}}: every rank of a group holds an "
                          "equal slice of the sequence", d.divides_sequence, _ex(seq_len=1001, **{d.field: 2})))
    return tuple(rules)


def parallel_rules() -> tuple[Rule, ...]:
    """Every registered degree's rules, then the pairs that do not compose (``ds_bench.config.degrees.pairs``)."""
    return (*(r for d in DEGREES for r in degree_rules(d)), *(_rule(p) for p in PAIR_RULES))


def switch_rules(switch: Switch) -> tuple[Rule, ...]:
    """A run switch's refusals (``config.run_switches``), in the table's terms."""
    return tuple(_rule(r) for r in switch.rules)


def run_option_rules() -> tuple[Rule, ...]:
    """Run options (``--breakdown``, ``--checkpoint``...) a degree's engine does not take yet."""
    return tuple(Rule(f"{d.called} and {flag}", lambda l, w, d=d, o=option: d.active(l, w) and o in w.run_options,
                      f"{flag} with {d.named}: {why}", source, _ex(**{d.field: 2}), frozenset({option}))
                 for d in DEGREES for option, flag, why, source in d.unmeasured_options)

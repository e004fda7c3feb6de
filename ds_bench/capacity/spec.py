"""``ds-bench capacity`` flags into a checked ``CapacitySpec``: every bad value is one line naming the
flag (exit 2) before any job is launched or any file written.

A layout is a sweep point (``config.layout.Layout``: ZeRO stage, offload, precision, micro-batch,
accumulation, parallel degrees, memory options) whose model is what the search varies; the family is
``--family gpt3|llama3`` or ``--scale layers|hidden`` from a base shape of ``--workload gpt2|llama|moe``
(``ds_bench.capacity.family``), or ``--scale seq``: one model's longest sequence (``capacity.seq_spec``). ``run``
options after ``--`` pass to every probe, checked by ``run``'s own parser; the ones capacity sets itself are
refused. A moe family's router is the tail's ``--experts`` / ``--top-k``, every ``--expert-parallel`` value
dividing its experts (``Workload.check_study``). A layout the legality table refuses at the world size is
skipped, saying why, and sets no length; every layout refused: exit 2, one line (``perf.grid.runnable``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass

from ds_bench.capacity.family import FAMILIES, SCALES, Member, named_family, scaled_family
from ds_bench.capacity.seq_search import Lengths
from ds_bench.capacity.seq_spec import seq_family
from ds_bench.config import argcheck
from ds_bench.config.layout import OFFLOADS, PRECISIONS, Layout
from ds_bench.config.parsers import config_path, flag_type, parse_count, parse_list, parse_memory
from ds_bench.config.run_flags import parse_run_tail
from ds_bench.errors import UserError
from ds_bench.config.study_flags import StudySpec, add_degree_arguments, axis_flags, add_job_arguments, add_switch_arguments, degrees_of
from ds_bench.config.stacks import Stack
from ds_bench.config.study_flags import add_stack_arguments, job_options, run_flags_of, stacks_from, switches_of
from ds_bench.jobs.compute_nodes import with_job_gpus
from ds_bench.machine.compute_node import ComputeNode
from ds_bench.perf.grid import families, runnable, study_where

OWNED = {"micro_batch": "--micro-batch", "steps": "--steps", "warmup": "--warmup", "results": "--results",
         "tag": "--tag", "cpu_mem_limit": "--cpu-mem-limit", "size": "--size", "seq_len": "--seq-len",
         "layers": "--layers", "hidden": "--hidden", "heads": "--heads", "workload": "--workload"}
"""Run options capacity sets for every probe (its own flags of the same names; the degrees' and switches' too:
``jobs.flags.axis_flags``)."""


@dataclass(frozen=True)
class CapacitySpec(StudySpec):
    ds_config: str
    base: dict
    """The base config with ``--set`` applied (each layout's config is derived from it)."""
    layouts: tuple[Layout, ...]
    """Each a ``Layout`` whose model is what the search varies: stage, offload, precision, micro-batch,
    accumulation, parallel degrees."""
    members: tuple[Member, ...]
    """The family, smallest first; ``--scale seq``: the model at the start length (``capacity.family.seq_member``)."""
    family: str
    """``gpt3`` or ``scale layers from 2 x 64 x 2``: what the table says it searched."""
    seq_len: int
    run_args: tuple[str, ...]
    nproc: int
    steps: int = 4
    warmup: int = 1
    cpu_mem_limit: int | None = None
    prune: bool = True
    device_type: str = "cpu"
    workload: str = "gpt2"
    scale: str | None = None
    """``--scale`` (``layers``, ``hidden``, ``seq``); None for a ``--family``."""
    max_seq_len: int = 0
    seq_granularity: int = 0
    router: tuple = (None, None)
    """moe: the ``--experts`` and ``--top-k`` after ``--`` (``capacity.family.Router``), every member's."""
    compute: ComputeNode | None = None
    """Where the probes run (``jobs.compute_nodes.for_study``); None: this machine."""
    dry_run: bool = False
    seq_multiple: int = 1
    """The least common multiple of what each layout not skipped slices a sequence by (``Layout.sequence_multiple``)."""
    stacks: tuple[Stack, ...] = (Stack(),)
    """``--deepspeed``, ``--torch``, ``--transformers`` (``config.stacks``): every layout searched once per stack."""
    python: str | None = None
    """The interpreter of one probe's job (its stack's environment); None: this one."""

    @property
    def lengths(self) -> Lengths:
        """``--scale seq``'s lengths: each a multiple of ``seq_multiple``."""
        return Lengths(self.seq_len, self.max_seq_len, self.seq_granularity, self.seq_multiple)

    def capacity_id(self) -> str:
        """What makes two searches comparable: config, family, run arguments, ranks, steps, memory cap; for
        ``--scale seq`` not its lengths (a search with another start or maximum goes on from the same probes)."""
        seq = "seq" if self.scale == "seq" else self.seq_len
        key = json.dumps([self.base, [m.run_args for m in self.members], seq, self.run_args, self.nproc,
                          self.launcher, self.hostfile, self.steps, self.warmup, self.cpu_mem_limit]
                         + ([self.workload] if self.workload != "gpt2" else [])  # gpt2's ids as before --workload
                         + ([["slurm nodes", self.slurm.nodes]] if self.slurm is not None else []),
                         sort_keys=True, default=str)
        return hashlib.sha256(key.encode()).hexdigest()[:12]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ds-config", required=True, help="base DeepSpeed JSON config (ds_configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the base config by dotted path")
    p.add_argument("--stages", default=None, help="ZeRO stages, e.g. 0,3 (default: the base config's)")
    p.add_argument("--offload", default="none", help="none,optimizer,all,zenflow (default none)")
    add_degree_arguments(p, what="layout")
    add_switch_arguments(p, what="layout")
    p.add_argument("--workload", default="gpt2", choices=("gpt2", "llama", "moe"),
                   help="whose shapes the family is (default gpt2; llama for --family llama3, --tensor-parallel and "
                        "--sequence-parallel; moe for --expert-parallel, its router from --experts/--top-k after --)")
    p.add_argument("--precision", default=None, help="fp32 or bf16 (default: the base config's)")
    p.add_argument("--micro-batch", type=int, default=1, help="per-device micro-batch (default 1)")
    p.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps (default 1)")
    p.add_argument("--family", default=None,
                   help="named family to search: gpt3 (GPT-3 paper shapes; gpt2) or llama3 (Meta's sizes; llama)")
    p.add_argument("--scale", default=None, help="layers | hidden: grow the base shape (--layers/--hidden/--heads); "
                                                 "seq: the longest sequence the model (--size, or the base shape) "
                                                 "trains with")
    p.add_argument("--size", default=None, help="--scale seq: a named size of the workload (llama: tiny, "
                                                "llama3.2-1b ...; gpt2: tiny, small ... gpt3-*)")
    p.add_argument("--layers", type=int, default=None, help="base shape for --scale: transformer blocks")
    p.add_argument("--hidden", type=int, default=None, help="base shape for --scale: width")
    p.add_argument("--heads", type=int, default=None, help="base shape for --scale: attention heads")
    p.add_argument("--max-scale", type=int, default=8, help="--scale: up to this many times the base (default 8)")
    p.add_argument("--seq-len", type=flag_type(parse_count, "--seq-len"), default=1024, metavar="TOKENS",
                   help="sequence length, e.g. 1024 or 8k (k = 2^10; default 1024); --scale seq: the first length "
                        "probed")
    p.add_argument("--max-seq-len", type=flag_type(parse_count, "--max-seq-len"), default=None, metavar="TOKENS",
                   help="--scale seq: the longest length probed, e.g. 64k (default 1M = 1048576)")
    p.add_argument("--seq-granularity", type=flag_type(parse_count, "--seq-granularity"), default=None,
                   metavar="TOKENS",
                   help="--scale seq: the bisection stops when the longest that fit and the shortest that did not "
                        "are this close (default 256); every length probed is a multiple of every "
                        "--sequence-parallel degree (each rank holds an equal slice), the step rounded up to one")
    p.add_argument("--steps", type=int, default=4, help="steps per probe, warm-up included (default 4)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--cpu-mem-limit", type=flag_type(parse_memory, "--cpu-mem-limit"), default=None, metavar="SIZE",
                   help="cap each CPU rank's memory, e.g. 3GiB (a unit is needed)")
    p.add_argument("--no-prune", dest="prune", action="store_false", help="run members predicted not to fit")
    add_job_arguments(p, results="results/capacity.jsonl", master_port=29800)
    add_stack_arguments(p)


def from_args(args: argparse.Namespace, node: ComputeNode) -> CapacitySpec:
    """The checked spec; the precision, ranks per node and device come from ``node``, where the probes run."""
    from ds_bench.config.deepspeed import prepare as ds_config
    from ds_bench.config.deepspeed.derive import axes_of

    _check_numbers(args)
    job = with_job_gpus(job_options(args), node)
    path = config_path(args.ds_config)
    if not os.path.isfile(path):
        raise UserError(f"--ds-config {args.ds_config}: file not found (as given, or in ds_configs/)")
    base = ds_config.apply_overrides(ds_config.load_json(path), tuple(args.overrides))
    axes = axes_of(base)
    precision = args.precision or ("fp32" if axes["precision"] == "bf16" and not node.runs_bf16
                                   else axes["precision"])
    stacks = stacks_from(args)
    layouts = tuple(dataclasses.replace(layout, stack=stack.label) for stack in stacks
                    for layout in _layouts(args, axes["stage"], precision))
    run_args = _run_args(args)
    tail = run_flags_of(args.workload, run_args)
    router = (tail.experts, tail.top_k)
    nproc, device_type = args.nproc or node.default_ranks(), node.device_type
    kept = runnable(layouts, _where(args.workload, run_args, device_type, nproc, job), "layout")
    multiple = math.lcm(*(layout.sequence_multiple for layout in kept))
    family, members, seq = _family(args, multiple, router)
    _check_study(args, (*members[0].run_args, *run_args))
    return CapacitySpec(
        ds_config=path, base=base, layouts=layouts, members=tuple(members), family=family, workload=args.workload,
        seq_len=args.seq_len, run_args=run_args, nproc=nproc, **job,
        steps=args.steps, warmup=args.warmup, cpu_mem_limit=args.cpu_mem_limit, prune=args.prune,
        device_type=device_type, scale=args.scale, router=router, seq_multiple=multiple, compute=node,
        dry_run=args.dry_run, stacks=stacks, **seq)


def _where(workload: str, run_args: tuple[str, ...], device_type: str, nproc: int, job: dict):
    """``study_where`` before the spec is built: the world of the job flags (``jobs.spawn.world_of``)."""
    from types import SimpleNamespace

    from ds_bench.jobs.spawn import world_of

    world, _ = world_of(SimpleNamespace(nproc=nproc, **job))
    return study_where(SimpleNamespace(workload=workload, run_args=run_args, device_type=device_type), world)


def _check_numbers(args: argparse.Namespace) -> None:
    for flag, value in (("--micro-batch", args.micro_batch), ("--grad-accum", args.grad_accum),
                        ("--seq-len", args.seq_len), ("--max-scale", args.max_scale),
                        ("--max-seq-len", args.max_seq_len), ("--seq-granularity", args.seq_granularity)):
        argcheck.at_least(flag, value, 1)
    argcheck.steps("--steps", args.steps, args.warmup)


def _family(args: argparse.Namespace, multiple: int, router: tuple = (None, None)) -> tuple[str, list[Member], dict]:
    """What the table says was searched, the members, and ``--scale seq``'s spec fields (``multiple``: every
    length's divisor, the sequence-parallel degrees' least common multiple; ``router``: a moe family's)."""
    if (args.family is None) == (args.scale is None):
        raise UserError("give one of --family gpt3 or --scale layers|hidden|seq (with --layers, --hidden, --heads)")
    if args.scale == "seq":
        shaped = any(v is not None for v in (args.layers, args.hidden, args.heads))
        return seq_family(args, multiple, _base_shape(args) if shaped else None, router)
    for flag, value in (("--size", args.size), ("--max-seq-len", args.max_seq_len),
                        ("--seq-granularity", args.seq_granularity)):
        if value is not None:
            raise UserError(f"{flag} is for --scale seq (the model whose longest sequence is searched)")
    if args.family is not None:
        if args.family not in FAMILIES:
            raise UserError(f"--family {args.family!r} is unknown; known: {', '.join(FAMILIES)}")
        if FAMILIES[args.family] != args.workload:
            raise UserError(f"--family {args.family} is a family of workload {FAMILIES[args.family]}, not "
                            f"{args.workload}: add --workload {FAMILIES[args.family]}")
        if any(v is not None for v in (args.layers, args.hidden, args.heads)):
            raise UserError("--layers/--hidden/--heads give the base shape of --scale; --family has its own shapes")
        return args.family, named_family(args.family, args.seq_len), {}
    if args.scale not in SCALES:
        raise UserError(f"--scale {args.scale!r} is unknown; known: {', '.join(SCALES)}")
    layers, hidden, heads = _base_shape(args)
    members = scaled_family(args.scale, layers, hidden, heads, args.max_scale, args.seq_len, args.workload, router)
    return f"scale {args.scale} from {layers} x {hidden} x {heads}", members, {}


def _base_shape(args: argparse.Namespace) -> tuple[int, int, int]:
    shape = {"--layers": args.layers, "--hidden": args.hidden, "--heads": args.heads}
    missing = [flag for flag, v in shape.items() if v is None]
    if missing:
        raise UserError(f"--scale {args.scale} needs the base shape: {', '.join(missing)} missing")
    for flag, value in shape.items():
        argcheck.at_least(flag, value, 1)
    if args.hidden % args.heads:
        raise UserError(f"--hidden {args.hidden} is not divisible by --heads {args.heads}")
    return args.layers, args.hidden, args.heads


def _layouts(args: argparse.Namespace, base_stage: int, precision: str) -> tuple[Layout, ...]:
    stages = parse_list("--stages", args.stages, allowed=(0, 1, 2, 3), kind=int) if args.stages else (base_stage,)
    offloads = parse_list("--offload", args.offload, allowed=OFFLOADS)
    degrees = degrees_of(args)
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return tuple(f.with_micro_batch(args.micro_batch) for f in families(
        stages, offloads, (precision,), (args.grad_accum,), degrees=degrees, switches=switches_of(args)))


def _check_study(args: argparse.Namespace, first_probe: tuple[str, ...]) -> None:
    """The degree axes against the workload, and the run flags of the smallest member's probe (``first_probe``:
    its shape, then the tail) against the model they build (``Workload.check_study``)."""
    from ds_bench.workloads import REGISTRY

    REGISTRY[args.workload].check_study(degrees_of(args), run_flags_of(args.workload, first_probe))


def _run_args(args: argparse.Namespace) -> tuple[str, ...]:
    tail = list(args.run_args)
    try:
        _, given = parse_run_tail(["--workload", args.workload, "--ds-config", "-"], tail)
    except UserError as e:
        raise UserError(f"run arguments after '--' ({' '.join(tail)}): {e}") from None
    for name, flag in {**OWNED, **axis_flags()}.items():
        if name in given:
            shape = name in ("size", "layers", "hidden", "heads")
            raise UserError(f"run argument {flag} after '--': ds-bench capacity sets it for every probe; "
                            f"use capacity's own {flag}" + (" (or --family/--scale)" if shape else ""))
    return tuple(tail)


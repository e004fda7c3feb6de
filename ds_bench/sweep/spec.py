"""The sweep's command line and ``SweepSpec``, validated at load (before anything is launched).

Every axis defaults to the base config's own value (``derive.axes_of``). Without ``--workload`` the
sweep is this machine's preset (``preset``): what ``make bench`` runs. ``run`` options after ``--``
pass through to every point and are checked by ``run``'s own parser first (``common_args``: also ``--seq-len``,
one value a run option of every point, several an axis).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass, field

from ds_bench.config import argcheck
from ds_bench.config.layout import ATTENTION, SWITCHES, Layout
from ds_bench.config.parsers import CONFIG_DIR, config_path, flag_type, parse_count, parse_memory
from ds_bench.errors import UserError
from ds_bench.config.stacks import Stack
from ds_bench.config.study_flags import StudySpec, add_degree_arguments, add_job_arguments, add_switch_arguments
from ds_bench.config.study_flags import add_stack_arguments, job_options, run_flags_of, stacks_from
from ds_bench.jobs.compute_nodes import with_job_gpus
from ds_bench.machine.compute_node import ComputeNode
from ds_bench.perf.grid import families
from ds_bench.sweep.axes import axes_of_sweep, extra_points
from ds_bench.sweep.common_args import common_run_args


@dataclass(frozen=True)
class SweepSpec(StudySpec):
    workload: str
    ds_config: str
    overrides: tuple[str, ...]
    stages: tuple[int, ...]
    offloads: tuple[str, ...]
    precisions: tuple[str, ...]
    micro_batches: tuple[int, ...] | None
    """None: ``--micro-batch auto``."""
    grad_accums: tuple[int, ...]
    run_args: tuple[str, ...]
    """``--size``, ``--seq-len``, ``--data`` and whatever came after ``--``: the same for every point."""
    nproc: int
    steps: int = 20
    warmup: int = 5
    repeats: int = 1
    headroom_pct: float = 10.0
    baseline: str | None = None
    prune: bool = True
    max_micro_batch: int = 1024
    cpu_mem_limit: int | None = None
    device_type: str = "cpu"
    notes: tuple[str, ...] = field(default=())
    extra_points: tuple[Layout, ...] = ()
    """``--point``: single points beyond the grid (e.g. one offload point)."""
    engines: tuple[str, ...] = ("deepspeed",)
    degrees: dict = field(default_factory=dict)
    """Each parallel degree's values (``jobs.flags.degrees_of``): ``{"pipeline_stages": (1, 2)}``."""
    attns: tuple[str, ...] = ("",)
    """``--attn``: attention implementations (empty: the workload's default)."""
    compiles: tuple[bool, ...] = (False,)
    """``--compile off,on``: eager and/or compiled points."""
    switches: dict = field(default_factory=dict)
    """Each memory option's values (``jobs.flags.switches_of``): ``{"tiled_mlp": (False, True)}``."""
    seq_lens: tuple[int, ...] = (0,)
    """``--seq-len`` with several values: each family's ``Layout.seq_len``; (0,): one value or none, a run
    argument of every point (``run_args``)."""
    prune_predicted: str | None = None
    """``--prune-predicted FILE``: a results file with a ``plan`` record whose ranking prunes the grid
    (``sweep.prune``); None: every point runs."""
    prune_keep: int = 3
    """``--prune-keep``: the grid's points kept by ``--prune-predicted``."""
    compute: ComputeNode | None = None
    """Where the jobs run (``jobs.compute_nodes.for_study``); None: this machine."""
    dry_run: bool = False
    stacks: tuple[Stack, ...] = (Stack(),)
    """``--deepspeed``, ``--torch``, ``--transformers`` (``config.stacks``): every point runs once per stack."""
    python: str | None = None
    """The interpreter of one attempt's job (its stack's environment, ``machine.stack_envs``); None: this one."""

    def families(self) -> list[Layout]:
        """The grid's families (``jobs.points.families``), every axis of the sweep, the stack innermost (a family's
        stacks side by side: the driver interleaves their runs)."""
        grid = families(self.stages, self.offloads, self.precisions, self.grad_accums, self.engines, self.degrees,
                        self.attns, self.compiles, self.switches, self.seq_lens)
        return [dataclasses.replace(f, stack=stack.label) for f in grid for stack in self.stacks]

    def sweep_id(self, base_config: dict) -> str:
        """What makes two measurements comparable: workload, run arguments, the base config's
        content, ranks, launcher, steps, memory cap. The axes are not part of it, so widening a
        sweep reuses the points it already measured."""
        key = json.dumps([self.workload, self.run_args, base_config, self.nproc, self.launcher, self.hostfile,
                          self.steps, self.warmup, self.cpu_mem_limit, *_slurm_world(self)], sort_keys=True,
                         default=str)
        return hashlib.sha256(key.encode()).hexdigest()[:12]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default=None,
                   help="mnist | resnet | gpt2 | llama | moe (default: this machine's preset)")
    p.add_argument("--ds-config", default=None, help="base DeepSpeed JSON config (ds_configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the base config by dotted path")
    p.add_argument("--stages", default=None, help="ZeRO stages, e.g. 0,1,2,3 (default: the base config's)")
    p.add_argument("--offload", default=None, help="none,optimizer,all,zenflow (default: the base config's)")
    p.add_argument("--precision", default=None, help="fp32,bf16,fp16 (default: the base config's)")
    p.add_argument("--micro-batch", default=None, help="e.g. 1,2,4,8 or auto (default: the base config's, else auto)")
    p.add_argument("--grad-accum", default=None, help="gradient accumulation steps, e.g. 1,4")
    add_degree_arguments(p)
    add_switch_arguments(p)
    p.add_argument("--engines", default=None,
                   help="deepspeed,ddp,fsdp: DDP and FSDP baselines beside ZeRO from the same config (default "
                        "deepspeed; the preset: all three). DDP: one point per precision; FSDP: stages 2 and 3")
    p.add_argument("--attn", default=None, help=f"attention implementations per point, e.g. sdpa,eager (gpt2; known: "
                                                 f"{', '.join(ATTENTION)}; default: the workload's)")
    p.add_argument("--compile", default=None, help="off, on or off,on: eager and/or torch.compile points (default off)")
    p.add_argument("--point", dest="points", action="append", default=None, metavar="KEY",
                   help="one more point beyond the grid, e.g. 'z2 off=optimizer mbs=128' (repeatable)")
    p.add_argument("--repeats", type=int, default=1, help="runs per point, each in fresh processes (default 1)")
    p.add_argument("--headroom", type=float, default=10.0, help="%% of memory the recommended point must leave")
    p.add_argument("--baseline", default=None, help="point key the diff column compares to (default: ZeRO-0, no offload)")
    p.add_argument("--no-prune", dest="prune", action="store_false", help="run points predicted not to fit")
    p.add_argument("--max-micro-batch", type=flag_type(parse_count, "--max-micro-batch"), default=1024,
                   help="where --micro-batch auto stops doubling (default 1024)")
    p.add_argument("--prune-predicted", default=None, metavar="FILE",
                   help="gpt2, llama, moe: a results file with a `ds-bench plan` record (the newest of this workload, "
                        "size and world size): run only the --prune-keep points of the grid its model predicts the "
                        "most tokens/s per rank for, skip the others saying why (--point points always run)")
    p.add_argument("--prune-keep", type=int, default=3, metavar="K",
                   help="with --prune-predicted: points kept over the whole grid, not per family (default 3)")
    p.add_argument("--cpu-mem-limit", type=flag_type(parse_memory, "--cpu-mem-limit"), default=None, metavar="SIZE",
                   help="cap each CPU rank's memory, e.g. 3GiB (a unit is needed)")
    p.add_argument("--steps", type=int, default=20, help="steps per point, warm-up included (default 20)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--size", default=None, help="named model size of the workload")
    p.add_argument("--seq-len", default=None, metavar="TOKENS",
                   help="sequence length (gpt2, llama), e.g. 1024 or 8k (k = 2^10): one value goes to every point; a "
                        "list, e.g. 1k,4k, is an axis: each point runs one (its key says seq=4096)")
    p.add_argument("--data", default=None, help="data path (default synthetic)")
    add_job_arguments(p, results="results/sweep.jsonl", master_port=29600)
    add_stack_arguments(p)


def check_numbers(args: argparse.Namespace) -> None:
    argcheck.at_least("--repeats", args.repeats, 1)
    argcheck.at_least("--max-micro-batch", args.max_micro_batch, 1)
    argcheck.at_least("--prune-keep", args.prune_keep, 1)
    argcheck.steps("--steps", args.steps, args.warmup)
    if not (math.isfinite(args.headroom) and 0 <= args.headroom < 100):
        raise UserError(f"--headroom must be a percentage in [0, 100), got {args.headroom}")


def from_args(args: argparse.Namespace, run_tail: list[str], node: ComputeNode) -> tuple[SweepSpec, dict]:
    """The validated spec and the base config (``--ds-config`` with ``--set`` applied, not resolved); what depends
    on the machine (the preset, the precision, ranks per node, memory) comes from ``node``, where the jobs run."""
    from ds_bench.sweep import preset

    notes = preset.apply(args, bool(node.gpus)) if args.workload is None else []
    check_numbers(args)
    job = with_job_gpus(job_options(args), node)
    path, base = _base_config(args)
    axes = axes_of_sweep(args, base, node.runs_bf16, notes)
    spec = SweepSpec(
        workload=args.workload, ds_config=path, overrides=tuple(args.overrides), **axes,
        run_args=common_run_args(args, run_tail), nproc=args.nproc or node.default_ranks(), **job,
        steps=args.steps,
        warmup=args.warmup, repeats=args.repeats, headroom_pct=args.headroom, baseline=args.baseline, prune=args.prune,
        max_micro_batch=args.max_micro_batch, cpu_mem_limit=args.cpu_mem_limit,
        device_type=node.device_type, notes=tuple(notes), prune_predicted=args.prune_predicted,
        prune_keep=args.prune_keep, compute=node, dry_run=args.dry_run, stacks=stacks_from(args))
    _check_variants(spec)
    _check_prune(spec)
    return dataclasses.replace(spec, extra_points=extra_points(args.points or (), spec)), base


def _check_variants(spec: SweepSpec) -> None:
    """``--attn`` only for a workload with attention, ``--tensor-parallel`` beyond 1 for one AutoTP shards,
    ``--expert-parallel`` beyond 1 for one with experts, each dividing them (``Workload.check_study``; a
    ``--point`` is left to the legality table and its job);
    ``--compile on`` needs a warm-up and dynamo on."""
    from ds_bench.config.run_checks import check_compile_environment
    from ds_bench.workloads import REGISTRY

    if spec.attns != ("",):
        REGISTRY[spec.workload].check_attention_flag()
    REGISTRY[spec.workload].check_study(spec.degrees, run_flags_of(spec.workload, spec.run_args))
    for s in SWITCHES:
        if s.long_context and any(spec.switches.get(s.field, ())):
            REGISTRY[spec.workload].check_long_context_flag(s.option)
    if True in spec.compiles:
        argcheck.at_least("--warmup (with --compile on)", spec.warmup, 1)
        check_compile_environment("--compile on")


def _check_prune(spec: SweepSpec) -> None:
    """``--prune-predicted``: a language model's sweep (what ``ds-bench plan`` models) over listed micro-batches
    (``auto``'s points are not known before they run); the file is read by the driver."""
    from ds_bench.sweep.prune import LANGUAGE_MODELS

    if spec.prune_predicted is None:
        return
    if spec.workload not in LANGUAGE_MODELS:
        raise UserError(f"--prune-predicted: workload {spec.workload} is not one ds-bench plan models "
                        f"({', '.join(LANGUAGE_MODELS)})")
    if spec.micro_batches is None:
        raise UserError("--prune-predicted with --micro-batch auto: the grid's points must be known to rank them; "
                        "give the micro-batches, e.g. --micro-batch 1,2,4")
    if not os.path.isfile(spec.prune_predicted):
        raise UserError(f"--prune-predicted {spec.prune_predicted}: file not found")


def _base_config(args: argparse.Namespace) -> tuple[str, dict]:
    """The base config's path and content (``--set`` applied), the workload checked."""
    from ds_bench.config.deepspeed import prepare as ds_config
    from ds_bench.workloads import REGISTRY

    if args.workload not in REGISTRY:
        raise UserError(f"--workload {args.workload!r} is unknown; known: {', '.join(sorted(REGISTRY))}")
    if args.ds_config is None:
        raise UserError("--ds-config is required with --workload: the base DeepSpeed config, e.g. ds_configs/zero2.json")
    path = config_path(args.ds_config)
    if not os.path.isfile(path):
        raise UserError(f"--ds-config {args.ds_config}: file not found (as given, or in {CONFIG_DIR})")
    return path, ds_config.apply_overrides(ds_config.load_json(path), tuple(args.overrides))


def _slurm_world(spec) -> list:
    """Under ``--executor slurm``, the jobs' nodes (the world size); nothing locally, so local ids stay as they were."""
    return [] if spec.slurm is None else [["slurm nodes", spec.slurm.nodes]]


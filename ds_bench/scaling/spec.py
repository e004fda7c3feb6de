"""``ds-bench scaling`` flags into a checked ``ScalingSpec``: every bad value is one line naming the
flag (exit 2) before any job is launched or any file written.

``run`` options after ``--`` (``--steps``, ``--warmup``, ``--micro-batch``, ``--size``, ``--set``...)
pass through to every point and are checked by ``run``'s own parser first. The DeepSpeed config is
resolved at every point's world size here: weak scaling needs the same micro-batch and gradient
accumulation per device at every point (a config that fixes ``train_batch_size`` would shrink the
micro-batch as ranks are added: strong scaling), so such a config is refused up front.
"""

from __future__ import annotations

import argparse
import itertools
import os
from dataclasses import asdict, dataclass, replace

from ds_bench.jobs.compute_nodes import with_job_gpus
from ds_bench.machine.compute_node import ComputeNode
from ds_bench.config import argcheck
from ds_bench.config.layout import Layout
from ds_bench.errors import UserError
from ds_bench.config.stacks import Stack
from ds_bench.config.study_flags import StudySpec, add_job_arguments, add_stack_arguments, job_options, stacks_from
from ds_bench.scaling.points import Placement, node_points, rank_points


@dataclass(frozen=True)
class ScalingSpec(StudySpec):
    workload: str
    ds_config: str
    points: tuple[Placement, ...]
    """Ascending world sizes; the first is the efficiency baseline."""
    run_args: tuple[str, ...]
    """What came after ``--``: the same for every point."""
    layout: Layout
    """The one layout of every point: its config's stage, offload and precision (``--set`` applied), the
    micro-batch and accumulation per device (the same at every point), the run flags' engine and degrees."""
    device_type: str
    plot: str | None = None
    dry_run: bool = False
    stacks: tuple[Stack, ...] = (Stack(),)
    """``--deepspeed``, ``--torch``, ``--transformers`` (``config.stacks``): the points run once per stack, each
    stack's a scaling record of its own (``layout.stack`` says which)."""
    python: str | None = None
    """The interpreter of the points' jobs (the stack's environment); None: this one."""

    def on(self, stack: Stack) -> ScalingSpec:
        """This study's points on ``stack`` (its Python: ``jobs.stack_axis.on_stack``)."""
        return replace(self, layout=replace(self.layout, stack=stack.label))

    @property
    def plot_path(self) -> str:
        if self.plot and self.layout.stack:
            root, ext = os.path.splitext(self.plot)
            return f"{root}-{self.layout.stack}{ext}"
        return self.plot or self.table_path(".png")

    def table_path(self, suffix: str) -> str:
        """Where the table (``.md``) or plot (``.png``) of this stack's points goes: beside the results file, the
        stack's label in the name where the study has several."""
        return self.output_path(f"-{self.layout.stack}{suffix}" if self.layout.stack else suffix)

    def to_dict(self) -> dict:
        return asdict(self)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", required=True, help="mnist | resnet | gpt2 | llama")
    p.add_argument("--ds-config", required=True, help="DeepSpeed JSON config (ds_configs/), the same at every point")
    p.add_argument("--ranks", default=None, help="world sizes on this node, increasing, e.g. 1,2,4")
    p.add_argument("--nodes", default=None, help="with --hostfile: run on its first k hosts for each k, e.g. 1,2,4; "
                                                 "with --executor slurm: each point a job of k nodes")
    p.add_argument("--plot", default=None, help="PNG plot (default: beside --results)")
    add_job_arguments(p, results="results/scaling.jsonl", master_port=29700, nodes=False)
    add_stack_arguments(p)


def parse_counts(flag: str, text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``: positive integers, strictly increasing (pure)."""
    from ds_bench.config.parsers import parse_items

    values = parse_items(flag, text, kind=int)
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise UserError(f"{flag} {text!r}: expected increasing counts without repeats, e.g. 1,2,4")
    return tuple(values)


def placements(args: argparse.Namespace, node: ComputeNode) -> tuple[Placement, ...]:
    """The points from ``--ranks`` or ``--hostfile`` + ``--nodes``, checked against what exists."""
    if args.executor == "slurm":
        return _slurm_placements(args, node)
    if args.nproc is not None:
        raise UserError("--nproc is for --executor slurm (ranks per node of each point's job); on this node give "
                        "--ranks, with --hostfile its slots")
    if args.nodes is not None and not args.hostfile:
        raise UserError("--nodes needs --hostfile: the hosts whose first k each point runs on")
    if args.hostfile and args.nodes is None:
        raise UserError("--hostfile needs --nodes, e.g. --nodes 1,2: how many of its hosts each point uses")
    if args.hostfile:
        if args.ranks is not None:
            raise UserError("--ranks with --nodes: each node runs the ranks its hostfile line gives (slots=N); "
                            "give --ranks (one node) or --hostfile with --nodes")
        return _node_placements(args.hostfile, parse_counts("--nodes", args.nodes))
    if args.ranks is None:
        raise UserError("--ranks is required: world sizes on this node, e.g. --ranks 1,2,4 (or --hostfile with --nodes)")
    ranks = parse_counts("--ranks", args.ranks)
    if node.gpus and ranks[-1] > node.gpus:
        raise UserError(f"--ranks {args.ranks!r}: {ranks[-1]} ranks but this node has {node.gpus} GPU(s)")
    return rank_points(ranks)


def _slurm_placements(args: argparse.Namespace, node: ComputeNode) -> tuple[Placement, ...]:
    """``--executor slurm --nodes 1,2 [--nproc N]``: each point a job of k nodes with N ranks on each (default:
    the compute nodes' GPUs, else 2 CPU ranks: ``ComputeNode.default_ranks``)."""
    if args.ranks is not None or args.nodes is None:
        raise UserError("--executor slurm: give --nodes, e.g. --nodes 1,2 (each point a job of that many nodes) "
                        "and --nproc (ranks per node), not --ranks")
    per_node = args.nproc or node.default_ranks()
    return tuple(Placement(world_size=k * per_node, nodes=k, per_node=per_node)
                 for k in parse_counts("--nodes", args.nodes))


def _node_placements(path: str, nodes: tuple[int, ...]) -> tuple[Placement, ...]:
    from ds_bench.cluster.hostfile import load_hostfile

    hosts = tuple(load_hostfile(path).items())
    if nodes[-1] > len(hosts):
        raise UserError(f"--nodes {','.join(map(str, nodes))}: the hostfile {path} has {len(hosts)} host(s) "
                        f"({', '.join(h for h, _ in hosts)})")
    return node_points(hosts, nodes)


def from_args(args: argparse.Namespace, node: ComputeNode) -> ScalingSpec:
    from ds_bench.config.parsers import config_path
    from ds_bench.workloads import REGISTRY

    if args.launcher == "srun" and args.executor != "slurm":
        raise UserError("--launcher srun: scaling starts each point on a part of the allocation, which is not built "
                        "yet; use deepspeed or mpirun with --hostfile and --nodes")
    device_type = node.device_type
    points = placements(args, node)
    job = with_job_gpus(job_options(args, local_mpirun=True), node)
    if args.workload not in REGISTRY:
        raise UserError(f"--workload {args.workload!r} is unknown; known: {', '.join(sorted(REGISTRY))}")
    path = config_path(args.ds_config)
    if not os.path.isfile(path):
        raise UserError(f"--ds-config {args.ds_config}: file not found (as given, or in ds_configs/)")
    argcheck.output_folder("--plot", args.plot)
    run = _run_namespace(args.workload, path, list(args.run_args))
    return ScalingSpec(workload=args.workload, ds_config=path, points=points, **job, run_args=tuple(args.run_args),
                       layout=_layout(path, run, points, device_type), device_type=device_type, plot=args.plot,
                       dry_run=args.dry_run, stacks=stacks_from(args))


OWNED = {"results": "--results", "tag": "--tag", "workload": "--workload", "ds_config": "--ds-config"}
"""Run options the scaling command sets itself (per point, or before '--')."""


def _run_namespace(workload: str, path: str, tail: list[str]) -> argparse.Namespace:
    from ds_bench.config.run_flags import parse_run_tail

    try:
        ns, given = parse_run_tail(["--workload", workload, "--ds-config", path], tail)
    except UserError as e:
        raise UserError(f"run arguments after '--' ({' '.join(tail)}): {e}") from None
    for name, flag in OWNED.items():
        if name in given:
            raise UserError(f"run argument {flag} after '--': ds-bench scaling sets it"
                            + (" per point" if name in ("results", "tag") else f"; give {flag} before '--'"))
    return ns


def _layout(path: str, run: argparse.Namespace, points: tuple[Placement, ...], device_type: str) -> Layout:
    """The layout of every point, checked against the legality table at each point's world size, with the
    same micro-batch and gradient accumulation per device at every point; or a UserError."""
    from ds_bench.config import legality
    from ds_bench.config.deepspeed import prepare as ds_config
    from ds_bench.config.deepspeed.derive import axes_of
    from ds_bench.config.layout import from_run

    seen = {}
    try:  # the file and --set: read once, for the legality table and every point's resolution
        read_cfg = ds_config.read(path, tuple(run.overrides))
    except UserError as e:
        raise UserError(f"--ds-config at {points[0].world_size} rank(s): {e}") from None
    for p in points:
        legality.refuse_run(run, p.world_size, device_type, read_cfg)
        ctx = ds_config.RunContext(world_size=p.world_size, device_type=device_type, lr=1e-3, steps=run.steps,
                                   warmup=run.warmup, micro_batch=run.micro_batch)
        try:
            cfg = ds_config.resolve(read_cfg, ctx, path)
        except UserError as e:
            raise UserError(f"--ds-config at {p.world_size} rank(s): {e}") from None
        seen[p.world_size] = (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"])
    if len(set(seen.values())) > 1:
        got = ", ".join(f"{m} x {g} at {n}" for n, (m, g) in seen.items())
        raise UserError(f"--ds-config {path}: micro-batch x accumulation per device changes with the rank count "
                        f"({got}): its train_batch_size fixes the global batch (strong scaling); weak scaling "
                        "needs it 'auto' with a micro-batch (train_micro_batch_size_per_gpu or --micro-batch after '--')")
    return from_run(run, axes_of(cfg))

"""``ds-bench bench``: a suite of runs under the real deepspeed launcher, then one comparison table.

Each run is a separate ``deepspeed --num_gpus N --module ds_bench run ...`` (fresh processes,
so one run's memory or a crash cannot colour the next). Runs share a ``--tag`` (the suite id) and a
results file; the table and plot are made from the records carrying that tag. ``build_command``
is pure and tested on exact argv; ``launch`` is the one place a child process is started.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time
from dataclasses import dataclass

from ds_bench import argcheck, plots, results, summary
from ds_bench.errors import UserError
from ds_bench.launch import run_child

log = logging.getLogger("ds_bench")

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ds_configs")


@dataclass(frozen=True)
class SuiteRun:
    workload: str
    ds_config: str
    args: tuple[str, ...] = ()


# Per-workload run arguments of the default suite. On CPU, shapes small enough that all twelve runs
# finish in a few minutes on 2 cores; on GPU, the defaults users compare against.
CPU_SHAPES: dict[str, tuple[str, ...]] = {
    "mnist": (),
    "resnet": ("--size", "resnet18", "--image-size", "64", "--micro-batch", "8"),
    "gpt2": ("--size", "tiny", "--seq-len", "128", "--micro-batch", "2"),
}
GPU_SHAPES: dict[str, tuple[str, ...]] = {
    "mnist": (),
    "resnet": ("--size", "resnet50", "--image-size", "224", "--micro-batch", "32"),
    "gpt2": ("--size", "small", "--seq-len", "1024", "--micro-batch", "8"),
}


def default_suite(gpu: bool) -> tuple[SuiteRun, ...]:
    """Every workload over ZeRO 0-3 (ds_configs/zero{0..3}.json), at the device's shapes."""
    shapes = GPU_SHAPES if gpu else CPU_SHAPES
    return tuple(SuiteRun(w, f"zero{stage}.json", args) for w, args in shapes.items() for stage in range(4))



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks on this node (default: all GPUs; on CPU 2, or 1 with a single core)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--results", default="results/results.jsonl")
    p.add_argument("--configs", nargs="*", default=None, metavar="JSON",
                   help="DeepSpeed configs to compare (default: zero0..3.json of ds_configs/)")
    p.add_argument("--workload", default=None, help="run only this workload")
    p.add_argument("--master-port", type=int, default=29511)
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def default_nproc() -> int:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return min(2, os.cpu_count() or 1)


def config_path(name: str) -> str:
    """A config as given when that file exists, else the one of that name in ds_configs/."""
    return name if os.path.isfile(name) else os.path.join(CONFIG_DIR, name)


def build_command(run: SuiteRun, *, nproc: int, master_port: int, steps: int, warmup: int,
                  results_path: str, tag: str, launcher: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The deepspeed-launcher argv of one suite run."""
    config = config_path(run.ds_config)
    return [launcher, "--num_gpus", str(nproc), "--master_port", str(master_port), "--module", "ds_bench",
            "run", "--workload", run.workload, "--ds-config", config, "--steps", str(steps),
            "--warmup", str(warmup), "--results", results_path, "--tag", tag, *run.args, *extra]


def deepspeed_launcher() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    return beside if os.path.exists(beside) else "deepspeed"


def launch(argv: list[str]) -> int:
    log.info("$ %s", shlex.join(argv))
    return run_child(argv)


def plan(args: argparse.Namespace, gpu: bool | None = None) -> list[SuiteRun]:
    """The suite's runs: the default suite (GPU or CPU shapes), filtered by --workload, over --configs."""
    from ds_bench.workloads import REGISTRY

    if args.workload and args.workload not in REGISTRY:
        raise UserError(f"--workload {args.workload!r} is unknown; known: {', '.join(sorted(REGISTRY))}")
    suite = default_suite(_has_gpu() if gpu is None else gpu)
    runs = [r for r in suite if args.workload in (None, r.workload)]
    if args.configs:
        shapes = {r.workload: r.args for r in runs}
        runs = [SuiteRun(w, c, a) for w, a in shapes.items() for c in args.configs]
    for run in runs:
        if not os.path.isfile(config_path(run.ds_config)):
            raise UserError(f"--configs {run.ds_config}: file not found (as given, or in {CONFIG_DIR})")
    return runs


def default_precision_args(gpu: bool, native_bf16: bool) -> tuple[str, ...]:
    """The configs are bf16; a CPU that only emulates bf16 (``ds_bench.cpu_features``) runs fp32.
    Put first, so a user's own ``-- --set bf16.enabled=true`` still wins."""
    return () if gpu or native_bf16 else ("--set", "bf16.enabled=false")


def check_args(args: argparse.Namespace) -> None:
    """bench's own arguments and the run arguments after ``--``, before any run is launched."""
    argcheck.at_least("--nproc", args.nproc, 1)
    argcheck.steps("--steps", args.steps, args.warmup)
    argcheck.port("--master-port", args.master_port)
    if args.configs is not None and not args.configs:
        raise UserError("--configs needs at least one DeepSpeed JSON file")
    if args.run_args:
        from ds_bench.cli import build_parser

        try:
            build_parser().parse_args(["run", "--workload", "mnist", "--ds-config", "-", *args.run_args])
        except UserError as e:
            raise UserError(f"run arguments after '--' ({' '.join(args.run_args)}): {e}") from None


def check_configs(runs: list[SuiteRun], nproc: int, args: argparse.Namespace, gpu: bool,
                  extra: tuple[str, ...]) -> None:
    """Every suite config resolved as its runs will resolve it, so a bad one stops the suite at once."""
    from ds_bench import ds_config
    from ds_bench.cli import build_parser

    for run in runs:
        ns = build_parser().parse_args(["run", "--workload", run.workload, "--ds-config", run.ds_config,
                                        *run.args, *extra])
        ctx = ds_config.RunContext(world_size=nproc, device_type="cuda" if gpu else "cpu", lr=ns.lr or 1e-3,
                                   steps=args.steps, warmup=args.warmup, micro_batch=ns.micro_batch)
        ds_config.prepare(config_path(run.ds_config), tuple(ns.overrides), ctx)


def main(args: argparse.Namespace) -> int:
    from ds_bench.cpu_features import this_cpu_has_native_bf16

    check_args(args)
    runs = plan(args)
    tag = "bench-" + time.strftime("%Y%m%dT%H%M%S")
    nproc = args.nproc or default_nproc()
    gpu = _has_gpu()
    precision = default_precision_args(gpu, this_cpu_has_native_bf16())
    check_configs(runs, nproc, args, gpu, precision + tuple(args.run_args))
    if precision:
        log.warning("this CPU has no native bf16 (no avx512_bf16/amx_bf16/bf16 flag; torch would emulate it, "
                    "~9x slower): running fp32. Measure bf16 anyway with: -- --set bf16.enabled=true")
    argvs = [build_command(r, nproc=nproc, master_port=args.master_port, steps=args.steps,
                           warmup=args.warmup, results_path=args.results, tag=tag,
                           launcher=deepspeed_launcher(), extra=precision + tuple(args.run_args)) for r in runs]
    if args.dry_run:
        print("\n".join(shlex.join(a) for a in argvs))
        return 0
    failed = [shlex.join(a) for a in argvs if launch(a) != 0]
    for cmd in failed:
        log.error("run failed: %s", cmd)
    if len(failed) == len(argvs):
        return 1
    code = show(args.results, tag, plot_path=os.path.splitext(args.results)[0] + f"-{tag}.png")
    return 1 if failed else code


def show(results_path: str, tag: str | None, plot_path: str | None) -> int:
    if os.path.isdir(results_path):
        raise UserError(f"{results_path}: is a folder; expected a results file (JSON lines)")
    if not os.path.isfile(results_path):
        raise UserError(f"{results_path}: no results file")
    argcheck.output_folder("--plot", plot_path)
    records = [r for r in results.read_records(results_path) if tag is None or r.get("tag") == tag]
    if not records:
        raise UserError(f"{results_path}: no records" + (f" with tag {tag}" if tag else ""))
    print(summary.table(records))
    print(f"\nresults: {results_path}" + (f" (tag {tag})" if tag else ""))
    if plot_path and plots.bench_plot(records, plot_path):
        print(f"plot:    {plot_path}")
    return 0


def report_main(args: argparse.Namespace) -> int:
    return show(args.results, args.tag, args.plot)

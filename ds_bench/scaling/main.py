"""``ds-bench scaling``: check (flags, points, threads per CPU rank), execute (each point a fresh job
through the studies' runner, ``ds_bench.jobs.runner``, as a sweep point), record (one ``kind: scaling``
line, table, plot).

    ds-bench scaling --workload mnist --ds-config ds_configs/zero1.json --ranks 1,2,4 \\
        -- --steps 30 --warmup 5 --micro-batch 32 --set bf16.enabled=false
    ds-bench scaling --workload gpt2 --ds-config ds_configs/zero2.json --hostfile hosts --nodes 1,2,4 \\
        --launcher mpirun -- --size small --micro-batch 8

Each point runs ``ds-bench run ... --tag scaling:<id>:n<ranks>`` with its output in
``<results>.logs/``; its run record (in ``<results>.runs.jsonl``) is read back by that tag and
classified as a sweep point is (``jobs.outcome.classify``). A point that times out, exits non-zero
or records a failure is a ``failed`` row with its reason; the command then exits 1.

CPU ranks: ``ds-bench run`` gives each rank (its cores) // (ranks on the node) threads, so 1 rank
would get every core and N ranks one each: not the same device. On one node every point therefore
runs with ``OMP_NUM_THREADS`` = cores // (ranks of the largest point), unless it is already set;
with a hostfile each node keeps its slots at every point, so the default is already constant.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import uuid

from tqdm import tqdm

from ds_bench.jobs import spawn
from ds_bench.machine.compute_node import ComputeNode
from ds_bench.jobs.runner import (
    INTERRUPTED,
    check_cluster,
    command_line,
    run_argv,
    run_attempt,
    run_concurrently,
    until_interrupted,
    workers,
)
from ds_bench.jobs.stack_axis import on_stack, prepare_stacks, stack_lines, stack_named
from ds_bench.machine.stack_envs import ready_versions
from ds_bench.record import store as results
from ds_bench.record.schema import ScalingRecord, ScalingRow
from ds_bench.report import scaling_table as report
from ds_bench.scaling import efficiency, points
from ds_bench.scaling.spec import ScalingSpec, from_args


def main(args: argparse.Namespace) -> int:
    from ds_bench.jobs.compute_nodes import for_study

    node = for_study(args)
    print(node.line(), flush=True)
    spec = from_args(args, node)
    env, threads, threads_note = thread_setting(spec, os.environ, _cores())
    sid = uuid.uuid4().hex[:8]
    notes = [threads_note] if threads_note else []
    if spec.layout.precision == "bf16" and not node.runs_bf16:
        notes.append("the compute nodes have no native bf16 known and the config enables it: every point runs "
                     "emulated bf16 (~9x slower than fp32); add '-- --set bf16.enabled=false' for fp32")
    for note in notes:
        print(f"note: {note}", flush=True)
    if spec.dry_run:
        for point in spec.points:
            print(f"{point.label}: {shlex.join(_command(spec, sid, point))}")
        for line in stack_lines(spec.stacks):
            print(line)
        return 0
    check_cluster(spec)
    prepare_stacks(spec)
    worst = 0
    for stack in spec.stacks:  # each stack's points a scaling of its own (its id, record, table and plot)
        sid = sid if stack is spec.stacks[0] else uuid.uuid4().hex[:8]
        code = _scale(on_stack(spec.on(stack), stack.label), sid, env, notes, threads, node)
        if code == INTERRUPTED:
            return code
        worst = max(worst, code)
    return worst


def _scale(spec: ScalingSpec, sid: str, env: dict[str, str] | None, notes: list[str], threads: int | None,
           node: ComputeNode) -> int:
    print(f"scaling {sid}: {spec.workload}, {spec.layout.key}, {', '.join(str(p.world_size) for p in spec.points)} "
          f"rank(s), micro-batch {spec.layout.micro_batch} x {spec.layout.grad_accum} per device, results "
          f"{spec.results}", flush=True)
    finished, rows = until_interrupted(lambda: execute(spec, sid, env), lambda: (
        f"scaling interrupted: no scaling record written; finished points' run records are in {spec.runs_path} "
        f"(tag scaling:{sid}:...)"))
    if not finished:
        return INTERRUPTED
    return record(spec, sid, rows, notes, threads, node)


def thread_setting(spec: ScalingSpec, environ, cores: int) -> tuple[dict[str, str] | None, int | None, str | None]:
    """(the jobs' environment or None for this one's, threads per rank where known, a note) (pure)."""
    if spec.device_type != "cpu":
        return None, None, None
    if "OMP_NUM_THREADS" in environ:
        return None, _int(environ["OMP_NUM_THREADS"]), (f"OMP_NUM_THREADS={environ['OMP_NUM_THREADS']} from the "
                                                         "environment: every rank of every point uses it")
    if spec.hostfile or getattr(spec, "slurm", None) is not None:
        return None, None, ("threads per rank: ds-bench run's default on each node (its cores // its ranks), the same "
                            "at every point since each node keeps its " + ("hostfile slots" if spec.hostfile else
                                                                            "--nproc ranks"))
    largest = spec.points[-1].per_node
    threads = points.threads_per_rank(cores, largest)
    note = (f"CPU ranks: OMP_NUM_THREADS={threads} at every point ({cores} cores // {largest} ranks of the largest "
            "point), so 1 rank and N ranks each run the same threads per rank")
    return {**environ, "OMP_NUM_THREADS": str(threads)}, threads, note


def execute(spec: ScalingSpec, sid: str, env: dict[str, str] | None) -> list[ScalingRow]:
    """Every point, in order here; under Slurm each a job of its own, all queued at once (``--max-jobs``)."""
    with tqdm(total=len(spec.points), unit="point", desc="scaling", file=sys.stderr, dynamic_ncols=True,
              disable=None) as bar:
        def one(point: points.Placement) -> ScalingRow:
            row = run_point(spec, sid, point, env)
            bar.update(1)
            tqdm.write(_line(row), file=sys.stdout)
            return row

        return run_concurrently([lambda p=p: one(p) for p in spec.points], workers(spec, len(spec.points)))


def run_point(spec: ScalingSpec, sid: str, point: points.Placement, env: dict[str, str] | None) -> ScalingRow:
    tag = points.tag(sid, point)
    log_path = os.path.join(spec.output_path(".logs"), f"{sid}-{point.label}.log")
    done = run_attempt(spec, run_argv(spec, tag, spec.ds_config), tag, log_path, job=_job(spec, sid, point), env=env)
    run = done.run if done.status == "ok" else None
    status, reason = efficiency.point_status(done.status, done.reason, run, point.world_size)
    return efficiency.row(point, status, reason, run if status == "ok" else None, tag=tag, log=done.log,
                          wall_s=round(done.job.ended_at - done.job.started_at, 2), busy=done.busy, slurm=done.slurm)


def _job(spec: ScalingSpec, sid: str, point: points.Placement) -> points.Job:
    if spec.slurm is not None:  # the point's own allocation: its nodes, its ranks per node
        return points.job(point, "srun", None, spec.iface)
    hostfile = _write_hostfile(spec, sid, point) if points.needs_hostfile(point, spec.launcher) else None
    return points.job(point, spec.launcher, hostfile, spec.iface)


def _command(spec: ScalingSpec, sid: str, point: points.Placement) -> list[str]:
    tag = points.tag(sid, point)
    return command_line(spec, run_argv(spec, tag, spec.ds_config), _job(spec, sid, point))


def _write_hostfile(spec: ScalingSpec, sid: str, point: points.Placement) -> str:
    """The point's hosts (the first k of ``--hostfile``, or this node for mpirun) under the results folder."""
    path = os.path.join(spec.output_path(".hosts"), f"{sid}-{point.label}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(points.hostfile_text(point.hosts or points.local_hosts(point.per_node)))
    return path


def record(spec: ScalingSpec, sid: str, rows: list[ScalingRow], notes: list[str], threads: int | None,
           node: ComputeNode) -> int:
    """Append the scaling record, write the table and the plot, print them; 1 if any point failed. The machine is
    the compute node's under Slurm (this one is the login node), else this one's."""
    rows, base = efficiency.with_efficiency(rows)
    machine = _machine() if spec.slurm is None else {"cores": node.cpus, "compute_nodes": node.line()}
    found = efficiency.notes(rows, machine["cores"] or _cores(), spec.device_type)
    notes = notes + found
    failed = [r for r in rows if r.status != "ok"]
    md, png = spec.table_path(".md"), spec.plot_path
    stamp = results.base_record(results.new_run_id(), spec.to_dict())
    stamp["versions"] = {**stamp["versions"], **_stack_versions(spec)}
    rec = ScalingRecord(**stamp, kind="scaling", scaling=sid,
                        status="failed" if failed else "ok", workload=spec.workload, ds_config=spec.ds_config,
                        launcher=spec.launcher, hostfile=spec.hostfile, device_type=spec.device_type,
                        machine=machine, threads_per_rank=threads, micro_batch=spec.layout.micro_batch,
                        grad_accum=spec.layout.grad_accum, baseline_world_size=base, points=rows, notes=notes,
                        runs=spec.runs_path, table=md, plot=png if base is not None else None,
                        stack=spec.layout.stack or None)
    with open(md, "w", encoding="utf-8") as f:
        f.write(f"{report.title(rec)}\n\n{report.table(rows, base, fmt='github')}\n")
    if base is not None:
        report.write_plot(rows, png, report.title(rec))
    results.append_record(spec.results, rec)
    print("\n" + report.table(rows, base))
    for note in found:
        print(f"note: {note}")
    print(f"results: {spec.results} (scaling {sid}; runs in {spec.runs_path})\ntable:   {md}"
          + (f"\nplot:    {png}" if base is not None else ""), flush=True)
    return 1 if failed else 0


def _stack_versions(spec: ScalingSpec) -> dict:
    """The versions the points ran with where they ran on a stack of the axis (its environment's ready file), which
    the record's own stamp (this process's) is not."""
    stack = stack_named(spec, spec.layout.stack)
    built = ready_versions(stack) if stack is not None else None
    return (built or {}).get("versions", {})


def _line(row: ScalingRow) -> str:
    head = f"{row.world_size:>4} rank(s)"
    if row.status == "ok":
        return (f"{head} {row.samples_per_s_per_device:>10,.1f} {row.unit} per device, step "
                f"{row.step_ms_median:.1f} ms median  ok")
    return f"{head}  failed: {report.brief(row.reason)}\n    log: {row.log}"


def _machine() -> dict:
    import torch

    return {"cpu": platform.processor() or platform.machine(), "cores": _cores(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None

"""``ds-bench sweep``: walk the grid of points, run each as a fresh job, record, then rank and recommend.

Per family (stage, offload, precision, accumulation), micro-batches ascending, or for ``auto``
doubling from 1 then bisecting on the first out-of-memory (``points.next_auto_micro_batch``). Each
point is first checked without running anything: an invalid combination (the legality table, read with the
sequence the point runs: ``Sweep.with_seq``), a config ``run`` would
reject (``ds_config.prepare``, the run's own check), a micro-batch above one that already ran out of
memory, or a predicted peak above the device's memory (``perf.peak_memory``; ``--no-prune`` runs it
anyway) ends it as ``skipped`` with the reason. Otherwise it runs ``--repeats`` times
(``jobs.runner``) and each attempt is appended to the results file, the sweep's state (``jobs.ledger``).
A point with its own sequence (``seq=N``: a ``--seq-len`` axis, a ``--point``) runs it instead of the sweep's
one ``--seq-len``.
"""

from __future__ import annotations

import dataclasses
import os

from ds_bench.config.deepspeed.derive import write_derived
from ds_bench.config.layout import Layout
from ds_bench.config.parsers import parse_count
from ds_bench.config.run_config import RunConfig
from ds_bench.errors import UserError
from ds_bench.jobs import ledger, spawn
from ds_bench.config.study_flags import run_flags_of
from ds_bench.perf.grid import next_auto_micro_batch, skip_reason, study_where
from ds_bench.jobs.runner import new_tag, run_argv, run_attempt, run_concurrently, slug, workers
from ds_bench.jobs.stack_axis import on_stack, stack_where
from ds_bench.jobs.compute_nodes import rank_capacity
from ds_bench.perf.peak_memory import MemoryModel
from ds_bench.record import store as results
from ds_bench.record.schema import SweepPointRecord
from ds_bench.report.ranking import GIB
from ds_bench.sweep.common_args import seq_arg, without_seq
from ds_bench.sweep.point_record import point_record
from ds_bench.sweep.progress import Progress
from ds_bench.sweep.prune import PRUNED


class Sweep:
    def __init__(self, spec, base: dict):
        self.spec, self.base = spec, base
        self.sweep_id = spec.sweep_id(base)
        self.world, self.per_node = spawn.world_of(spec)
        self.where = study_where(spec, self.world)
        self.capacity = rank_capacity(spec, self.per_node)
        self.done = load_ledger(spec.results, self.sweep_id)
        self.memory = MemoryModel(self.world, self.per_node, spec.device_type, self.capacity, _expert_params(spec))
        self.memory.learn_from(r for r in self.done.values() if r.status == "ok")
        self.progress = Progress()
        self.attempts = 0
        self.pruning = self._prune_by_plan()

    def where_of(self, point: Layout):
        """Where ``point`` runs: the sweep's ranks and run options, with its stack's versions."""
        return stack_where(self.spec, self.where, point)

    # --- the grid -------------------------------------------------------------------------------
    def run(self) -> None:
        s = self.spec
        fams = s.families()
        planned = (len(fams) * (len(s.micro_batches) if s.micro_batches else 4) + len(s.extra_points)) * s.repeats
        groups = stack_groups(fams)
        with self.progress.open(planned):  # families are independent: under Slurm, all queued at once
            run_concurrently([lambda g=g: self._run_group(g) for g in groups], workers(s, len(groups)))
            for point in self.spec.extra_points:  # one already measured in the grid is reused, not rerun
                self._run_point(point, smallest_oom=None)

    def _run_group(self, group: list[Layout]) -> None:
        """One family on each stack of the axis. With listed micro-batches their attempts interleave, each
        micro-batch's repeats taken stack after stack (A B A B ...), so that a load that comes and goes on the
        machine falls on every stack alike (docs/stacks.md); one stack, or ``auto``, family after family."""
        if len(group) == 1 or not self.spec.micro_batches:
            for family in group:
                self._run_family(family)
            return
        fits: dict[Layout, dict[int, str]] = {f: {} for f in group}
        for m in sorted(self.spec.micro_batches):
            for repeat in range(self.spec.repeats):
                for f in group:
                    if fits[f].get(m, "fits") == "fits":  # not ended by an earlier repeat
                        fits[f][m] = self._run_point(f.with_micro_batch(m), _smallest_oom(fits[f], below=m),
                                                     repeats=(repeat,))

    def _run_family(self, family: Layout) -> None:
        fits: dict[int, str] = {}
        if self.spec.micro_batches:
            for m in sorted(self.spec.micro_batches):
                fits[m] = self._run_point(family.with_micro_batch(m), smallest_oom=_smallest_oom(fits))
            return
        while (m := next_auto_micro_batch(fits, self.spec.max_micro_batch)) is not None:
            self.progress.grow_if_full(self.spec.repeats)
            fits[m] = self._run_point(family.with_micro_batch(m), smallest_oom=None)

    def _run_point(self, point: Layout, smallest_oom: int | None, repeats: tuple[int, ...] | None = None) -> str:
        """Runs (or skips) every repeat of one point (``repeats``: those alone); for the micro-batch search:
        ``fits``, ``oom`` (ran out, or predicted to), or what else ended it (``invalid``, ``timeout``, ``crashed``)."""
        reason = self._skip_reason(point, smallest_oom)
        if reason is None and self.pruning is not None:
            reason = self.pruning.pruned.get(point.key)
        predicted = self.memory.predict(point)
        if reason is None and self.spec.prune and self.memory.surely_too_big(predicted, point):
            reason = (f"predicted {predicted / GIB:.2f} GiB per rank > {self.capacity / GIB:.2f} GiB of memory "
                      "(--no-prune runs it anyway)")
        if reason is not None:
            if self._final(point.key, 0) is None:
                self._append(point_record(sweep_id=self.sweep_id, spec=self.spec, point=point, repeat=0,
                                          status="skipped", reason=reason, world_size=self.world,
                                          predicted=predicted, capacity=self.capacity))
            self.progress.advance(self.spec.repeats)
            self.progress.say(point, "skipped", reason=reason)
            return "oom" if smallest_oom is not None or reason.startswith("predicted") else "invalid"
        status = "ok"
        for repeat in range(self.spec.repeats) if repeats is None else repeats:
            record = self._final(point.key, repeat) or self._attempt(point, repeat, predicted)
            status = record.status
            self.progress.advance(1)
            if status != "ok":
                self.progress.advance(self.spec.repeats - repeat - 1)
                break
        return {"ok": "fits"}.get(status, status)

    def _skip_reason(self, point: Layout, smallest_oom: int | None) -> str | None:
        reason = skip_reason(self.with_seq(point), self.where_of(point))
        if reason is None and smallest_oom is not None and point.micro_batch > smallest_oom:
            reason = f"micro-batch {smallest_oom} already ran out of memory"
        if reason is None:
            reason = self._config_rejected(point)
        return reason

    def _final(self, key: str, repeat: int) -> SweepPointRecord | None:
        """The attempt's record when it need not run again: a point an earlier ``--prune-predicted`` skipped runs
        once it is kept."""
        r = ledger.final(self.done, (key, repeat))
        return None if r is not None and r.status == "skipped" and (r.reason or "").startswith(PRUNED) else r

    def _prune_by_plan(self):
        """``--prune-predicted``: the grid's points (those the legality table leaves) ranked by the plan
        record's model on its cluster (``sweep.prune``); None without it."""
        from ds_bench.perf import shapes
        from ds_bench.perf.devices import Cluster
        from ds_bench.record.plan_schema import PlanRecord
        from ds_bench.sweep import prune

        s = self.spec
        if s.prune_predicted is None:
            return None
        flags = run_flags_of(s.workload, s.run_args)
        shape_cache: dict[int, object] = {}

        def shape(seq_len: int):
            if seq_len not in shape_cache:
                shape_cache[seq_len] = shapes.of_workload(s.workload, flags.size, flags.layers, flags.hidden,
                                                          flags.heads, seq_len, flags.experts, flags.top_k)
            return shape_cache[seq_len]

        grid = [f.with_micro_batch(m) for f in s.families() for m in sorted(s.micro_batches)]
        points = [(p, self.with_seq(p).seq_len) for p in grid if skip_reason(self.with_seq(p), self.where) is None]
        label = shape(self.with_seq(grid[0]).seq_len).label
        plan = prune.pick_plan(results.read_records(s.prune_predicted, PlanRecord), s.workload, label, self.world,
                               s.prune_predicted)
        try:
            cluster = Cluster.from_dict(plan.cluster)
        except (ValueError, TypeError) as e:
            raise UserError(f"--prune-predicted {s.prune_predicted}: plan {plan.run_id}: {e}") from None
        predictions = [prune.predict(shape(seq), p, seq, cluster, bool(flags.activation_checkpointing),
                                     s.headroom_pct) for p, seq in points]
        return prune.rank([p for p in predictions if p is not None], s.prune_keep, plan.run_id or "?",
                          s.prune_predicted)

    def with_seq(self, point: Layout) -> Layout:
        """The point with the sequence its run gets (a legality rule reads it): its own, else the sweep's one
        ``--seq-len``, else ``ds-bench run``'s default."""
        if point.seq_len:
            return point
        given = seq_arg(self.spec.run_args)
        return dataclasses.replace(point, seq_len=parse_count("--seq-len", given) if given else RunConfig.seq_len)

    def _config_rejected(self, point: Layout) -> str | None:
        from ds_bench import engines
        from ds_bench.config.deepspeed import prepare as ds_config

        data_parallel = self.world // point.model_parallel  # the batch counts data-parallel replicas
        ctx = ds_config.RunContext(world_size=data_parallel, device_type=self.spec.device_type, lr=1e-3,
                                   steps=self.spec.steps, warmup=self.spec.warmup, micro_batch=None)
        try:
            path = write_derived(self._config_file(point), self.base, point)
            engines.choose(point.engine, ds_config.prepare(path, (), ctx), 1e-3, path)
        except UserError as e:
            return f"config rejected: {e}"
        return None

    # --- one attempt ----------------------------------------------------------------------------
    def _attempt(self, point: Layout, repeat: int, predicted: int | None) -> SweepPointRecord:
        s = self.spec
        self.attempts += 1
        tag = new_tag(f"sweep-{self.sweep_id}", point.key, repeat)
        if point.seq_len:  # its own sequence, not the sweep's one --seq-len (a --point seq=N)
            s = dataclasses.replace(s, run_args=without_seq(s.run_args))
        s = on_stack(s, point.stack)
        run_args = run_argv(s, tag, self._config_file(point), point)  # the config was written by the check
        log_path = os.path.join(s.output_path(".logs"), f"{slug(point.key)}-r{repeat}-{tag[-6:]}.log")
        done = run_attempt(s, run_args, tag, log_path)
        record = point_record(sweep_id=self.sweep_id, spec=s, point=point, repeat=repeat, status=done.status,
                              reason=done.reason, world_size=self.world, run=done.run, predicted=predicted,
                              capacity=self.capacity, log=done.log, job=done.job, busy=done.busy, slurm=done.slurm)
        self._append(record)
        if done.status == "ok":
            self.memory.learn_from([record])
        self.progress.say(point, done.status, record=record, reason=done.reason, log_path=done.log)
        return record

    def _append(self, record: SweepPointRecord) -> None:
        results.append_record(self.spec.results, record)
        self.done[(record.key, record.repeat)] = record

    def _config_file(self, point: Layout) -> str:
        return os.path.join(self.spec.output_path(".configs"), f"{slug(point.key)}.json")


def load_ledger(path: str, sweep_id: str) -> dict:
    """The latest record of each (point key, repeat) of this sweep."""
    return ledger.load(path, SweepPointRecord, lambda r: r.sweep == sweep_id, lambda r: (r.key, r.repeat))


def _smallest_oom(fits: dict[int, str], below: int | None = None) -> int | None:
    return min((m for m, r in fits.items() if r == "oom" and (below is None or m < below)), default=None)


def stack_groups(families: list[Layout]) -> list[list[Layout]]:
    """Families that differ only in their stack, together, in order (pure)."""
    groups: dict[Layout, list[Layout]] = {}
    for f in families:
        groups.setdefault(dataclasses.replace(f, stack=""), []).append(f)
    return list(groups.values())


def _expert_params(spec) -> int:
    """The experts' parameters of the model every point builds (0: a dense model), for the memory model."""
    from ds_bench.workloads import REGISTRY

    return REGISTRY[spec.workload].expert_param_count(run_flags_of(spec.workload, spec.run_args))

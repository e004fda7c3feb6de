"""``ds-bench sweep``: plan the points, run each as a fresh job, record, then rank and recommend.

Per family (stage, offload, precision, accumulation), micro-batches ascending, or for ``auto``
doubling from 1 then bisecting on the first out-of-memory (``points.next_auto_micro_batch``). Each
point is first checked without running anything: an invalid combination, a config ``run`` would
reject (``ds_config.prepare``, the run's own check), a micro-batch above one that already ran out of
memory, or a predicted peak above the device's memory (``predict``; ``--no-prune`` runs it anyway)
ends it as ``skipped`` with the reason. Otherwise it runs ``--repeats`` times (``jobs.run_job``) and
each attempt is classified (``outcome.classify``) and appended to the results file (``ledger``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import uuid

from tqdm import tqdm

from ds_bench.cluster.rendezvous import free_port
from ds_bench.errors import UserError
from ds_bench.jobs import outcome, predict
from ds_bench.jobs import spawn as jobs
from ds_bench.jobs.derive import derive
from ds_bench.jobs.points import Point, families, invalid_reason, next_auto_micro_batch
from ds_bench.record import store as results
from ds_bench.record.schema import RunMetrics, RunRecord, SweepPointRecord
from ds_bench.report.ranking import GIB
from ds_bench.report.sweep_table import brief
from ds_bench.sweep import ledger

log = logging.getLogger("ds_bench")


class Sweep:
    def __init__(self, spec, base: dict):
        self.spec, self.base = spec, base
        self.sweep_id = spec.sweep_id(base)
        self.world, self.per_node = jobs.world_of(spec)
        self.capacity = predict.device_capacity_bytes(spec.device_type, self.per_node, spec.cpu_mem_limit)
        self.done = ledger.load(spec.results, self.sweep_id)
        self.shape = self.calibration = None
        self.ok_points: list[SweepPointRecord] = []
        self.two_point = False
        self.attempts = 0
        self.bar = None
        self._learn_from(r for r in self.done.values() if r.status == "ok")

    # --- the plan -------------------------------------------------------------------------------
    def run(self) -> None:
        s = self.spec
        fams = families(s.stages, s.offloads, s.precisions, s.grad_accums, s.engines)
        planned = (len(fams) * (len(s.micro_batches) if s.micro_batches else 4) + len(s.extra_points)) * s.repeats
        with tqdm(total=planned, unit="point", desc="sweep", file=sys.stderr, dynamic_ncols=True,
                  disable=None) as self.bar:
            for family in fams:
                self._run_family(family)
            for point in self.spec.extra_points:  # one already measured in the grid is reused, not rerun
                self._run_point(point, smallest_oom=None)

    def _run_family(self, family: Point) -> None:
        fits: dict[int, str] = {}
        if self.spec.micro_batches:
            for m in sorted(self.spec.micro_batches):
                fits[m] = self._run_point(family.with_micro_batch(m), smallest_oom=_smallest_oom(fits))
            return
        while (m := next_auto_micro_batch(fits, self.spec.max_micro_batch)) is not None:
            if self.bar is not None and self.bar.n >= self.bar.total:
                self.bar.total += self.spec.repeats
            fits[m] = self._run_point(family.with_micro_batch(m), smallest_oom=None)

    def _run_point(self, point: Point, smallest_oom: int | None) -> str:
        """Runs (or skips) every repeat of one point; for the micro-batch search: ``fits``, ``oom``
        (ran out, or predicted to), or what else ended it (``invalid``, ``timeout``, ``crashed``)."""
        reason = self._skip_reason(point, smallest_oom)
        predicted = self._predict(point)
        if reason is None and self.spec.prune and self._surely_too_big(predicted):
            reason = (f"predicted {predicted / GIB:.2f} GiB per rank > {self.capacity / GIB:.2f} GiB of memory "
                      "(--no-prune runs it anyway)")
        if reason is not None:
            if ledger.final(self.done, point.key, 0) is None:
                self._append(ledger.point_record(sweep_id=self.sweep_id, spec=self.spec, point=point, repeat=0,
                                                 status="skipped", reason=reason, world_size=self.world,
                                                 predicted=predicted, capacity=self.capacity))
            self._advance(self.spec.repeats)
            self._say(point, "skipped", reason=reason)
            return "oom" if smallest_oom is not None or reason.startswith("predicted") else "invalid"
        status = "ok"
        for repeat in range(self.spec.repeats):
            record = ledger.final(self.done, point.key, repeat) or self._attempt(point, repeat, predicted)
            status = record.status
            self._advance(1)
            if status != "ok":
                self._advance(self.spec.repeats - repeat - 1)
                break
        return {"ok": "fits"}.get(status, status)

    def _surely_too_big(self, predicted: int | None) -> bool:
        """Calibrated on two micro-batches the prediction came within 0.91-1.00x of the measured
        peak; on one, 1.2-1.8x high (it counts the step's fixed cost as per-sample), so then only a
        prediction over twice the capacity skips a point (measured: ``ds_bench.jobs.predict``)."""
        if predicted is None:
            return False
        return predicted > self.capacity * (1 if self.two_point else 2)

    def _skip_reason(self, point: Point, smallest_oom: int | None) -> str | None:
        reason = invalid_reason(point, self.spec.device_type)
        if reason is None and smallest_oom is not None and point.micro_batch > smallest_oom:
            reason = f"micro-batch {smallest_oom} already ran out of memory"
        if reason is None:
            reason = self._config_rejected(point)
        return reason

    def _config_rejected(self, point: Point) -> str | None:
        from ds_bench import engines
        from ds_bench.config.deepspeed import prepare as ds_config

        ctx = ds_config.RunContext(world_size=self.world, device_type=self.spec.device_type, lr=1e-3,
                                   steps=self.spec.steps, warmup=self.spec.warmup, micro_batch=None)
        try:
            path = self._write_config(point)
            engines.choose(point.engine, ds_config.prepare(path, (), ctx), 1e-3, path)
        except UserError as e:
            return f"config rejected: {e}"
        return None

    # --- one attempt ----------------------------------------------------------------------------
    def _attempt(self, point: Point, repeat: int, predicted: int | None) -> SweepPointRecord:
        s = self.spec
        self.attempts += 1
        tag = f"sweep-{self.sweep_id}-{_slug(point.key)}-r{repeat}-{uuid.uuid4().hex[:6]}"
        run_args = ["run", "--workload", s.workload, "--ds-config", self._config_file(point),  # written by the check
                    "--steps", str(s.steps), "--warmup", str(s.warmup), "--results", s.runs_path, "--tag", tag,
                    "--step-timeout", str(s.timeout_s), "--engine", point.engine,
                    *(["--cpu-mem-limit", str(s.cpu_mem_limit)] if s.cpu_mem_limit else []),
                    *s.run_args]
        log_path = os.path.join(s.output_path(".logs"), f"{_slug(point.key)}-r{repeat}-{tag[-6:]}.log")
        argv = jobs.command(s, run_args, free_port(s.master_port))
        probe = outcome.BusyProbe.start_now()
        end = jobs.run_job(argv, log_path, s.timeout_s)
        busy = probe.finish()
        runs = [r for r in results.read_records(s.runs_path, RunRecord, missing_ok=True) if r.tag == tag]
        status, reason = outcome.classify(runs, end.exit_code, end.timed_out, s.timeout_s)
        chosen = next((r for r in runs if r.status == "ok"), runs[0] if runs else None)
        record = ledger.point_record(sweep_id=self.sweep_id, spec=s, point=point, repeat=repeat, status=status,
                                     reason=reason, world_size=self.world, run=chosen, predicted=predicted,
                                     capacity=self.capacity, log=log_path, job=end, busy=busy)
        self._append(record)
        if status == "ok":
            self._learn_from([record])
        self._say(point, status, record=record, reason=reason, log_path=log_path)
        return record

    def _learn_from(self, records) -> None:
        """Calibrate the prediction on the first ok point (model size, baseline, activations), and
        again once a second micro-batch of that point's family ran ok: two peaks separate the
        fixed per-step cost from the per-sample one (``predict.calibrate``)."""
        for r in records:
            deepspeed = r.point.get("engine", "deepspeed") == "deepspeed"
            if not r.params or r.peak_mem_bytes is None or not deepspeed:
                continue  # DDP/FSDP memory follows other rules than the DeepSpeed model predict.py calibrates
            self.ok_points.append(r)
            first = self.ok_points[0]
            same_family = [x for x in self.ok_points[1:] if x.point | {"micro_batch": 0} == first.point | {"micro_batch": 0}
                           and x.point["micro_batch"] != first.point["micro_batch"]]
            if self.calibration is None or (same_family and not self.two_point):
                self.shape = predict.ModelShape(first.params, first.largest_layer_params or 0)
                second = (_as_run(same_family[0]), Point.from_dict(same_family[0].point)) if same_family else None
                self.calibration = predict.calibrate(_as_run(first), Point.from_dict(first.point), self.world,
                                                     self.per_node, self.spec.device_type, second=second)
                self.two_point = second is not None

    def _predict(self, point: Point) -> int | None:
        if self.shape is None or self.calibration is None or point.engine != "deepspeed":
            return None
        return predict.predict_peak_bytes(self.shape, point, self.world, self.per_node, self.spec.device_type,
                                          self.calibration)

    # --- output ---------------------------------------------------------------------------------
    def _append(self, record: SweepPointRecord) -> None:
        results.append_record(self.spec.results, record)
        self.done[(record.key, record.repeat)] = record

    def _advance(self, n: int) -> None:
        if self.bar is not None and n > 0:
            self.bar.update(n)

    def _say(self, point: Point, status: str, record: SweepPointRecord | None = None, reason: str | None = None,
             log_path: str | None = None) -> None:
        line = f"{point.key:<30}"
        if record and status == "ok":
            line += f" {record.throughput:>12,.0f} {record.unit:<10} {record.peak_mem_bytes / GIB:6.2f} GiB  ok"
        else:
            line += f"  {status}: {brief(reason or '-')}"
        tqdm.write(line, file=sys.stdout)
        if status in ("crashed", "timeout") and log_path:
            tqdm.write(f"    log: {log_path}\n" + "".join(f"    | {t}\n" for t in _tail(log_path, 8)).rstrip(),
                       file=sys.stdout)

    def _config_file(self, point: Point) -> str:
        return os.path.join(self.spec.output_path(".configs"), f"{_slug(point.key)}.json")

    def _write_config(self, point: Point) -> str:
        path = self._config_file(point)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(derive(self.base, point), f, indent=2)
        os.replace(path + ".tmp", path)
        return path


def _as_run(point_record: SweepPointRecord) -> RunRecord:
    """The fields of a run record that ``predict.calibrate`` reads, from a point record."""
    return RunRecord(workload=point_record.workload or "", status="ok", params=point_record.params,
                     largest_layer_params=point_record.largest_layer_params,
                     metrics=RunMetrics(peak_mem_bytes=point_record.peak_mem_bytes,
                                        baseline_mem_bytes=point_record.baseline_mem_bytes or 0))


def _smallest_oom(fits: dict[int, str]) -> int | None:
    return min((m for m, r in fits.items() if r == "oom"), default=None)


def _slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", key.replace("=", "")).strip("_")


def _tail(path: str, n: int) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n")[:200] for line in f.readlines()[-n:]]

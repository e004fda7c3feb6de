"""One layout's search: probe family members as real jobs until the largest that trains is known.

Each probe is a fresh job (``jobs.runner``: the sweep's launcher, isolation, out-of-memory
classification and timeout) running ``ds-bench run`` for a few steps. The first probe (the smallest
member) calibrates the memory prediction (``perf.peak_memory``: DeepSpeed's estimators for the model
states, the measured baseline, and activations scaled from the probe by layers x width, an
approximation); members predicted above twice the memory are then not run (one calibration run
over-predicts by up to 1.8x, ``perf.peak_memory``), and the rest is bisected (``capacity.search``).
A layout with a degree the memory model does not split by (a pipeline) is not predicted (``perf.states.models``):
only run.
The results file is the state (``jobs.ledger``): a probe recorded for the same search, layout and member
is not run again; ``timeout`` and ``crashed`` probes are. ``--scale seq`` is the same search along sequence
lengths (``capacity.seq_driver.SeqSearch``: its own policy and prediction, these probes and records).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from tqdm import tqdm

from ds_bench.capacity import search
from ds_bench.capacity.family import Member
from ds_bench.capacity.spec import CapacitySpec
from ds_bench.config.deepspeed.derive import write_derived
from ds_bench.config.deepspeed.prepare import portable, write_config
from ds_bench.config.layout import Layout
from ds_bench.jobs import ledger
from ds_bench.jobs.runner import new_tag, run_argv, run_attempt, slug
from ds_bench.jobs.stack_axis import on_stack
from ds_bench.jobs.slurm_batch import slurm_block
from ds_bench.perf import peak_memory
from ds_bench.perf.states import ModelShape, models
from ds_bench.record import store
from ds_bench.record.schema import (
    Busy,
    CapacityMember,
    CapacityProbeRecord,
    CapacityRecord,
    RunMetrics,
    RunRecord,
)
from ds_bench.report.capacity_notes import ABOVE_CAP_NOTE, PROBE_TAG_PREFIX, above_cap

TOO_BIG_FACTOR = 2.0


class LayoutSearch:
    def __init__(self, spec: CapacitySpec, layout: Layout, world: int, per_node: int, capacity: int, done: dict):
        self.spec, self.layout, self.world, self.per_node, self.capacity = spec, layout, world, per_node, capacity
        self.capacity_id = spec.capacity_id()
        self.probes: dict[int, CapacityProbeRecord] = {r.index: r for r in done.values() if r.layout == layout.key}
        self.calibration = None

    def run(self) -> search.Answer:
        known = {i: r.status for i, r in self.probes.items() if r.status in ledger.FINAL}
        self._calibrate()
        n = len(self.spec.members)
        while (i := search.next_probe(n, self._with_predictions(known))) is not None:
            record = self._probe(i)
            known[i] = record.status
            self._calibrate()
        return search.answer(n, self._with_predictions(known))

    def member(self, i: int) -> Member:
        """The member a probe index names: the family's ``i``-th."""
        return self.spec.members[i]

    def summary(self, answer: search.Answer) -> CapacityRecord:
        """The layout's ``kind: capacity`` record: the largest member that ran and the next one's fate."""
        best = self.probes.get(answer.largest) if answer.largest is not None else None
        nxt = self.member(answer.next) if answer.next is not None else None
        nxt_probe = self.probes.get(answer.next) if answer.next is not None else None
        config = self._write_largest_config(best) if best else None
        return CapacityRecord(
            kind="capacity", capacity=self.capacity_id, layout=self.layout.key, point=self.layout.to_dict(),
            data_parallel_size=self.layout.data_parallel(self.world),
            world_size=self.world, family=self.spec.family, scale=self.spec.scale, status="ok" if best else "failed",
            largest=_member(self.member(answer.largest), best) if best else None,
            next=_member(nxt, nxt_probe, self.predict(nxt)).model_copy(
                update={"why": answer.why, "reason": nxt_probe and nxt_probe.reason}) if nxt else None,
            capacity_bytes=self.capacity, config=config, time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def summary_skipped(self, why: str) -> CapacityRecord:
        """The ``kind: capacity`` record of a layout DeepSpeed cannot train here."""
        return self.summary(search.Answer(None, None, None)).model_copy(update={"status": "skipped", "reason": why})

    def _with_predictions(self, known: dict[int, str]) -> dict[int, str]:
        if not self.spec.prune:
            return known
        out = dict(known)
        for i, m in enumerate(self.spec.members):
            predicted = self.predict(m)
            if i not in out and predicted is not None and predicted > TOO_BIG_FACTOR * self.capacity:
                out[i] = search.PREDICTED
        return out

    def _calibrate(self) -> None:
        first = min((i for i, r in self.probes.items() if r.status == "ok"), default=None)
        if first is None or not models(self.layout):
            return
        r = self.probes[first]
        run = RunRecord(workload=self.spec.workload, status="ok", params=r.params, largest_layer_params=r.largest_layer_params,
                        metrics=RunMetrics(peak_mem_bytes=r.peak_mem_bytes, baseline_mem_bytes=r.baseline_mem_bytes))
        calibration = peak_memory.calibrate(run, self.layout, self.world, self.per_node, self.spec.device_type,
                                            expert_params=self.member(first).expert_params)
        self.calibration = (calibration, self.spec.members[first]) if calibration else None

    def predict(self, m: Member) -> int | None:
        if self.calibration is None:
            return None
        calibration, measured = self.calibration
        grown = (m.layers * m.hidden) / (measured.layers * measured.hidden)  # activations ~ layers x width
        per_sample = calibration.activation_bytes_per_sample * grown
        scaled = dataclasses.replace(calibration, activation_bytes_per_sample=per_sample)
        shape = ModelShape(m.params, m.largest_layer_params, m.expert_params)
        return peak_memory.predict_peak_bytes(shape, self.layout, self.world, self.per_node, self.spec.device_type,
                                              scaled)

    def _probe(self, i: int) -> CapacityProbeRecord:
        s, m = self.spec, self.member(i)
        tag = new_tag(f"{PROBE_TAG_PREFIX}{self.capacity_id}", f"{self.layout.key} {m.name}")
        seq = ("--seq-len", str(m.seq_len or s.seq_len))
        run_args = run_argv(s, tag, self._write_config(), self.layout, (*m.run_args, *seq))
        log = os.path.join(s.output_path(".logs"), f"{slug(self.layout.key)}-{slug(m.name)}-{tag[-6:]}.log")
        attempt = run_attempt(on_stack(s, self.layout.stack), run_args, tag, log)
        record = probe_record(self, i, attempt)
        store.append_record(s.results, record)
        self.probes[i] = record
        tqdm.write(probe_line(record, self.capacity), file=sys.stdout)
        return record

    def _write_config(self) -> str:
        path = os.path.join(self.spec.output_path(".configs"), f"{slug(self.layout.key)}.json")
        return write_derived(path, self.spec.base, self.layout)

    def _write_largest_config(self, best: CapacityProbeRecord) -> str | None:
        if not best.ds_config:
            return None
        path = self.spec.output_path(f"-{slug(self.layout.key)}-largest.json")
        write_config(path, portable(best.ds_config))
        return path


def probe_record(search_: LayoutSearch, index: int, attempt) -> CapacityProbeRecord:
    m, run = search_.member(index), attempt.run
    metrics = run.metrics if run is not None else RunMetrics()
    ok = attempt.status == "ok"
    return CapacityProbeRecord(
        kind="capacity_probe", capacity=search_.capacity_id, layout=search_.layout.key, index=index, member=m.name,
        run_args=list(m.run_args), seq_len=m.seq_len or search_.spec.seq_len, params=(run and run.params) or m.params,
        largest_layer_params=(run and run.largest_layer_params) or m.largest_layer_params,
        status=attempt.status, reason=attempt.reason, world_size=search_.world,
        peak_mem_bytes=metrics.peak_mem_bytes if ok else None, baseline_mem_bytes=metrics.baseline_mem_bytes,
        predicted_mem_bytes=search_.predict(m), capacity_bytes=search_.capacity,
        step_s=metrics.step_ms_median / 1e3 if ok else None,
        tokens_per_s=metrics.tokens_per_s if ok else None,
        tflops_per_device=metrics.tflops_per_device if ok else None,
        run_id=run and run.run_id, ds_config=run and run.ds_config, log=attempt.log,
        wall_s=round(attempt.job.ended_at - attempt.job.started_at, 2),
        busy=Busy(**attempt.busy) if attempt.busy is not None else None, **slurm_block(attempt.slurm),
        time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def probe_line(record: CapacityProbeRecord, capacity: int) -> str:
    head = f"{record.layout:<28} {record.member:<18} {record.params / 1e6:9.1f}M"
    if record.status == "ok":
        over = f" {ABOVE_CAP_NOTE}" if above_cap(record.peak_mem_bytes, capacity) else ""
        return f"{head}  ok   peak {record.peak_mem_bytes / 2**30:.2f} of {capacity / 2**30:.2f} GiB{over}"
    return f"{head}  {record.status}: {(record.reason or '-').splitlines()[0][:100]}"


def _member(m: Member, probe: CapacityProbeRecord | None, predicted: int | None = None) -> CapacityMember:
    """A member as the ``capacity`` record names it, with its probe's figures (None where it was not run but
    ``predicted``, the prediction that kept it from running)."""
    seq = {"seq_len": m.seq_len} if m.seq_len else {}
    if probe is None:
        return CapacityMember(member=m.name, params=m.params, status=None, peak_mem_bytes=None,
                              predicted_mem_bytes=predicted, step_s=None, tokens_per_s=None, tflops_per_device=None,
                              run_id=None, **seq)
    return CapacityMember(member=m.name, **seq, params=probe.params or m.params, status=probe.status,
                          peak_mem_bytes=probe.peak_mem_bytes, predicted_mem_bytes=probe.predicted_mem_bytes,
                          step_s=probe.step_s, tokens_per_s=probe.tokens_per_s,
                          tflops_per_device=probe.tflops_per_device, run_id=probe.run_id)

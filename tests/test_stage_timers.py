"""Per-stage pipeline timers (``ds_bench.measure.stage_timers``) on inline inputs: the instruction handlers wrapped
on the engine instance only, a step's instructions summed per timer, measured steps only, the medians, the
measured bubble, the reduction over a stage's ranks, and the summary's timers line. The real 2-rank run's
timers are checked in ``tests/test_pipeline.py``."""

from types import MethodType

import pytest
import torch

from ds_bench.measure.loop import LoopTimes, run_loop
from ds_bench.measure.metrics import RankReport
from ds_bench.measure.stage_timers import TIMERS, StageTimers, per_stage, stage_times
from ds_bench.record.schema import RunRecord
from ds_bench.report import summary
from ds_bench.report.degree_lines import degree_lines


class FakeClock:
    """Host time that moves only when an instruction says so."""

    def __init__(self):
        self.now = 0.0

    def mark(self):
        return [self.now]

    def seconds(self, start, end):
        return end[0] - start[0]


def instruction(name: str):
    return type(name, (), {})


LOAD, FORWARD, SEND, BACKWARD, RECV, OPTIMIZER = (instruction(n) for n in (
    "LoadMicroBatch", "ForwardPass", "SendActivation", "BackwardPass", "RecvGrad", "OptimizerStep"))
COST = {LOAD: 0.001, FORWARD: 0.010, SEND: 0.002, BACKWARD: 0.020, RECV: 0.005, OPTIMIZER: 0.003}


def _handler(kind):
    def handler(self, buffer_id=0):
        self.clock.now += COST[kind]
        self.ran.append((kind.__name__, buffer_id))
    return handler


class FakeScheduledEngine:
    """Runs a first stage's schedule as ``PipelineEngine._exec_schedule`` does: each handler looked up in
    ``self._INSTRUCTION_MAP`` and bound to the engine."""

    _INSTRUCTION_MAP = {kind: _handler(kind) for kind in COST}
    stage_id = 0

    def __init__(self, clock, micro_batches=2):
        self.clock, self.micro_batches, self.ran = clock, micro_batches, []

    def train_batch(self, data_iter):
        schedule = [(kind, {"buffer_id": i}) for i in range(self.micro_batches) for kind in (LOAD, FORWARD, SEND)]
        schedule += [(kind, {"buffer_id": i}) for i in range(self.micro_batches) for kind in (RECV, BACKWARD)]
        for kind, kwargs in schedule + [(OPTIMIZER, {})]:
            MethodType(self._INSTRUCTION_MAP[kind], self)(**kwargs)
        self.clock.now += 0.004  # outside any instruction: the loss broadcast
        return torch.tensor(1.0)


def test_instructions_are_timed_on_the_engine_instance_only():
    clock = FakeClock()
    engine = FakeScheduledEngine(clock)
    timers = StageTimers(engine, clock)
    assert FakeScheduledEngine._INSTRUCTION_MAP[FORWARD] is not engine._INSTRUCTION_MAP[FORWARD]
    timers.begin()
    engine.train_batch(None)
    got = timers.read()
    assert set(got) == set(TIMERS) and timers.stage == 0
    assert got["forward_compute"] == pytest.approx(0.020) and got["backward_compute"] == pytest.approx(0.040)
    assert got["forward_send"] == pytest.approx(0.004) and got["backward_recv"] == pytest.approx(0.010)
    assert got["batch_load"] == pytest.approx(0.002) and got["optimizer"] == pytest.approx(0.003)
    assert got["forward_recv"] == got["grads_all_reduce"] == 0.0
    assert ("ForwardPass", 1) in engine.ran  # the handlers still get their arguments
    timers.begin()
    assert timers.read()["forward_compute"] == 0.0


def test_the_loop_keeps_the_measured_steps_timers():
    clock = FakeClock()
    engine = FakeScheduledEngine(clock)
    times = LoopTimes()
    run_loop(engine, None, iter(()), steps=5, warmup=2, grad_accum=2, float_dtype=torch.float32, sync=lambda: None,
             barrier=lambda: None, times=times, pipeline=True, stage_timers=StageTimers(engine, clock))
    assert times.pipeline_stage == 0 and set(times.stage_s) == set(TIMERS)
    assert times.stage_s["forward_compute"] == pytest.approx([0.020] * 3)  # warm-up excluded


def test_stage_times_medians_other_and_bubble():
    step_s = [0.100, 0.100, 0.300]
    timers = {"forward_compute": [0.020, 0.030, 0.020], "backward_compute": [0.030, 0.020, 0.130],
              "backward_recv": [0.040, 0.040, 0.100]}
    times, bubble = stage_times(step_s, timers)
    assert times["forward_compute"] == pytest.approx(20.0) and times["backward_compute"] == pytest.approx(30.0)
    assert times["step"] == pytest.approx(100.0) and times["other"] == pytest.approx(10.0)  # 10, 10, 50 ms
    assert bubble == pytest.approx(0.5)  # 1 - 50/100, 1 - 50/100, 1 - 150/300


def test_stage_times_bubble_is_zero_when_the_step_is_all_compute():
    _, bubble = stage_times([0.1, 0.2], {"forward_compute": [0.04, 0.08], "backward_compute": [0.06, 0.12]})
    assert bubble == pytest.approx(0.0)


def _report(rank: int, stage: int, forward: float, rss: int) -> RankReport:
    return RankReport(rank=rank, host="n1", step_s=[0.1], phase_s={}, losses=[1.0], peak_mem={"rss": rss},
                      pipeline_stage=stage, stage_s={name: [0.0] for name in TIMERS} | {"forward_compute": [forward]})


def test_per_stage_takes_the_first_data_parallel_rank_and_the_largest_peak():
    reports = [_report(3, 1, 0.04, 7), _report(0, 0, 0.01, 5), _report(1, 0, 0.02, 6), _report(2, 1, 0.03, 8)]
    layout = [{"stage": 0, "params": 10}, {"stage": 1, "params": 12}]
    stages = per_stage(reports, layout)
    assert [(s["stage"], s["rank"], s["peak_mem_bytes"]) for s in stages] == [(0, 0, 6), (1, 2, 8)]
    assert [s["times_ms"]["forward_compute"] for s in stages] == pytest.approx([10.0, 30.0])
    assert [s["bubble"] for s in stages] == pytest.approx([0.9, 0.7])
    assert per_stage([], layout) == layout  # no timers (a run from before them): the layout as it was


def test_summary_prints_a_timers_line_per_stage():
    times = dict.fromkeys(TIMERS, 1.0) | {"forward_compute": 120.3, "backward_compute": 240.1, "other": 0.5,
                                          "step": 500.0}
    stage = {"stage": 1, "layers": [8, 16], "blocks": [6, 11], "n_blocks": 6, "params": 81_100_000,
             "unique_params": 42_000_000, "build_s": 1.0, "rank": 1, "times_ms": times, "bubble": 0.18,
             "peak_mem_bytes": int(1.2 * 2**30)}
    old = {key: stage[key] for key in ("stage", "layers", "blocks", "n_blocks", "params", "unique_params", "build_s")}
    record = RunRecord(workload="gpt2", pipeline_stages=2, data_parallel_size=1, micro_batches=4,
                       partition="parameters", schedule_bubble=0.2, pipeline_layout=[stage, old])  # an old record's keys
    assert degree_lines(record) == ["  pp           pp2, 4 micro-batches per step, partition parameters, schedule "
                                    "bubble (P-1)/(m+P-1) = 20%"]
    new_line, old_line = (summary.stage_line(s, record.setting("schedule_bubble")) for s in record.pipeline_layout)
    assert new_line == ("    stage 1 (rank 1, blocks 6-11, 81.10M params): forward-compute 120.3 | forward-recv 1.0 | "
                        "forward-send 1.0 | backward-compute 240.1 | backward-recv 1.0 | backward-send 1.0 | "
                        "backward-embedding-all-reduce 1.0 | backward-params-all-reduce 1.0 | optimizer 1.0 | "
                        "batch-generator 1.0 | other 0.5 of a 500.0 ms step; bubble 18% (schedule 20%); peak 1.20 GiB")
    assert old_line == "    stage 1    layers 8-15, blocks 6-11, 81.10M parameters, built in 1.00 s"

"""The training loop's timing modes on a counting stub: how often it waits for the device, and that
the phase breakdown, compute time and outside clock come out of either mode."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from ds_bench.measure.loop import PHASES, DeviceClock, LoopTimes, run_loop, timing


class Engine:
    device = torch.device("cpu")

    def __init__(self):
        self.w = torch.ones(512, 512, requires_grad=True)
        self.steps = 0

    def backward(self, loss):
        loss.backward()

    def step(self):
        self.steps += 1


class Workload:
    def loss(self, engine, batch):
        return (batch["x"] @ engine.w).square().mean()


def batches():
    return ({"x": torch.randn(512, 512)} for _ in itertools.count())  # ~ms steps: bookkeeping is small beside them


def loop(breakdown: bool, steps=6, warmup=2, grad_accum=3):
    calls = {"sync": 0, "barrier": 0}
    times = LoopTimes()
    engine = Engine()
    run_loop(engine, Workload(), batches(), steps=steps, warmup=warmup, grad_accum=grad_accum,
             float_dtype=torch.float32, sync=lambda: calls.__setitem__("sync", calls["sync"] + 1),
             barrier=lambda: calls.__setitem__("barrier", calls["barrier"] + 1), times=times,
             clock=DeviceClock(torch.device("cpu")), breakdown=breakdown)
    return calls, times, engine


def test_default_mode_synchronizes_once_per_step():
    calls, times, engine = loop(breakdown=False)
    assert calls == {"sync": 6 + 1, "barrier": 2}  # one per step, one before the opening barrier; open + close
    assert timing(False, 3) == {"timing_mode": "step", "syncs_per_step": 1}  # what the record says
    assert engine.steps == 6 * 3 and len(times.step_s) == 4 and times.steps_done == 6


def test_breakdown_mode_synchronizes_after_every_phase():
    calls, times, _ = loop(breakdown=True)
    assert calls == {"sync": 6 * 3 * 4 + 1, "barrier": 2}  # 4 phases x 3 micro-steps per step
    assert timing(True, 3) == {"timing_mode": "breakdown", "syncs_per_step": 4 * 3}


# Seconds each phase moves the clock on by (a patched ``time.perf_counter``): no real time, so the figures are
# exact whatever else the machine is doing. The backward's is spent before autograd runs, so compute time
# (forward to autograd's end) holds forward and backward.
PHASE_TICKS = {"data": 10.0, "forward": 20.0, "backward": 40.0, "optimizer": 80.0}


@pytest.mark.parametrize("breakdown", [False, True])
def test_phases_compute_and_window_are_measured_in_both_modes(breakdown, monkeypatch):
    """Each phase's time is its own (named right, summed over the 3 micro-steps), the phases tile the step,
    compute time is forward plus backward, and the window is the measured steps' sum."""
    real, offset = time.perf_counter, [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: real() + offset[0])

    def tick(phase):
        offset[0] += PHASE_TICKS[phase]

    class TickingEngine(Engine):
        def backward(self, loss):
            tick("backward")
            super().backward(loss)

        def step(self):
            tick("optimizer")
            super().step()

    class TickingWorkload(Workload):
        def loss(self, engine, batch):
            tick("forward")
            return super().loss(engine, batch)

    def ticking_batches():
        for batch in batches():
            tick("data")
            yield batch

    times = LoopTimes()
    run_loop(TickingEngine(), TickingWorkload(), ticking_batches(), steps=6, warmup=2, grad_accum=3,
             float_dtype=torch.float32, sync=lambda: None, barrier=lambda: None, times=times,
             clock=DeviceClock(torch.device("cpu")), breakdown=breakdown)
    real_slack = 3.0  # the stub's real work: milliseconds, up to ~0.5 s a step on a loaded machine
    step_ticks = 3 * sum(PHASE_TICKS.values())
    assert len(times.step_s) == 4
    for i, step in enumerate(times.step_s):
        for name, seconds in PHASE_TICKS.items():
            assert times.phase_s[name][i] == pytest.approx(3 * seconds, abs=real_slack), (name, times.phase_s)
        assert step == pytest.approx(step_ticks, abs=real_slack)
        assert 0 <= step - sum(times.phase_s[name][i] for name in PHASES) < 0.5  # nothing outside a phase
        assert times.compute_s[i] == pytest.approx(3 * (PHASE_TICKS["forward"] + PHASE_TICKS["backward"]),
                                                   abs=real_slack)
    assert times.window_s == pytest.approx(4 * step_ticks, abs=real_slack) and sum(times.step_s) <= times.window_s


def test_no_measured_step_leaves_the_window_unmeasured():
    calls, times, _ = loop(breakdown=False, steps=2, warmup=2)
    assert times.window_s == 0.0 and calls == {"sync": 2, "barrier": 0}


def test_after_step_time_is_in_no_step_and_out_of_the_window(monkeypatch):
    """What the caller does between steps (checkpoint saves) is excluded: no step holds it, and the
    window is the steps' sum again once ``excluded_s`` is taken out. The callback moves the clock
    on by 10 s (a long save) and each optimizer step by 5 s, without taking real time, so a busy machine
    cannot blur the test: the loop's real bookkeeping between steps (ms; CI once saw it 13% of a window of
    ms-long real steps) is small beside 5 s steps."""
    real, offset, done = time.perf_counter, [0.0], []
    monkeypatch.setattr(time, "perf_counter", lambda: real() + offset[0])

    class FiveSecondStep(Engine):
        def step(self):
            offset[0] += 5.0
            super().step()

    times = LoopTimes()
    run_loop(FiveSecondStep(), Workload(), batches(), steps=5, warmup=1, grad_accum=1, float_dtype=torch.float32,
             sync=lambda: None, barrier=lambda: None, times=times,
             after_step=lambda n: (done.append(n), offset.__setitem__(0, offset[0] + 10.0)))
    assert done == [1, 2, 3, 4, 5]
    assert max(times.step_s) < 10
    assert times.excluded_s == pytest.approx(4 * 10.0, abs=1.0)  # after steps 2..5: inside the window
    assert sum(times.step_s) <= times.window_s and sum(times.step_s) == pytest.approx(times.window_s, rel=0.05)

"""Metric reductions on inline per-rank measurements."""

import pytest

from ds_bench.measure.metrics import RankReport, summarize
from ds_bench.workloads.base import shard_epochs


def report(rank, steps, losses, rss):
    phases = {"data": [0.001] * len(steps), "forward": [s / 2 for s in steps]}
    return RankReport(rank=rank, host=f"h{rank}", step_s=steps, phase_s=phases, losses=losses, peak_mem={"rss": rss})


def test_straggler_sets_the_step_time_and_throughput():
    reports = [report(0, [0.10, 0.10, 0.10, 0.10], [2.0, 1.0], 100),
               report(1, [0.10, 0.20, 0.10, 0.30], [4.0, 3.0], 300)]
    m = summarize(reports, train_batch_size=64)
    assert m["steps_measured"] == 4
    assert m["step_ms_median"] == pytest.approx(150.0)  # per-step max: .1 .2 .1 .3
    assert m["step_ms_p90"] == pytest.approx(270.0)      # linear interpolation
    assert m["samples_per_s"] == pytest.approx(64 * 4 / 0.7)
    assert m["samples_per_s_per_device"] == pytest.approx(64 * 4 / 0.7 / 2)
    assert m["peak_mem_bytes"] == 300 and m["peak_mem_bytes_mean"] == 200
    assert (m["loss_first"], m["loss_last"]) == (3.0, 2.0)
    assert m["breakdown_ms_median"]["forward"] == pytest.approx(75.0)


def test_shards_are_disjoint_and_cover_equal_halves():
    a = next(shard_epochs(10, 0, 2, 5, seed=1))
    b = next(shard_epochs(10, 1, 2, 5, seed=1))
    assert len(a) == len(b) == 5 and not set(a.tolist()) & set(b.tolist())

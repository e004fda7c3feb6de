"""Where a study job's wall time goes (``ds_bench.jobs.point_time``), the sweep summary's table of it
(``ds_bench.report.point_cost``) and a study's default launcher (``ds_bench.jobs.flags.default_launcher``), on
inline records. The real sweeps that print the table: tests/test_distributed.py."""

from __future__ import annotations

import pytest

from ds_bench.jobs.flags import default_launcher
from ds_bench.jobs.point_time import PHASES, split
from ds_bench.record.schema import PointTime, RunRecord, SweepPointRecord
from ds_bench.report.point_cost import median_split, point_cost

STARTED = 1_000.0
"""The job's launch (Unix s); rank 0's process starts 1.5 s later."""
STARTUP = {"process_started_at": STARTED + 1.5, "imports_s": 2.0, "prepare_s": 0.3, "ops_s": 0.1,
           "process_group_s": 0.4, "libraries_s": 2.5, "model_build_s": 0.05, "engine_s": 0.2, "data_s": 0.01,
           "compile_s": None, "warmup_s": 1.0, "other_s": 0.04, "total_s": 6.6}


def run(window_s: float = 3.0, **startup) -> RunRecord:
    return RunRecord(workload="mnist", status="ok", run_id="r", startup={**STARTUP, **startup},
                     metrics={"window_wall_s": window_s})


def test_the_split_adds_up_to_the_job_s_wall_time():
    ended = STARTED + 1.5 + 6.6 + 3.0 + 0.7
    t = split(run(), STARTED, ended)
    assert t["launcher_s"] == pytest.approx(1.5) and t["exit_s"] == pytest.approx(0.7)
    assert t["build_s"] == pytest.approx(0.05 + 0.2 + 0.01 + 0.04) and t["warmup_s"] == 1.0 and t["measured_s"] == 3.0
    assert sum(v for k, v in t.items() if k != "wall_s") == pytest.approx(t["wall_s"]) == pytest.approx(ended - STARTED)
    assert list(t)[:-1] == [f"{p}_s" for p in PHASES] and set(t) == set(PointTime.model_fields)


def test_compile_time_counts_as_warm_up():
    t = split(run(compile_s=4.0), STARTED, STARTED + 20)
    assert t["warmup_s"] == 5.0


@pytest.mark.parametrize("missing", ["process_started_at", "total_s"])
def test_no_split_without_the_run_s_marks(missing):
    assert split(run(**{missing: None}), STARTED, STARTED + 20) is None
    assert split(None, STARTED, STARTED + 20) is None
    assert split(run(), None, None) is None


def point(wall: float, measured: float) -> SweepPointRecord:
    return SweepPointRecord(kind="sweep_point", sweep="s", key=f"k{wall}", status="ok",
                            time_split=PointTime(launcher_s=1.0, imports_s=2.0, measured_s=measured,
                                                 exit_s=wall - 3.0 - measured, wall_s=wall))


def test_the_summary_shows_each_phase_s_median_and_the_measured_share():
    points = [point(10.0, 2.0), point(12.0, 4.0), point(20.0, 6.0), SweepPointRecord(kind="sweep_point", sweep="s",
                                                                                    key="failed", status="crashed")]
    medians = median_split(points)
    assert medians == {"launcher": 1.0, "imports": 2.0, "measured": 4.0, "exit": 5.0, "wall": 12.0}
    heading, header, _, row = point_cost(points).splitlines()
    assert "median over 3 ok point(s)" in heading and "wall 10.0-20.0 s each, 42 s in all" in heading
    assert "29% of it in measured steps" in heading  # 12 / 42
    assert header.split() == ["launcher", "imports", "measured", "exit", "wall"]
    assert row.split() == ["1.0", "2.0", "4.0", "5.0", "12.0"]
    assert point_cost(points[3:]) is None


def test_a_study_starts_its_jobs_with_torchrun_on_one_node_and_the_deepspeed_launcher_on_a_hostfile():
    assert default_launcher(None) == "torchrun"
    assert default_launcher("hostfiles/two_nodes") == "deepspeed"

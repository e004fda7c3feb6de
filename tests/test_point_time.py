"""Where a study job's wall time goes (``ds_bench.jobs.point_time``), the sweep summary's table of it
(``ds_bench.report.point_cost``) and a study's default launcher (``ds_bench.config.study_flags.default_launcher``), on
inline records. The real sweeps that print the table: tests/test_distributed.py."""

from __future__ import annotations

import pytest

from ds_bench.config.study_flags import default_launcher
from ds_bench.jobs.spawn import rank_threads
from ds_bench.run.startup import process_start
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
    assert "median over 3 ok attempt(s)" in heading and "wall 10.0-20.0 s each, 42 s in all" in heading
    assert "29% of it in measured steps" in heading  # 12 / 42
    assert header.split() == ["launcher", "imports", "measured", "exit", "wall"]
    assert row.split() == ["1.0", "2.0", "4.0", "5.0", "12.0"]
    assert point_cost(points[3:]) is None


def test_a_study_starts_its_jobs_with_torchrun_on_one_node_and_the_deepspeed_launcher_on_a_hostfile():
    assert default_launcher(None) == "torchrun"
    assert default_launcher("hostfiles/two_nodes") == "deepspeed"
    assert default_launcher(None, "slurm") == "srun"


def test_torchrun_ranks_get_their_share_of_the_cores_not_torchrun_s_one_thread():
    assert rank_threads({}, "torchrun", 64, 8) == "8"
    assert rank_threads({}, "torchrun", 2, 2) == "1" and rank_threads({}, "torchrun", 3, 8) == "1"
    assert rank_threads({"OMP_NUM_THREADS": "4"}, "torchrun", 64, 8) is None  # the user's setting stays
    assert rank_threads({}, "deepspeed", 64, 8) is None  # the ranks take cores // ranks themselves


def test_a_process_start_is_read_to_the_tick_not_to_the_boot_time_s_whole_second(tmp_path):
    import psutil

    ours, coarse = process_start(), psutil.Process().create_time()
    assert coarse <= ours + 0.02 and ours - coarse < 1.0  # psutil's btime is whole seconds, truncated
    assert process_start(str(tmp_path / "none")) == coarse  # no /proc: psutil's


def test_a_torchrun_job_is_started_with_its_ranks_threads(tmp_path, monkeypatch):
    """What ``runner.run_attempt`` hands the job it starts under torchrun (the job itself stubbed: the real sweeps
    are tests/test_distributed.py's)."""
    import argparse
    import os

    from ds_bench.jobs import runner, spawn

    started = {}

    def job(argv, log_path, timeout_s, env=None):
        started.update(argv=argv, env=env)
        return spawn.JobEnd(0, False, 0.0, 1.0)

    monkeypatch.setattr(spawn, "run_job", job)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    spec = argparse.Namespace(launcher="torchrun", nproc=2, hostfile=None, iface=None, master_port=29500,
                              timeout_s=60.0, slurm=None, runs_path=str(tmp_path / "r.runs.jsonl"))
    runner.run_attempt(spec, ["run", "--workload", "mnist"], "t", str(tmp_path / "log"))
    assert "torchrun" in started["argv"][0]
    assert started["env"]["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))

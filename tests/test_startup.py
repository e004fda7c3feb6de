"""The start-up breakdown of a run (``ds_bench.run.startup``): pure on inline marks; a real run's is
checked in tests/test_distributed.py."""

from __future__ import annotations

import pytest

from ds_bench.record.run_schema import StartUp
from ds_bench.report.summary import startup_line
from ds_bench.run import startup


def test_phases_are_the_marks_and_other_is_what_lies_between():
    marks = {"process_started_at": 100.0, "entered_at": 102.0, "prepare_s": 0.5, "ops_s": 0.25,
             "process_group_s": 0.25, "libraries_s": 1.0, "data_s": 0.5, "window_open_at": 110.0}
    out = startup.breakdown(marks, {"model_s": 1.0, "engine_s": 0.5}, loop_started_at=108.0)
    assert out == {"process_started_at": 100.0, "imports_s": 2.0, "prepare_s": 0.5, "ops_s": 0.25, "process_group_s": 0.25, "libraries_s": 1.0,
                   "model_build_s": 1.0, "engine_s": 0.5, "data_s": 0.5, "compile_s": None, "warmup_s": 2.0,
                   "total_s": 10.0, "other_s": 2.0}
    line = startup_line(StartUp(**out))
    assert line.startswith("10.0 s to the first measured step: imports 2.00, prepare 0.50") and "other 2.00" in line
    assert "compile" not in line


def test_a_compiled_run_takes_its_compile_out_of_the_warm_up():
    marks = {"process_started_at": 100.0, "entered_at": 102.0, "compile_s": 1.5, "window_open_at": 110.0}
    out = startup.breakdown(marks, None, loop_started_at=108.0)
    assert (out["compile_s"], out["warmup_s"]) == (1.5, 0.5)
    assert out["other_s"] == pytest.approx(10.0 - 2.0 - 1.5 - 0.5)
    assert "compile 1.50, warm-up 0.50" in startup_line(StartUp(**out))


def test_a_pipeline_run_has_no_whole_model_build_and_a_failed_start_no_total():
    marks = {"process_started_at": 100.0, "entered_at": 101.0, "window_open_at": 104.0}
    out = startup.breakdown(marks, None, loop_started_at=103.0)
    assert out["model_build_s"] is None and out["warmup_s"] == 1.0
    assert out["other_s"] == pytest.approx(4.0 - 1.0 - 1.0)  # total 4 s less imports and warm-up
    assert startup.breakdown({"entered_at": 5.0}, None, 6.0)["total_s"] is None

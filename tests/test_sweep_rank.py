"""The sweep's verdict on inline records (pure): rows per point, ranking, recommendation, table,
CSV, Pareto front and figures."""

from __future__ import annotations

import csv
import os
import statistics

import pytest

from ds_bench.config.layout import Layout
from ds_bench.jobs.outcome import was_busy
from ds_bench.record.schema import Record, SweepPointRecord
from ds_bench.report.ranking import GIB, rank, recommendation_line, summarize_points
from ds_bench.report.sweep_plots import pareto_front, write_plots
from ds_bench.report.sweep_table import NOTE_CHARS, brief, markdown, terminal, write_csv

CAP = 80 * GIB


def rec(stage=2, offload="none", precision="bf16", mbs=8, *, repeat=0, status="ok", tput=1000.0,
        peak=40 * GIB, predicted=None, capacity=CAP, reason=None, busy=None, grad_accum=1, **extra) -> SweepPointRecord:
    point = Layout(stage, offload, precision, mbs, grad_accum)
    ok = status == "ok"
    return SweepPointRecord.model_validate({"kind": "sweep_point", "sweep": "s1", "key": point.key, "point": point.to_dict(),
            "repeat": repeat, "status": status, "reason": reason, "workload": "gpt2", "size": "tiny",
            "world_size": 2, "unit": "tokens/s", "throughput": tput if ok else None,
            "peak_mem_bytes": peak if ok else None, "predicted_mem_bytes": predicted, "capacity_bytes": capacity,
            "run_id": f"run-{point.key}-{repeat}", "ds_config": {"mbs": mbs, "repeat": repeat},
            "log": f"logs/{repeat}.log", "wall_s": 10.0, "time": "2026-01-01T00:00:00",
            "busy": busy or {"load_before": 0.1, "load_after": 0.2, "other_cores": 0.0, "gpu_others": []},
            **extra})


def repeats(tputs, **kw) -> list[SweepPointRecord]:
    return [rec(repeat=i, tput=t, **kw) for i, t in enumerate(tputs)]


def by_key(rows):
    return {r.key: r for r in rows}


# summarize_points

def test_latest_record_per_key_and_repeat_wins():
    records = [rec(repeat=0, status="timeout", reason="no step in 600 s"), rec(repeat=1, tput=900.0),
               rec(repeat=0, tput=1100.0)]
    (row,) = summarize_points(records)
    assert row.repeats == 2 and row.repeats_ok == 2
    assert row.status == "ok" and row.reason is None
    assert row.throughput_min == 900.0 and row.throughput_max == 1100.0


def test_a_failed_rerun_supersedes_an_ok_attempt():
    (row,) = summarize_points([rec(tput=1000.0), rec(status="crashed", reason="segfault")])
    assert row.status == "crashed" and row.reason == "segfault" and row.throughput_median is None


def test_median_min_max_and_sample_cv():
    (row,) = summarize_points(repeats([100.0, 110.0, 90.0]))
    assert row.throughput_median == 100.0
    assert (row.throughput_min, row.throughput_max) == (90.0, 110.0)
    assert row.cv_pct == pytest.approx(statistics.stdev([100, 110, 90]) / 100 * 100)  # 10.0: sample std
    assert row.cv_pct == pytest.approx(10.0)
    assert row.noisy


def test_one_repeat_has_no_cv_and_is_not_noisy():
    (row,) = summarize_points([rec(tput=500.0)])
    assert row.cv_pct is None and not row.noisy and row.throughput_median == 500.0


def test_quiet_repeats_are_not_noisy():
    (row,) = summarize_points(repeats([1000.0, 1010.0, 990.0]))
    assert row.cv_pct == pytest.approx(1.0) and not row.noisy


def test_status_ok_when_any_repeat_ok_with_the_failure_noted():
    (row,) = summarize_points([rec(repeat=0, tput=1000.0), rec(repeat=1, status="oom", reason="CUDA OOM")])
    assert row.status == "ok" and row.repeats_ok == 1
    assert "1 of 2 repeats oom" in row.reason and "CUDA OOM" in row.reason


def test_memory_headroom_ratio_and_median_repeat_config():
    records = [rec(repeat=0, tput=100.0, peak=60 * GIB, predicted=66 * GIB),
               rec(repeat=1, tput=120.0, peak=50 * GIB, predicted=66 * GIB),
               rec(repeat=2, tput=110.0, peak=55 * GIB, predicted=66 * GIB)]
    (row,) = summarize_points(records)
    assert row.peak_mem_bytes == 60 * GIB  # max over ok repeats
    assert row.headroom_pct == pytest.approx(25.0)  # (80 - 60) / 80
    assert row.prediction_ratio == pytest.approx(1.1)
    assert row.ds_config == {"mbs": 8, "repeat": 2} and row.log == "logs/2.log"  # the median repeat's


def test_unknown_capacity_leaves_headroom_unknown():
    (row,) = summarize_points([rec(capacity=None)])
    assert row.headroom_pct is None and row.prediction_ratio is None


def test_was_busy():
    quiet = {"load_before": 0.5, "load_after": 0.5, "other_cores": 0.1, "gpu_others": []}
    assert not was_busy(rec(busy=quiet), cores=2)
    assert was_busy(rec(busy={**quiet, "other_cores": 0.5}), cores=2)
    assert was_busy(rec(busy={**quiet, "gpu_others": [{"pid": 7}]}), cores=2)
    assert was_busy(rec(busy={**quiet, "load_before": 2.0, "other_cores": None}), cores=2)
    # the study's own previous job keeps the 1-minute load up; the CPU others used is the evidence
    assert not was_busy(rec(busy={**quiet, "load_before": 2.0, "other_cores": 0.01}), cores=2)
    assert not was_busy(rec(busy={**quiet, "load_before": 2.0}))  # cores unknown: load not judged
    assert not was_busy(SweepPointRecord(kind="sweep_point", sweep="s1", key="k", status="ok"), cores=2)
    rows = summarize_points([rec(repeat=0), rec(repeat=1, busy={**quiet, "other_cores": 1.5})], cores=2)
    assert rows[0].busy


def test_other_record_kinds_are_ignored_and_key_order_kept():
    rows = summarize_points([rec(mbs=4), Record.model_validate({"kind": "sweep_start", "sweep": "s1"}), rec(mbs=2), rec(mbs=4, repeat=1)])
    assert [r.point.micro_batch for r in rows] == [4, 2]


# rank

def mixed_rows():
    return summarize_points([
        *repeats([500.0, 505.0], stage=0, mbs=4),
        rec(stage=0, mbs=16, status="oom", reason="CUDA out of memory"),
        *repeats([1000.0, 1001.0], stage=2, mbs=8),
        rec(stage=3, offload="all", mbs=8, status="timeout", reason="no step in 600 s"),
        *repeats([700.0, 702.0], stage=1, mbs=8),
        rec(stage=1, offload="all", mbs=8, status="skipped", reason="parameter offload needs ZeRO stage 3"),
    ])


def test_ok_rows_by_throughput_then_failures_keeping_reasons():
    ranking = rank(mixed_rows())
    assert [r.key for r in ranking.rows] == [
        "z2 off=none bf16 mbs=8", "z1 off=none bf16 mbs=8", "z0 off=none bf16 mbs=4",
        "z0 off=none bf16 mbs=16", "z3 off=all bf16 mbs=8", "z1 off=all bf16 mbs=8"]
    assert [r.reason for r in ranking.rows[3:]] == [
        "CUDA out of memory", "no step in 600 s", "parameter offload needs ZeRO stage 3"]
    assert [ranking.label(r) for r in ranking.rows] == ["1", "2", "3", "-", "-", "-"]


def test_default_baseline_is_the_fastest_plain_data_parallel_point_and_diffs_are_relative():
    rows = mixed_rows() + summarize_points([rec(stage=0, mbs=2, tput=400.0)])
    ranking = rank(rows)
    assert ranking.baseline.key == "z0 off=none bf16 mbs=4"
    diffs = {r.key: ranking.diff_pct(r) for r in ranking.rows}
    assert diffs["z2 off=none bf16 mbs=8"] == pytest.approx((1000.5 - 502.5) / 502.5 * 100)
    assert diffs["z0 off=none bf16 mbs=4"] == 0.0
    assert diffs["z0 off=none bf16 mbs=2"] == pytest.approx((400 - 502.5) / 502.5 * 100)
    assert diffs["z0 off=none bf16 mbs=16"] is None


def test_explicit_baseline_and_an_unknown_one():
    ranking = rank(mixed_rows(), baseline_key="z1 off=none bf16 mbs=8")
    assert ranking.diff_pct(ranking.rows[0]) == pytest.approx((1000.5 - 701.0) / 701.0 * 100)
    with pytest.raises(ValueError, match="'z9 off=none bf16 mbs=1' is not a point.*z2 off=none bf16 mbs=8"):
        rank(mixed_rows(), baseline_key="z9 off=none bf16 mbs=1")


def test_no_plain_point_no_baseline_no_diff():
    ranking = rank(summarize_points([rec(stage=2, tput=100.0), rec(stage=3, tput=90.0)]))
    assert ranking.baseline is None and ranking.diff_pct(ranking.rows[0]) is None


def test_recommendation_skips_a_point_with_too_little_headroom():
    rows = summarize_points([rec(stage=1, tput=2000.0, peak=75 * GIB),  # 6% headroom
                             rec(stage=2, tput=1500.0, peak=60 * GIB),
                             rec(stage=3, tput=1000.0, peak=30 * GIB)])
    ranking = rank(rows)
    assert ranking.rows[0].key.startswith("z1") and ranking.recommended.key.startswith("z2")
    assert ranking.why is None
    assert rank(rows, headroom_pct=5.0).recommended.key.startswith("z1")


def test_unknown_headroom_counts_as_fitting():
    ranking = rank(summarize_points([rec(tput=2000.0, capacity=None), rec(stage=3, tput=10.0)]))
    assert ranking.recommended.key.startswith("z2")


def test_points_within_noise_are_equal_to_the_winner():
    rows = summarize_points([*repeats([1000.0, 1002.0, 998.0], stage=2),
                             *repeats([985.0, 987.0, 983.0], stage=1),  # 1.5% slower: inside 2%
                             *repeats([900.0, 901.0, 899.0], stage=3)])
    ranking = rank(rows)
    assert ranking.recommended.key.startswith("z2")
    assert [r.key for r in ranking.equal] == ["z1 off=none bf16 mbs=8"]
    assert [ranking.label(r) for r in ranking.rows] == ["=1", "=1", "3"]
    assert recommendation_line(ranking, "tokens/s").endswith("; equal within noise: z1 off=none bf16 mbs=8")


def test_a_clear_winner_outside_the_noise_band():
    rows = summarize_points([*repeats([1000.0, 1002.0, 998.0], stage=2),
                             *repeats([950.0, 951.0, 949.0], stage=1)])  # 5% slower, spreads < 1%
    ranking = rank(rows)
    assert ranking.equal == [] and [ranking.label(r) for r in ranking.rows] == ["1", "2"]
    assert "equal within noise" not in recommendation_line(ranking, "tokens/s")


def test_a_wide_spread_widens_the_noise_band():
    rows = summarize_points([*repeats([1000.0, 1002.0, 998.0], stage=2),
                             *repeats([950.0, 1010.0, 890.0], stage=1)])  # spread 12.6%: 5% is noise
    assert [r.key for r in rank(rows).equal] == ["z1 off=none bf16 mbs=8"]


def test_recommendation_line():
    tputs = [41230.0, 41000.0, 41500.0]
    rows = summarize_points([rec(repeat=i, tput=t, peak=int(61.2 * GIB)) for i, t in enumerate(tputs)])
    line = recommendation_line(rank(rows), "tokens/s")
    cv = statistics.stdev(tputs) / statistics.mean(tputs) * 100
    assert line == (f"recommended: z2 off=none bf16 mbs=8  41,230 tokens/s (median of 3, CV {cv:.1f}%), "
                    "peak 61.2 GiB of 80.0 GiB (24% headroom)")


def test_recommendation_line_for_none():
    failed = summarize_points([rec(status="oom", reason="CUDA OOM"), rec(stage=3, status="skipped", reason="x")])
    assert recommendation_line(rank(failed), "tokens/s") == "recommended: none (no point ran ok)"
    tight = summarize_points([rec(peak=79 * GIB)])
    assert recommendation_line(rank(tight), "tokens/s") == "recommended: none (no ok point leaves 10% headroom)"
    assert rank([]).recommended is None


# pareto front

def test_pareto_front():
    rows = summarize_points([rec(stage=0, tput=100.0, peak=10 * GIB),
                             rec(stage=1, tput=300.0, peak=20 * GIB),
                             rec(stage=2, tput=250.0, peak=30 * GIB),  # dominated by z1
                             rec(stage=3, tput=400.0, peak=40 * GIB),
                             rec(stage=3, mbs=4, tput=300.0, peak=20 * GIB),  # equal to z1: kept
                             rec(stage=1, mbs=64, status="oom", reason="OOM")])
    assert [r.key for r in pareto_front(rows)] == [
        "z0 off=none bf16 mbs=8", "z1 off=none bf16 mbs=8", "z3 off=none bf16 mbs=4", "z3 off=none bf16 mbs=8"]
    assert pareto_front(summarize_points([rec(status="oom")])) == []


# table

def test_markdown_has_every_point_with_reasons_and_flags():
    rows = mixed_rows() + summarize_points(repeats([800.0, 900.0, 700.0], stage=3, mbs=2))
    text = markdown(rank(rows), "tokens/s")
    for row in rows:
        assert f"| {row.key} " in text
    for reason in ("CUDA out of memory", "no step in 600 s", "parameter offload needs ZeRO stage 3"):
        assert reason in text
    assert "median tokens/s" in text and "peak GiB" in text
    z2 = next(line for line in text.splitlines() if "| z2 off=none" in line)
    assert "recommended" in z2 and "1,000" in z2
    z0 = next(line for line in text.splitlines() if "| z0 off=none bf16 mbs=4 " in line)
    assert "baseline" in z0 and "+0.0" in z0
    assert "noisy" in next(line for line in text.splitlines() if "z3 off=none bf16 mbs=2" in line)
    assert "recommended: z2 off=none bf16 mbs=8" in text


def test_tied_rows_show_equal_rank_in_terminal_table():
    rows = summarize_points([*repeats([1000.0, 1001.0], stage=2), *repeats([995.0, 996.0], stage=1),
                             rec(stage=3, status="crashed", reason="rank 1 exited with -11")])
    text = terminal(rank(rows), "tokens/s")
    lines = text.splitlines()
    assert lines[2].startswith("=1") and lines[3].startswith("=1") and lines[4].startswith("-")
    assert "rank 1 exited with -11" in text


def test_busy_and_headroom_notes():
    quiet = {"load_before": 0.1, "load_after": 0.1, "other_cores": 0.0, "gpu_others": []}
    rows = summarize_points([rec(stage=1, tput=2000.0, peak=78 * GIB),
                             rec(stage=2, tput=100.0, busy={**quiet, "other_cores": 1.0})], cores=2)
    text = markdown(rank(rows), "tokens/s")
    assert "headroom < 10%" in next(line for line in text.splitlines() if "| z1 off" in line)
    assert "busy machine" in next(line for line in text.splitlines() if "| z2 off" in line)


CUDA_OOM = ("rank 0: failed at step 1 of 20: OutOfMemoryError('CUDA out of memory. Tried to allocate 12.27 GiB. "
            "GPU 0 has a total capacity of 79.18 GiB of which 7.11 GiB is free. Including non-PyTorch memory, this "
            "process has 72.06 GiB memory in use. Of the allocated memory 57.97 GiB is allocated by PyTorch')")


def test_a_long_failure_reason_is_cut_in_the_table_and_whole_in_the_csv(tmp_path):
    rows = summarize_points([rec(stage=2, tput=1000.0), rec(stage=0, status="oom", reason=CUDA_OOM)])
    line = next(line for line in markdown(rank(rows), "tokens/s").splitlines() if "| z0 off" in line)
    note = line.rstrip(" |").rsplit("|", 1)[1].strip()
    assert note.startswith("rank 0: failed at step 1 of 20: OutOfMemoryError('CUDA out of memory. Tried to allocate")
    assert len(note) <= NOTE_CHARS and note.endswith("\u2026")
    write_csv(rank(rows), str(tmp_path / "s.csv"))
    with open(tmp_path / "s.csv", newline="") as f:
        oom = next(g for g in csv.DictReader(f) if g["status"] == "oom")
    assert oom["reason"] == CUDA_OOM and oom["notes"] == CUDA_OOM


def test_brief_keeps_short_text_and_folds_lines():
    assert brief("a\n  b") == "a b"
    assert brief("x" * 20, limit=10) == "x" * 9 + "\u2026"


def test_csv_has_a_header_and_one_row_per_point(tmp_path):
    rows = mixed_rows()
    path = tmp_path / "sweep.csv"
    write_csv(rank(rows), str(path))
    with open(path, newline="") as f:
        got = list(csv.DictReader(f))
    assert len(got) == len(rows)
    assert {g["key"] for g in got} == {r.key for r in rows}
    assert got[0]["key"] == "z2 off=none bf16 mbs=8" and float(got[0]["throughput_median"]) == 1000.5
    assert got[0]["rank"] == "1" and got[0]["unit"] == "tokens/s"
    assert float(got[0]["peak_gib"]) == 40.0
    oom = next(g for g in got if g["status"] == "oom")
    assert oom["reason"] == "CUDA out of memory" and oom["throughput_median"] == "" and oom["rank"] == "-"


# plots

def test_write_plots_writes_three_pngs(tmp_path):
    rows = mixed_rows() + summarize_points(repeats([600.0, 610.0], stage=2, mbs=2, predicted=30 * GIB))
    paths = write_plots(rank(rows), str(tmp_path / "out" / "sweep"))
    assert len(paths) == 3 and len(set(paths)) == 3
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert all((tmp_path / "out" / f"sweep_{n}.png").stat().st_size > 1000 for n in ("throughput", "memory", "pareto"))


def test_write_plots_with_nothing_ok(tmp_path):
    paths = write_plots(summarize_points([rec(status="oom", reason="OOM")]), str(tmp_path / "s"))
    assert paths == [str(tmp_path / f"s_{n}.png") for n in ("throughput", "memory", "pareto")]
    assert all(os.path.getsize(p) > 0 for p in paths)


# pipeline points: the bubble beside the schedule's

def test_pipeline_points_show_their_measured_bubble_beside_the_schedules(tmp_path):
    pp2 = Layout(1, "none", "fp32", 2, 4, pipeline_stages=2)
    pipe = rec(stage=1, precision="fp32", mbs=2, grad_accum=4, tput=900.0, bubble=0.3125, schedule_bubble=0.2)
    pipe = pipe.model_copy(update={"key": pp2.key, "point": pp2.to_dict()})
    plain = rec(stage=1, precision="fp32", mbs=2, grad_accum=4, tput=1000.0)
    ranking = rank(summarize_points([plain, pipe]))
    table = markdown(ranking, "tokens/s").splitlines()
    column = [c.strip() for c in table[0].split("|")].index("bubble % (schedule)")
    cell = {row.split("|")[2].strip(): row.split("|")[column].strip() for row in table[2:4]}
    assert cell == {pp2.key: "31 (20)", plain.key: "-"}, table
    write_csv(ranking, str(tmp_path / "s.csv"))
    with open(tmp_path / "s.csv", newline="") as f:
        got = {g["key"]: (g["bubble"], g["schedule_bubble"]) for g in csv.DictReader(f)}
    assert got == {pp2.key: ("0.3125", "0.2"), plain.key: ("", "")}
    assert "bubble" not in terminal(rank(summarize_points([plain])), "tokens/s")  # no pipeline, no column


def test_a_pipeline_runs_bubble_is_the_mean_of_its_stages():
    from types import SimpleNamespace as Run

    from ds_bench.sweep.point_record import measured_bubble

    stages = [Run(bubble=0.25), Run(bubble=0.375)]
    assert measured_bubble(Run(pipeline_layout=stages)) == pytest.approx(0.3125)
    assert measured_bubble(Run(pipeline_layout=[Run(bubble=0.25), Run(bubble=None)])) is None  # a stage untimed
    assert measured_bubble(Run(pipeline_layout=None)) is None and measured_bubble(None) is None

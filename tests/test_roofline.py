"""``ds-bench roofline`` and ``mfu_vs_measured``: the sampling (pure, with a fake operation), the ceiling a
run reads, the flags; the real 2-rank measurement is tests/test_distributed.py's (with the run that reads it)."""

from __future__ import annotations

import pytest

from ds_bench import cli
from ds_bench.measure import roofline
from ds_bench.record import store
from ds_bench.record.schema import RooflineRecord, RooflineRow
from ds_bench.run.measure import vs_measured


def test_iterations_double_until_a_sample_is_long_enough():
    clock = {"t": 0.0}

    def op():
        clock["t"] += 0.001  # each operation "takes" 1 ms of the fake clock

    roofline.time.perf_counter, real = (lambda: clock["t"]), roofline.time.perf_counter
    try:
        fig = roofline.sampled(op, work=2.0, sync=lambda: None, min_time_s=0.04, repeats=4)
    finally:
        roofline.time.perf_counter = real
    assert fig.iters == 16 and fig.repeats == 4  # 1, 2, 4, 8 ms too short for 10 ms a sample
    assert fig.median == pytest.approx(2000.0) and fig.low == pytest.approx(fig.high)  # 2 units per ms


def row(**kw) -> dict:
    base = {"rank": 0, "host": "h", "device": "x86_64", "test": "matmul", "dtype": "fp32", "size": 256,
            "median": 0.1, "low": 0.09, "high": 0.11, "iters": 8, "repeats": 5}
    return {**base, **kw}


def test_the_ceiling_is_the_best_matmul_of_that_host_device_and_dtype():
    rows = [row(), row(size=512, median=0.2), row(dtype="bf16", median=5.0), row(host="other", median=9.0),
            row(test="copy", median=30.0)]
    assert roofline.ceiling(rows, "h", "x86_64", "fp32") == 0.2
    assert roofline.ceiling(rows, "h", "x86_64", "fp16") is None


def test_a_run_takes_the_newest_record_of_its_host(tmp_path, monkeypatch):
    path = str(tmp_path / "roofline.jsonl")
    monkeypatch.setattr("socket.gethostname", lambda: "h")
    assert vs_measured(0.05, "x86_64", "fp32", path)["measured_note"].startswith("no roofline record")
    for run_id, median in (("old", 0.1), ("new", 0.25)):
        store.append_record(path, RooflineRecord(kind="roofline", run_id=run_id, host="h",
                                                 results=[RooflineRow(**row(median=median))]))
    store.append_record(path, RooflineRecord(kind="roofline", run_id="elsewhere", host="g",
                                             results=[RooflineRow(**row(host="g", median=9.0))]))
    out = vs_measured(0.05, "x86_64", "fp32", path)
    assert out["measured_tflops"] == 0.25 and out["mfu_vs_measured"] == pytest.approx(0.2) and "new" in out["measured_note"]


@pytest.mark.parametrize("args,message", [
    (["--dtypes", "fp8"], "--dtypes"), (["--sizes", "0"], "must be a positive integer"),
    (["--min-time", "0"], "--min-time in"), (["--repeats", "0"], "--repeats >= 1"),
    (["--copy-bytes", "lots"], "--copy-bytes"), (["--results", "/nonexistent/dir/r.jsonl"], "--results")])
def test_bad_flags_are_one_line_before_joining(args, message, capsys):
    assert cli.main(["roofline", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err

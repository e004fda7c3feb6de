"""``ds-bench roofline`` and ``mfu_vs_measured``: the sampling (pure, with a fake operation), the ceiling a
run reads, the flags; the real 2-rank measurement is tests/test_distributed.py's (with the run that reads it)."""

from __future__ import annotations

import pytest
import torch

from ds_bench import cli
from ds_bench.measure import ceilings
from ds_bench.record import store
from ds_bench.record.schema import RooflineRecord, RooflineRow
from ds_bench.run.run_metrics import vs_measured


def test_iterations_double_until_a_sample_is_long_enough():
    clock = {"t": 0.0}

    def op():
        clock["t"] += 0.001  # each operation "takes" 1 ms of the fake clock

    ceilings.time.perf_counter, real = (lambda: clock["t"]), ceilings.time.perf_counter
    try:
        fig = ceilings.sampled(op, work=2.0, sync=lambda: None, min_time_s=0.04, repeats=4)
    finally:
        ceilings.time.perf_counter = real
    assert fig.iters == 16 and fig.repeats == 4  # 1, 2, 4, 8 ms too short for 10 ms a sample
    assert fig.median == pytest.approx(2000.0) and fig.low == pytest.approx(fig.high)  # 2 units per ms


def row(**kw) -> dict:
    base = {"rank": 0, "host": "h", "device": "x86_64", "test": "matmul", "dtype": "fp32", "size": 256,
            "median": 0.1, "low": 0.09, "high": 0.11, "iters": 8, "repeats": 5}
    return {**base, **kw}


def test_the_ceiling_is_the_best_matmul_of_that_host_device_and_dtype():
    rows = [row(), row(size=512, median=0.2), row(dtype="bf16", median=5.0), row(host="other", median=9.0),
            row(test="copy", median=30.0)]
    assert ceilings.ceiling(rows, "h", "x86_64", "fp32") == 0.2
    assert ceilings.ceiling(rows, "h", "x86_64", "fp16") is None


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
    (["--min-time", "601s"], "--min-time in"), (["--min-time", "1"], "--min-time 1: give a unit"), (["--repeats", "0"], "--repeats >= 1"),
    (["--copy-bytes", "lots"], "--copy-bytes"), (["--results", "/etc/hostname/dir/r.jsonl"], "--results"),
    (["--gpt2", "huge"], "--gpt2 'huge' is unknown"), (["--tokens", "64"], "--tokens needs --gpt2"),
    (["--gpt2", "small", "--tokens", "0"], "--tokens must be a positive integer")])
def test_bad_flags_are_one_line_before_joining(args, message, capsys):
    assert cli.main(["roofline", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err


def test_a_gpt2_blocks_products_are_its_forward_and_backward_gemms():
    """Per forward product (m x k) @ (k x n), backward's input and weight gradients: same FLOPs, other shapes;
    all of them together are 3 x forward, and forward is 2 x tokens x the block's weights and the LM head."""
    from ds_bench.workloads.gpt2_shapes import VOCAB, gemms

    shapes = gemms(768, 1024)
    assert shapes[:3] == [("qkv", 1024, 768, 2304), ("qkv.dgrad", 1024, 2304, 768), ("qkv.wgrad", 768, 1024, 2304)]
    flops = {name: 2 * m * k * n for name, m, k, n in shapes}
    forward = sum(f for name, f in flops.items() if "." not in name)
    assert sum(flops.values()) == 3 * forward
    assert forward == 2 * 1024 * (12 * 768 * 768 + 768 * VOCAB)  # weights: 3d^2 + d^2 + 4d^2 + 4d^2, head d x V


def test_a_gemm_row_names_its_product_and_rates_its_flops():
    rows = ceilings.measure_rank({"rank": 0, "host": "h", "device": "cpu"}, torch.device("cpu"), ("fp32",), (), 4096,
                                 0.0, 2, lambda: None, lambda: None, gemms=(("mlp_fc", 8, 4, 16),))
    gemm = next(r for r in rows if r["test"] == "gemm")
    assert (gemm["name"], gemm["shape"], gemm["size"]) == ("mlp_fc", [8, 4, 16], 8) and gemm["median"] > 0
    RooflineRow(**gemm)  # the record's row type takes it

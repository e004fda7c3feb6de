"""Peak table lookup and TFLOPs/MFU arithmetic."""

import pytest

from ds_bench.measure.peaks import compute_metrics, peak_tflops


def test_dense_peaks_by_device_and_dtype():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "cuda", "bf16")[0] == 989.4
    assert peak_tflops("NVIDIA H100 PCIe", "cuda", "bf16")[0] == 756.5
    assert peak_tflops("NVIDIA H200", "cuda", "fp32")[0] == 66.9
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "cuda", "fp16")[0] == 312.0
    assert peak_tflops("Tesla V100-SXM2-32GB", "cuda", "bf16") == (None, "V100 has no bf16 peak in ds_bench.measure.peaks")


def test_names_match_whole_words_never_a_neighbour():
    assert peak_tflops("NVIDIA L40", "cuda", "bf16")[0] is None
    assert peak_tflops("NVIDIA L4", "cuda", "bf16")[0] == 121.0
    assert peak_tflops("NVIDIA RTX A1000 Laptop GPU", "cuda", "bf16")[0] is None
    assert peak_tflops("NVIDIA A10G", "cuda", "bf16")[0] is None
    assert peak_tflops("NVIDIA A10", "cuda", "bf16")[0] == 125.0
    assert peak_tflops("AMD Instinct MI250X", "cuda", "bf16")[0] == 191.5  # one GCD


def test_cpu_has_no_made_up_peak():
    peak, why = peak_tflops("x86_64", "cpu", "bf16")
    assert peak is None and "--peak-tflops" in why
    m = compute_metrics(1e9, 100.0, 2, peak, why)
    assert m["tflops_per_device"] == pytest.approx(1e9 * 100 / 2 / 1e12) and m["mfu"] is None
    assert "--peak-tflops" in m["mfu_note"]


def test_mfu_is_achieved_over_peak():
    m = compute_metrics(6e12, 10.0, 4, 100.0, "x")  # 6e13 FLOP/s over 4 devices = 15 TFLOP/s each
    assert m["tflops_per_device"] == pytest.approx(15.0) and m["mfu"] == pytest.approx(0.15)

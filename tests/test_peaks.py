"""Peak table lookup and TFLOPs/MFU arithmetic."""

import pytest

from ds_bench.measure.peaks import compute_metrics, peak_tflops


def test_dense_peaks_by_device_and_dtype():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "cuda", "bf16")[0] == 989.4
    assert peak_tflops("NVIDIA H100 PCIe", "cuda", "bf16")[0] == 756.5
    assert peak_tflops("NVIDIA H200", "cuda", "fp32")[0] == 66.9
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "cuda", "fp16")[0] == 312.0
    assert peak_tflops("Tesla V100-SXM2-32GB", "cuda", "bf16") == (None, "V100 has no bf16 peak in ds_bench.measure.peaks")


@pytest.mark.parametrize("name,bf16,fp32", [
    ("NVIDIA B200", 2250.0, 75.0), ("NVIDIA B300 SXM6 AC", 2250.0, 75.0), ("NVIDIA GB200", 2500.0, 80.0),
    ("NVIDIA GB300", 2500.0, 80.0), ("NVIDIA H20", 148.0, 44.0), ("NVIDIA L40", 181.05, 90.5),
    ("NVIDIA L40S", 362.05, 91.6), ("NVIDIA RTX 6000 Ada Generation", 364.25, 91.1),
    ("AMD Instinct MI325X", 1307.4, 163.4), ("AMD Instinct MI355X", 2516.6, 157.3)])
def test_todays_accelerators_by_the_names_torch_reports(name, bf16, fp32):
    assert (peak_tflops(name, "cuda", "bf16")[0], peak_tflops(name, "cuda", "fp32")[0]) == (bf16, fp32)


def test_names_match_whole_words_never_a_neighbour():
    assert peak_tflops("NVIDIA H200", "cuda", "bf16")[0] == 989.4  # not H20's
    assert peak_tflops("NVIDIA RTX PRO 6000 Blackwell Server Edition", "cuda", "bf16")[0] is None
    assert peak_tflops("NVIDIA GeForce RTX 4090", "cuda", "bf16")[0] is None
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

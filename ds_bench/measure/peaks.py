"""Per-device peak dense TFLOP/s, for MFU, and the TFLOPs/MFU arithmetic.

MFU (model FLOPs utilisation, Chowdhery et al. 2022, "PaLM", appendix B) = achieved model FLOP/s
/ peak FLOP/s, where model FLOPs count the forward and backward pass once (no recomputation).
Peaks are the vendors' dense figures (never the 2:4-sparsity ones), per dtype:
- H100 SXM5 / H200 / GH200: NVIDIA H100 and H200 datasheets: bf16/fp16 989.4, fp32 66.9 (tf32 494.7);
- H100 PCIe: 756.5 / 51.2; H100 NVL: 835.5 / 60.0;
- A100 (40/80 GB, SXM and PCIe): NVIDIA A100 datasheet: bf16/fp16 312, fp32 19.5 (tf32 156);
- V100 SXM2: fp16 125, fp32 15.7 (no bf16); V100 PCIe: 112 / 14;
- L40S: 362.05 / 91.6; L4: 121 / 30.3; A10: 125 / 31.2 (NVIDIA product briefs);
- AMD MI300X: 1307.4 / 163.4; MI250X: 191.5 / 47.9 per GCD (the datasheet's 383 / 95.7 is for
  the two-die module, which torch sees as two devices) (AMD Instinct datasheets, matrix cores).
fp32 runs switch TF32 off (``run.py``), so the plain fp32 peak applies. Names match whole words
(``L4`` is not ``L40``, ``A100`` is not ``RTX A1000``, ``A10`` is not ``A10G``); an unknown
device gets no MFU, never a neighbour's peak.
"""

from __future__ import annotations

import re

# (substring of torch.cuda.get_device_name(), {dtype: dense TFLOP/s}); first match wins.
PEAKS: list[tuple[str, dict[str, float]]] = [
    ("H100 PCIe", {"bf16": 756.5, "fp16": 756.5, "fp32": 51.2}),
    ("H100 NVL", {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("GH200", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("V100-PCIE", {"fp16": 112.0, "fp32": 14.0}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
    ("L40S", {"bf16": 362.05, "fp16": 362.05, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2}),
    ("MI300X", {"bf16": 1307.4, "fp16": 1307.4, "fp32": 163.4}),
    ("MI250X", {"bf16": 191.5, "fp16": 191.5, "fp32": 47.9}),
]


def peak_tflops(device_name: str, device_type: str, precision: str) -> tuple[float | None, str]:
    """(peak dense TFLOP/s, where it came from); None with the reason when unknown."""
    if device_type == "cpu":
        return None, "no peak table for CPUs; pass --peak-tflops to get MFU"
    for key, table in PEAKS:
        if re.search(rf"(?<![\w-]){re.escape(key)}(?![\w])", device_name):
            if precision in table:
                return table[precision], f"{key} {precision} dense peak (ds_bench.measure.peaks)"
            return None, f"{key} has no {precision} peak in ds_bench.measure.peaks"
    return None, f"unknown device {device_name!r}; pass --peak-tflops to get MFU"


def compute_metrics(flops_per_sample: float | None, samples_per_s: float, world_size: int,
                    peak: float | None, peak_note: str) -> dict:
    """TFLOP/s per device = model FLOPs per sample x samples/s / devices / 1e12; MFU = that / peak."""
    if flops_per_sample is None:
        return {"tflops_per_device": None, "mfu": None, "mfu_note": "workload has no FLOPs formula"}
    tflops = flops_per_sample * samples_per_s / world_size / 1e12
    return {"tflops_per_device": tflops, "mfu": tflops / peak if peak else None,
            "peak_tflops": peak, "mfu_note": peak_note}

"""Per-device peak dense TFLOP/s, for MFU, and the TFLOPs/MFU arithmetic.

MFU (model FLOPs utilisation, Chowdhery et al. 2022, "PaLM", appendix B) = achieved model FLOP/s
/ peak FLOP/s, where model FLOPs count the forward and backward pass once (no recomputation).
Peaks are the vendors' dense figures (never the 2:4-sparsity ones), per dtype:
- H100 SXM5 / H200 / GH200: NVIDIA H100 and H200 datasheets: bf16/fp16 989.4, fp32 66.9 (tf32 494.7);
- H100 PCIe: 756.5 / 51.2; H100 NVL: 835.5 / 60.0;
- A100 (40/80 GB, SXM and PCIe): NVIDIA A100 datasheet: bf16/fp16 312, fp32 19.5 (tf32 156);
- V100 SXM2: fp16 125, fp32 15.7 (no bf16); V100 PCIe: 112 / 14;
- L40S: 362.05 / 91.6; L40: 181.05 / 90.5 (its bf16 with fp32 accumulate runs at half the L40S's rate);
  L4: 121 / 30.3; A10: 125 / 31.2; RTX 6000 Ada: 364.25 / 91.1 (a quarter of the datasheet's 1,457 FP8
  sparse TFLOP/s); H20: 148 / 44 (NVIDIA product briefs);
- Blackwell (NVIDIA HGX B200 / B300 and GB200 / GB300 NVL72 specifications, whose tensor figures are quoted
  with sparsity: halved here, per GPU): B200 and B300 (HGX, 8 GPUs: 36 PF bf16 sparse, 600 TF fp32) 2,250 /
  75; GB200 and GB300 (NVL72: 360 PF bf16 sparse, 5,760 TF fp32 over 72 GPUs) 2,500 / 80. RTX PRO 6000
  Blackwell is left out: its datasheet gives only FP4 "AI TOPS";
- AMD MI300X and MI325X (the same CDNA 3 compute): 1307.4 / 163.4; MI355X (CDNA 4): 2516.6 / 157.3;
  MI250X: 191.5 / 47.9 per GCD (the datasheet's 383 / 95.7 is for the two-die module, which torch sees
  as two devices) (AMD Instinct datasheets, matrix cores).
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
    ("H20", {"bf16": 148.0, "fp16": 148.0, "fp32": 44.0}),
    ("GB200", {"bf16": 2500.0, "fp16": 2500.0, "fp32": 80.0}),
    ("GB300", {"bf16": 2500.0, "fp16": 2500.0, "fp32": 80.0}),
    ("B200", {"bf16": 2250.0, "fp16": 2250.0, "fp32": 75.0}),
    ("B300", {"bf16": 2250.0, "fp16": 2250.0, "fp32": 75.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("V100-PCIE", {"fp16": 112.0, "fp32": 14.0}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
    ("L40S", {"bf16": 362.05, "fp16": 362.05, "fp32": 91.6}),
    ("L40", {"bf16": 181.05, "fp16": 181.05, "fp32": 90.5}),
    ("RTX 6000 Ada", {"bf16": 364.25, "fp16": 364.25, "fp32": 91.1}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2}),
    ("MI300X", {"bf16": 1307.4, "fp16": 1307.4, "fp32": 163.4}),
    ("MI325X", {"bf16": 1307.4, "fp16": 1307.4, "fp32": 163.4}),
    ("MI355X", {"bf16": 2516.6, "fp16": 2516.6, "fp32": 157.3}),
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

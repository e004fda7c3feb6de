"""What this CPU computes natively, for choosing a CPU run's default precision.

bf16 matrix work is native on x86 CPUs with AVX512_BF16 or AMX (``avx512_bf16`` / ``amx_bf16`` in
/proc/cpuinfo's flags) and on Arm CPUs with the BF16 extension (``bf16`` in ``Features``);
elsewhere torch emulates it: measured on an AVX2-only EPYC (this project's CI image, 2026-11-22),
an MNIST CNN step is ~9x slower in bf16 than in fp32. CPU defaults pick fp32 there and say so.
"""

from __future__ import annotations

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature words of /proc/cpuinfo's first ``flags`` (x86) or ``Features`` (Arm) line."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def native_bf16(flags: frozenset[str]) -> bool:
    return bool(flags & NATIVE_BF16_FLAGS)


def this_cpu_has_native_bf16() -> bool:
    return native_bf16(this_cpu_flags())  # not Linux: no flags, assume emulated (fp32, the fast default)


def emulated_precision_note(precision: str, device_type: str, flags: frozenset[str]) -> str | None:
    """Why a ``device_type`` run in ``precision`` is slow on a CPU with these ``flags``, or None when it is
    not: bf16 on a CPU without native bf16 (torch emulates it, several times slower than fp32). Only CPU
    runs; fp32 and fp16 are left alone (DeepSpeed's CPU runs are fp32 or bf16)."""
    if device_type != "cpu" or precision != "bf16" or native_bf16(flags):
        return None
    return ("bf16 is emulated on this CPU (no avx512_bf16, amx_bf16 or Arm bf16 in its flags): steps run "
            "several times slower than fp32 (an MNIST CNN ~9x here); for fp32 run with --set bf16.enabled=false")


def this_cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return cpu_flags(f.read())
    except OSError:  # not Linux: no flags known, so bf16 counts as emulated (as this_cpu_has_native_bf16)
        return frozenset()

"""``ds-bench run`` in a precision this CPU emulates (bf16 without avx512_bf16 / AMX / Arm bf16): a warning
before the run starts and ``precision_emulated`` (with its note) in the record. CPU runs only."""

import sys

import pytest

from ds_bench.machine.cpu_features import cpu_flags, emulated_precision_note, this_cpu_has_native_bf16
from tests.conftest import explain, records, run_cmd

AVX2_EPYC = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize("cpuinfo, precision, device, emulated", [
    (AVX2_EPYC, "bf16", "cpu", True),
    (AVX2_EPYC, "fp32", "cpu", False),
    (AVX2_EPYC, "bf16", "cuda", False),  # GPU runs: not this CPU's business
    (SAPPHIRE_RAPIDS, "bf16", "cpu", False),
    (GRAVITON3, "bf16", "cpu", False),
    ("", "bf16", "cpu", True),  # no flags known (not Linux): counted as emulated
])
def test_the_decision_on_inline_cpu_features(cpuinfo, precision, device, emulated):
    note = emulated_precision_note(precision, device, cpu_flags(cpuinfo))
    assert (note is not None) == emulated
    if note:
        assert "emulated" in note and "--set bf16.enabled=false" in note


def test_a_real_bf16_run_records_whether_this_cpu_emulates_it(tmp_path):
    results = tmp_path / "r.jsonl"
    proc = run_cmd([sys.executable, "-m", "ds_bench", "run", "--workload", "mnist", "--ds-config",
                    "ds_configs/zero1.json", "--set", "bf16.enabled=true", "--steps", "3", "--warmup", "1",
                    "--results", str(results)], timeout=240, HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, explain(proc)
    (r,) = records(results)
    assert r["precision"] == "bf16" and r["hardware"]["device_type"] == "cpu"
    emulated = not this_cpu_has_native_bf16()
    assert r["precision_emulated"] is emulated
    assert ("--set bf16.enabled=false" in (r["precision_note"] or "")) is emulated
    warned = proc.stderr.count("bf16 is emulated on this CPU") + proc.stdout.count("bf16 is emulated on this CPU")
    assert warned == (1 if emulated else 0), explain(proc)

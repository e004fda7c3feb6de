"""tools/yardstick.py: its loops run and report side by side (the ratios' values are figures for
docs/results/measurement-cpu.md, not asserted here; that each ratio is its row over the bare loop is)."""

import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_the_yardstick_prints_each_loop_against_the_bare_one():
    """The bare loop and ds-bench's runs (ZeRO-0, DDP) side by side: each row's ratios are its own figures over the
    bare loop's (tokens/s over the bare tokens/s; the bare median step over its own), not the bare loop over itself."""
    proc = subprocess.run([sys.executable, "tools/yardstick.py", "--workload", "gpt2", "--size", "tiny", "--seq-len", "16",
                           "--micro-batch", "2", "--steps", "3", "--warmup", "1", "--precision", "fp32"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2 measured steps after 1" in proc.stdout
    rows = {}
    for line in proc.stdout.splitlines():
        for label in ("bare loop (fp32)", "ds-bench run, ZeRO-0", "ds-bench run, --engine ddp"):
            if line.startswith(label):
                rows[label] = [float(v.replace(",", "")) for v in line[len(label):].split()[:4]]
    assert len(rows) == 3, proc.stdout
    bare_tps, _, bare_ms, _ = rows["bare loop (fp32)"]
    for tps, tps_ratio, ms, ms_ratio in rows.values():
        assert tps > 0 and ms > 0
        # each ratio is printed to 0.01 from unrounded figures, the figures to 0.1: allow both roundings (a bare
        # loop of 37.5 tokens/s leaves 718.4 / 37.5 up to 0.027 from the printed 19.17)
        assert tps_ratio == pytest.approx(tps / bare_tps, abs=rounding(tps / bare_tps, tps, bare_tps)), proc.stdout
        assert ms_ratio == pytest.approx(bare_ms / ms, abs=rounding(bare_ms / ms, bare_ms, ms)), proc.stdout


def rounding(ratio: float, top: float, bottom: float) -> float:
    """How far ``top / bottom`` of two figures printed to 0.1 may be from their ratio printed to 0.01."""
    return 0.005 + ratio * 0.05 * (1 / top + 1 / bottom) + 1e-6

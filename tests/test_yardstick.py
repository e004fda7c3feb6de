"""tools/yardstick.py: its bare loop runs and reports (the ratios themselves are figures for
docs/results/measurement-cpu.md, measured side by side by the tool, not asserted here)."""

import subprocess
import sys

from tests.conftest import REPO


def test_the_bare_loop_prints_its_throughput_and_spread():
    proc = subprocess.run([sys.executable, "tools/yardstick.py", "--workload", "gpt2", "--size", "tiny", "--seq-len", "16",
                           "--micro-batch", "2", "--steps", "3", "--warmup", "1", "--bare-only", "--precision", "fp32"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("bare loop (fp32)"))
    tokens_per_s, ratio, _, by_median = row.split()[3:7]
    assert float(tokens_per_s.replace(",", "")) > 0 and ratio == by_median == "1.00", proc.stdout
    assert "2 measured steps after 1" in proc.stdout

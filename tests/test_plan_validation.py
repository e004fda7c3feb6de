"""``ds-bench plan`` against measurement on this machine's CPU ranks (``tools/plan_validation.py --quick``): the
ranks' ceiling and busbw measured (``roofline``, ``comm``), then every GPT-2 layout of 2 ranks the legality table
allows (ZeRO 0-3, a 2-stage pipeline) predicted from those records and run for real (``plan --confirm``). The
median predicted/measured step time must be within ``BOUND``: docs/plan.md has the table it was set from (2 ranks,
11 layouts: 0.50-1.05, median 0.90; the GPT-2 ones 0.77-0.98)."""

from __future__ import annotations

import re
import statistics
import sys

import pytest

from tests.conftest import REPO, run_cmd

BOUND = (0.7, 1.5)
"""Median predicted/measured over the GPT-2 layouts of 2 CPU ranks, measured: 0.90 (AVX2 image, 2026-11-26), 1.10
(avx512_bf16 image, a quiet run, 2026-11-29: docs/plan.md), 1.35 (the same image inside the full tier, 2026-11-29).
There the comm benchmark measured the small collectives 3-5x slower than the quiet run did (reduce_scatter at
256 KiB: 0.048 against 0.225 GB/s), which the training runs themselves did not see (their steps within 1-4% of
the quiet run's), so ZeRO-1-3's exposed reduce-scatters came out over-predicted (1.48-1.71). What slowed the
benchmark is not known; a Slurm test had failed its teardown (a daemon left for a moment) just before."""


@pytest.mark.full
@pytest.mark.solo  # asserts this machine's figures: no other test's runs beside it
def test_the_plans_step_times_match_this_machines_runs(tmp_path):
    proc = run_cmd([sys.executable, str(REPO / "tools" / "plan_validation.py"), "--worlds", "2", "--quick",
                    "--out", str(tmp_path), "--steps", "5", "--warmup", "2"], timeout=2400)
    log = (tmp_path / "log.txt").read_text() if (tmp_path / "log.txt").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + log[-3000:]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == 6, proc.stdout  # z0-z3 over 2 ranks, pp2 at z0 and z1
    ratios = [float(r[5]) for r in rows]
    assert BOUND[0] <= statistics.median(ratios) <= BOUND[1], proc.stdout
    assert all(0.5 <= r <= 2.0 for r in ratios), proc.stdout  # none flagged far off
    memory = [(float(r[6]), float(r[7])) for r in rows]
    assert all(0.7 <= p / m <= 1.4 for p, m in memory), proc.stdout
    assert re.search(r"median predicted/measured [0-9.]+ over 6 layouts", proc.stdout)


TERMS = {"tiled-loss": (0.9, 1.05), "tiled-mlp": (0.6, 1.05), "ckpt (not selective)": (-0.2, 0.9)}
"""Measured / predicted peak memory an option saves, per option, on a 12-block GPT-2 (docs/plan.md, 2026-11-29,
five runs): tiled loss 0.96-0.98; tiled MLP 0.71-0.92; full checkpointing against selective 0.30-0.65 (full
checkpointing's resident peak holds more than its allocations, which the model matches within 1.5%:
tests/test_activation_memory.py; and it moves most from run to run: 1.74-1.94 GiB). A CPU rank's peak moves ~0.1-0.2 GiB between runs, a third to a half of a 0.37 GiB term. Full against selective: -0.1 in
the full tier of 2026-11-29 (full checkpointing's peak 1.99 GiB there, 1.74-1.94 before): its 0.38 GiB term is
inside that peak's run-to-run spread, so this check catches only a sign or scale error."""
TOTAL = (0.7, 1.1)
"""Predicted / measured peak per rank of each of the six layouts: 0.79-0.87 (full checkpointing) to 1.02 over four
runs; 0.83-1.01 with one block's backward counted; 0.74 for full checkpointing in the full tier of 2026-11-29
(docs/plan.md)."""


@pytest.mark.full
def test_each_memory_options_predicted_saving_is_what_its_runs_measure(tmp_path):
    """``tools/plan_validation.py --terms``: a 12-block GPT-2 layout of 2 CPU ranks at 4,096 tokens per rank with
    ALST's tiled MLP and tiled loss each on and off, and full against selective checkpointing, run for real by
    ``plan --confirm``; per option, the peak memory the runs without it and with it differ by, against the
    difference of plan's predictions, and each layout's peak against its prediction. Peaks, not times: not solo."""
    proc = run_cmd([sys.executable, str(REPO / "tools" / "plan_validation.py"), "--worlds", "2", "--terms",
                    "--out", str(tmp_path), "--steps", "3", "--warmup", "1"], timeout=1200)
    log = (tmp_path / "log.txt").read_text() if (tmp_path / "log.txt").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + log[-3000:]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines()
            if line.startswith("| 2 | tiled-") or line.startswith("| 2 | ckpt")]
    assert sorted(r[1].strip() for r in rows) == ["ckpt (not selective)", "tiled-loss", "tiled-loss", "tiled-mlp",
                                                  "tiled-mlp"], proc.stdout
    for _, option, _, predicted, measured in rows:
        low, high = TERMS[option.strip()]
        assert low <= float(measured) / float(predicted) <= high, proc.stdout
    layouts = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| 2 | gpt2")]
    assert len(layouts) == 6 and all(TOTAL[0] <= float(r[6]) / float(r[7]) <= TOTAL[1] for r in layouts), proc.stdout


AUTOTP_ULYSSES_MOE = (0.45, 1.9)
"""Predicted / measured step of Llama's AutoTP and Ulysses layouts and MoE's expert-parallel ones on 2 CPU ranks,
measured on the two machine images this project runs on: AMD EPYC AVX2, 2026-11-26 (docs/plan.md's table: 0.53
AutoTP, 0.76 Ulysses, 0.95 data-parallel Llama, 1.03-1.10 MoE: AutoTP's all-reduces wait for the other rank's busy
core inside a step, which the comm benchmark does not see); AMD EPYC avx512_bf16, 2026-11-29, two runs: 1.00-1.03
AutoTP, 1.24-1.31 Ulysses, 1.34-1.49 data parallel, 1.25-1.56 MoE (the full tier's run at 1.49-1.56). In the full tier of 2026-11-29: 1.02-1.79,
its comm benchmark reading the small collectives 3-5x slower than a quiet run (test_the_plans_step_times...)."""


@pytest.mark.full
@pytest.mark.solo  # asserts this machine's figures: no other test's runs beside it
def test_autotp_ulysses_and_expert_parallel_layouts_match_this_machines_runs(tmp_path):
    """``tools/plan_validation.py --worlds 2 --only llama,moe``: the ranks' ceiling and busbw measured, then every
    Llama layout of 2 ranks (AutoTP 2, Ulysses 2, data parallel) and MoE layout (experts over 2 ranks, data parallel)
    predicted and run for real by ``plan --confirm``: each within ``AUTOTP_ULYSSES_MOE``, its peak memory within
    0.7-1.4 of the prediction."""
    proc = run_cmd([sys.executable, str(REPO / "tools" / "plan_validation.py"), "--worlds", "2", "--only", "llama,moe",
                    "--out", str(tmp_path), "--steps", "5", "--warmup", "2"], timeout=2400)
    log = (tmp_path / "log.txt").read_text() if (tmp_path / "log.txt").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + log[-3000:]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| 2 |")]
    labels = " ".join(r[2] for r in rows)
    assert "tp2" in labels and "sp2" in labels and "ep2" in labels, proc.stdout
    for r in rows:
        assert AUTOTP_ULYSSES_MOE[0] <= float(r[5]) <= AUTOTP_ULYSSES_MOE[1], proc.stdout
        assert 0.7 <= float(r[6]) / float(r[7]) <= 1.4, proc.stdout

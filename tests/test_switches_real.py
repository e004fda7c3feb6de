"""Full tier: the issue-48 options as a study runs them, on 2 CPU ranks. ZenFlow as an offload mode beside classic
optimizer offload in one sweep (its config derived from a base without a ZenFlow section: DeepSpeedExamples'
settings), each point's record saying what ran. ZenFlow's optimizer process loads ``cpu_adam`` from the op store
(built by ``make``)."""

from __future__ import annotations

import pytest

from tests.conftest import OFFLINE, explain, records, run_cmd

pytestmark = pytest.mark.full


def test_a_sweep_runs_zenflow_beside_classic_offload(tmp_path):
    out = tmp_path / "zen.jsonl"
    done = run_cmd(["python", "-m", "ds_bench", "sweep", "--workload", "llama", "--size", "tiny", "--seq-len", "64",
                    "--ds-config", "ds_configs/zero2.json", "--stages", "2", "--offload", "optimizer,zenflow",
                    "--precision", "fp32", "--micro-batch", "4", "--steps", "6", "--warmup", "1", "--repeats", "1",
                    "--nproc", "2", "--results", str(out)], timeout=900, **OFFLINE)
    assert done.returncode == 0, explain(done)
    points = {r["key"]: r for r in records(out) if r.get("kind") == "sweep_point"}
    assert set(points) == {"z2 off=optimizer fp32 mbs=4", "z2 off=zenflow fp32 mbs=4"}, list(points)
    assert all(p["status"] == "ok" for p in points.values()), [(k, p["reason"]) for k, p in points.items()]
    zen = points["z2 off=zenflow fp32 mbs=4"]["ds_config"]["zero_optimization"]
    classic = points["z2 off=optimizer fp32 mbs=4"]["ds_config"]["zero_optimization"]
    assert zen["zenflow"]["topk_ratio"] == 0.1 and zen["offload_optimizer"]["device"] == "cpu"
    assert "zenflow" not in classic and classic["offload_optimizer"]["device"] == "cpu"
    assert "ZenFlow" in done.stdout or "zenflow" in done.stdout

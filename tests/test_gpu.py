"""GPU smoke tests: a real run on CUDA, skipped cleanly where there is none."""

import pytest
import torch

from tests.conftest import ds_bench, explain, records

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]


@pytest.mark.parametrize("config", ["zero2.json", "zero3.json", "zero2_fp16.json"])
def test_mnist_on_one_gpu(tmp_path, config):
    results = tmp_path / "r.jsonl"
    proc = ds_bench("run", "--workload", "mnist", "--ds-config", f"ds_configs/{config}", "--steps", "20",
                    "--warmup", "5", "--results", str(results))
    assert proc.returncode == 0, explain(proc)
    r = records(results)[0]
    assert r["hardware"]["device_type"] == "cuda" and r["backend"] == "nccl"
    m = r["metrics"]
    assert m["peak_mem_kind"] == "allocated" and m["peak_mem_reserved_bytes"] >= m["peak_mem_bytes"] > 0
    assert m["samples_per_s"] > 0

"""Building the model partitioned under DeepSpeed ZeRO-3 (``deepspeed.zero.Init``, ``ds_bench.engines.zero_init``).

Unit checks: which engine/workload combinations build partitioned, whole-model counts of a partitioned
parameter, the record's ``build`` block in the summary. Real 2-rank runs (module-scoped, run once): a
GPT-2 of 24 blocks of width 256 (--seq-len 32; 32,082,688 parameters, 122 MiB in fp32, blocks ~60 %
of them) under ZeRO-2 and ZeRO-3 in fp32 with the same seed. ZeRO-3 builds it partitioned and must
train exactly as ZeRO-2 does (same initial weights: ``ds_bench.workloads.hf_init``), while rank 0
holds about half the model after the build.
"""

import math

import pytest
import torch

from ds_bench import engines
from ds_bench.cluster.rendezvous import free_port
from ds_bench.config.run_config import RunConfig
from ds_bench.engines import zero_init
from ds_bench.workloads import build_workload
from tests.conftest import OFFLINE, REPO, explain, records, run_cmd

SHAPE = ["--layers", "24", "--hidden", "256", "--heads", "4", "--seq-len", "32"]
PARAMS = 32_082_688
FP32_BYTES = 4 * PARAMS
PORTS = {2: "29876", 3: "29877"}
CONFIG = str(REPO / "ds_configs" / "zero3.json")


def choice(name="deepspeed", stage=3, dtype=torch.float32):
    return engines.EngineChoice(name, stage, dtype, dtype)


def test_nothing_but_deepspeed_zero3_with_a_willing_workload_builds_partitioned():
    """The negative half, in-process: ZeRO-2, an unwilling workload, DDP, FSDP build whole. The positive half needs
    a process group: ``test_zero3_builds_partitioned_and_counts_the_whole_model`` (2 real ranks, ZeRO-3 partitioned)."""
    for c, allows in ((choice(stage=2), True), (choice(stage=3), False), (choice("ddp", 0), True),
                      (choice("fsdp", 3), True)):
        with engines.partitioned_build(c, {}, allows):
            assert not zero_init.building_partitioned()


def test_which_workloads_allow_a_partitioned_build():
    def allows(workload, **kw):
        return build_workload(RunConfig(workload=workload, ds_config=CONFIG, **kw)).partitioned_build

    assert allows("gpt2", size="tiny")
    assert not allows("mnist") and not allows("resnet", size="resnet18")  # FLOPs by a forward pass


def test_a_partitioned_parameter_counts_whole():
    p = torch.nn.Parameter(torch.empty(0))
    p.ds_numel, p.ds_id = 1234, 0
    assert zero_init.full_numel(p) == 1234 and zero_init.full_numel(torch.nn.Parameter(torch.ones(3, 2))) == 6
    assert zero_init.is_partitioned(torch.nn.ParameterList([p]))
    assert not zero_init.is_partitioned(torch.nn.Linear(2, 2))


# ---- real 2-rank runs ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """ZeRO stage -> its record: the same GPT-2, seed and synthetic tokens, fp32, 4 steps."""
    out = {}
    for stage, port in PORTS.items():
        results = tmp_path_factory.mktemp(f"zinit{stage}") / "r.jsonl"
        proc = run_cmd(["torchrun", "--nproc_per_node", "2", "--master_port", str(free_port(int(port))), "-m",
                        "ds_bench", "run",
                        "--workload", "gpt2", *SHAPE, "--micro-batch", "1", "--ds-config",
                        str(REPO / "ds_configs" / f"zero{stage}.json"), "--set", "bf16.enabled=false",
                        "--steps", "4", "--warmup", "1", "--results", str(results)], timeout=400, **OFFLINE)
        assert proc.returncode == 0, explain(proc)
        (out[stage],) = records(results)
        assert "  build        model" in proc.stdout, proc.stdout
    return out


@pytest.mark.dist
def test_zero3_builds_partitioned_and_counts_the_whole_model(runs):
    for stage, partitioned in ((2, False), (3, True)):
        r = runs[stage]
        assert (r["status"], r["zero_stage"], r["build"]["partitioned"]) == ("ok", stage, partitioned)
        assert (r["params"], r["largest_layer_params"]) == (PARAMS, 50257 * 256)  # the tied embedding
        assert r["build"]["model_s"] > 0 and r["build"]["engine_s"] > 0


@pytest.mark.dist
def test_partitioned_build_trains_exactly_as_the_whole_one(runs):
    """Same seed, fp32: each parameter drawn from its own seeded generator, written gathered under
    ``zero.Init`` (``hf_init``), so the initial weights are bitwise equal (measured: identical 6-digit
    losses at every step). Written without gathering, the partitioned (empty) parameters refuse the writes."""
    z2, z3 = (runs[s]["metrics"]["loss_curve"] for s in (2, 3))
    print(f"loss ZeRO-2 {z2}\nloss ZeRO-3 {z3}")
    assert len(z2) == len(z3) == 4 and all(math.isfinite(x) for x in z2)
    for a, b in zip(z2, z3):
        assert b == pytest.approx(a, rel=1e-4)


@pytest.mark.dist
def test_partitioned_build_holds_about_half_the_model(runs):
    """Rank 0's memory over its baseline once the model is built (RSS after the heap's free pages went
    back). Measured: ZeRO-2 124 MiB (the whole fp32 model is 122 MiB), ZeRO-3 76 MiB (its 61 MiB
    shard and ~15 MiB of DeepSpeed's own). The bounds leave ~15 MiB either way."""
    z2, z3 = (runs[s]["build"]["model_mem_bytes"] for s in (2, 3))
    print(f"after the model build: ZeRO-2 {z2 / 2**20:.0f} MiB, ZeRO-3 {z3 / 2**20:.0f} MiB, "
          f"fp32 model {FP32_BYTES / 2**20:.0f} MiB")
    assert z3 < 0.75 * FP32_BYTES, z3
    assert z2 > 0.9 * FP32_BYTES, z2

"""Ulysses sequence parallelism with DeepSpeed's MoE layer (``ds_bench.engines.degrees.moe_sequence_parallel``), run for
real: the same tiny Mixtral, seed and Shakespeare batches in fp32, ZeRO-1, capacity factor 0 (no dropping) and aux
weight 0, on one rank and with each sequence split over two ranks that also shard the experts (SP=2 with EP=2 on
the same 2 ranks); in the full tier SP=2 x EP=2 on 4 ranks (two replicas). The losses agree to 1e-5 relative: without
the override the first step fails ('ProcessGroupGloo::allgather: invalid tensor size'). The aux loss's group mean
(``sequence_parallel.group_mean``) on 2 real Ulysses ranks: value and gradient. Also: the legality table
lets the pair through on the DeepSpeed it was measured with and refuses it on another, and the paths not measured
are refused before joining.
"""

from __future__ import annotations

import math
import re
import sys

import pytest

from ds_bench import cli
from ds_bench.config.degrees import protocol
from ds_bench.config.layout import Layout
from ds_bench.config.legality import Where, violation
from ds_bench.engines.degrees import moe_sequence_parallel
from ds_bench.engines.degrees.expert_parallel import AUTOEP, HF_BLOCKS, ExpertParallelPlan, Router, with_sequence_parallel
from ds_bench.errors import UserError
from tests.conftest import OFFLINE, PASSED, degree, explain, records, run_cmd, size_of, stop_past_checks

SEQ = 64
RUN = ["-m", "ds_bench", "run", "--workload", "moe", "--size", "tiny", "--seq-len", str(SEQ), "--micro-batch", "1",
       "--ds-config", "ds_configs/zero1.json", "--set", "bf16.enabled=false", "--steps", "4", "--warmup", "1",
       "--lr", "3e-3", "--seed", "5", "--aux-loss-weight", "0"]
PAIR = Layout(1, "none", "fp32", 2, sequence_parallel=2, expert_parallel=2)


def _run(name: str, launcher: list[str], flags: list[str], folder, data) -> dict:
    results = folder / f"{name}.jsonl"
    proc = run_cmd([*launcher, *RUN, *flags, "--data", str(data), "--results", str(results)], timeout=300, **OFFLINE)
    assert proc.returncode == 0, explain(proc)
    return {"record": records(results)[0], "stdout": proc.stdout}


def _torchrun(n: int, port: int) -> list[str]:
    return ["torchrun", "--nproc_per_node", str(n), "--master_port", str(port)]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, shakespeare):
    """Two micro-steps of one sequence per step: the batches one SP group (accumulation 2) or two replicas
    (accumulation 1, replica r takes the epoch's r-th sequence of each pair) read."""
    return _run("one", [sys.executable], ["--set", "gradient_accumulation_steps=2"], tmp_path_factory.mktemp("moe_sp"),
                shakespeare)


def _parity(one: dict, other: dict) -> float:
    a, b = one["metrics"]["loss_curve"], other["metrics"]["loss_curve"]
    assert (one["status"], other["status"]) == ("ok", "ok")
    assert len(a) == len(b) == 4 and all(math.isfinite(x) for x in a) and a[-1] != a[0]
    print(f"loss 1 rank {a}\nloss SP x EP {b}\nmax |diff| {max(abs(x - y) for x, y in zip(a, b)):.2e}")
    assert b == pytest.approx(a, rel=1e-5)
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.mark.dist
def test_two_ranks_sharing_sequences_and_experts_reproduce_one_rank(one_rank, tmp_path, shakespeare):
    """SP=2 and EP=2 on the same 2 ranks: each holds half of every sequence and half the experts; losses equal one
    rank's, every all-to-all of both degrees is counted, and the record says S=2, one replica."""
    run = _run("sp2ep2", _torchrun(2, 29961), ["--set", "gradient_accumulation_steps=2", "--sequence-parallel", "2",
                                               "--expert-parallel", "2"], tmp_path, shakespeare)
    one, two = one_rank["record"], run["record"]
    _parity(one, two)
    assert (size_of(two, "sequence_parallel"), two["data_parallel_size"], two["world_size"]) == (2, 1, 2)
    e = degree(two, "expert_parallel")["settings"]
    assert (e["path"], size_of(two, "expert_parallel"), e["local_experts"], e["data_parallel_size"],
            e["expert_data_parallel_size"]) == ("moe-layer", 2, 2, 1, 1)
    k, layers = 2, 2  # micro-steps per step, MoE blocks (= attention layers) of tiny
    assert degree(two, "sequence_parallel")["comm"]["calls_per_step"] == 8 * layers * k  # Ulysses: 4 fwd + 4 bwd
    assert degree(two, "expert_parallel")["comm"]["calls_per_step"] == 4 * layers * k  # dispatch + combine, fwd, bwd
    assert set(two["comm_bound"]["bus_bytes_per_step"]) >= {"sp_all_to_all", "ep_all_to_all"}
    assert "1 data-parallel (sp2)" in run["stdout"]


@pytest.mark.dist
@pytest.mark.full
def test_two_replicas_of_sequence_and_expert_parallel_groups_reproduce_one_rank(one_rank, tmp_path, shakespeare):
    """SP=2 x EP=2 on 4 ranks: two replicas of 2-rank Ulysses groups, the experts sharded over ranks 0-1 and 2-3,
    each expert's gradient averaged over the 2 ranks that hold it."""
    run = _run("sp2ep2_w4", _torchrun(4, 29962), ["--set", "gradient_accumulation_steps=1", "--sequence-parallel", "2",
                                                  "--expert-parallel", "2"], tmp_path, shakespeare)
    four = run["record"]
    _parity(one_rank["record"], four)
    assert (size_of(four, "sequence_parallel"), four["data_parallel_size"], four["world_size"]) == (2, 2, 4)
    e = degree(four, "expert_parallel")["settings"]
    assert (e["data_parallel_size"], e["expert_data_parallel_size"]) == (2, 2)


def test_the_table_lets_the_pair_through_on_the_verified_deepspeed_only(monkeypatch):
    where = Where(2, "cpu", engaged=frozenset({"expert_parallel"}))
    assert protocol.installed_deepspeed() == protocol.DEEPSPEED, "ds_bench's verified DeepSpeed is the one installed"
    assert violation(PAIR, where) is None
    assert violation(Layout(1, "none", "fp32", 2, sequence_parallel=2), where) is None  # EP = 1: the MoE layer too
    monkeypatch.setattr(protocol, "installed_deepspeed", lambda: "deepspeed 0.20.0")
    said = violation(PAIR, where)
    assert said and said.startswith("--workload moe (--expert-parallel 2) with --sequence-parallel 2: ")
    assert "measured with deepspeed 0.19.8 only" in said
    assert violation(Layout(1, "none", "fp32", 2, sequence_parallel=2), Where(2)) is None  # no MoE layer: dense


@pytest.mark.parametrize("path", [AUTOEP, HF_BLOCKS])
def test_only_the_moe_layer_path_is_measured_under_ulysses(path):
    ep = ExpertParallelPlan(1, 2, 4, Router(2), path)
    with pytest.raises(UserError, match=rf"^--moe-path {path} with --sequence-parallel 2: not measured yet"):
        with_sequence_parallel(ep, 2)
    assert with_sequence_parallel(ep, 1) is ep


def test_under_ulysses_the_non_expert_replicas_are_the_groups():
    four = with_sequence_parallel(ExpertParallelPlan(2, 4, 4, Router(2)), 2)
    assert (four.data_parallel_size, four.expert_data_parallel_size, four.local_experts) == (2, 2, 2)
    assert with_sequence_parallel(ExpertParallelPlan(1, 2, 4, Router(2)), 1).data_parallel_size == 2  # S=1


def test_hfs_own_blocks_under_ulysses_exit_2_before_joining(monkeypatch, tmp_path, capsys):
    stop_past_checks(monkeypatch)
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(name, value)
    code = cli.main(["run", "--workload", "moe", "--size", "tiny", "--seq-len", "32", "--moe-path", "hf",
                     "--sequence-parallel", "2", "--ds-config", "ds_configs/zero1.json", "--set", "bf16.enabled=false",
                     "--results", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("ds-bench: error: ")]
    assert code == 2 and PASSED not in err and "Traceback" not in err, err[-2000:]
    assert errors == ["ds-bench: error: --moe-path hf with --sequence-parallel 2: not measured yet (DeepSpeed's MoE "
                      "layer composes with Ulysses: --moe-path moe-layer)"]


def test_the_override_answers_one_under_ulysses_only_and_is_put_back():
    """In ``sharded_moe`` and ``mappings`` only: Ulysses' mpu gets 1, any other mpu DeepSpeed's own answer."""
    import deepspeed.moe.mappings as mappings
    import deepspeed.moe.sharded_moe as sharded_moe
    from deepspeed.runtime.sequence_parallel import parallel_state_sp
    from deepspeed.utils import bwc

    class Megatron:
        def get_tensor_model_parallel_world_size(self):
            return 4

    assert not moe_sequence_parallel.installed()
    try:
        moe_sequence_parallel.install()
        moe_sequence_parallel.install()  # idempotent
        for module in (sharded_moe, mappings):
            f = getattr(module, moe_sequence_parallel.NAME)
            assert f is not bwc.bwc_tensor_model_parallel_world_size
            assert (f(parallel_state_sp), f(Megatron()), f(None)) == (1, 4, 1)
        assert bwc.bwc_tensor_model_parallel_world_size(Megatron()) == 4
    finally:
        moe_sequence_parallel.restore()
    assert not moe_sequence_parallel.installed()
    for module in (sharded_moe, mappings):
        assert getattr(module, moe_sequence_parallel.NAME) is bwc.bwc_tensor_model_parallel_world_size


GROUP_MEAN = """
import os

import deepspeed
import deepspeed.comm as dist
import torch
from deepspeed.runtime.sequence_parallel import parallel_state_sp

from ds_bench.engines.degrees.sequence_parallel import group_mean

deepspeed.init_distributed(dist_backend="gloo")
parallel_state_sp.initialize_sequence_parallel(2)
rank = dist.get_rank()
x = torch.tensor(1.0, requires_grad=True)
out = group_mean(x * (rank + 1.0), {"group_size": 2, "gradient_scale": 1})  # this rank's aux: 1, 2
out.backward()
print(f"RANK {rank} value {out.item():.6f} grad {x.grad.item():.6f}", flush=True)
torch.distributed.destroy_process_group()
os._exit(0)  # gloo's exit crash (docs: ENVIRONMENT): nothing left to run
"""


@pytest.mark.dist
def test_the_aux_loss_of_a_group_is_its_ranks_mean(tmp_path):
    """``sequence_parallel.group_mean``, on 2 real Ulysses ranks: the value is the group's mean on both, the
    gradient each rank's term / S (DeepSpeed then sums the group's gradients: the mean's gradient)."""
    import os

    from ds_bench.machine import toolchain
    from tests.conftest import REPO

    script = tmp_path / "group_mean.py"
    script.write_text(GROUP_MEAN)
    env = {**toolchain.this_environment_toolchain(os.environ), "PYTHONPATH": str(REPO), "DS_ACCELERATOR": "cpu"}
    proc = run_cmd([*_torchrun(2, 29963), str(script)], timeout=120, **env)  # ds_bench's op folder: no JIT build
    assert proc.returncode == 0, explain(proc)
    lines = sorted(re.findall(r"RANK \d value [\d.]+ grad [\d.]+", proc.stdout))  # two ranks' prints may interleave
    assert lines == ["RANK 0 value 1.500000 grad 0.500000", "RANK 1 value 1.500000 grad 1.000000"], proc.stdout

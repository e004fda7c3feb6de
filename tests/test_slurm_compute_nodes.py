"""A study submitted from a login node plans for the compute nodes (``jobs.compute_nodes``), on a real Slurm whose
node records say something else than the login node (tests/slurm_bed.py).

The bed's ``hostb`` is a GPU node to Slurm (``Gres=gpu:h100:2``, counted from its ``gres.conf``: no device behind
it) in partition ``gpu``; ``hosta``, the login node the study runs on, has no GPU, and in partition ``cpu`` its node
record lists CPU features saying the opposite of this CPU's bf16 (``avx2,avx512f`` where this CPU has
``avx512_bf16``, and the reverse). A study that took these from the login node would plan CPU ranks in the
login CPU's precision.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ds_bench.machine.cpu_features import this_cpu_has_native_bf16
from tests.slurm_bed import module_bed

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parent.parent
LOGIN_BF16 = this_cpu_has_native_bf16()
CPU_FEATURES = "avx2,avx512f" if LOGIN_BF16 else "avx2,avx512f,avx512_bf16"
SWEEP = [sys.executable, "-m", "ds_bench", "sweep", "--ds-config", "ds_configs/zero2.json", "--stages", "1,2",
         "--micro-batch", "4", "--executor", "slurm", "--dry-run"]


@pytest.fixture(scope="module")
def slurm():
    nodes = {"hosta": f"Features={CPU_FEATURES}", "hostb": "Gres=gpu:h100:2"}
    with module_bed("dsbg", node_options=nodes, partitions={"gpu": "hostb", "cpu": "hosta"},
                    gres={"hostb": "Name=gpu Type=h100 Count=2"}) as cluster:
        yield cluster


def study(slurm, argv: list[str]) -> str:
    r = slurm.run(argv, env={"HF_HUB_OFFLINE": "1"}, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.explain()
    return r.stdout


@pytest.mark.timeout(240)
def test_a_sweep_for_the_gpu_partition_plans_its_gpus_from_the_node_records(slurm):
    out = study(slurm, [*SWEEP, "--workload", "gpt2", "--size", "small", "--partition", "gpu"])
    lines = out.splitlines()
    assert lines[0] == ("compute nodes: partition gpu (1 node(s): hostb): 2 GPU(s) per node (h100, 80 GiB each), "
                        "bf16 native, 2 CPUs, 8 GiB per node (from Slurm's node records)"), out
    assert "  z1 off=none bf16" in lines and "  z2 off=none bf16" in lines, out
    job = next(line for line in lines if line.startswith("each point"))
    assert "--ntasks-per-node=2 " in job and "--gpus-per-node=2" in job, job  # one rank per GPU, and it asks for them


@pytest.mark.timeout(240)
def test_a_sweep_for_the_cpu_partition_takes_bf16_from_its_features_and_a_flag_overrides_them(slurm):
    out = study(slurm, [*SWEEP, "--workload", "mnist", "--partition", "cpu"])
    lines = out.splitlines()
    nodes_bf16 = not LOGIN_BF16
    assert lines[0].startswith("compute nodes: partition cpu (1 node(s): hosta): no GPU, "
                               + ("bf16 native" if nodes_bf16 else "bf16 emulated")), out
    assert f"  z1 off=none {'bf16' if nodes_bf16 else 'fp32'}" in lines, out
    assert "--gpus-per-node" not in out
    flipped = "native" if LOGIN_BF16 else "emulated"
    out = study(slurm, [*SWEEP, "--workload", "mnist", "--partition", "cpu", "--compute-node", f"bf16={flipped}"])
    assert out.splitlines()[0].endswith("(from Slurm's node records and --compute-node)"), out
    assert f"  z1 off=none {'bf16' if LOGIN_BF16 else 'fp32'}" in out.splitlines(), out


@pytest.mark.timeout(240)
def test_capacity_and_plan_for_the_gpu_partition_follow_its_nodes(slurm, tmp_path):
    out = study(slurm, [sys.executable, "-m", "ds_bench", "capacity", "--ds-config", "zero1.json", "--family", "gpt3",
                        "--executor", "slurm", "--partition", "gpu", "--dry-run"])
    assert "2 GPU(s) per node (h100" in out.splitlines()[0] and ", 2 rank(s), 80.00 GiB per rank" in out, out
    out = study(slurm, [sys.executable, "-m", "ds_bench", "plan", "--workload", "gpt2", "--size", "small",
                        "--executor", "slurm", "--partition", "gpu", "--top", "2", "--results",
                        str(tmp_path / "plan.jsonl")])
    assert out.splitlines()[0].startswith("compute nodes: partition gpu"), out
    assert "\ncluster: 1 x 2 H100, 80.0 GiB each" in out, out

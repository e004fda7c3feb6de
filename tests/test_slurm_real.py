"""Real Slurm on the two-host test bed (tests/netns.py + tests/slurm_bed.py): no emulated srun.

One cluster for the module: munged, slurmctld on hosta and one slurmd per host (hosta, hostb), each in
its own network namespace. The node names resolve to the blocked eth0; the nodes talk over ib0.
Skips with the reason where the bed cannot be built (not root, no network namespaces, Slurm neither
installed nor installable through apt).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, records
from tests.netns import ADDRS, skip_reason, two_hosts

pytestmark = pytest.mark.dist

PREFIX = "dsbr"
PY = sys.executable
CONNECT = ["--connect-timeout", "5", "--dist-timeout", "60"]
FP32 = ["--set", "bf16.enabled=false"]  # emulated bf16 is ~20x slower on an AVX2-only CPU


@pytest.fixture(scope="module")
def slurm():
    reason = skip_reason(PREFIX)
    if reason:
        pytest.skip(reason)
    from tests import slurm_bed

    reason = slurm_bed.ensure_installed()
    if reason:
        pytest.skip(reason)
    with two_hosts(PREFIX) as bed, slurm_bed.slurm_cluster(bed) as cluster:
        yield cluster
    assert slurm_bed.running_daemons(cluster.workdir) == [], "a Slurm daemon outlived the bed"


def sbatch(slurm, script: str, args: list[str], env: dict[str, str], out: Path, timeout: float):
    """``sbatch --wait`` a run script from the repository; the job's exit status and its output."""
    env = {"PYTHON": PY, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **env}
    res = slurm.run(["sbatch", "--wait", f"--output={out}", *args, script], env=env, timeout=timeout, cwd=REPO)
    text = out.read_text(errors="replace") if out.exists() else ""
    return res, text


def explain(res, text: str, slurm) -> str:
    return f"{res.explain()}\n--- job output\n{text[-6000:]}\n{slurm.logs()}"


@pytest.mark.timeout(60)
def test_srun_pmix_gives_mpi4py_one_rank_per_host(slurm):
    code = ("from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; "
            "print('RANK', c.rank, c.size, socket.gethostname(), flush=True)")
    res = slurm.run(["srun", "--mpi=pmix", "-N2", "--ntasks-per-node=1", PY, "-c", code], timeout=45, cwd=REPO)
    assert res.returncode == 0, res.explain() + slurm.logs()
    lines = sorted(line.split()[1:] for line in res.stdout.splitlines() if line.startswith("RANK "))
    assert lines == [["0", "2", "hosta"], ["1", "2", "hostb"]], res.explain()


@pytest.mark.timeout(150)
def test_sbatch_multi_node_srun_pmix_rendezvous_on_ib0(slurm, tmp_path):
    """``run_scripts/slurm_multi_node_srun.sbatch`` across both hosts, MPI=pmix, IFACE unset: the script runs
    ``ds-bench launch srun --mpi pmix`` (the ``launch srun`` path), ranks come from PMIx + mpi4py, and ds_bench
    puts the rendezvous on ib0 by itself, not on the blocked eth0 that the node names resolve to."""
    results, out = tmp_path / "r.jsonl", tmp_path / "job.out"
    env = {"NODES": "2", "NPROC_PER_NODE": "1", "MPI": "pmix", "WORKLOAD": "mnist", "DS_CONFIG": "ds_configs/zero2.json",
           "EXTRA": " ".join(["--steps", "6", "--warmup", "2", *FP32, *CONNECT]), "RESULTS": str(results)}
    res, text = sbatch(slurm, "run_scripts/slurm_multi_node_srun.sbatch",
                       ["-N2", "--ntasks-per-node=1", "--cpus-per-task=1"], env, out, timeout=130)
    assert res.returncode == 0, explain(res, text, slurm)
    (rec,) = records(results)
    assert rec["status"] == "ok", rec.get("error")
    assert rec["hosts"] == ["hosta", "hostb"] and rec["world_size"] == 2, rec
    assert rec["launcher"] == "pmix", rec["launcher"]
    rdv = rec["rendezvous"]
    assert (rdv["iface"], rec["master_addr"]) == ("ib0", ADDRS["hosta"]["ib0"]), rdv

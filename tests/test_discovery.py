"""Tests for ds_bench.cluster.discovery: every launcher path, precedence, errors, MPI completion."""

import dataclasses
import importlib.util
import json
import re
import subprocess
import sys
import types

import pytest

from ds_bench.cluster import discovery
from ds_bench.cluster.discovery import RankInfo, discover
from ds_bench.cluster.mpi_discovery import complete_with_mpi
from ds_bench.errors import UserError


def info(rank, world, local, local_world, node, addr, port, source, hosts=()):
    return RankInfo(rank, world, local, local_world, node, addr, port, source, tuple(hosts))


def raises(message):
    return pytest.raises(UserError, match="^" + re.escape(message) + "$")


def test_single_when_nothing_is_set():
    assert discover({}) == info(0, 1, 0, 1, 0, None, None, "single")
    assert discover({"RANK": "", "WORLD_SIZE": " "}).source == "single"
    assert discover({"MASTER_ADDR": "h", "MASTER_PORT": "29500"}) == info(0, 1, 0, 1, 0, "h", 29500, "single")


def test_plain_env():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert discover(env) == info(3, 4, 1, 2, 1, "10.0.0.1", 29500, "env")


def test_deepspeed_launch_py_variables():
    # What deepspeed/launcher/launch.py exports to each child (deepspeed 0.19).
    env = {"MASTER_ADDR": "node01", "MASTER_PORT": "29500", "WORLD_SIZE": "8", "CROSS_RANK": "1",
           "CROSS_SIZE": "2", "LOCAL_SIZE": "4", "RANK": "6", "LOCAL_RANK": "2"}
    assert discover(env) == info(6, 8, 2, 4, 1, "node01", 29500, "deepspeed")


def test_deepspeed_mpich_runner_is_plain_env():
    # DeepSpeed's MPICH runner exports LOCAL_SIZE but no CROSS_*; its helper sets RANK/LOCAL_RANK.
    env = {"WORLD_SIZE": "4", "LOCAL_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "PMI_RANK": "1",
           "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    assert discover(env) == info(1, 4, 1, 2, None, "n1", 29500, "env")


def test_torchrun():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "GROUP_RANK": "1", "NODE_RANK": "0", "TORCHELASTIC_RUN_ID": "abc",
           "MASTER_ADDR": "m", "MASTER_PORT": "1234"}
    assert discover(env) == info(5, 8, 1, 4, 1, "m", 1234, "torchrun")
    del env["TORCHELASTIC_RUN_ID"]
    assert discover(env).source == "torchrun"


def test_torch_path_wins_over_mpi_and_slurm():
    env = {"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert discover(env) == info(1, 2, None, None, None, None, None, "env")


@pytest.mark.parametrize("present, absent", [("RANK", "WORLD_SIZE"), ("WORLD_SIZE", "RANK")])
def test_half_torch_env_is_an_error(present, absent):
    with raises(f"environment: {present} is set but {absent} is not; set both or neither"):
        discover({present: "1"})


def test_stray_rank_ignored_when_a_launcher_is_present():
    env = {"RANK": "7", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    assert discover(env).source == "openmpi"


OMPI = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_NODE_RANK": "1"}


def test_openmpi_leaves_node_rank_and_master_to_mpi():
    got = discover(OMPI)
    assert got == info(5, 8, 1, 4, None, None, None, "openmpi")
    assert got.missing() == ["master_addr"]


def test_mpirun_inside_slurm_allocation_ignores_allocation_variables():
    # Under mpirun in an sbatch script, SLURM_* describe the batch step, not the MPI ranks.
    env = {**OMPI, "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
           "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
    assert discover(env) == info(5, 8, 1, 4, None, None, None, "openmpi")
    env["SLURM_PROCID"] = "5"  # rank agrees by chance, but the sizes do not
    assert discover(env).hosts == ()


SRUN = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "2(x4)", "SLURM_STEP_NODELIST": "gpu[1-4]",
        "SLURM_JOB_NODELIST": "gpu[1-9]"}
GPUS = ("gpu1", "gpu2", "gpu3", "gpu4")


def test_pmix_alone_has_no_size():
    got = discover({"PMIX_RANK": "3"})
    assert got == info(3, None, None, None, None, None, None, "pmix")
    assert got.missing() == ["world_size", "local_rank", "master_addr"]


def test_srun_mpi_pmix_fills_from_slurm():
    # master_addr stays unset: under MPI, rank 0 offers its interface's address instead of a node name
    assert discover({**SRUN, "PMIX_RANK": "3"}) == info(3, 8, 1, 2, 1, None, None, "pmix", GPUS)


def test_pmix_disagreeing_with_slurm_is_not_filled():
    assert discover({**SRUN, "PMIX_RANK": "4"}) == info(4, None, None, None, None, None, None, "pmix")


def test_mvapich():
    env = {"MV2_COMM_WORLD_RANK": "2", "MV2_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_LOCAL_RANK": "0",
           "MV2_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_PORT": "6000"}
    assert discover(env) == info(2, 4, 0, 2, None, None, 6000, "mvapich")


def test_pmi_hydra():
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert discover(env) == info(1, 2, 1, 2, None, None, None, "pmi")


def test_srun_mpi_pmi2_fills_only_the_gaps():
    env = {**SRUN, "PMI_RANK": "3", "PMI_SIZE": "8", "MASTER_ADDR": "10.1.1.1"}
    assert discover(env) == info(3, 8, 1, 2, 1, "10.1.1.1", None, "pmi", GPUS)
    env["PMI_SIZE"] = "16"  # same rank, different world: Slurm describes something else
    assert discover(env) == info(3, 16, None, None, None, "10.1.1.1", None, "pmi")


def test_mpi_order_openmpi_before_pmix_before_mvapich_before_pmi():
    env = {"PMI_RANK": "0", "MV2_COMM_WORLD_RANK": "0", "PMIX_RANK": "0", **OMPI}
    assert discover(env).source == "openmpi"
    del env["OMPI_COMM_WORLD_RANK"]
    assert discover(env).source == "pmix"
    del env["PMIX_RANK"]
    assert discover(env).source == "mvapich"
    del env["MV2_COMM_WORLD_RANK"]
    assert discover(env).source == "pmi"


def test_slurm():
    assert discover(SRUN) == info(3, 8, 1, 2, 1, "gpu1", None, "slurm", GPUS)


def test_slurm_variants():
    env = {"SLURM_PROCID": "6", "SLURM_NPROCS": "11", "SLURM_LOCALID": "0", "SLURM_NODEID": "2",
           "SLURM_TASKS_PER_NODE": "4(x2),3", "SLURM_NODELIST": "a[1-2],b", "MASTER_ADDR": "x"}
    assert discover(env) == info(6, 11, 0, 3, 2, "x", None, "slurm", ("a1", "a2", "b"))
    env["SLURM_STEP_TASKS_PER_NODE"] = "5(x3)"
    assert discover(env).local_world_size == 5


def test_slurm_ntasks_per_node_and_job_nodelist():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0",
           "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "c[07-08]"}
    assert discover(env) == info(0, 4, 0, 2, None, "c07", None, "slurm", ("c07", "c08"))


def test_slurm_minimal():
    assert discover({"SLURM_PROCID": "0"}) == info(0, None, None, None, None, None, None, "slurm")


def test_slurm_node_beyond_tasks_per_node():
    env = {"SLURM_PROCID": "0", "SLURM_NODEID": "3", "SLURM_TASKS_PER_NODE": "4(x2),3"}
    with raises("environment: SLURM_NODEID=3 is beyond SLURM_TASKS_PER_NODE='4(x2),3' (3 nodes)"):
        discover(env)


def test_slurm_bad_lists_name_the_variable():
    with pytest.raises(UserError, match=re.escape("SLURM_STEP_NODELIST='gpu[1-': not a Slurm host list")):
        discover({"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "gpu[1-"})
    with pytest.raises(UserError, match=re.escape("SLURM_TASKS_PER_NODE='4(x'")):
        discover({"SLURM_PROCID": "0", "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "4(x"})


@pytest.mark.parametrize(
    "env, message",
    [
        ({"RANK": "abc", "WORLD_SIZE": "2"}, "environment: RANK='abc' is not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "2.0"}, "environment: WORLD_SIZE='2.0' is not an integer"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "environment: RANK='-1'; expected an integer >= 0"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "environment: WORLD_SIZE='0'; expected an integer >= 1"),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "x"},
         "environment: OMPI_COMM_WORLD_LOCAL_SIZE='x' is not an integer"),
        ({"PMIX_RANK": "one"}, "environment: PMIX_RANK='one' is not an integer"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS_PER_NODE": "0"},
         "environment: SLURM_NTASKS_PER_NODE='0'; expected an integer >= 1"),
        ({"MASTER_PORT": "http"}, "environment: MASTER_PORT='http' is not an integer"),
        ({"MASTER_PORT": "0"}, "environment: MASTER_PORT='0'; expected an integer >= 1"),
        ({"MASTER_PORT": "70000"}, "environment: MASTER_PORT=70000 is not a TCP port; expected 1..65535"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "environment: RANK=4 must be below WORLD_SIZE=4"),
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_SIZE": "2"},
         "environment: LOCAL_RANK=2 must be below LOCAL_SIZE=2"),
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "8"},
         "environment: LOCAL_WORLD_SIZE=8 must be at most WORLD_SIZE=4"),
        ({"PMI_RANK": "2", "PMI_SIZE": "2"}, "environment: PMI_RANK=2 must be below PMI_SIZE=2"),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "4"}, "environment: SLURM_PROCID=5 must be below SLURM_NTASKS=4"),
    ],
)
def test_bad_values(env, message):
    with raises(message):
        discover(env)


def test_missing_and_frozen():
    full = info(0, 2, 0, 2, 0, "h", None, "env")
    assert full.missing() == []
    assert info(None, None, None, None, None, None, None, "pmix").missing() == [
        "rank", "world_size", "local_rank", "master_addr"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        full.rank = 1


# --- complete_with_mpi against a fake mpi4py: several ranks simulated one at a time. ---------


class FakeRequest:
    def __init__(self, done):
        self.done = done

    def Test(self):
        return self.done


class FakeComm:
    def __init__(self, rank, names, root_choice, barrier_done=True):
        self.rank, self.names, self.root_choice, self.barrier_done = rank, names, root_choice, barrier_done

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return len(self.names)

    def Ibarrier(self):
        return FakeRequest(self.barrier_done)

    def allgather(self, value):
        assert value == self.names[self.rank]
        return list(self.names)

    def bcast(self, value, root):
        return value if self.rank == root else self.root_choice


def fake_mpi(monkeypatch, comm):
    mpi = types.SimpleNamespace(COMM_WORLD=comm, Get_processor_name=lambda: comm.names[comm.rank])
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=mpi))


NAMES = ["a", "a", "b", "b", "a", "b"]


def test_complete_groups_ranks_by_processor_name(monkeypatch):
    fake_mpi(monkeypatch, FakeComm(5, NAMES, root_choice=("ok", ("10.0.0.9", 29500))))
    start = info(None, None, None, None, None, None, None, "pmix")
    got = complete_with_mpi(start, lambda spans: pytest.fail("only rank 0 chooses"), timeout_s=1)
    assert got == info(5, 6, 2, 3, 1, "10.0.0.9", 29500, "pmix", ("a", "b"))


def test_complete_rank0_chooses_knowing_the_run_spans_hosts(monkeypatch):
    fake_mpi(monkeypatch, FakeComm(0, NAMES, root_choice=None))
    seen = []
    start = info(0, 6, 0, 4, 7, None, 29600, "openmpi", ("h1",))
    got = complete_with_mpi(start, lambda spans: seen.append(spans) or ("10.0.0.1", 1), timeout_s=1)
    assert seen == [True]
    assert got == info(0, 6, 0, 4, 7, "10.0.0.1", 29600, "openmpi", ("h1",))


def test_complete_keeps_own_master(monkeypatch):
    fake_mpi(monkeypatch, FakeComm(0, ["a"], root_choice=None))
    got = complete_with_mpi(discover({"MASTER_ADDR": "m", "MASTER_PORT": "123"}),
                            lambda spans: pytest.fail("not needed"), 1)
    assert (got.master_addr, got.master_port) == ("m", 123)


def test_complete_rejects_disagreeing_world(monkeypatch):
    fake_mpi(monkeypatch, FakeComm(0, ["a"], root_choice=None))
    with raises("MPI: COMM_WORLD says rank 0 of 1 but the environment (slurm) says rank 0 of 4"):
        complete_with_mpi(discover({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}), lambda s: ("x", 1), 1)


def test_complete_times_out_when_a_rank_never_arrives(monkeypatch):
    fake_mpi(monkeypatch, FakeComm(0, ["a", "b"], root_choice=None, barrier_done=False))
    message = ("MPI: not every rank arrived within 0.05s; "
               "check that all ranks were started by the same mpirun/srun")
    with raises(message):
        complete_with_mpi(info(None, None, None, None, None, None, None, "pmix"), lambda s: ("x", 1), 0.05)


def test_complete_rank0_failure_reaches_every_rank(monkeypatch):
    def fail(spans):
        raise UserError("no interface")

    fake_mpi(monkeypatch, FakeComm(0, ["a", "b"], root_choice=None))
    with raises("no interface"):
        complete_with_mpi(info(None, None, None, None, None, None, None, "pmix"), fail, 1)
    fake_mpi(monkeypatch, FakeComm(1, ["a", "b"], root_choice=("error", "no interface")))
    with raises("rank 0 could not choose a master address: no interface"):
        complete_with_mpi(info(None, None, None, None, None, None, None, "pmix"), fail, 1)


REAL_MPI_SCRIPT = """
import json
from ds_bench.cluster.discovery import discover
from ds_bench.cluster.mpi_discovery import complete_with_mpi
from mpi4py import MPI
got = complete_with_mpi(discover({}), lambda spans: ("192.0.2.7", 29555), timeout_s=30)
print(json.dumps([got.rank, got.world_size, got.local_rank, got.local_world_size, got.node_rank,
                  got.master_addr, got.source, list(got.hosts), MPI.Get_processor_name()]))
"""


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py not installed")
def test_complete_with_real_mpi4py_single_process():
    # A subprocess keeps MPI initialisation out of the pytest process.
    done = subprocess.run([sys.executable, "-c", REAL_MPI_SCRIPT], capture_output=True, text=True,
                          timeout=120, cwd=discovery.__file__.rsplit("/ds_bench/", 1)[0])
    if done.returncode != 0 and "ImportError" in done.stderr:
        pytest.skip(f"mpi4py present but MPI unusable: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    rank, world, local, local_world, node, addr, source, hosts, name = json.loads(
        done.stdout.strip().splitlines()[-1])
    assert (rank, world, local, local_world, node, addr, source) == (0, 1, 0, 1, 0, "192.0.2.7", "single")
    assert hosts == [name]

"""Multi-rank start-up without torch-style variables: real Open MPI mpirun, and srun's environment.

mpirun: two real ranks with no RANK/WORLD_SIZE/MASTER_* set; ds_bench discovers them from
OMPI_COMM_WORLD_* and mpi4py, and rank 0 broadcasts the master address it chose.
Slurm: srun cannot run here, so two processes get exactly the variables srun sets for a 2-task,
1-node step (no MPI plugin), and ds_bench must find its ranks and rendezvous from them alone.
Both run a 2-stage GPT-2 pipeline (DeepSpeed's PipelineModule, one stage per rank): rank discovery and
the interface choice are the same for every engine, and the pipeline engine then builds its stage and
data-parallel groups on the world they found. (Data-parallel runs under mpirun: tests/test_launch.py,
test_faults.py, test_netns.py.)
"""

import random
import socket
import subprocess
import sys

import pytest

from tests.conftest import OFFLINE, REPO, child_env, degree, explain, records, run_cmd, size_of

pytestmark = pytest.mark.dist

RUN = ["-m", "ds_bench", "run", "--workload", "gpt2", "--layers", "4", "--hidden", "64", "--heads", "4", "--seq-len",
       "32", "--ds-config", "ds_configs/zero1.json", "--set", "bf16.enabled=false", "--set",
       "gradient_accumulation_steps=2", "--pipeline-stages", "2", "--steps", "3", "--warmup", "1",
       "--connect-timeout", "20s", "--dist-timeout", "120s"]


def check_pipeline(r: dict) -> None:
    assert (size_of(r, "pipeline_stages"), r["data_parallel_size"], degree(r, "pipeline_stages")["settings"]["micro_batches"]) == (2, 1, 2)
    assert [s["stage"] for s in r["pipeline_layout"]] == [0, 1] and len(r["metrics"]["loss_curve"]) == 3


def test_mpirun_two_ranks_without_rank_variables(tmp_path):
    results = tmp_path / "r.jsonl"
    proc = run_cmd(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PATH",
                    "-x", "HF_HUB_OFFLINE", "-x", "HF_DATASETS_OFFLINE", sys.executable, *RUN, "--results",
                    str(results)], timeout=240, **OFFLINE)
    assert proc.returncode == 0, explain(proc)
    (r,) = records(results)
    assert (r["status"], r["launcher"], r["world_size"]) == ("ok", "openmpi", 2)
    assert r["master_addr"] == r["rendezvous"]["master_addr"] and r["rendezvous"]["iface"]
    assert r["rendezvous"]["hosts"] == [socket.gethostname()] and not r["rendezvous"]["spans_hosts"]
    check_pipeline(r)


def srun_env(procid: int, job_id: str) -> dict[str, str]:
    host = socket.gethostname().split(".")[0]
    return {
        "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid), "SLURM_NODEID": "0", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2",
        "SLURM_STEP_NUM_TASKS": "2", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_STEP_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": host, "SLURM_NODELIST": host, "SLURM_STEP_NODELIST": host,
        "SLURM_TASKS_PER_NODE": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_CPUS_ON_NODE": "2", "SLURMD_NODENAME": host, "SLURM_TOPOLOGY_ADDR": host, "SLURM_CLUSTER_NAME": "test",
    }


def test_two_processes_with_the_environment_srun_sets(tmp_path):
    results = tmp_path / "r.jsonl"
    job = str(random.randint(1000, 900000))
    procs = [subprocess.Popen([sys.executable, *RUN, "--results", str(results)], cwd=REPO,
                              env=child_env(**srun_env(i, job), **OFFLINE), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"exit {p.returncode}\n{out[-2000:]}\n{err[-4000:]}"
    (r,) = records(results)
    assert (r["status"], r["launcher"], r["world_size"]) == ("ok", "slurm", 2)
    assert r["rendezvous"]["master_port"] == 20000 + int(job) % 20000
    assert r["master_addr"] == socket.gethostname().split(".")[0]
    check_pipeline(r)

"""The Slurm executor's pure parts (``ds_bench.jobs.slurm_batch``) and the study flags that ask for it, on
inline inputs; tests/test_slurm_studies.py runs studies through a real Slurm."""

from __future__ import annotations

import argparse

import pytest

from ds_bench.config import study_flags as flags
from ds_bench.errors import UserError
from ds_bench.jobs import runner
from ds_bench.jobs.slurm_batch import (
    Allocation,
    SlurmEnd,
    batch_script,
    never_starts,
    parse_fields,
    parse_sacct,
    same_unit,
    sbatch_argv,
    time_limit,
    unit_of,
)

ALLOC = Allocation(nodes=2, tasks_per_node=4, time_limit_s=900, partition="gpu", account="proj1", gpus_per_node=4,
                   mpi="pmix")


@pytest.mark.parametrize("seconds, minutes", [(1, "1"), (60, "1"), (61, "2"), (90, "2"), (900, "15"), (3600, "60")])
def test_time_limit_rounds_up_to_whole_minutes(seconds, minutes):
    assert time_limit(seconds) == minutes


def test_sbatch_asks_for_the_allocation_and_names_the_job_after_the_tag():
    argv = sbatch_argv(ALLOC, "sweep-abc-z1_mbs8-r0-1a2b3c", "/r/s.logs/x.log", "/work")
    assert argv[:2] == ["sbatch", "--parsable"]
    for want in ("--job-name=sweep-abc-z1_mbs8-r0-1a2b3c", "--nodes=2", "--ntasks-per-node=4", "--time=15",
                 "--output=/r/s.logs/x.log", "--chdir=/work", "--partition=gpu", "--account=proj1",
                 "--gpus-per-node=4", "--export=ALL", "--no-requeue"):
        assert want in argv


def test_a_cpu_job_asks_for_no_gpus_partition_or_account():
    argv = sbatch_argv(Allocation(1, 2, 60), "t", "l", ".")
    assert not [a for a in argv if a.startswith(("--gpus", "--partition", "--account"))]


def test_the_batch_script_exports_the_iface_address_only_without_an_mpi_plugin():
    srun = ["srun", "--nodes", "2", "python", "-m", "ds_bench", "run", "--tag", "a b"]
    plain = batch_script(srun, "ib0", None)
    assert "ip -4 -o addr show dev ib0" in plain and "export MASTER_ADDR" in plain
    assert plain.rstrip().endswith("exec srun --nodes 2 python -m ds_bench run --tag 'a b'")
    assert "MASTER_ADDR" not in batch_script(srun, "ib0", "pmix")
    assert "MASTER_ADDR" not in batch_script(srun, None, None)


def test_a_rerun_finds_the_same_unit_whatever_its_nonce():
    first, second = "sweep-abc-z1_mbs8-r0-1a2b3c", "sweep-abc-z1_mbs8-r0-ffee00"
    assert unit_of(first) == unit_of(second) == "sweep-abc-z1_mbs8-r0"
    assert same_unit(first, second)
    assert not same_unit(first, "sweep-abc-z1_mbs8-r1-1a2b3c")  # another repeat
    assert not same_unit(first, "sweep-abd-z1_mbs8-r0-1a2b3c")  # another sweep
    assert unit_of("scaling:981d19b8:n2") == "scaling:981d19b8:n2"  # no nonce: the tag itself


SCONTROL = ("JobId=7 JobName=sweep-x-r0-aaaaaa UserId=root(0) JobState=NODE_FAIL Reason=NodeDown Dependency=(null) "
            "ExitCode=0:9 RunTime=00:00:21 NodeList=hosta,hostb BatchHost=hosta StdOut=/r/l.log")


def test_scontrol_fields_are_read_and_a_node_failure_is_slurms_end():
    fields = parse_fields(SCONTROL)
    assert fields["JobState"] == "NODE_FAIL" and fields["StdOut"] == "/r/l.log"
    end = SlurmEnd.of("7", fields)
    assert (end.state, end.reason, end.exit_code, end.signal, end.nodes) == ("NODE_FAIL", "NodeDown", 0, 9, "hosta,hostb")
    assert end.imposed and end.exit_status == 137
    status, reason = end.status(("crashed", "rank 1 (pid 5 on hostb) had exited"))
    assert status == "crashed"
    assert reason.startswith("Slurm job 7 NODE_FAIL (reason NodeDown) on hosta,hostb, exit 0:9")
    assert reason.endswith("the ranks recorded: rank 1 (pid 5 on hostb) had exited")
    assert end.to_record()["state"] == "NODE_FAIL"


def test_a_reason_with_spaces_is_kept_whole():
    fields = parse_fields("JobId=3 JobState=CANCELLED Reason=still queued after 60 s ExitCode=0:15")
    assert fields["Reason"] == "still queued after 60 s" and fields["ExitCode"] == "0:15"


@pytest.mark.parametrize("state, status", [("TIMEOUT", "timeout"), ("OUT_OF_MEMORY", "oom"), ("CANCELLED", "crashed"),
                                           ("PREEMPTED", "crashed"), ("BOOT_FAIL", "crashed"), ("UNKNOWN", "crashed")])
def test_ends_slurm_imposes_set_the_point_status(state, status):
    end = SlurmEnd.of("9", {"JobState": state, "ExitCode": "0:15", "Reason": "None"})
    assert end.status(("ok", None)) == (status, "Slurm job 9 " + state + ", exit 0:15")
    assert end.status(("crashed", "exit code 143 (SIGTERM) with no record"), recorded=False) == (
        status, "Slurm job 9 " + state + ", exit 0:15; no rank recorded anything")


@pytest.mark.parametrize("state", ["COMPLETED", "FAILED"])
def test_the_jobs_own_end_is_what_its_ranks_recorded(state):
    end = SlurmEnd.of("9", {"JobState": state, "ExitCode": "1:0"})
    assert not end.imposed and end.exit_status == 1
    assert end.status(("oom", "out of memory on rank 1")) == ("oom", "out of memory on rank 1")


def test_sacct_lines_read_as_scontrols_keys():
    text = "12|sweep-x-r0-aaaaaa|CANCELLED by 0|0:15|None|hostb\n12.batch|batch|CANCELLED|0:15||hostb\n"
    assert parse_sacct(text) == {"JobId": "12", "JobName": "sweep-x-r0-aaaaaa", "JobState": "CANCELLED",
                                 "ExitCode": "0:15", "Reason": "None", "NodeList": "hostb"}
    assert parse_sacct("") == {}


def test_a_job_that_can_never_start_is_told_from_one_that_waits():
    assert never_starts({"JobState": "PENDING", "Reason": "PartitionNodeLimit"}) == "PartitionNodeLimit"
    assert never_starts({"JobState": "PENDING", "Reason": "QOSMaxWallDurationPerJobLimit"})
    assert never_starts({"JobState": "PENDING", "Reason": "AssocMaxNodesPerJobLimit"})
    assert never_starts({"JobState": "PENDING", "Reason": "Priority"}) is None
    assert never_starts({"JobState": "PENDING", "Reason": "Resources"}) is None
    assert never_starts({"JobState": "RUNNING", "Reason": "PartitionNodeLimit"}) is None


def _args(**kw) -> argparse.Namespace:
    base = dict(executor="local", nodes=None, partition=None, account=None, gpus_per_node=0, mpi=None, max_jobs=None,
                queue_timeout="1d", hostfile=None, launcher=None, dry_run=True)
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize("kw, message", [
    ({"nodes": 2}, "--nodes is for Slurm jobs: add --executor slurm"),
    ({"nodes": 0}, "--nodes is for Slurm jobs: add --executor slurm"),
    ({"partition": "gpu"}, "--partition is for Slurm jobs"),
    ({"mpi": "pmix"}, "--mpi is for Slurm jobs"),
    ({"executor": "slurm", "hostfile": "h"}, "--hostfile with --executor slurm"),
    ({"executor": "slurm", "launcher": "mpirun"}, "--launcher mpirun with --executor slurm"),
    ({"executor": "slurm", "launcher": "deepspeed"}, "--launcher deepspeed with --executor slurm"),
    ({"executor": "slurm", "nodes": 0}, "--nodes must be a positive integer"),
    ({"executor": "slurm", "max_jobs": 0}, "--max-jobs must be a positive integer"),
    ({"executor": "slurm", "queue_timeout": "soon"}, "--queue-timeout 'soon': expected a duration"),
])
def test_slurm_flags_are_checked_before_anything_starts(kw, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        flags.slurm_options(_args(**kw))


def test_slurm_options_and_how_many_parts_run_at_once():
    assert flags.slurm_options(_args()) is None
    opts = flags.slurm_options(_args(executor="slurm", nodes=2, partition="gpu", max_jobs=3, queue_timeout="2h"))
    assert (opts.nodes, opts.partition, opts.max_jobs, opts.queue_timeout_s) == (2, "gpu", 3, 7200)
    spec = argparse.Namespace(slurm=opts)
    assert runner.workers(spec, 8) == 3 and runner.workers(spec, 2) == 2
    assert runner.workers(argparse.Namespace(slurm=None), 8) == 1
    unlimited = argparse.Namespace(slurm=flags.slurm_options(_args(executor="slurm")))
    assert runner.workers(unlimited, 8) == 8


def test_parts_run_concurrently_take_turns_and_keep_their_order():
    import threading
    import time

    inside, overlaps = [], []
    lock = threading.Lock()

    def part(i):
        with lock:
            inside.append(i)
            overlaps.append(len(inside))
        time.sleep(0.05)  # study code: nobody else may be inside meanwhile
        with lock:
            inside.remove(i)
        with runner._turn.released():  # "the job runs": others take their turn
            time.sleep(0.2)
        return i * 10

    start = time.monotonic()
    assert runner.run_concurrently([lambda i=i: part(i) for i in range(4)], 4) == [0, 10, 20, 30]
    assert max(overlaps) == 1, "two threads ran study code at once"
    assert time.monotonic() - start < 0.2 * 4, "the jobs' waits did not overlap"


def test_the_first_failure_of_a_part_is_raised():
    def bad():
        raise UserError("sbatch refused the job: invalid account")

    with pytest.raises(UserError, match="invalid account"):
        runner.run_concurrently([lambda: 1, bad, lambda: 3], 3)


def test_a_local_record_has_no_slurm_block_and_a_slurm_one_has_it():
    from ds_bench.jobs.slurm_batch import slurm_block

    assert slurm_block(None) == {}
    end = SlurmEnd.of("4", {"JobState": "COMPLETED", "ExitCode": "0:0", "NodeList": "hostb"})
    assert slurm_block(end) == {"slurm": {"job_id": "4", "state": "COMPLETED", "reason": None, "exit_code": 0,
                                          "signal": 0, "nodes": "hostb"}}


def test_the_job_environment_drops_an_enclosing_allocations_variables():
    from ds_bench.jobs.slurm_executor import _submit_env

    env = _submit_env({"SLURM_CPUS_PER_TASK": "8", "SLURM_JOB_ID": "3", "SLURM_CONF": "/etc/s.conf", "PATH": "/bin"})
    assert env == {"SLURM_CONF": "/etc/s.conf", "PATH": "/bin"}

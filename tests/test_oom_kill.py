"""A rank the kernel's OOM killer ends is recorded ``oom``, with the evidence, by its surviving peer; the survivor's
own record says a peer ran out of memory (``ds_bench.run.oom_victims``, ``ds_bench.machine.oom_kills``).

The real thing: two torchrun ranks of a GPT-2 whose step needs ~2 GB a rank (its logits: 16 x 512 tokens x 50,257
words), rank 0 moved, once started, into a memory cgroup of 1.2 GB (tests/memory_cgroup.py): the kernel kills it
with SIGKILL at its first step and torchrun then stops rank 1 with SIGTERM, as docs/moe.md's first command did on a
24 GB machine before. Pure parts: the counters, the kernel's log lines, the cgroup files, the job's outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ds_bench.jobs.outcome import classify
from ds_bench.machine import oom_kills
from ds_bench.record.schema import RunRecord
from tests import memory_cgroup

REPO = Path(__file__).resolve().parent.parent
KMSG = """\
6,3512,14626265965,-;Tasks state (memory values in pages):
4,3516,14626265973,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/dsbtest,\
task_memcg=/dsbtest,task=python3,pid=29945,uid=0
3,3517,14626265999,-;Memory cgroup out of memory: Killed process 29945 (python3) total-vm:221460kB, \
anon-rss:204160kB, file-rss:6624kB, shmem-rss:0kB, UID:0 pgtables:468kB oom_score_adj:0
3,3600,14700000000,-;Out of memory: Killed process 812 (pt_main_thread) total-vm:9000000kB, anon-rss:8000000kB, \
file-rss:1000kB, shmem-rss:24kB, UID:0 pgtables:20000kB oom_score_adj:0
"""


def test_the_kernels_log_names_each_killed_pid_its_resident_memory_and_its_cause():
    kills = oom_kills.kernel_kills(KMSG)
    assert kills[29945] == oom_kills.KernelKill(29945, (204160 + 6624) * 1024, "CONSTRAINT_MEMCG", 14626265999)
    assert kills[812] == oom_kills.KernelKill(812, (8000000 + 1000 + 24) * 1024, None, 14700000000)
    assert list(oom_kills.kernel_kills(KMSG, since_us=14650000000)) == [812]  # a pid reused since is not that one


def test_the_kernels_pids_are_ours_outside_a_pid_namespace_only():
    assert oom_kills.pids_are_the_kernels("Name:\tpython\nNSpid:\t4242\n")
    assert not oom_kills.pids_are_the_kernels("Name:\tpython\nNSpid:\t4242\t17\n")
    assert oom_kills.pids_are_the_kernels("Name:\tpython\n")


def _survivor(tmp_path, peers_gone: int, recorded: tuple[int, ...] = ()):
    """Rank 0 of a run on this host whose ranks 1.. ``peers_gone`` have gone; ``recorded``: of them, those whose own
    failed record is in the results file."""
    import socket
    from types import SimpleNamespace

    host = socket.gethostname()
    results = tmp_path / "runs.jsonl"
    for rank in recorded:
        results.open("a").write(json.dumps({"kind": "run", "status": "failed", "workload": "gpt2", "run_id": "r1",
                                            "failure": {"kind": "terminated", "rank": rank}}) + "\n")
    peers = [{"rank": r, "host": host, "pid": 100 + r} for r in range(peers_gone + 1)]
    run = SimpleNamespace(peers=peers, run_id="r1", cfg=SimpleNamespace(results=str(results)),
                          state=SimpleNamespace(rank=0), oom_counts=oom_kills.OomCounts(5, 2, "/cg", 1000.0))
    return run, {r: "gone" for r in range(1, peers_gone + 1)}


def test_a_gone_peer_is_oom_killed_only_on_its_own_evidence(tmp_path, monkeypatch):
    """The decision of ``run.oom_victims.victims`` with the kernel's answers given: the log, where readable, must
    name the peer's pid since the run joined; without it the cgroup's count must have risen by every peer gone;
    a peer that recorded its own end is not a victim."""
    from ds_bench.run import oom_victims

    log = "3,9,5000,-;Memory cgroup out of memory: Killed process 102 (python) total-vm:1kB, anon-rss:1024kB, " \
          "file-rss:0kB, shmem-rss:0kB\n"
    monkeypatch.setattr(oom_kills, "read_counts", lambda: oom_kills.OomCounts(6, 3, "/cg", 9000.0))
    monkeypatch.setattr(oom_kills, "logged_pids_are_ours", lambda: True)
    monkeypatch.setattr(oom_kills, "read_kernel_log", lambda: log)
    run, troubled = _survivor(tmp_path, 2)
    assert sorted(oom_victims.victims(run, troubled)) == [2]  # rank 1 exited otherwise: the log names rank 2 only
    assert oom_victims.reports_them(run, {2: None})
    monkeypatch.setattr(oom_kills, "read_kernel_log", lambda: None)
    assert oom_victims.victims(run, troubled) == {}  # 1 kill counted, 2 peers gone: which one is not known
    for folder in ("one", "recorded"):
        (tmp_path / folder).mkdir()
    run, troubled = _survivor(tmp_path / "one", 1)
    assert oom_victims.victims(run, troubled)[1].evidence == "oom_kill counters"
    run, troubled = _survivor(tmp_path / "recorded", 1, recorded=(1,))
    assert oom_victims.victims(run, troubled) == {}


def test_the_counters_and_the_cgroup_file_of_v1_and_v2():
    assert oom_kills.oom_kill_count("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == 3
    assert oom_kills.oom_kill_count("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n") == 2
    assert oom_kills.oom_kill_count("pgfault 12\n") is None
    v1 = "4:memory:/slurm/uid_0/job_12\n0::/\n"
    assert oom_kills.cgroup_counter_file(v1, "/cg") == "/cg/memory/slurm/uid_0/job_12/memory.oom_control"
    assert oom_kills.cgroup_counter_file("0::/system.slice/x.scope\n", "/nonexistent") == (
        "/nonexistent/system.slice/x.scope/memory.events")
    before, after = oom_kills.OomCounts(5, None), oom_kills.OomCounts(7, 1)
    assert after.rise_since(before) == (2, None)


def test_a_job_with_no_record_while_the_oom_count_rose_is_oom():
    assert classify([], -9, False, 60, oom_kills=1)[0] == "oom"
    assert classify([], -9, False, 60, oom_kills=0) == ("crashed", "killed by SIGKILL with no record")


def _rank_pid(launcher: psutil.Process, rank: str, timeout: float = 60) -> int:
    """The pid of the rank torchrun started with RANK=``rank`` (its environment, from /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in launcher.children(recursive=True):
            try:
                if child.environ().get("RANK") == rank and "ds_bench" in " ".join(child.cmdline()):
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.05)
    raise AssertionError(f"no rank {rank} under torchrun within {timeout} s")


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_a_rank_the_oom_killer_ends_is_recorded_oom_by_its_peer(tmp_path):
    reason = memory_cgroup.skip_reason()
    if reason:
        pytest.skip(reason)
    results = tmp_path / "runs.jsonl"
    argv = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2", "--master_port", "29571",
            "-m", "ds_bench", "run", "--workload", "gpt2", "--size", "tiny", "--ds-config", "ds_configs/zero1.json",
            "--set", "bf16.enabled=false", "--seq-len", "512", "--micro-batch", "16", "--steps", "3", "--warmup", "1",
            "--results", str(results)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with memory_cgroup.limited(1200 * 2**20) as cgroup:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            cgroup.move(_rank_pid(psutil.Process(proc.pid), "0"))
            out, _ = proc.communicate(timeout=240)
        finally:
            proc.kill()
        kills = cgroup.oom_kills()
    assert proc.returncode != 0 and kills >= 1, out[-3000:]
    records = [RunRecord(**json.loads(line)) for line in results.read_text().splitlines()]
    by_rank = {r.failure.rank: r for r in records}
    victim, survivor = by_rank[0], by_rank[1]
    assert (victim.status, victim.failure.kind, victim.failure.signal) == ("failed", "oom", "SIGKILL"), victim.error
    evidence = victim.failure.oom_kill
    assert evidence.reported_by == 1 and evidence.pid > 0 and (evidence.kernel_oom_kills or 0) >= 1, evidence
    if oom_kills.read_kernel_log() is not None:  # root reads the kernel's own account: the rank's memory, the cause
        assert evidence.evidence == "kernel log" and evidence.cause == "cgroup limit", evidence
        assert evidence.rss_bytes > 1.0 * 2**30, evidence
    assert victim.error.startswith("rank 0: killed by the kernel's OOM killer"), victim.error
    assert survivor.failure.peers == {"0": "oom"}, survivor.failure
    assert "rank 0 (pid" in survivor.error and "was killed by the kernel's OOM killer" in survivor.error, survivor.error
    assert classify(records, proc.returncode, False, 240)[0] == "oom"

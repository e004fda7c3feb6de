"""Faults end the job quickly and leave a record: real launchers, real signals.

- a rank SIGKILLed mid-run (what the OOM killer or a node loss does) under torchrun, the deepspeed
  launcher and Open MPI's mpirun: the job exits non-zero within 60 s, and a surviving rank's
  ``failed`` record names the rank that died and the step reached;
- SIGTERM (Slurm's time limit, scancel) and SIGINT (Ctrl-C): exit 128 + signal, a ``failed``
  record ``terminated by SIG... at step k`` with the metrics of the steps done; a second signal
  ends the process at once;
- a rank that stops making progress (SIGSTOP): the step watchdog of the other rank dumps every
  thread's stack and records ``no step finished in N s``;
- a rank killed and a stage stopped in a 2-stage pipeline (each stage waits on the other in every step);
- a rank killed under AutoTP, Ulysses and expert parallelism (each layer's collectives wait on the other rank).
Pure parts (messages, /proc states) are tested on inline inputs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ds_bench.cluster import faults
from tests.conftest import BIN, REPO, child_env, default_sigint, shm_buffers

RUN = ["run", "--workload", "mnist", "--ds-config", "ds_configs/zero1.json", "--set", "bf16.enabled=false",
       "--micro-batch", "8", "--steps", "100000", "--warmup", "2"]
PIPELINE_RUN = ["run", "--workload", "gpt2", "--ds-config", "ds_configs/zero1.json", "--set", "bf16.enabled=false",
                "--layers", "4", "--hidden", "64", "--heads", "4", "--seq-len", "32", "--micro-batch", "2",
                "--set", "gradient_accumulation_steps=2", "--pipeline-stages", "2", "--steps", "100000",
                "--warmup", "2"]
"""Two pipeline stages on two ranks: each rank waits on the other in every step (activations forward,
gradients back)."""
TENSOR_PARALLEL_RUN = ["run", "--workload", "llama", "--size", "tiny", "--ds-config", "ds_configs/zero1.json", "--set",
                       "bf16.enabled=false", "--seq-len", "32", "--micro-batch", "2", "--tensor-parallel", "2",
                       "--steps", "100000", "--warmup", "2"]
"""Two AutoTP ranks: every layer's all-reduce waits on the other rank."""
SEQUENCE_PARALLEL_RUN = ["run", "--workload", "llama", "--size", "tiny", "--ds-config", "ds_configs/zero1.json", "--set",
                         "bf16.enabled=false", "--seq-len", "64", "--micro-batch", "1", "--sequence-parallel", "2",
                         "--steps", "100000", "--warmup", "2"]
"""Two Ulysses ranks: every layer's all-to-alls wait on the other rank."""
EXPERT_PARALLEL_RUN = ["run", "--workload", "moe", "--size", "tiny", "--ds-config", "ds_configs/zero1.json", "--set",
                       "bf16.enabled=false", "--seq-len", "64", "--micro-batch", "2", "--expert-parallel", "2",
                       "--steps", "100000", "--warmup", "2"]
"""Two expert-parallel ranks, each holding half the experts: every MoE block's all-to-alls wait on the other rank."""


class Job:
    """A real launcher running ds_bench, its output in files, found again by rank."""

    def __init__(self, tmp: Path, launcher: str, port: int, *extra: str, run: list[str] = RUN):
        self.results, self.out = tmp / "r.jsonl", tmp / "out.log"
        args = [*run, "--results", str(self.results), *extra]
        argv = {
            "torchrun": [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port), "-m", "ds_bench"],
            "deepspeed": [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(port), "--module", "ds_bench"],
            "mpirun": ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PATH", sys.executable,
                       "-m", "ds_bench"],
            "single": [sys.executable, "-m", "ds_bench"],
        }[launcher] + args
        self.log = open(self.out, "w")
        self.proc = subprocess.Popen(argv, cwd=REPO, env=child_env(), stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=default_sigint)

    def wait_for(self, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.out.read_text():
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {text!r}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"no {text!r} within {timeout} s:\n{self.tail()}"
            time.sleep(0.2)

    def rank_pid(self, rank: int) -> int:
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                env, cmd = p.environ(), " ".join(p.cmdline())
            except psutil.Error:
                continue
            if "ds_bench" in cmd and (env.get("RANK") or env.get("OMPI_COMM_WORLD_RANK")) == str(rank):
                return p.pid
        raise AssertionError(f"rank {rank} not found:\n{self.tail()}")

    def end(self, timeout: float) -> tuple[int, float]:
        start = time.monotonic()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {timeout} s after the fault:\n{self.tail()}") from None
        return code, time.monotonic() - start

    def records(self) -> list[dict]:
        if not self.results.exists():
            return []
        return [json.loads(line) for line in self.results.read_text().splitlines()]

    def tail(self) -> str:
        return self.out.read_text()[-4000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            import os

            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


@pytest.fixture
def job(tmp_path):
    made = []

    def start(*args, **kw):
        made.append(Job(tmp_path, *args, **kw))
        return made[-1]

    yield start
    for j in made:
        j.kill()


@pytest.mark.dist
@pytest.mark.parametrize("launcher,port,run", [
    ("torchrun", 29801, RUN), pytest.param("deepspeed", 29802, RUN, marks=pytest.mark.full), ("mpirun", 0, RUN),
    pytest.param("torchrun", 29813, PIPELINE_RUN, marks=pytest.mark.full),
    pytest.param("torchrun", 29815, TENSOR_PARALLEL_RUN, marks=pytest.mark.full),
    pytest.param("torchrun", 29816, SEQUENCE_PARALLEL_RUN, marks=pytest.mark.full),
    pytest.param("torchrun", 29817, EXPERT_PARALLEL_RUN, marks=pytest.mark.full),
], ids=["torchrun", "deepspeed", "mpirun", "torchrun-pipeline", "torchrun-tensor-parallel",
        "torchrun-sequence-parallel", "torchrun-expert-parallel"])
def test_a_rank_killed_mid_run_ends_the_job_with_a_record_naming_it(job, launcher, port, run):
    j = job(launcher, port, run=run)
    j.wait_for("warm-up done")
    victim = j.rank_pid(1)
    psutil.Process(victim).send_signal(signal.SIGKILL)
    code, seconds = j.end(timeout=60)
    assert code != 0, j.tail()
    recs = j.records()
    assert recs and all(r["status"] == "failed" for r in recs), j.tail()
    survivor = [r for r in recs if r["failure"]["rank"] == 0]
    assert survivor, recs
    (r,) = survivor
    assert r["failure"]["steps_done"] >= 2 and r["failure"]["peers"] == {"1": "gone"}, r["failure"]
    assert f"rank 1 (pid {victim} on " in r["error"] and "had exited" in r["error"], r["error"]
    assert shm_buffers(r["rendezvous"]["master_port"]) == [], "a killed job left DeepSpeed shm buffers in /dev/shm"
    print(f"{launcher}: exit {code} {seconds:.1f} s after SIGKILL of rank 1; record: {r['error']}")


@pytest.mark.dist
@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.full)])
def test_a_signal_to_the_launcher_stops_every_rank_with_a_record(job, signum):
    j = job("torchrun", 29805 + signum)
    j.wait_for("warm-up done")
    time.sleep(1.0)
    j.proc.send_signal(signum)  # torchrun passes it to its ranks, as Slurm signals every task
    code, seconds = j.end(timeout=60)
    assert code != 0, j.tail()
    recs = j.records()
    name = signal.Signals(signum).name
    assert {r["failure"]["rank"] for r in recs} <= {0, 1} and recs, j.tail()
    for r in recs:
        assert r["status"] == "failed" and f"terminated by {name} at step" in r["error"], r["error"]
        assert r["failure"]["signal"] == name and r["failure"]["steps_done"] > 2
        assert r["metrics"]["steps_measured"] == r["failure"]["steps_done"] - 2 and r["metrics"]["samples_per_s"] > 0
    print(f"torchrun {name}: exit {code} after {seconds:.1f} s; {[r['error'] for r in recs]}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.full)])
def test_one_process_exits_128_plus_the_signal(job, signum):
    j = job("single", 0)
    j.wait_for("warm-up done")
    time.sleep(0.5)
    j.proc.send_signal(signum)
    code, _ = j.end(timeout=30)
    assert code == 128 + signum, j.tail()
    (r,) = j.records()
    assert r["error"].startswith(f"rank 0: terminated by {signal.Signals(signum).name} at step ")
    assert r["metrics"]["steps_measured"] >= 1 and "Traceback" not in j.tail()


def test_a_second_signal_ends_the_process_at_once(tmp_path):
    """The second signal exits inside the handler, whatever the process was doing (here: sleeping
    in a deferred section, where the first signal is held back)."""
    code = ("import os, signal, time; from ds_bench.cluster import faults; faults.install_signal_handlers()\n"
            "with faults.deferred():\n"
            "    os.kill(os.getpid(), signal.SIGTERM); print('held', flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGINT); time.sleep(30); print('not reached', flush=True)\n")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=20)
    assert proc.returncode == 128 + signal.SIGINT and proc.stdout == "held\n", proc
    assert time.monotonic() - start < 10


def test_a_sigterm_twice_at_once_is_one_stop_but_later_it_ends_at_once(tmp_path):
    """Slurm's time limit: slurmstepd SIGTERMs every task and srun forwards the SIGTERM it got, so a rank gets two
    within milliseconds; the second must not skip the record. A SIGTERM seconds later still ends it at once."""
    code = ("import os, signal, sys, time; from ds_bench.cluster import faults; faults.install_signal_handlers()\n"
            "try:\n"
            "    with faults.deferred():\n"
            "        os.kill(os.getpid(), signal.SIGTERM); os.kill(os.getpid(), signal.SIGTERM); print('held', flush=True)\n"
            "except faults.Terminated as t:\n"
            "    print('recorded', t.exit_code, flush=True)\n"
            "    time.sleep(faults.DUPLICATE_S + 0.5); os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(30); print('not reached', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=40)
    assert proc.stdout == "held\nrecorded 143\n" and proc.returncode == 143, proc


_SIGTERM_WHILE_RECORDING = """
import os, signal, socket, sys
import torch
from ds_bench import engines
from ds_bench.cluster import faults
from ds_bench.run import run_record as run
from ds_bench.run.state import Started
from ds_bench.config.run_config import RunConfig
from ds_bench.cluster.process_group import DistState

faults.install_signal_handlers()

def peer_states(peers, host, proc="/proc"):
    os.kill(os.getpid(), signal.SIGTERM)  # the launcher's SIGTERM, arriving while the record is made
    return {1: "gone"}

faults.peer_states = peer_states
cfg = RunConfig(workload="mnist", ds_config="ds_configs/zero1.json", results=sys.argv[1], steps=10, warmup=2)
state = DistState(0, 2, 0, 2, "127.0.0.1", 29500, "torchrun", torch.device("cpu"), "gloo", {})
ds_cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "train_batch_size": 8,
          "zero_optimization": {"stage": 1}}
peers = [{"rank": 0, "host": socket.gethostname(), "pid": os.getpid()},
         {"rank": 1, "host": socket.gethostname(), "pid": 999999}]
try:
    run.record_failure(Started(cfg, ds_cfg, engines.choose("deepspeed", ds_cfg, 1e-3, "x"), state, None, "rid", peers),
                        error=RuntimeError("Connection closed by peer"))
except faults.Terminated as t:
    print("terminated", t.exit_code)
"""


def test_a_sigterm_while_the_failure_is_recorded_waits_for_the_record(tmp_path):
    """torchrun SIGTERMs the survivors moments after a rank dies; the survivor is then already
    writing its failed record (the race CI hit: the signal cut the record short, leaving none)."""
    results = tmp_path / "r.jsonl"
    proc = subprocess.run([sys.executable, "-c", _SIGTERM_WHILE_RECORDING, str(results)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=child_env())
    assert proc.stdout.strip() == "terminated 143", proc
    (r,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert r["status"] == "failed" and "Connection closed by peer" in r["error"], r["error"]
    assert r["failure"]["peers"] == {"1": "gone"} and "rank 1 (pid 999999" in r["error"]


def test_deferred_sections_nest():
    """An inner section's end must not deliver a signal the outer section still holds."""
    faults._state.update(received=None, pending=None, deferring=0)
    try:
        with pytest.raises(faults.Terminated):
            with faults.deferred():
                with faults.deferred():
                    faults._state.update(received=signal.SIGTERM, pending=signal.SIGTERM)
                assert faults._state["pending"] == signal.SIGTERM  # still held by the outer section
    finally:
        faults._state.update(received=None, pending=None, deferring=0)


@pytest.mark.dist
@pytest.mark.parametrize("port,run", [(29809, RUN), pytest.param(29814, PIPELINE_RUN, marks=pytest.mark.full)],
                         ids=["data-parallel", "pipeline"])
def test_a_stalled_rank_is_caught_by_the_step_watchdog(job, port, run):
    """A pipeline stage stopped leaves the other waiting in its receive, which gloo would hold for the
    whole --dist-timeout: the watchdog ends it after --step-timeout, as for a data-parallel rank."""
    j = job("torchrun", port, "--step-timeout", "6s", run=run)
    j.wait_for("warm-up done")
    stalled = j.rank_pid(1)
    psutil.Process(stalled).suspend()  # SIGSTOP: the rank stops making progress
    try:
        deadline = time.monotonic() + 60
        while not j.records():
            assert time.monotonic() < deadline, j.tail()
            time.sleep(0.5)
    finally:
        psutil.Process(stalled).kill()
    code, _ = j.end(timeout=60)
    (r,) = j.records()
    assert code != 0 and r["failure"]["rank"] == 0 and r["failure"]["stalled_s"] == 6
    assert "no step finished in 6 s" in r["error"] and f"rank 1 (pid {stalled} on " in r["error"], r["error"]
    assert "was stopped" in r["error"]
    out = j.out.read_text()
    assert "stacks of every thread" in out and "most recent call first" in out


# --- pure parts ---

PEERS = [{"rank": 0, "host": "a", "pid": 10}, {"rank": 1, "host": "a", "pid": 11}, {"rank": 2, "host": "b", "pid": 12}]


def test_messages_name_the_signal_the_stall_and_the_peer():
    kw = dict(rank=0, steps_done=7, steps=50, peers=PEERS)
    assert faults.describe(**kw, error=None, signum=signal.SIGTERM, stalled_s=None, troubled={}) == \
        "rank 0: terminated by SIGTERM at step 7 of 50"
    assert faults.describe(**kw, error=None, signum=None, stalled_s=30.0, troubled={1: "stopped"}) == \
        "rank 0: no step finished in 30 s (after step 7 of 50); rank 1 (pid 11 on a) was stopped"
    assert faults.describe(**kw, error=RuntimeError("Connection closed by peer"), signum=None, stalled_s=None,
                           troubled={1: "gone"}) == \
        "rank 0: failed at step 7 of 50: RuntimeError('Connection closed by peer'); rank 1 (pid 11 on a) had exited"


def test_a_peer_on_another_host_is_named_by_the_address_in_the_error():
    """Under Slurm the ranks are on other nodes, out of /proc's sight: gloo's error names the lost address."""
    peers = [{**p, "addrs": [addr]} for p, addr in zip(PEERS, ("10.78.0.1", "10.78.0.1", "10.78.0.2"))]
    error = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [10.78.0.2]:41157: Connection reset by peer.")
    assert faults.peers_named_by(error, peers, "a") == {2: "lost"}
    assert faults.peers_named_by(error, peers, "b") == {}  # its own host: /proc says (peer_states)
    assert faults.peers_named_by(RuntimeError("Connection closed by peer"), peers, "a") == {}
    assert faults.peers_named_by(None, peers, "a") == {}
    assert faults.peers_named_by(RuntimeError("version 10.78.0.20"), peers, "a") == {}
    assert faults.peers_named_by(error, PEERS, "a") == {}  # no addresses exchanged
    try:  # srun's SIGTERM landing while gloo's error unwinds: the Terminated carries it as its context
        try:
            raise error
        except RuntimeError:
            raise faults.Terminated(15)  # noqa: B904 - as the signal handler raises it
    except faults.Terminated as terminated:
        assert faults.peers_named_by(terminated, peers, "a") == {2: "lost"}
    assert faults.peers_named_by(faults.Terminated(15), peers, "a") == {}  # a plain SIGTERM names no one
    assert faults.describe(rank=0, steps_done=7, steps=50, peers=peers, error=error, signum=None, stalled_s=None,
                           troubled={2: "lost"}).endswith("; rank 2 (pid 12 on b) dropped its connection")


def test_process_states_from_proc(tmp_path):
    # pid (comm) state ppid pgrp session tty_nr tpgid flags ...; flags 0x400104 carries PF_EXITING (0x4):
    # a killed rank closing its sockets before it turns zombie
    for pid, stat in ((11, "11 (python) S 1 2 2 0 -1 4194560 9"), (12, "12 (py thon) Z 1 2 2 0 -1 4194560"),
                      (13, "13 (x) T 1"), (15, "15 (py) R 1 2 2 0 -1 4194564 9")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat)
    states = [faults.proc_state(p, str(tmp_path)) for p in (11, 12, 13, 14, 15)]
    assert states == ["alive", "gone", "stopped", "gone", "gone"]
    peers = PEERS + [{"rank": 3, "host": "a", "pid": 12}, {"rank": 4, "host": "a", "pid": 13}]
    assert faults.peer_states(peers, "a", str(tmp_path)) == {0: "gone", 3: "gone", 4: "stopped"}

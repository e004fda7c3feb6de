"""Studies through a real Slurm (``--executor slurm``) on the two-host bed (tests/netns.py, tests/slurm_bed.py):
the study runs on hosta (the login node) and each point is a batch job of its own.

- a sweep's two families run as two jobs at once, one per host, each recorded with its Slurm job;
- Ctrl-C cancels what the sweep submitted and records nothing of it; a study killed outright leaves its jobs
  queued or running, and the re-run finds them again instead of submitting them twice (or takes the results of
  those that completed meanwhile); the re-run finishes;
- a job Slurm ends (node set DOWN, cancelled by someone else, its time limit) is a failed point with Slurm's
  own state, reason and exit state;
- scaling at 1 and 2 nodes submits one job per node count.
Skips with the reason where the bed or Slurm cannot be had (not root, no namespaces, no apt).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.slurm_bed import module_bed

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parent.parent
SWEEP = [sys.executable, "-m", "ds_bench", "sweep", "--workload", "mnist", "--ds-config", "ds_configs/zero1.json",
         "--precision", "fp32", "--micro-batch", "16", "--warmup", "2", "--nproc", "2", "--executor", "slurm"]


@pytest.fixture(scope="module")
def slurm():
    with module_bed("dsbe") as cluster:
        yield cluster


def records(path: Path, kind: str) -> list[dict]:
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == kind]


def jobs_named(slurm, part: str) -> list[dict]:
    out = slurm.check(["scontrol", "show", "job", "-o"])
    from ds_bench.jobs.slurm_batch import parse_fields

    return [f for f in map(parse_fields, out.splitlines()) if part in f.get("JobName", "")]


def wait_running(slurm, part: str, n: int, timeout: float = 90) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        running = [j for j in jobs_named(slurm, part) if j.get("JobState") == "RUNNING"]
        if len(running) >= n:
            return running
        assert time.monotonic() < deadline, f"{n} job(s) not running within {timeout} s:\n{slurm.logs()}"
        time.sleep(0.5)


def wait_log(path: Path, text: str, timeout: float = 90) -> None:
    _until(lambda: path.exists() and text in path.read_text(), timeout)


def sweep_id(results: Path) -> str:
    return next(iter(records(results, "sweep_point")))["sweep"]


@pytest.mark.timeout(300)
def test_a_sweep_runs_its_families_as_slurm_jobs_two_at_once(slurm, tmp_path):
    results = tmp_path / "sweep.jsonl"
    r = slurm.run([*SWEEP, "--stages", "1,2", "--steps", "6", "--timeout", "3m", "--results", str(results)],
                  env={"HF_HUB_OFFLINE": "1"}, timeout=240, cwd=REPO)
    assert r.returncode == 0, r.explain() + slurm.logs()
    points = records(results, "sweep_point")
    assert sorted(p["key"] for p in points) == ["z1 off=none fp32 mbs=16", "z2 off=none fp32 mbs=16"], points
    assert all(p["status"] == "ok" and p["slurm"]["state"] == "COMPLETED" for p in points), points
    assert {p["slurm"]["nodes"] for p in points} == {"hosta", "hostb"}, "the two jobs did not run side by side"
    a, b = points
    assert a["launched_at"] < b["ended_at"] and b["launched_at"] < a["ended_at"], "the jobs ran one after the other"
    assert len({p["slurm"]["job_id"] for p in points}) == 2
    for p in points:  # each job's own log: its sbatch line, its script, its ranks' output
        log = Path(p["log"]).read_text()
        assert log.startswith("$ sbatch --parsable") and "srun --nodes 1 --ntasks-per-node 2" in log
        assert "warm-up done" in log


@pytest.mark.timeout(60)
def test_a_partition_the_cluster_lacks_is_refused_before_anything_is_submitted(slurm, tmp_path):
    results = tmp_path / "sweep.jsonl"
    before = len(jobs_named(slurm, "sweep-"))
    r = slurm.run([*SWEEP, "--stages", "1", "--steps", "6", "--partition", "gpu", "--results", str(results)],
                  env={"HF_HUB_OFFLINE": "1"}, timeout=45, cwd=REPO)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "ds-bench: error: --partition gpu: gpu is not a partition of this cluster; it has bed"], r.explain()
    assert "Traceback" not in r.stderr and not results.exists() and len(jobs_named(slurm, "sweep-")) == before


@pytest.mark.full
@pytest.mark.timeout(420)
def test_ctrl_c_cancels_a_killed_study_is_found_again_and_the_rerun_finishes(slurm, tmp_path):
    results = tmp_path / "sweep.jsonl"
    argv = [*SWEEP, "--stages", "1,2", "--steps", "150", "--timeout", "5m", "--results", str(results)]
    env = slurm.env({"HF_HUB_OFFLINE": "1"})
    out = tmp_path / "first.out"
    # 1. Ctrl-C once both jobs run: both cancelled, nothing recorded, exit 130.
    with open(out, "w") as sink:
        first = _start(slurm, argv, env, sink)
        running = wait_running(slurm, "sweep-", 2)
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=60) == 130, out.read_text()
    assert "cancelled Slurm job(s)" in out.read_text() and "re-run the same command" in out.read_text()
    ids = {j["JobId"] for j in running}
    _until(lambda: all(j["JobState"] == "CANCELLED" for j in jobs_named(slurm, "sweep-") if j["JobId"] in ids), 60)
    assert records(results, "sweep_point") == [], "a cancelled point was recorded"
    # 2. The study killed outright (its login session lost): its jobs run on.
    with open(tmp_path / "second.out", "w") as sink:
        second = _start(slurm, argv, env, sink)
        running = {j["JobId"] for j in wait_running(slurm, "sweep-", 2)} - ids
        assert len(running) == 2
        second.kill()
        second.wait(timeout=30)
    # 3. The re-run finds both again, submits nothing, and finishes.
    r = slurm.run(argv, env={"HF_HUB_OFFLINE": "1"}, timeout=240, cwd=REPO)
    assert r.returncode == 0, r.explain()
    assert r.stdout.count("found Slurm job") == 2, r.stdout
    mine = jobs_named(slurm, f"sweep-{sweep_id(results)}")
    assert len(mine) == 4, [(j["JobId"], j["JobState"]) for j in mine]  # 2 cancelled + the 2 found again
    points = records(results, "sweep_point")
    assert {p["slurm"]["job_id"] for p in points} == running and all(p["status"] == "ok" for p in points), points
    # 4. Jobs that completed while no study waited on them (killed after they ended, before it recorded them):
    #    the re-run takes their results, submits nothing.
    results.write_text("".join(line + "\n" for line in results.read_text().splitlines()
                               if json.loads(line).get("kind") != "sweep_point"))
    r = slurm.run(argv, env={"HF_HUB_OFFLINE": "1"}, timeout=120, cwd=REPO)
    assert r.returncode == 0 and r.stdout.count("found Slurm job") == 2, r.explain()
    assert len(jobs_named(slurm, f"sweep-{sweep_id(results)}")) == 4
    again = records(results, "sweep_point")
    assert sorted((p["slurm"]["job_id"], p["throughput"]) for p in again) == sorted(
        (p["slurm"]["job_id"], p["throughput"]) for p in points)  # the same jobs' results (in any order)


def _start(slurm, argv, env, sink):
    import subprocess

    from tests.conftest import default_sigint

    # SIGINT back to default: a suite started in the background (CI's or `make test &`) ignores it, and so would
    # the study (seen: the Ctrl-C of step 1 ignored, the sweep ran to its end and exited 0)
    return subprocess.Popen(slurm.bed.wrap("hosta", argv), cwd=REPO, env={**_clean(), **env}, stdout=sink,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=default_sigint)


def _clean() -> dict:
    from tests.netns import clean_env

    return clean_env()


def _until(check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s"
        time.sleep(0.5)


@pytest.mark.full
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["node-down", "scancel", "time-limit"])
def test_a_job_slurm_ends_is_a_failed_point_with_slurms_reason(slurm, tmp_path, how):
    results = tmp_path / "sweep.jsonl"
    timeout = "1m" if how == "time-limit" else "5m"
    argv = [*SWEEP, "--stages", "1", "--steps", "100000", "--timeout", timeout, "--results", str(results)]
    env = slurm.env({"HF_HUB_OFFLINE": "1"})
    with open(tmp_path / "out", "w") as sink:
        proc = _start(slurm, argv, env, sink)
        try:
            (job,) = wait_running(slurm, f"sweep-{_id_of(slurm, proc, tmp_path)}", 1)
            node = job["NodeList"]
            if how == "node-down":
                slurm.check(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=dsbench-test"])
            elif how == "scancel":
                wait_log(Path(job["StdOut"]), "warm-up done")
                slurm.check(["scancel", job["JobId"]])
            code = proc.wait(timeout=200)
        finally:
            if proc.poll() is None:
                proc.kill()
            if how == "node-down" and slurm.node_states().get(node) not in ("idle", "mix", "alloc"):
                slurm.check(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
    (point,) = records(results, "sweep_point")
    want = {"node-down": "NODE_FAIL", "scancel": "CANCELLED", "time-limit": "TIMEOUT"}[how]
    assert point["slurm"]["state"] == want, point
    assert point["status"] == ("timeout" if how == "time-limit" else "crashed"), point
    assert point["reason"].startswith(f"Slurm job {job['JobId']} {want}"), point["reason"]
    assert point["slurm"]["nodes"] == node and point["slurm"]["signal"] is not None, point["slurm"]
    assert code != 0
    print(f"{how}: {point['status']}: {point['reason']}")
    if how != "node-down":  # SIGTERM, then KillWait: the ranks record why they stop (once, though signalled twice)
        assert "the ranks recorded: rank " in point["reason"] and "terminated by SIGTERM at step" in point["reason"]
    if how == "node-down":
        _until(lambda: slurm.node_states().get(node) == "idle", 30)


def _id_of(slurm, proc, tmp_path) -> str:
    """The sweep's id, from its first line."""
    deadline = time.monotonic() + 60
    out = tmp_path / "out"
    while "sweep " not in out.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
        time.sleep(0.2)
    return out.read_text().split("sweep ", 1)[1].split(":", 1)[0]


@pytest.mark.full
@pytest.mark.timeout(300)
def test_scaling_at_1_and_2_nodes_submits_one_job_per_node_count(slurm, tmp_path):
    results = tmp_path / "scaling.jsonl"
    r = slurm.run([sys.executable, "-m", "ds_bench", "scaling", "--workload", "mnist", "--ds-config",
                   "ds_configs/zero1.json", "--executor", "slurm", "--nodes", "1,2", "--nproc", "1", "--mpi", "pmix",
                   "--timeout", "3m", "--results", str(results), "--", "--steps", "6", "--warmup", "2", "--micro-batch",
                   "16", "--set", "bf16.enabled=false"], env={"HF_HUB_OFFLINE": "1"}, timeout=240, cwd=REPO)
    assert r.returncode == 0, r.explain()
    (rec,) = records(results, "scaling")
    rows = rec["points"]
    assert [(row["nodes"], row["world_size"], row["status"]) for row in rows] == [(1, 1, "ok"), (2, 2, "ok")], rows
    assert rows[1]["hosts"] == ["hosta", "hostb"] and rows[1]["slurm"]["nodes"] == "hosta,hostb"
    assert rows[0]["slurm"]["job_id"] != rows[1]["slurm"]["job_id"]


@pytest.mark.full
@pytest.mark.timeout(400)
def test_a_capacity_search_on_slurm_searches_its_layouts_at_once(slurm, tmp_path):
    """ZeRO-0 and ZeRO-3, a family of two, each probe a Slurm job; the two layouts' searches run side by side."""
    results = tmp_path / "c.jsonl"
    r = slurm.run([sys.executable, "-m", "ds_bench", "capacity", "--ds-config", "zero1.json", "--stages", "0,3",
                   "--precision", "fp32", "--scale", "layers", "--layers", "2", "--hidden", "64", "--heads", "2",
                   "--seq-len", "16", "--max-scale", "2", "--steps", "1", "--warmup", "0", "--nproc", "2",
                   "--executor", "slurm", "--timeout", "3m", "--results", str(results)],
                  env={"HF_HUB_OFFLINE": "1"}, timeout=360, cwd=REPO)
    assert r.returncode == 0, r.explain()
    answers = {a["layout"]: a for a in records(results, "capacity")}
    assert len(answers) == 2 and all(a["largest"]["member"] == "4 x 64 x 2" for a in answers.values()), answers
    probes = records(results, "capacity_probe")
    assert len(probes) == 4 and all(p["status"] == "ok" and p["slurm"]["state"] == "COMPLETED" for p in probes)
    first = sorted(probes, key=lambda p: int(p["slurm"]["job_id"]))[:2]  # each layout's first probe, side by side
    assert {p["layout"] for p in first} == set(answers) and {p["slurm"]["nodes"] for p in first} == {"hosta", "hostb"}


@pytest.mark.full
@pytest.mark.timeout(300)
def test_plan_confirms_its_best_layout_as_a_slurm_job(slurm, tmp_path):
    results = tmp_path / "plan.jsonl"
    r = slurm.run([sys.executable, "-m", "ds_bench", "plan", "--workload", "gpt2", "--size", "tiny", "--seq-len", "128",
                   "--global-batch", "256", "--device", "cpu", "--nproc", "1", "--peak-tflops", "0.05", "--stages", "0",
                   "--offload", "none", "--micro-batch", "2", "--activation-checkpointing", "off",
                   "--pipeline-stages", "1", "--confirm", "1", "--steps", "4", "--warmup", "1", "--executor", "slurm",
                   "--timeout", "3m", "--results", str(results)], env={"HF_HUB_OFFLINE": "1"}, timeout=240, cwd=REPO)
    assert r.returncode == 0, r.explain()
    (plan,) = records(results, "plan")
    confirmed = plan["ranked"][0]["confirmed"]
    assert confirmed["status"] == "ok" and confirmed["step_s"] > 0, confirmed
    assert jobs_named(slurm, "plan-"), "no Slurm job of the plan's confirm run"

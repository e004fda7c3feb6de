"""``ds-bench scaling``: pure parts on inline inputs, the failed-point path in-process, then one real
run at 1 and 2 CPU ranks (MNIST, ZeRO-1 fp32, 8 steps: ~25 s here)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from ds_bench import cli
from ds_bench.errors import UserError
from ds_bench.jobs import spawn as jobs
from ds_bench.record import store as results
from ds_bench.record.schema import RunRecord
from ds_bench.scaling import efficiency
from ds_bench.scaling import main as scaling_main
from ds_bench.scaling import points
from ds_bench.scaling.spec import parse_counts
from tests.conftest import ds_bench, explain, records

RUN = ["run", "--workload", "mnist", "--ds-config", "c.json"]


# ---- pure ----------------------------------------------------------------------------------------


def test_counts_are_positive_and_strictly_increasing():
    assert parse_counts("--ranks", "1, 2,4") == (1, 2, 4)
    for text, why in [("0", "must be a positive integer"), ("2,x", "'x' is not an integer"),
                      ("2,1", "increasing counts without repeats"), ("1,1", "increasing"), ("1,,2", "comma-separated")]:
        with pytest.raises(UserError, match=why):
            parse_counts("--ranks", text)


def test_nodes_take_the_first_hosts_with_their_slots_and_write_them_as_a_hostfile():
    hosts = (("a", 2), ("b", 2), ("c", 4))
    p1, p3 = points.node_points(hosts, (1, 3))
    assert (p1.world_size, p1.nodes, p1.per_node, p1.hosts) == (2, 1, 2, (("a", 2),))
    assert (p3.world_size, p3.nodes, p3.per_node) == (8, 3, 4)
    assert points.hostfile_text(p3.hosts) == "a slots=2\nb slots=2\nc slots=4\n"
    assert points.hostfile_text(points.local_hosts(3)) == "localhost slots=3\n"
    assert points.tag("abc", p3) == "scaling:abc:n8"
    assert [p.world_size for p in points.rank_points((1, 2, 4))] == [1, 2, 4]


def test_every_cpu_point_gets_the_threads_of_the_largest():
    assert points.threads_per_rank(2, 2) == 1 and points.threads_per_rank(16, 4) == 4
    assert points.threads_per_rank(2, 4) == 1  # oversubscribed: still one thread
    spec = SimpleNamespace(device_type="cpu", hostfile=None, points=points.rank_points((1, 2, 4)))
    env, threads, note = scaling_main.thread_setting(spec, {"PATH": "/bin"}, 16)
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "4"} and threads == 4 and "16 cores // 4 ranks" in note
    env, threads, note = scaling_main.thread_setting(spec, {"OMP_NUM_THREADS": "3"}, 16)
    assert env is None and threads == 3 and "from the environment" in note
    assert scaling_main.thread_setting(SimpleNamespace(device_type="cuda"), {}, 16) == (None, None, None)


def _row(n, status="ok", per_device=None, threads=1):
    point = points.Placement(n, 1, n)
    run = RunRecord.model_validate({
        "workload": "mnist", "run_id": f"r{n}", "world_size": n, "micro_batch": 16, "grad_accum": 1,
        "train_batch_size": 16 * n, "hardware": {"torch_threads": threads},
        "metrics": {"samples_per_s": per_device * n, "samples_per_s_per_device": per_device, "step_ms_median": 10.0,
                    "step_ms_p90": 12.0, "sample_unit": "images"}}) if status == "ok" else None
    return efficiency.row(point, status, None if status == "ok" else "crashed: exit code 1", run, tag=f"t{n}", log=None)


def test_efficiency_is_per_device_throughput_over_the_smallest_ok_point():
    rows, base = efficiency.with_efficiency([_row(1, "failed"), _row(2, per_device=400.0), _row(4, per_device=300.0)])
    assert base == 2
    assert [r.efficiency for r in rows] == [None, 1.0, 0.75]
    assert rows[2].global_batch == 64 and rows[2].unit == "images/s"
    assert efficiency.with_efficiency([_row(1, "failed")]) == ([_row(1, "failed")], None)


def test_a_point_is_failed_unless_its_run_is_ok_at_the_planned_world_size():
    assert efficiency.point_status("ok", None, RunRecord(workload="mnist", world_size=2), 2) == ("ok", None)
    assert efficiency.point_status("timeout", "no result within 3 s", None, 2) == ("failed", "timeout: no result within 3 s")
    status, reason = efficiency.point_status("ok", None, RunRecord(workload="mnist", world_size=1), 2)
    assert status == "failed" and "says 1 rank(s), expected 2" in reason


def test_notes_name_differing_threads_and_oversubscription():
    rows, _ = efficiency.with_efficiency([_row(1, per_device=400.0, threads=2), _row(4, per_device=100.0)])
    text = " ".join(efficiency.notes(rows, 2, "cpu"))
    assert "threads per rank differ" in text and "at 4 rank(s)" in text and "exceed its 2 cores" in text


def test_points_launch_as_sweep_points_do(tmp_path):
    run = [*RUN, "--results", "r.jsonl"]
    assert jobs.command(points.job(points.Placement(2, 1, 2), "torchrun", None), run, 29500)[1:] == [
        "--nnodes", "1", "--nproc_per_node", "2", "--node_rank", "0", "--master_addr", "127.0.0.1",
        "--master_port", "29500", "-m", "ds_bench", *run]
    hf = tmp_path / "hf"
    hf.write_text(points.hostfile_text(points.local_hosts(3)))
    assert jobs.command(points.job(points.Placement(3, 1, 3), "mpirun", str(hf)), run, 29500) == [
        "mpirun", "-np", "3", "--host", "localhost:3", "--map-by", "slot", "-x", "PATH", sys.executable,
        "-m", "ds_bench", *run]


@pytest.mark.parametrize("launcher, word", [("torchrun", "--nproc_per_node"), ("mpirun", "-np"), ("deepspeed", "--num_gpus")])
def test_each_launcher_starts_this_nodes_points_without_a_hostfile(launcher, word, tmp_path, capsys):
    """The studies' one ``--launcher`` list: on one node scaling takes each (mpirun from a hostfile it writes)."""
    code = cli.main(["scaling", "--workload", "mnist", "--ds-config", "zero1.json", "--ranks", "1,2", "--launcher",
                     launcher, "--results", str(tmp_path / "s.jsonl"), "--dry-run", "--", "--steps", "3", "--warmup", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert [line.split(":")[0] for line in out.splitlines() if word in line] == ["n1", "n2"], out


def test_dry_run_writes_the_sub_hostfiles_and_prints_each_command(tmp_path, capsys):
    (tmp_path / "hosts").write_text("localhost slots=2\n")
    code = cli.main(["scaling", "--workload", "mnist", "--ds-config", "zero1.json", "--hostfile", str(tmp_path / "hosts"),
                     "--nodes", "1", "--results", str(tmp_path / "s.jsonl"), "--dry-run", "--", "--steps", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    [sub] = (tmp_path / "s.hosts").iterdir()
    assert sub.read_text() == "localhost slots=2\n"
    assert f"--hostfile {sub}" in out and "--no_ssh_check" in out and "--tag scaling:" in out
    assert not (tmp_path / "s.jsonl").exists()


# ---- failed points, in-process (no job is started) --------------------------------------------------


def test_a_failed_point_is_a_row_and_the_exit_is_1(tmp_path, monkeypatch, capsys):
    """1 rank: exit 1 with no record; 2 ranks: an ok record. The 2-rank point becomes the baseline."""
    runs = tmp_path / "s.runs.jsonl"

    def fake_job(argv, log_path, timeout_s, env=None):
        tag = argv[argv.index("--tag") + 1]
        if tag.endswith(":n2"):
            results.append_record(str(runs), RunRecord.model_validate({
                "workload": "mnist", "tag": tag, "status": "ok", "world_size": 2, "run_id": "x", "micro_batch": 16,
                "grad_accum": 1, "train_batch_size": 32, "hardware": {"torch_threads": int(env["OMP_NUM_THREADS"])},
                "metrics": {"samples_per_s": 500.0, "samples_per_s_per_device": 250.0, "step_ms_median": 64.0,
                            "step_ms_p90": 70.0}}))
        return jobs.JobEnd(0 if tag.endswith(":n2") else 1, False, 0.0, 1.0)

    monkeypatch.setattr(jobs, "run_job", fake_job)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    code = cli.main(["scaling", "--workload", "mnist", "--ds-config", "zero1.json", "--ranks", "1,2",
                     "--results", str(tmp_path / "s.jsonl"), "--", "--steps", "3", "--set", "bf16.enabled=false"])
    out = capsys.readouterr().out
    assert code == 1, out
    [rec] = records(tmp_path / "s.jsonl")
    assert rec["kind"] == "scaling" and rec["status"] == "failed" and rec["baseline_world_size"] == 2
    assert [(p["status"], p["efficiency"]) for p in rec["points"]] == [("failed", None), ("ok", 1.0)]
    assert rec["points"][0]["reason"] == "crashed: exit code 1 with no record"
    assert "failed: crashed: exit code 1 with no record" in out
    assert (tmp_path / "s.png").exists() and (tmp_path / "s.md").exists()


# ---- a real run ------------------------------------------------------------------------------------


@pytest.mark.dist
def test_scaling_runs_1_and_2_ranks_and_reports_weak_scaling_efficiency(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # ds-bench scaling then sets it for every point
    out = tmp_path / "s.jsonl"
    proc = ds_bench("scaling", "--workload", "mnist", "--ds-config", "ds_configs/zero1.json", "--ranks", "1,2",
                    "--results", str(out), "--master-port", "29891", "--timeout", "150s", "--",
                    "--steps", "8", "--warmup", "2", "--micro-batch", "16", "--set", "bf16.enabled=false", timeout=300)
    assert proc.returncode == 0, explain(proc)
    [rec] = records(out)
    assert rec["kind"] == "scaling" and rec["status"] == "ok" and rec["versions"]["deepspeed"]
    pts = rec["points"]
    assert [(p["world_size"], p["status"]) for p in pts] == [(1, "ok"), (2, "ok")]
    runs = {r["tag"]: r for r in records(tmp_path / "s.runs.jsonl") if r.get("status") == "ok"}
    per_device = [runs[p["tag"]]["metrics"]["samples_per_s_per_device"] for p in pts]
    assert pts[0]["efficiency"] == 1.0
    assert pts[1]["efficiency"] == pytest.approx(per_device[1] / per_device[0])
    assert [p["global_batch"] for p in pts] == [16, 32]  # weak scaling: 16 per device
    assert [p["torch_threads"] for p in pts] == [1, 1] == [runs[p["tag"]]["hardware"]["torch_threads"] for p in pts]
    assert "OMP_NUM_THREADS=1 at every point" in proc.stdout
    assert (tmp_path / "s.png").stat().st_size > 0 and "efficiency" in (tmp_path / "s.md").read_text()
    assert f"{pts[1]['efficiency']:.2f}" in proc.stdout
    assert cli.main(["report", str(out)]) == 0  # the record's table again
    assert f"{pts[1]['efficiency']:.2f}" in capsys.readouterr().out

"""Launch-command builders on exact argv, the run scripts' printed commands, and a real launch."""

import sys

import pytest

from ds_bench.errors import UserError
from ds_bench.jobs.launch import deepspeed_command, mpirun_command, srun_command, torchrun_command
from tests.conftest import REPO, ds_bench, explain, records, run_cmd

RUN = ["run", "--workload", "mnist", "--ds-config", "ds_configs/zero2.json"]


def test_mpirun_from_slots_pins_the_interface():
    argv = mpirun_command({"n1": [0, 1, 2, 3], "n2": [0, 1]}, RUN, python="py", iface="ib0")
    assert argv == ["mpirun", "-np", "6", "--host", "n1:4,n2:2", "--map-by", "slot", "-x", "PATH",
                    "--mca", "oob_tcp_if_include", "ib0", "--mca", "btl_tcp_if_include", "ib0",
                    "-x", "DS_BENCH_IFACE=ib0", "py", "-m", "ds_bench", *RUN]


def test_mpirun_rejects_gpu_subsets_it_cannot_express():
    with pytest.raises(UserError, match=r"n1 needs slots 0\.\.1, not \[1, 3\]"):
        mpirun_command({"n1": [1, 3]}, RUN, python="py")


def test_deepspeed_passes_master_addr_and_filters():
    argv = deepspeed_command("hf", RUN, master_addr="n1-ib", master_port=29500, include="n1:0,1@n2")
    assert argv == ["deepspeed", "--hostfile", "hf", "--master_addr", "n1-ib", "--master_port", "29500",
                    "--include", "n1:0,1@n2", "--module", "ds_bench", *RUN]


def test_torchrun_and_srun():
    assert torchrun_command(RUN, nnodes=2, nproc_per_node=4, node_rank=1, master_addr="n1", master_port=1) == [
        "torchrun", "--nnodes", "2", "--nproc_per_node", "4", "--node_rank", "1", "--master_addr", "n1",
        "--master_port", "1", "-m", "ds_bench", *RUN]
    assert srun_command(RUN, nnodes=2, tasks_per_node=4, python="py", mpi="pmix") == [
        "srun", "--nodes", "2", "--ntasks-per-node", "4", "--kill-on-bad-exit=1", "--mpi=pmix", "py", "-m",
        "ds_bench", *RUN]


SCRIPTS = {
    "slurm_single_node_deepspeed.sbatch": "deepspeed --num_gpus 4 --module ds_bench run --workload gpt2",
    "slurm_multi_node_srun.sbatch": "srun --nodes 2 --ntasks-per-node 4 --kill-on-bad-exit=1",
    "mpirun_hostfile.sh": "mpirun -np 8 --host node01:4,node02:4 --map-by slot -x PATH ",
    "torchrun_multi_node.sh": "torchrun --nnodes 2 --nproc_per_node 4 --node_rank 0 --master_addr node01",
}


@pytest.mark.parametrize("script", SCRIPTS)
def test_run_scripts_print_their_command(script):
    proc = run_cmd(["bash", f"run_scripts/{script}"], timeout=60, DRY_RUN="1", PYTHON=sys.executable)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.startswith(SCRIPTS[script]), proc.stdout
    assert "ds_bench run" in proc.stdout or "-m ds_bench run" in proc.stdout


def test_srun_asks_for_gpus_only_when_given():
    assert "--gpus-per-node=4" in srun_command(RUN, nnodes=1, tasks_per_node=4, python="py", gpus_per_node=4)
    assert not any("gpus" in a for a in srun_command(RUN, nnodes=1, tasks_per_node=4, python="py"))
    with pytest.raises(UserError, match="--gpus-per-node is an srun option"):
        from ds_bench.jobs import launch

        launch.build(launch.LaunchSpec("torchrun", tuple(RUN), gpus_per_node=4))


def script_command(script: str, **env: str) -> str:
    proc = run_cmd(["bash", f"run_scripts/{script}"], timeout=60, DRY_RUN="1", PYTHON=sys.executable, **env)
    assert proc.returncode == 0, explain(proc)
    return proc.stdout


SBATCH = ["slurm_multi_node_srun.sbatch", "slurm_single_node_deepspeed.sbatch", "acceptance.sbatch"]


@pytest.mark.parametrize("script", SBATCH)
def test_sbatch_scripts_hard_code_no_gpus(script):
    """An #SBATCH line cannot read a variable: a GRES line there makes sbatch refuse the job on a CPU
    partition, so GPUs go on the sbatch command line (documented in the script)."""
    text = (REPO / "run_scripts" / script).read_text()
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives and not any(g in line for line in directives for g in ("gpu", "gres"))
    assert f"sbatch --gpus-per-node=" in text


@pytest.mark.parametrize("gpus", [None, "", "0"])
def test_srun_scripts_ask_for_no_gpus_when_gpus_per_node_is_zero_or_unset(gpus):
    env = {} if gpus is None else {"GPUS_PER_NODE": gpus}
    out = script_command("slurm_multi_node_srun.sbatch", **env)
    assert out.startswith("srun --nodes 2 --ntasks-per-node 4 --kill-on-bad-exit=1 ") and "gpu" not in out
    acc = script_command("acceptance.sbatch", SLURM_JOB_NODELIST="n[1-2]", **env)
    assert "gpus-per-node" not in acc


def test_srun_scripts_ask_for_the_gpus_sbatch_was_given():
    out = script_command("slurm_multi_node_srun.sbatch", SLURM_GPUS_PER_NODE="h100:4", SLURM_NTASKS_PER_NODE="4")
    assert out.startswith("srun --nodes 2 --ntasks-per-node 4 --kill-on-bad-exit=1 --gpus-per-node=4 ")
    acc = script_command("acceptance.sbatch", SLURM_JOB_NODELIST="n[1-2]", GPUS_PER_NODE="8")
    assert all("--gpus-per-node 8" in line for line in acc.splitlines() if " launch srun " in line)


SCRIPTS_WITH_IFACE = ["slurm_multi_node_srun.sbatch", "mpirun_hostfile.sh", "torchrun_multi_node.sh"]


@pytest.mark.parametrize("script", SCRIPTS_WITH_IFACE + ["acceptance.sbatch"])
@pytest.mark.parametrize("iface", [None, ""])
def test_an_empty_or_unset_iface_lets_ds_bench_choose(script, iface):
    env = {"SLURM_JOB_NODELIST": "n[1-2]"} | ({} if iface is None else {"IFACE": iface})
    out = script_command(script, **env)
    assert "--iface" not in out and "ib0" not in out and "if_include" not in out and "DS_BENCH_IFACE" not in out


@pytest.mark.parametrize("script", SCRIPTS_WITH_IFACE + ["acceptance.sbatch"])
def test_a_given_iface_is_passed_on(script):
    out = script_command(script, IFACE="ib1", SLURM_JOB_NODELIST="n[1-2]")
    assert "--iface ib1" in out or "DS_BENCH_IFACE=ib1" in out, out


def test_launch_with_a_bad_hostfile_names_the_line(tmp_path):
    bad = tmp_path / "hf"
    bad.write_text("node01 slots=4\nnode01 slots=2\n")
    proc = ds_bench("launch", "mpirun", "--hostfile", str(bad), "--dry-run")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "hf:2: duplicate host 'node01'" in proc.stderr


@pytest.mark.dist
@pytest.mark.full  # mpirun runs for real in tests/test_launch_paths.py and test_faults.py
def test_real_mpirun_launch_from_a_hostfile(tmp_path):
    results = tmp_path / "r.jsonl"
    proc = ds_bench("launch", "mpirun", "--hostfile", "hostfiles/localhost_2", "--", *RUN, "--steps", "4",
                    "--warmup", "1", "--results", str(results), timeout=240,
                    OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.startswith("mpirun -np 2 --host localhost:2")
    (r,) = records(results)
    assert (r["status"], r["launcher"], r["world_size"]) == ("ok", "openmpi", 2)


def test_netns_demo_dry_run_prints_and_creates_nothing():
    proc = run_cmd(["bash", "run_scripts/netns_demo.sh", "--iface", "eth0"], timeout=60, DRY_RUN="1",
                   PYTHON=sys.executable)
    assert proc.returncode == 0, explain(proc)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# would create network namespaces") and len(lines) == 2
    assert lines[1].startswith("mpirun --allow-run-as-root -np 2 --host hosta,hostb") and lines[1].endswith("--iface eth0")


def launch_args(*argv):
    from ds_bench.cli import build_parser

    args = build_parser(["launch"]).parse_args(["launch", *argv])
    args.run_args = RUN
    return args


def test_deepspeed_skips_the_ssh_check_when_every_host_is_this_machine():
    from ds_bench.jobs import launch

    assert deepspeed_command("hf", RUN, master_addr="localhost", master_port=29500, local_only=True) == [
        "deepspeed", "--hostfile", "hf", "--master_addr", "localhost", "--master_port", "29500", "--no_ssh_check",
        "--module", "ds_bench", *RUN]
    assert launch.is_local_host("localhost", ()) and launch.is_local_host("127.0.0.1", ())
    assert launch.is_local_host("box", ("box",)) and not launch.is_local_host("node01", ("box",))
    assert "--no_ssh_check" in launch.build(launch.LaunchSpec("deepspeed", tuple(RUN), hostfile="hostfiles/localhost_2"))
    assert "--no_ssh_check" not in launch.build(launch.LaunchSpec("deepspeed", tuple(RUN),
                                                                hostfile="hostfiles/example_2nodes_4gpus"))


def test_a_failing_launcher_is_one_line_and_its_exit_code(monkeypatch, capsys):
    from ds_bench.commands import launch as command
    from ds_bench.jobs import launch

    monkeypatch.setattr(launch, "run_child", lambda argv: 250)
    assert command.main(launch_args("deepspeed", "--hostfile", "hostfiles/localhost_2")) == 250
    assert capsys.readouterr().err.strip() == "ds-bench launch: deepspeed exited with code 250"

"""The software stack as a study axis (``ds_bench.config.stacks``, ``machine.stack_envs``, ``config.stack_rules``,
``report.compare_curves``), on inline inputs: the flags' versions and the stacks they make, a stack in a point's
key, the jobs' Python, the features an older release refuses, and ``compare --stacks`` with its step-by-step
check of losses and gradient norms. The real environments and runs (DeepSpeed #7718 caught, the oldest stack's
core subset) are ``tests/test_stacks_real.py`` (``full`` tier).
"""

import dataclasses
import json
import os
import sys

import pytest

from ds_bench import cli
from ds_bench.config.layout import Layout, parse_key
from ds_bench.config.legality import violation
from ds_bench.config.legality_rules import Where
from ds_bench.config.stack_rules import NEEDS, too_old
from ds_bench.config.stacks import SUPPORTED, Stack, parse_versions, stacks_of
from ds_bench.errors import UserError
from ds_bench.jobs import spawn
from ds_bench.machine.stack_envs import env_path, stacks_root
from ds_bench.report.compare_curves import check
from tests.conftest import REPO

HERE = {"deepspeed": "0.19.8", "torch": "2.13.0+cpu", "transformers": "5.24.0"}


def test_versions_are_single_releases_no_older_than_the_supported_one():
    assert parse_versions("--deepspeed", "0.18.4,installed", "0.16.0") == ("0.18.4", "installed")
    for bad, said in ((">=0.18", "expected release versions"), ("0.18.*", "expected release versions"),
                      ("latest", "expected release versions"), ("0.14.5", "older than the oldest"),
                      ("0.18.4,0.18.4", "each version once"), ("0.18.4,", "each version once")):
        with pytest.raises(UserError, match=said):
            parse_versions("--deepspeed", bad, "0.16.0")


def test_every_combination_is_a_stack_and_installed_is_this_environment():
    stacks = stacks_of({"deepspeed": ("0.18.4", "installed"), "transformers": ("4.57.6",)}, HERE)
    assert [s.label for s in stacks] == ["ds0.18.4+tf4.57.6", "ds0.19.8+tf4.57.6"]
    assert [s.requirements() for s in stacks] == [["deepspeed==0.18.4", "transformers==4.57.6"],
                                                  ["transformers==4.57.6"]]
    own = stacks_of({"deepspeed": ("0.18.4", "0.19.8")}, HERE)[1]
    assert own.own and own.label == "ds0.19.8"  # the installed release named by its number: this environment
    assert stacks_of({"torch": ("installed",)}, HERE)[0].label == "torch2.13.0"  # the local part left out
    assert stacks_of({}, HERE) == (Stack(),) and Stack().label == "" and Stack().own
    with pytest.raises(UserError, match="listed twice"):
        stacks_of({"deepspeed": ("0.19.8", "installed")}, HERE)


def test_a_stack_is_a_word_of_the_point_key_and_reads_back():
    point = Layout(2, "none", "fp32", 8, grad_accum=2, stack="ds0.17.6")
    assert point.key == "z2 off=none fp32 mbs=8 ga=2 stack=ds0.17.6"
    assert parse_key(point.key, Layout(0, "none", "fp32", 1)) == point
    assert Layout.from_dict(point.to_dict()) == point
    assert "stack" not in " ".join(point.run_flags())  # the job's Python is the stack, not a flag of run
    assert Layout(2, "none", "fp32", 8).key == "z2 off=none fp32 mbs=8"  # no axis: keys as before


def test_a_stack_s_environment_sits_beside_this_one_named_by_its_pins():
    stack = stacks_of({"deepspeed": ("0.17.6",), "torch": ("2.14.1",)}, HERE)[0]
    assert stacks_root({}, "/work/p/.venv") == "/work/p/.venv-stacks"
    assert stacks_root({"DS_BENCH_STACKS": "/scratch/s"}, "/work/p/.venv") == "/scratch/s"
    assert env_path(stack, "/r") == "/r/deepspeed0.17.6-torch2.14.1"


@dataclasses.dataclass
class Job:
    launcher: str
    nproc: int = 2
    hostfile: str | None = None
    iface: str | None = None
    python: str | None = None


def test_a_stack_s_jobs_start_with_its_python_and_its_launchers(tmp_path):
    env = tmp_path / "env" / "bin"
    env.mkdir(parents=True)
    for name in ("torchrun", "deepspeed"):
        (env / name).touch()
    (env / "python").symlink_to(os.path.realpath(sys.executable))  # as a venv's: the same binary, another environment
    python = str(env / "python")
    assert spawn.command(Job("torchrun", python=python), ["run"], 29500)[0] == str(env / "torchrun")
    assert spawn.command(Job("deepspeed", python=python), ["run"], 29500)[0] == str(env / "deepspeed")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    mpirun = spawn.command(Job("mpirun", hostfile=str(hostfile), python=python), ["run"], 29500)
    assert mpirun[mpirun.index("-m") - 1] == python
    assert spawn.command(Job("torchrun"), ["run"], 29500)[0] == spawn.beside_python("torchrun")  # no stack: as before
    assert sys.executable not in mpirun
    env = spawn.job_environment(Job("deepspeed"), {"PYTHONPATH": "/mine"}, python)
    assert env["PYTHONPATH"] == os.pathsep.join((str(REPO), "/mine"))  # the study's own ds_bench first
    assert spawn.job_environment(Job("deepspeed"), None, sys.executable) is None  # this environment: unchanged


def test_a_feature_newer_than_the_stack_s_release_is_refused_naming_both():
    sp = Layout(1, "none", "fp32", 1, sequence_parallel=2)
    old = Where(world_size=2, versions=(("deepspeed", "0.16.9"),))
    said = violation(sp, old)
    assert said.startswith("--sequence-parallel 2 needs deepspeed 0.18.1 or newer; this stack has deepspeed 0.16.9")
    assert too_old(sp, Where(world_size=2)) is None  # this environment's release has it
    assert too_old(sp, Where(versions=(("deepspeed", "0.18.1"),))) is None
    tp = Layout(1, "none", "fp32", 1, tensor_parallel=2)
    assert too_old(tp, Where(2, "cpu", versions=(("deepspeed", "0.17.6"),))).startswith(
        "--tensor-parallel 2 on CPU ranks needs deepspeed 0.18.0 or newer; this stack has deepspeed 0.17.6")
    assert too_old(tp, Where(2, "cuda", versions=(("deepspeed", "0.17.6"),))) is None  # GPUs: since 0.16.4
    assert "needs deepspeed 0.16.4" in too_old(tp, Where(2, "cuda", versions=(("deepspeed", "0.16.0"),)))
    offload = too_old(Layout(1, "none", "bf16", 1), Where(2, "cuda", frozenset({"checkpoint_offload"}),
                                                          versions=(("deepspeed", "0.19.5"),)))
    assert offload.startswith("--checkpoint-offload needs deepspeed 0.19.6")
    for need in NEEDS:  # each names a release the project supports, after the oldest
        assert tuple(map(int, need.release.split("."))) > tuple(map(int, SUPPORTED[need.package].split(".")))


def test_curves_equal_to_rounding_are_the_same_and_the_first_step_that_parts_is_named():
    base = {"loss_curve": [2.343386, 2.340258, 2.3], "grad_norm_curve": [0.543, 0.449, 0.461]}
    assert check(base, dict(base), "fp32").said == "same curves (3 steps)"
    bug = {"loss_curve": [2.343386, 2.344264, 2.3], "grad_norm_curve": [0.390, 0.344, 0.303]}  # DeepSpeed #7718
    assert check(base, bug, "fp32").said == ("gradient norm differs from step 1: 0.543 vs 0.39; loss differs from step "
                                             "2: 2.34026 vs 2.34426")  # the earliest first
    losses = {**base, "loss_curve": [2.343386, 2.340258, 2.31]}
    assert check(base, losses, "fp32").said == "loss differs from step 3: 2.3 vs 2.31"
    assert check(base, bug, "bf16").said.startswith("gradient norm")  # bf16 holds losses to 2e-2, not norms a third off
    assert check(base, {**base, "grad_norm_curve": [None, 0.449, 0.461]}, "fp32").same  # a step without a norm
    assert check({}, base, "fp32") is None  # a record without curves: nothing to say


def sweep_point(stack: str, throughput: float, losses: list, norms: list) -> dict:
    point = Layout(2, "none", "fp32", 8, grad_accum=2, stack=stack)
    return {"kind": "sweep_point", "sweep": "s1", "key": point.key, "point": point.to_dict(), "status": "ok",
            "workload": "mnist", "world_size": 2, "unit": "images/s", "throughput": throughput,
            "loss_curve": losses, "grad_norm_curve": norms}


def test_compare_stacks_pairs_each_layout_between_two_stacks_of_one_file(tmp_path, capsys):
    path = tmp_path / "sweep.jsonl"
    right = ([2.343386, 2.340258], [0.543, 0.449])
    lines = [sweep_point("ds0.18.4", 1000, *right), sweep_point("ds0.19.8", 1010, *right)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert cli.main(["compare", str(path), "--stacks", "ds0.18.4,ds0.19.8"]) == 0
    out = capsys.readouterr().out
    assert "z2 off=none fp32 mbs=8 ga=2" in out and "stack=" not in out and "same curves (2 steps)" in out
    wrong = [sweep_point("ds0.17.6", 1000, [2.343386, 2.344264], [0.390, 0.344])]
    path.write_text(path.read_text() + "".join(json.dumps(r) + "\n" for r in wrong))
    assert cli.main(["compare", str(path), "--stacks", "ds0.17.6,ds0.19.8"]) == 1  # as fast, but wrong
    out = capsys.readouterr().out
    assert "gradient norm differs from step 1: 0.39 vs 0.543; loss differs from step 2" in out
    assert "1 with different losses or gradient norms" in out
    assert cli.main(["compare", str(path), "--stacks"]) == 0  # alone: the file's first two stacks
    assert capsys.readouterr().out.startswith("stacks: ds0.18.4 (BASE) against ds0.19.8 (NEW)\n")
    assert cli.main(["compare", str(path), "--stacks", "ds0.16.0,ds0.19.8"]) == 2
    assert "has no sweep point or scaling of stack ds0.16.0; its stacks: ds0.18.4, ds0.19.8, ds0.17.6" in capsys.readouterr().err


@pytest.mark.parametrize("study", [
    ["sweep", "--workload", "mnist", "--ds-config", "zero2.json", "--stages", "1,2", "--micro-batch", "8"],
    ["capacity", "--ds-config", "zero1.json", "--stages", "1,2", "--family", "gpt3"],
    ["scaling", "--workload", "mnist", "--ds-config", "zero1.json", "--ranks", "1,2"],
])
def test_each_study_takes_the_stack_axis_and_its_dry_run_says_where_each_stack_runs(study, tmp_path, capsys,
                                                                                    monkeypatch):
    monkeypatch.setenv("DS_BENCH_STACKS", str(tmp_path / "stacks"))
    code = cli.main([*study, "--deepspeed", "0.18.4,installed", "--results", str(tmp_path / "r.jsonl"), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"stack ds0.18.4: {tmp_path / 'stacks' / 'deepspeed0.18.4'} (to be built before the first point)" in out
    assert "stack ds0.19.8: this environment" in out
    if study[0] != "scaling":  # a sweep's families and capacity's layouts once per stack, keyed by it
        for stage in (1, 2):
            assert [line for line in out.splitlines() if f"z{stage} " in line and "stack=ds0.18.4" in line], out
            assert [line for line in out.splitlines() if f"z{stage} " in line and "stack=ds0.19.8" in line], out
    assert not (tmp_path / "stacks").exists()  # a dry run builds nothing


def test_a_family_s_stacks_interleave_repeat_by_repeat_and_an_oom_ends_only_its_own_stack(tmp_path, monkeypatch):
    """The driver's side, without launching anything (``_attempt`` stands in for the job): each micro-batch's
    repeats run A B A B, so a load that comes and goes falls on both stacks; a stack that runs out of memory at a
    micro-batch skips the larger ones, the other goes on."""
    from ds_bench.machine.compute_node import ComputeNode
    from ds_bench.record.schema import SweepPointRecord
    from ds_bench.sweep import driver
    from ds_bench.sweep.spec import from_args

    node = ComputeNode(gpus=0, native_bf16=False, cpus=2, memory_bytes=24 * 2**30)
    argv = ["sweep", "--workload", "mnist", "--ds-config", "zero2.json", "--stages", "1", "--micro-batch", "8,16,32",
            "--repeats", "2", "--deepspeed", "0.18.4,installed", "--results", str(tmp_path / "s.jsonl")]
    spec, base = from_args(cli.parse(argv), [], node)
    sweep, ran = driver.Sweep(spec, base), []

    def attempt(point, repeat, predicted):
        ran.append(f"{point.micro_batch} {point.stack} r{repeat}")
        status = "oom" if point.stack == "ds0.18.4" and point.micro_batch == 16 else "ok"
        record = SweepPointRecord(kind="sweep_point", sweep=sweep.sweep_id, key=point.key, point=point.to_dict(),
                                  repeat=repeat, status=status, workload="mnist")
        sweep._append(record)
        return record

    monkeypatch.setattr(sweep, "_attempt", attempt)
    sweep.run()
    assert ran == ["8 ds0.18.4 r0", "8 ds0.19.8 r0", "8 ds0.18.4 r1", "8 ds0.19.8 r1",
                   "16 ds0.18.4 r0", "16 ds0.19.8 r0", "16 ds0.19.8 r1",
                   "32 ds0.19.8 r0", "32 ds0.19.8 r1"]
    skipped = [r for r in sweep.done.values() if r.status == "skipped"]
    assert [(r.key, r.reason) for r in skipped] == [("z1 off=none fp32 mbs=32 stack=ds0.18.4",
                                                     "micro-batch 16 already ran out of memory")]


def test_requirements_declare_the_oldest_releases_the_stack_axis_supports():
    """requirements.txt's minimums are ``config.stacks.PACKAGES``' oldest releases: what pip installs and what the
    full tier runs as the oldest stack are the same claim."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    from ds_bench.config.stacks import PACKAGES

    lines = [line for line in (REPO / "requirements.txt").read_text().splitlines() if line and line[0] != "#"]
    floors = {r.name: Version(s.version) for r in map(Requirement, lines) for s in r.specifier if s.operator == ">="}
    assert {p.name: floors.get(p.name) for p in PACKAGES} == {p.name: Version(p.oldest) for p in PACKAGES}


def test_the_docs_table_of_features_is_the_rules():
    """docs/stacks.md lists every ``NeedsRelease`` with its release and evidence, as the refusal says them."""
    page = (REPO / "docs" / "stacks.md").read_text()
    for need in NEEDS:
        feature = need.feature.format(sequence_parallel="S", tensor_parallel="T", master_states="bf16")
        assert f"| `{feature}` | {need.package} {need.release} | {need.evidence} |" in page, feature

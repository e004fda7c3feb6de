"""The bench suite's launch commands, exactly."""

import argparse
import os

from ds_bench.suite import CONFIG_DIR, SuiteRun, build_command, plan


def test_build_command_is_the_documented_deepspeed_invocation():
    argv = build_command(SuiteRun("mnist", "zero2.json"), nproc=2, master_port=29511, steps=30, warmup=5,
                         results_path="results/r.jsonl", tag="bench-x", launcher="deepspeed", extra=("--seed", "1"))
    assert argv == ["deepspeed", "--num_gpus", "2", "--master_port", "29511", "--module", "ds_bench", "run",
                    "--workload", "mnist", "--ds-config", os.path.join(CONFIG_DIR, "zero2.json"), "--steps", "30",
                    "--warmup", "5", "--results", "results/r.jsonl", "--tag", "bench-x", "--seed", "1"]


def test_default_plan_is_mnist_over_zero_0_to_3():
    args = argparse.Namespace(workload=None, configs=None)
    assert [(r.workload, r.ds_config) for r in plan(args) if r.workload == "mnist"] == [
        ("mnist", f"zero{s}.json") for s in range(4)]


def test_report_prints_a_table_and_writes_a_plot(tmp_path):
    from ds_bench.results import append_record
    from tests.conftest import ds_bench

    results = tmp_path / "r.jsonl"
    for stage, sps in ((0, 900.0), (3, 450.0)):
        append_record(str(results), {
            "workload": "mnist", "size": None, "zero_stage": stage, "precision": "bf16", "world_size": 2,
            "micro_batch": 32, "status": "ok", "tag": "t1",
            "metrics": {"samples_per_s": sps, "step_ms_median": 70.0, "step_ms_p90": 80.0, "peak_mem_bytes": 2**29,
                        "loss_first": 2.3, "loss_last": 1.1, "tflops_per_device": None, "mfu": None}})
    append_record(str(results), {"workload": "mnist", "status": "failed", "tag": "other", "metrics": {}})
    proc = ds_bench("report", str(results), "--tag", "t1", "--plot", str(tmp_path / "p.png"))
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| mnist")]
    assert len(rows) == 2 and "900.0" in rows[0] and "512" in rows[0] and "450.0" in rows[1]
    assert (tmp_path / "p.png").stat().st_size > 5000
    missing = ds_bench("report", str(tmp_path / "none.jsonl"))
    assert missing.returncode == 2 and "no results file" in missing.stderr


def test_default_plan_covers_every_workload_over_zero_0_to_3_with_cpu_shapes():
    args = argparse.Namespace(workload=None, configs=None)
    runs = plan(args, gpu=False)
    assert [(r.workload, r.ds_config) for r in runs] == [
        (w, f"zero{s}.json") for w in ("mnist", "resnet", "gpt2") for s in range(4)]
    shapes = {r.workload: r.args for r in runs}
    assert shapes["resnet"] == ("--size", "resnet18", "--image-size", "64", "--micro-batch", "8")
    assert shapes["gpt2"] == ("--size", "tiny", "--seq-len", "128", "--micro-batch", "2")


def test_gpu_plan_uses_the_real_default_shapes():
    shapes = {r.workload: r.args for r in plan(argparse.Namespace(workload=None, configs=None), gpu=True)}
    assert shapes["resnet"][:4] == ("--size", "resnet50", "--image-size", "224")
    assert shapes["gpt2"][:4] == ("--size", "small", "--seq-len", "1024")


def test_configs_keep_the_workload_shape_and_user_arguments_come_last():
    args = argparse.Namespace(workload="gpt2", configs=["zero2.json", "zero3.json"])
    runs = plan(args, gpu=False)
    assert [(r.workload, r.ds_config) for r in runs] == [("gpt2", "zero2.json"), ("gpt2", "zero3.json")]
    argv = build_command(runs[0], nproc=2, master_port=1, steps=3, warmup=1, results_path="r", tag="t",
                         launcher="deepspeed", extra=("--micro-batch", "4"))
    assert argv[-8:] == ["--size", "tiny", "--seq-len", "128", "--micro-batch", "2", "--micro-batch", "4"]


def test_cpu_default_precision_follows_what_the_cpu_runs_natively():
    from ds_bench.cpu_features import cpu_flags, native_bf16
    from ds_bench.suite import default_precision_args

    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
    sapphire = "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    graviton3 = "Features\t: fp asimd sve bf16 i8mm\n"
    assert [native_bf16(cpu_flags(t)) for t in (avx2, sapphire, graviton3, "")] == [False, True, True, False]
    assert default_precision_args(gpu=False, native_bf16=False) == ("--set", "bf16.enabled=false")
    assert default_precision_args(gpu=False, native_bf16=True) == ()
    assert default_precision_args(gpu=True, native_bf16=False) == ()

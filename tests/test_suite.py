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

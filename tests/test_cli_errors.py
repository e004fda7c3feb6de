"""Bad input: a one-line error naming what is wrong, exit code 2, no traceback, nothing recorded."""

import shlex
import subprocess
import sys

import pytest

from tests.conftest import ds_bench, explain


def bad_run(tmp_path, *args):
    results = tmp_path / "r.jsonl"
    base = {"--workload": "mnist", "--ds-config": "ds_configs/zero2.json", "--results": str(results)}
    pairs = dict(zip(args[::2], args[1::2]))
    argv = [x for k, v in {**base, **pairs}.items() for x in (k, v)]
    proc = ds_bench("run", *argv, "--steps", pairs.get("--steps", "3"), "--warmup", pairs.get("--warmup", "1"),
                    timeout=120)
    return proc, results


def malformed(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "train_batch_size": 8\n  "bf16": {}\n}\n')
    return str(path)


CASES = {
    "malformed config": (lambda t: ("--ds-config", malformed(t)), r"broken\.json:3:3: invalid JSON: Expecting ','"),
    "fp16 on cpu": (lambda t: ("--ds-config", "ds_configs/zero2_fp16.json"), r"fp16 on CPU ranks: DeepSpeed's CPU accelerator has no fp16"),
}
"""Two cases through a real ``python -m ds_bench`` process (exit status, stderr, no traceback, nothing
written); the whole table of bad input runs in-process through the same CLI in tests/test_bad_inputs.py
(each process here costs ~2 s of imports)."""


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bad_input_is_one_line_exit_2_and_records_nothing(tmp_path, case):
    make_args, pattern = CASES[case]
    proc, results = bad_run(tmp_path, *make_args(tmp_path))
    assert proc.returncode == 2, explain(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ds-bench: error:")]
    assert len(errors) == 1, explain(proc)
    assert "Traceback" not in proc.stderr, explain(proc)
    import re

    assert re.search(pattern, errors[0]), errors[0]
    assert not results.exists()


def test_unknown_flag_is_exit_2_without_traceback():
    proc = ds_bench("run", "--workload", "mnist", "--ds-config", "ds_configs/zero2.json", "--stepz", "3")
    assert proc.returncode == 2 and "unrecognized arguments: --stepz" in proc.stderr
    assert "Traceback" not in proc.stderr


LAMB = 'optimizer={"type": "Lamb", "params": {"lr": 0.001}}'  # valid, but FusedLamb has no CPU kernel


def test_a_failure_after_start_up_is_recorded_as_failed_with_exit_1(tmp_path):
    results = tmp_path / "r.jsonl"
    proc = ds_bench("run", "--workload", "mnist", "--ds-config", "ds_configs/zero1.json", "--steps", "3",
                    "--warmup", "1", "--results", str(results), "--set", LAMB, timeout=180)
    assert proc.returncode == 1, explain(proc)  # a valid config whose op this device lacks (FusedLamb on CPU)
    (record,) = [__import__("json").loads(line) for line in results.read_text().splitlines()]
    assert record["status"] == "failed" and record["error"].startswith("rank 0:"), record["error"]
    assert record["metrics"] == {} and record["ds_config"]["optimizer"]["type"] == "Lamb"


def test_arguments_after_double_dash_are_refused_where_unused():
    proc = ds_bench("run", "--workload", "mnist", "--ds-config", "ds_configs/zero2.json", "--", "--steps", "3")
    assert proc.returncode == 2 and "arguments after '--' are not used here: --steps 3" in proc.stderr


@pytest.mark.dist
def test_a_two_rank_failure_is_recorded_by_the_failing_ranks_under_one_run_id(tmp_path):
    from tests.conftest import records, run_cmd

    results = tmp_path / "r.jsonl"
    proc = run_cmd(["torchrun", "--nproc_per_node", "2", "--master_port", "29790", "-m", "ds_bench", "run",
                    "--workload", "mnist", "--ds-config", "ds_configs/zero1.json", "--steps", "3", "--warmup", "1",
                    "--results", str(results), "--set", LAMB], timeout=180)
    assert proc.returncode != 0
    recs = records(results)
    assert 1 <= len(recs) <= 2 and len({r["run_id"] for r in recs}) == 1, recs
    assert all(r["status"] == "failed" and r["ds_config"]["optimizer"]["type"] == "Lamb" for r in recs)
    assert {r["error"].split(":")[0] for r in recs} <= {"rank 0", "rank 1"}


def test_error_lines_of_ranks_sharing_one_stderr_pipe_never_run_together():
    """Four processes print 500 error lines each into one pipe, as the ranks of a torchrun do when each refuses
    the same input (``ds_bench.errors.say``). ``print`` wrote the text and its newline apart and two ranks' lines ran
    together (the full tier's two-rank preflight test, CI 2026-11-29); in this test print spoiled ~1,800 of 8,000."""
    line = "ds-bench: error: " + "x" * 200 + " end"
    code = shlex.quote(f"from ds_bench.errors import say\nfor _ in range(500): say({line!r})")
    ranks = " ".join(f"{shlex.quote(sys.executable)} -c {code} &" for _ in range(4))
    proc = subprocess.run(["bash", "-c", f"{ranks} wait"], capture_output=True, text=True, timeout=60)
    lines = proc.stderr.splitlines()
    assert len(lines) == 2000 and set(lines) == {line}, proc.stderr[:2000]

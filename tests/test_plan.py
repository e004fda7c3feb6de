"""``ds-bench plan`` end to end: a plan for 64 x 8 H100 (in-process: no rank is started) prints its table, appends a
``plan`` record the schema accepts, writes the best layout's DeepSpeed config, and ``report`` (terminal and HTML)
shows it again; ``--confirm`` runs the best layout for real on this machine's CPU ranks and records it measured."""

from __future__ import annotations

import json

import re

import pytest

from ds_bench import cli
from tests.conftest import check_schema, ds_bench, records

H100_70B = ["plan", "--workload", "llama", "--size", "llama3.1-70b", "--seq-len", "8192", "--global-batch", "4M",
            "--device", "H100", "--nodes", "64", "--gpus-per-node", "8"]


def test_a_plan_for_512_gpus_is_a_table_a_record_and_a_config(tmp_path, capsys):
    results = tmp_path / "plan.jsonl"
    assert cli.main([*H100_70B, "--results", str(results), "--top", "5"]) == 0
    out = capsys.readouterr().out
    [record] = records(results)
    check_schema(record)
    assert record["kind"] == "plan" and record["cluster"]["nodes"] == 64 and record["sequences"] == 512
    assert len(record["ranked"]) == 5 and record["feasible"] > 5
    best = record["ranked"][0]
    assert best["label"] in out and "dropped" in out and "AutoTP and a pipeline" in out
    config = tmp_path / "plan.best.json"
    assert f"ds-bench run --workload llama --ds-config {config} --size llama3.1-70b --seq-len 8192 --engine" in out
    assert best["tokens_per_s_per_rank"] >= record["ranked"][-1]["tokens_per_s_per_rank"]
    assert best["memory_bytes"] <= 0.9 * 80 * 2 ** 30
    steps = best["compute_s"] + sum(best["exposed_s"].values()) + best["bubble_s"] + best["optimizer_s"]
    assert best["step_s"] == pytest.approx(steps)
    config = json.loads((tmp_path / "plan.best.json").read_text())
    assert config["zero_optimization"]["stage"] == best["point"]["stage"]
    assert config["train_micro_batch_size_per_gpu"] == best["point"]["micro_batch"]
    assert "train_batch_size" not in config  # portable: DeepSpeed derives it on any world size
    assert record["cluster"]["sources"]["peak_tflops"].startswith("H100 bf16 dense peak")

    assert cli.main(["report", str(results)]) == 0
    assert best["label"] in capsys.readouterr().out
    from ds_bench.report.html_report import read, write_report

    write_report(str(tmp_path / "r.html"), read([str(results)]))
    page = (tmp_path / "r.html").read_text()
    assert 'id="plan"' in page and "plan-table" in page and best["label"] in page


def test_a_dry_run_writes_nothing(tmp_path, capsys):
    assert cli.main([*H100_70B, "--results", str(tmp_path / "p.jsonl"), "--dry-run"]) == 0
    assert "the best 10" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_calibrated_with_records_the_cluster_is_this_ones(tmp_path, capsys):
    line = {"kind": "roofline", "run_id": "R1", "time": "t", "world_size": 1, "results": [
        {"rank": 0, "host": "h", "device": "x86_64", "test": "matmul", "dtype": "fp32", "size": 1024, "median": 0.07,
         "low": 0.06, "high": 0.08, "iters": 3, "repeats": 5}]}
    (tmp_path / "cal.jsonl").write_text(json.dumps(line) + "\n")
    assert cli.main(["plan", "--workload", "gpt2", "--size", "tiny", "--device", "cpu", "--nproc", "1",
                     "--calibrate", str(tmp_path / "cal.jsonl"), "--results", str(tmp_path / "p.jsonl")]) == 0
    [record] = records(tmp_path / "p.jsonl")
    assert record["cluster"]["peak_tflops"] == 0.07 and "roofline R1" in record["cluster"]["sources"]["peak_tflops"]


def confirm_one(results, *extra: str):
    """``plan --confirm 1`` of GPT-2 tiny's one ZeRO-0 layout on one CPU rank."""
    return ds_bench("plan", "--workload", "gpt2", "--size", "tiny", "--seq-len", "128", "--device", "cpu",
                    "--nproc", "1", "--peak-tflops", "0.05", "--stages", "0", "--offload", "none", "--micro-batch", "2",
                    "--activation-checkpointing", "off", "--pipeline-stages", "1", "--confirm", "1",
                    "--launcher", "torchrun", "--results", str(results), *extra, timeout=300)


@pytest.mark.dist
def test_confirm_runs_the_best_layout_and_records_it_beside_its_prediction(tmp_path):
    results = tmp_path / "plan.jsonl"
    proc = confirm_one(results, "--global-batch", "512", "--steps", "5", "--warmup", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [record] = records(results)
    row = record["ranked"][0]
    confirmed = row["confirmed"]
    assert record["status"] == "ok" and confirmed["status"] == "ok", confirmed
    assert confirmed["step_s"] > 0 and confirmed["ratio"] == pytest.approx(row["step_s"] / confirmed["step_s"])
    runs = [r for r in records(tmp_path / "plan.runs.jsonl") if r.get("tag") == confirmed["tag"]]
    assert runs and runs[0]["metrics"]["step_ms_median"] == pytest.approx(confirmed["step_s"] * 1e3)
    assert runs[0]["ds_config"]["gradient_accumulation_steps"] == row["point"]["grad_accum"] == 2
    assert "predicted/measured" in proc.stdout


@pytest.mark.full
def test_a_confirm_run_that_fails_is_the_plans_failure(tmp_path):
    """Planned for 4 GiB a rank, run under a 300 MiB cap: the run runs out of memory."""
    results = tmp_path / "plan.jsonl"
    proc = confirm_one(results, "--global-batch", "256", "--steps", "4", "--warmup", "1", "--device-memory", "4GiB",
                       "--cpu-mem-limit", "300MiB")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    [record] = records(results)
    assert record["status"] == "failed" and record["ranked"][0]["confirmed"]["status"] in ("oom", "crashed")


def test_the_run_options_every_confirm_run_gets_drop_the_layouts_that_refuse_them(tmp_path, capsys):
    argv = ["plan", "--workload", "gpt2", "--size", "small", "--device", "H100", "--gpus-per-node", "2",
            "--results", str(tmp_path / "p.jsonl"), "--dry-run", "--show-dropped"]
    assert cli.main([*argv, "--", "--breakdown"]) == 0
    out = capsys.readouterr().out
    assert "--breakdown with --pipeline-stages 2: it times the phases of each micro-step" in out
    assert cli.main(argv) == 0
    assert "--breakdown" not in capsys.readouterr().out


def test_plan_help_names_every_device_family_and_says_gpus_per_node_is_the_clusters():
    """``--device``'s choices come from the device table (V100-32GB was missing from a hand-written list), and
    ``--gpus-per-node`` says what plan reads it as (the planned cluster's size), not only a Slurm job's request."""
    import argparse

    from ds_bench.perf.devices import DEVICES
    from ds_bench.plan.spec import add_arguments

    p = argparse.ArgumentParser(prog="ds-bench plan")
    add_arguments(p)
    helps = {a.dest: " ".join(a.help.split()) for a in p._actions if a.help}
    assert all(d.family in helps["device"] for d in DEVICES.values()) and "V100-32GB" in helps["device"]
    assert helps["gpus_per_node"].startswith("devices per node of the planned cluster")
    s = argparse.ArgumentParser()
    from ds_bench.config.study_flags import add_slurm_arguments

    add_slurm_arguments(s)
    assert "none asked for" in next(a.help for a in s._actions if a.dest == "gpus_per_node")


def test_confirm_takes_distinct_layouts_not_a_layouts_micro_batch_twins():
    """The top rows are often one layout at several micro-batches, predicted alike: ``--confirm 2`` runs two
    layouts, the first row of each (a checkpointing variant is a layout of its own)."""
    from ds_bench.config.layout import Layout
    from ds_bench.perf.candidate import Candidate
    from ds_bench.plan.confirm import distinct_rows

    sp4 = Layout(3, "none", "bf16", 1, 4, sequence_parallel=4)
    rows = [Candidate(sp4), Candidate(sp4.with_micro_batch(2)), Candidate(Layout(3, "none", "bf16", 2, 4,
                                                                                  sequence_parallel=8)),
            Candidate(sp4, checkpointing=True)]
    assert distinct_rows(rows, 2) == [0, 2]
    assert distinct_rows(rows, 5) == [0, 2, 3]
    assert distinct_rows(rows, 1) == [0]


ISSUE_RUNS = {
    "1.3B, micro-batch 20, 64 H100": ["--layers", "24", "--hidden", "2048", "--heads", "16", "--seq-len", "2048",
                                      "--global-batch", "2621440", "--nodes", "8", "--micro-batch", "20",
                                      "--activation-checkpointing", "off"],
    "6.8B, 32K tokens, 8 H100": ["--layers", "32", "--hidden", "4096", "--heads", "32", "--seq-len", "32768",
                                 "--global-batch", "1048576", "--nodes", "1", "--micro-batch", "2",
                                 "--activation-checkpointing", "on"],
}
"""llm-foundry's H100 rows (docs/plan.md, ``ds_bench/perf/published_runs.yaml``) that plan called "fits no layout"."""


@pytest.mark.parametrize("run", ISSUE_RUNS)
def test_a_run_people_made_is_feasible_with_the_loss_and_dropout_it_ran(run, capsys):
    """FSDP full shard over every GPU, bf16, no tiling. With llm-foundry's fused cross entropy and MPT's no dropout
    (the configuration they ran) it fits, and its row is the run's layout. With HF's upcast loss and dropout the
    1.3B at micro-batch 20 fits no layout (its 12-byte logits of 40K tokens); the 6.8B at 32K, checkpointed, fits
    either way, since its loss's tensors are gone before the recomputed blocks' backward needs that memory."""
    argv = ["plan", "--workload", "gpt2", *ISSUE_RUNS[run], "--device", "H100", "--gpus-per-node", "8",
            "--engines", "fsdp", "--stages", "3", "--tensor-parallel", "1", "--pipeline-stages", "1",
            "--sequence-parallel", "1", "--offload", "none", "--tiled-mlp", "off", "--tiled-loss", "off",
            "--selective-checkpointing", "off", "--checkpoint-offload", "off", "--dry-run"]
    checkpointed = "on" in ISSUE_RUNS[run]
    assert cli.main([*argv, "--dropout", "on"]) == (0 if checkpointed else 2)
    assert checkpointed or "fits no layout" in capsys.readouterr().err
    capsys.readouterr()
    assert cli.main([*argv, "--loss", "fused", "--dropout", "off"]) == 0
    out = capsys.readouterr().out
    assert "1 of 1 candidates fit" in out and "fsdp dp" in out


def test_tiled_loss_and_tiled_mlp_are_candidates_beside_the_untiled(capsys):
    """Llama 3.1 8B at 64K tokens on 8 H100: the upcast loss's 12-byte logits of 64K tokens x 128K vocabulary
    (94 GiB) fit no untiled layout without tensor parallelism; tiled, they do. The rows name the tiling they take."""
    argv = ["plan", "--workload", "llama", "--size", "llama3.1-8b", "--seq-len", "64k", "--global-batch", "512k",
            "--device", "H100", "--gpus-per-node", "8", "--offload", "none", "--stages", "3",
            "--sequence-parallel", "1", "--dry-run", "--show-dropped"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    ranked = [line for line in out.splitlines() if line[:1].isdigit() and "  " in line[:5]]
    assert "tiled-loss ckpt" in ranked[0] and any("tiled-mlp tiled-loss ckpt" in line for line in ranked), out
    assert "dropped dp8 z3 off=none bf16 mbs=1 ckpt: needs 131.2 GiB per rank" in out  # the untiled twin
    # the tiled MLP alone saves nothing here: the loss's phase, not a block's backward, is the peak
    assert "dropped dp8 z3 off=none bf16 mbs=1 tiled-mlp ckpt: needs 131.2 GiB" in out


def test_the_batch_a_refusal_suggests_plans(capsys):
    """With ``--micro-batch 4`` fixed, 8 sequences divide no layout of 8 GPUs; the line's example (8 replicas x 4
    sequences) is a batch that plans."""
    argv = ["plan", "--device", "H100", "--workload", "gpt2", "--size", "tiny", "--seq-len", "1024", "--micro-batch",
            "4", "--tensor-parallel", "1", "--pipeline-stages", "1", "--sequence-parallel", "1", "--dry-run"]
    assert cli.main([*argv, "--global-batch", "8k"]) == 2
    suggested = re.search(r"e\.g\. (\d+) tokens", capsys.readouterr().err).group(1)
    assert cli.main([*argv, "--global-batch", suggested]) == 0


def test_selective_checkpointing_on_alone_leaves_out_full_checkpointing(capsys):
    """``--selective-checkpointing on`` (not ``off,on``) with checkpointing on: every candidate is selective, half
    as many as with full checkpointing beside them."""
    argv = ["plan", "--workload", "llama", "--size", "llama3.1-8b", "--device", "H100", "--gpus-per-node", "8",
            "--seq-len", "8k", "--global-batch", "512k", "--activation-checkpointing", "on", "--checkpoint-offload",
            "off", "--dry-run", "--top", "50"]
    counts = {}
    for value in ("on", "off,on"):
        assert cli.main([*argv, "--selective-checkpointing", value]) == 0
        out = capsys.readouterr().out
        rows = [line for line in out.splitlines() if line[:1].isdigit() and "  " in line[:5]]
        counts[value] = int(re.search(r"of (\d+) candidates", out).group(1))
        assert value != "on" or all("ckpt-selective" in line for line in rows), rows
    assert counts["off,on"] == 2 * counts["on"], counts

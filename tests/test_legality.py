"""The legality table (``ds_bench.config.legality``), walked rule by rule: ``ds-bench run`` refuses each
rule's example with exit 2 and the rule's sentence, before joining, and ``ds-bench sweep`` skips the same
layout with the same sentence (a rule on a run option, e.g. ``--breakdown`` with a pipeline: the sweep's
jobs get that option after ``--``).

Both commands run in-process through the CLI router, on a world of 2 ranks (rank 0 of 2 from the
environment; a run that passed its checks would reach ``init_distributed``, which raises here).
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from ds_bench import cli
from ds_bench.config import legality
from ds_bench.config.deepspeed.derive import derive
from ds_bench.config.layout import Layout
from ds_bench.config.legality import Where, rules

RULES = rules()
from tests.conftest import PASSED, REPO, stop_past_checks

WORLD = 2
RUN_FLAGS = {"breakdown": ["--breakdown"], "checkpoint": ["--checkpoint", "{tmp}/ckpt"],
             "resume": ["--resume", "{tmp}"], "model_path": ["--model", "{tmp}"],
             "checkpoint_offload": ["--activation-checkpointing", "--checkpoint-offload"],
             "selective_checkpointing": ["--activation-checkpointing", "--selective-checkpointing"]}
"""A run option as flags (``legality.RUN_OPTIONS``)."""
BASE = json.loads((REPO / "ds_configs" / "zero1.json").read_text())


def workload(layout: Layout) -> list[str]:
    """A workload whose model every rule's example can name (AutoTP and Ulysses shard llama, the pipeline is
    gpt2's, experts are moe's)."""
    name = "moe" if layout.expert_parallel > 1 else "llama" if layout.tensor_parallel > 1 or layout.sequence_parallel > 1 else "gpt2"
    return ["--workload", name, "--size", "tiny", "--seq-len", "32"]


@pytest.fixture
def two_ranks(monkeypatch):
    stop_past_checks(monkeypatch)
    env = {"RANK": "0", "WORLD_SIZE": str(WORLD), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(WORLD),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "TORCHDYNAMO_DISABLE": "0"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def run_line(rule, tmp_path, capsys) -> str:
    """``ds-bench run`` of the rule's example: its config derived from the layout, its options as flags."""
    layout = rule.example
    config = tmp_path / "c.json"
    config.write_text(json.dumps(derive(BASE, layout)))
    options = option_flags(rule, tmp_path)
    code = cli.main(["run", *workload(layout), "--ds-config", str(config), "--steps", "3", "--warmup", "1",
                     "--results", str(tmp_path / "r.jsonl"), "--engine", layout.engine, *layout.run_flags(), *options])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("ds-bench: error: ")]
    assert code == 2 and len(errors) == 1 and PASSED not in err and "Traceback" not in err, err[-2000:]
    assert not (tmp_path / "r.jsonl").exists()
    return errors[0].removeprefix("ds-bench: error: ")


def option_flags(rule, tmp_path) -> list[str]:
    return [f.replace("{tmp}", str(tmp_path)) for o in sorted(rule.example_options) for f in RUN_FLAGS[o]]


def sweep_reason(layout: Layout, tmp_path, capsys, tail: list[str]) -> str:
    """What ``ds-bench sweep --dry-run`` says of the layout as a ``--point`` of a 2-rank sweep whose jobs all
    get ``tail`` (run options after ``--``): its skip reason, or, when the tail refuses every point of the sweep,
    the one error line of a study with nothing to run (exit 2, issue 45), which names each distinct reason."""
    code = cli.main(["sweep", *workload(layout), "--ds-config", "ds_configs/zero1.json", "--nproc", str(WORLD),
                     "--results", str(tmp_path / "s.jsonl"), "--point", layout.key, "--dry-run", "--", *tail])
    out, err = capsys.readouterr()
    if code == 2:
        [line] = [line for line in err.splitlines() if line.startswith("ds-bench: error: ")]
        assert line.startswith(f"ds-bench: error: no point of this study can run at {WORLD} rank(s): "), line
        return line
    assert code == 0, out
    [line] = [line for line in out.splitlines() if line.strip().startswith(f"point {layout.key}")]
    found = re.search(r"  skipped: (.*)$", line)
    assert found, line
    return found.group(1)


OFF_VERSION = {"experts and Ulysses off the verified DeepSpeed"}
"""Rules that hold only with another DeepSpeed than ``protocol.DEEPSPEED``: walked with one pretended."""


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_run_and_sweep_say_the_same_sentence(rule, tmp_path, capsys, two_ranks, monkeypatch):
    if rule.name in OFF_VERSION:
        from ds_bench.config.degrees import protocol

        monkeypatch.setattr(protocol, "installed_deepspeed", lambda: "deepspeed 0.20.0")
    where = Where(WORLD, "cpu", rule.example_options)
    assert legality.first_broken(rule.example, where) is rule, "the example must break its own rule first"
    said = rule.says(rule.example, where)
    assert run_line(rule, tmp_path, capsys) == said
    by_sweep = sweep_reason(rule.example, tmp_path, capsys, option_flags(rule, tmp_path))
    assert by_sweep == said or (by_sweep.startswith("ds-bench: error: ") and said in by_sweep), by_sweep


def test_every_rule_is_data_with_a_source_and_a_sentence():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names)) and len(RULES) >= 20
    for rule in RULES:
        assert rule.source and rule.message.strip().endswith(tuple("abcdefghijklmnopqrstuvwxyz0123456789)")), rule.name
    assert not legality.violation(Layout(1, "none", "fp32", 4, pipeline_stages=2), Where(WORLD))
    assert not legality.violation(Layout(1, "none", "fp32", 4, tensor_parallel=2), Where(WORLD))


def test_capacity_skips_a_layout_with_the_tables_sentence(tmp_path, capsys, two_ranks):
    rule = next(r for r in RULES if r.name == "a pipeline takes ZeRO 0 or 1")
    code = cli.main(["capacity", "--ds-config", "ds_configs/zero1.json", "--stages", "1,2", "--pipeline-stages", "2",
                     "--precision", "fp32", "--scale", "layers", "--layers", "2", "--hidden", "64", "--heads", "2", "--seq-len", "32",
                     "--nproc", str(WORLD), "--results", str(tmp_path / "c.jsonl"), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    said = rule.says(Layout(2, "none", "fp32", 1, pipeline_stages=2), Where(WORLD))
    assert f"pp2 z2 off=none fp32 mbs=1  skipped: {said}" in out
    assert "pp2 z1 off=none fp32 mbs=1\n" in out


def test_a_study_keeps_its_runnable_points_and_refuses_when_none_is_left():
    """``perf.grid.runnable``: the points the table leaves, in order; none left is one line with each distinct
    reason (issue 45: a study of impossible layouts exits 2 before anything is launched)."""
    from ds_bench.errors import UserError
    from ds_bench.perf.grid import runnable

    plain, sp2, sp3 = (Layout(1, "none", "fp32", 1, sequence_parallel=s) for s in (1, 2, 3))
    assert runnable([sp3, plain, sp2], Where(2), "layout") == [plain, sp2]
    assert runnable([], Where(2), "point") == []
    with pytest.raises(UserError) as e:
        runnable([sp3, sp3.with_micro_batch(2), Layout(0, "optimizer", "fp32", 1)], Where(2), "point")
    assert str(e.value) == ("no point of this study can run at 2 rank(s): --sequence-parallel 3 does not divide the "
                            "world size 2: every data-parallel replica needs a whole sequence-parallel group; "
                            "offload=optimizer with ZeRO stage 0: offloading (zero_optimization.offload_*) needs "
                            "ZeRO stage 1, 2 or 3")


def test_the_docs_list_every_rule():
    """docs/engines-and-layouts.md's table is ``tools/legality_table.py``'s: every rule, its example, sentence
    and source as the table says them now."""
    spec = importlib.util.spec_from_file_location("legality_table", REPO / "tools" / "legality_table.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    page = (REPO / "docs" / "engines-and-layouts.md").read_text()
    missing = [r.name for r in RULES if f"| {r.name} |" not in page]
    assert missing == [], f"docs/engines-and-layouts.md lacks rules {missing}: python tools/legality_table.py"
    assert "\n".join(tool.rows()) in page, "docs/engines-and-layouts.md's legality table is stale: python tools/legality_table.py"


def test_a_legacy_spelling_counts_as_deepspeed_reads_it(tmp_path):
    """``zero_optimization.cpu_offload: true`` is DeepSpeed's old name of optimizer offload: refused at stage 0
    as ``offload_optimizer`` is (a real process: DeepSpeed logs its deprecation warning on the way)."""
    from tests.conftest import ds_bench

    config = tmp_path / "c.json"
    config.write_text(json.dumps({**BASE, "zero_optimization": {"stage": 0, "cpu_offload": True}}))
    proc = ds_bench("run", "--workload", "mnist", "--ds-config", str(config), "--steps", "2", "--warmup", "1",
                    "--results", str(tmp_path / "r.jsonl"))
    said = legality.violation(Layout(0, "optimizer", "fp32", 1), Where(1))
    assert proc.returncode == 2 and f"ds-bench: error: {said}" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "r.jsonl").exists()

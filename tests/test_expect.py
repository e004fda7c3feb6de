"""Expectations (``--expect FILE``): the file's checks, the verdicts, and the gate on commands.

Pure: files checked at load (one-line errors naming the entry; YAML and JSON), measurements matched by
kind, ``where``, hardware and message size, reduced and held against the bound (pass, fail, not
measured). The schema file equals the model's. The shipped example loads and cites its sources. Real: a
one-rank MNIST run whose expectation fails exits 1 with its record written and the table printed;
``report --expect`` on the same file passes with a bound it meets (exit 0) and fails with one it misses.
"""

import json

import pytest

from ds_bench import cli
from ds_bench.record.expect_check import evaluate
from ds_bench.record.expect_file import ExpectFile, json_schema, load
from ds_bench.record.schema import model_of
from tests.conftest import REPO, ds_bench, explain, records


def record(**fields):
    return model_of(fields).model_validate(fields)


def comm_record(device="NVIDIA H100 80GB HBM3", busbw=(100.0, 440.0, 450.0), world=8):
    sizes = (2**20, 2**30, 2**31)
    return record(kind="comm", status="ok", world_size=world, dtype="float32", backend="nccl",
                  hardware={"device": device},
                  results=[{"scope": "world", "group": "all ranks", "collective": "all_reduce", "size_bytes": s,
                            "busbw_GBps": b} for s, b in zip(sizes, busbw)]
                  + [{"scope": "pair", "group": "a<->b", "collective": "send_recv", "size_bytes": 2**26,
                      "busbw_GBps": 40.0}])


def run_record(tokens_per_s, status="ok", **over):
    return record(**{"kind": "run", "workload": "gpt2", "size": "small", "zero_stage": 2, "precision": "bf16",
                     "world_size": 1, "status": status, "hardware": {"device": "NVIDIA H100 80GB HBM3"},
                     "metrics": {"tokens_per_s": tokens_per_s, "mfu": 0.1}, **over})


def expect(*entries) -> ExpectFile:
    return ExpectFile.model_validate({"expectations": list(entries)})


ALL_REDUCE = {"name": "ar", "kind": "comm", "metric": "busbw_GBps", "where": {"collective": "all_reduce"},
              "min_size_bytes": 2**30, "hardware": "H100", "reduce": "min", "at_least": 430}


def test_comm_rows_at_or_above_the_size_on_the_named_hardware_are_reduced_and_bounded():
    (o,) = evaluate(expect(ALL_REDUCE), [comm_record()])
    assert (o.status, o.measured, o.count) == ("pass", 440.0, 2)  # the 1 MiB row left out, min of the others
    (o,) = evaluate(expect({**ALL_REDUCE, "at_least": 445}), [comm_record()])
    assert (o.status, o.measured) == ("fail", 440.0)
    (o,) = evaluate(expect(ALL_REDUCE), [comm_record(device="NVIDIA H200")])
    assert (o.status, o.measured, o.count) == ("not measured", None, 0)
    (o,) = evaluate(expect({**ALL_REDUCE, "where": {"scope": "pair"}, "min_size_bytes": 0, "at_least": 42}),
                    [comm_record()])
    assert (o.status, o.measured) == ("fail", 40.0)


def test_runs_match_on_their_fields_and_a_failed_run_measures_nothing():
    tokens = {"name": "gpt2 z2", "kind": "run", "metric": "tokens_per_s", "at_least": 100,
              "where": {"workload": "gpt2", "zero_stage": 2, "precision": "bf16"}}
    outcomes = evaluate(expect(tokens, {**tokens, "where": {"zero_stage": 3}},
                               {"name": "time", "kind": "run", "metric": "mfu", "at_most": 0.05}),
                        [run_record(90), run_record(130), run_record(150), run_record(1e9, status="failed")])
    assert [(o.status, o.measured) for o in outcomes] == [("pass", 130), ("not measured", None), ("fail", 0.1)]


def test_scaling_points_and_capacity_answers_are_measured():
    scaling = record(kind="scaling", scaling="s", status="ok", workload="gpt2",
                     points=[{"world_size": 8, "nodes": 1, "status": "ok", "efficiency": 1.0},
                             {"world_size": 16, "nodes": 2, "status": "ok", "efficiency": 0.85},
                             {"world_size": 32, "nodes": 4, "status": "failed"}])
    capacity = record(kind="capacity", capacity="c", status="ok", layout="z3", point={"stage": 3},
                      largest={"member": "m", "params": 350_000_000})
    outcomes = evaluate(expect({"name": "eff", "kind": "scaling", "metric": "efficiency", "where": {"nodes": 2},
                                "at_least": 0.9},
                               {"name": "eff4", "kind": "scaling", "metric": "efficiency", "where": {"nodes": 4},
                                "at_least": 0.9},
                               {"name": "fits", "kind": "capacity", "metric": "params", "where": {"stage": 3},
                                "at_least": 3e8}), [scaling, capacity])
    assert [(o.status, o.measured) for o in outcomes] == [("fail", 0.85), ("not measured", None), ("pass", 3.5e8)]


@pytest.mark.parametrize("entry, says", [
    ({"metric": "busbw"}, "expectations[0] ('ar'): metric 'busbw' is not one of comm's: busbw_GBps"),
    ({"at_most": 3}, "expectations[0] ('ar'): give exactly one of at_least and at_most"),
    ({"where": {"rank": 1}}, "expectations[0] ('ar'): where: rank not among comm's fields"),
    ({"kind": "run", "metric": "mfu", "where": {}}, "expectations[0] ('ar'): min_size_bytes is for comm expectations only"),
    ({"kind": "scaling", "metric": "efficiency", "where": {}, "min_size_bytes": None},
     "expectations[0] ('ar'): hardware: scaling records do not name their device"),
    ({"at_least": "fast"}, "expectations[0] ('ar'): at_least: Input should be a valid number"),
    ({"speed": 1}, "expectations[0] ('ar'): speed: Extra inputs are not permitted"),
])
def test_a_bad_entry_is_one_line_naming_it(tmp_path, entry, says):
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"expectations": [{**ALL_REDUCE, **entry}]}))
    with pytest.raises(Exception) as e:
        load(str(path))
    assert str(e.value).startswith(f"--expect {path}: {says}"), str(e.value)
    assert "\n" not in str(e.value)


def test_yaml_errors_name_the_line_and_an_empty_list_is_refused(tmp_path):
    bad = tmp_path / "e.yaml"
    bad.write_text("expectations:\n  - name: x\n    kind: [comm\n")
    with pytest.raises(Exception, match=r"e.yaml: line \d+: not YAML"):
        load(str(bad))
    bad.write_text("expectations: []\n")
    with pytest.raises(Exception, match="expectations: List should have at least 1 item"):
        load(str(bad))


def test_the_schema_file_is_the_models_and_the_example_loads_with_a_source_for_each_bound():
    assert json.loads((REPO / "docs/expect.schema.json").read_text()) == json_schema()
    example = load(str(REPO / "docs/expect.example.yaml"))
    assert len(example.expectations) >= 6 and all(e.source for e in example.expectations)
    cited = " ".join(e.source for e in example.expectations if e.kind == "comm")
    assert "NVIDIA/nccl-tests#212" in cited and "NVIDIA/nccl-tests#309" in cited and "H200" in cited
    assert load(str(REPO / "docs/expect.cpu.yaml")).expectations


def write_expect(path, **bound):
    path.write_text("expectations:\n  - name: mnist images/s\n    kind: run\n    metric: samples_per_s\n"
                    f"    where: {{workload: mnist}}\n    {next(iter(bound))}: {next(iter(bound.values()))}\n")
    return path


def test_a_real_run_that_misses_its_expectation_exits_1_and_report_judges_its_file_both_ways(tmp_path):
    results = tmp_path / "r.jsonl"
    miss = write_expect(tmp_path / "miss.yaml", at_least=1e9)
    proc = ds_bench("run", "--workload", "mnist", "--ds-config", "ds_configs/zero0.json", "--set",
                    "bf16.enabled=false", "--steps", "4", "--warmup", "1", "--results", str(results),
                    "--expect", str(miss))
    assert proc.returncode == 1, explain(proc)
    (rec,) = records(results)
    measured = rec["metrics"]["samples_per_s"]
    assert rec["status"] == "ok" and "FAIL" in proc.stdout and f"{measured:.4g}" in proc.stdout
    assert "expectations (" in proc.stdout and "0 pass, 1 fail, 0 not measured" in proc.stdout
    meet = write_expect(tmp_path / "meet.yaml", at_least=round(measured * 0.5, 3))
    assert cli.main(["report", str(results), "--expect", str(meet)]) == 0
    assert cli.main(["report", str(results), "--expect", str(miss)]) == 1
    assert cli.main(["report", str(results), "--expect", str(tmp_path / "none.yaml")]) == 2


def test_a_bad_file_stops_a_command_before_it_starts(tmp_path, capsys):
    bad = tmp_path / "e.yaml"
    bad.write_text("expectations:\n  - {name: x, kind: comm, metric: busbw_GBps}\n")
    results = tmp_path / "comm.jsonl"
    assert cli.main(["comm", "--expect", str(bad), "--results", str(results)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"ds-bench: error: --expect {bad}: expectations[0] ('x'): give exactly one of at_least and at_most"
    assert not results.exists()


def test_a_required_expectation_without_a_measurement_fails():
    (o,) = evaluate(expect({**ALL_REDUCE, "required": True}), [comm_record(device="NVIDIA H200")])
    assert (o.status, o.failed) == ("not measured", True)
    (o,) = evaluate(expect(ALL_REDUCE), [comm_record(device="NVIDIA H200")])
    assert (o.status, o.failed) == ("not measured", False)


def test_the_gate_judges_only_what_the_command_appended(tmp_path):
    """Records already in the file (one that would pass, and a line cut mid-write at the offset) are not the
    command's: the gate starts at the file's size when the command started, at a line's start."""
    from ds_bench.record.expect_gate import Gate

    results = tmp_path / "r.jsonl"
    results.write_text(json.dumps(run_record(500).to_json_dict()) + "\n" + '{"kind": "run", "workl')
    start = results.stat().st_size - 5  # mid-line, as a writer was cut
    with results.open("a") as f:
        f.write('oad": "gpt2"}\n' + json.dumps(run_record(50).to_json_dict()) + "\n")
    gate = Gate(expect({"name": "t", "kind": "run", "metric": "tokens_per_s", "at_least": 100}), "e", [(str(results), start)])
    assert gate.close(0) == 1  # the appended 50 tokens/s fails; the earlier 500 is not counted

"""The record schema (``ds_bench.record.schema``): the exported JSON Schema is the committed one, inline
records of every kind validate against it and round-trip, and records written before the schema
existed (``tests/data/pre_schema``: written by ds_bench at commit 8cb13ae -- ``ds-bench sweep``,
``scaling``, ``comm``, ``doctor --json`` and a 2-rank ``run`` on CPU; no ``schema_version``, run
records without ``kind``) still load in ``ds-bench report``, the sweep's resume and the comm verdict."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from ds_bench import cli
from ds_bench.config.layout import Layout
from ds_bench.jobs import ledger, outcome
from ds_bench.perf import comm_bound, peak_memory
from ds_bench.record import store
from ds_bench.record.schema import (
    SCHEMA_VERSION,
    CapacityProbeRecord,
    CapacityRecord,
    CommRecord,
    DoctorRecord,
    RunRecord,
    ScalingRecord,
    SweepPointRecord,
    json_schema,
    parse_record,
)
from ds_bench.sweep.driver import load_ledger
from tests.conftest import REPO, check_schema

OLD = Path(__file__).parent / "data" / "pre_schema"
BASE = {"run_id": "20260101T000000-0123abcd", "time": "2026-01-01T00:00:00+0000", "host": "n1",
        "versions": {"torch": "2.13.0", "deepspeed": None}, "git_sha": None, "config": {"steps": 5}}
BUSY = {"load_before": 0.1, "load_after": 0.2, "other_cores": 0.0, "cores": 2, "gpu_others": []}

INLINE = {
    "run": RunRecord(**BASE, workload="mnist", status="ok", error=None, size=None, tag="t", world_size=2,
                     launcher="torchrun", engine="deepspeed", zero_stage=1, precision="fp32", micro_batch=8,
                     grad_accum=1, train_batch_size=16, hardware={"device": "x86_64", "device_type": "cpu"},
                     metrics={"steps_measured": 3, "samples_per_s": 100.0, "step_ms_median": 80.0,
                              "peak_mem_bytes": 2**28, "peak_mem_kind": "rss", "loss_curve": [2.3, 2.2],
                              "breakdown_ms_median": {"forward": 10.0}, "a_metric_from_a_newer_writer": 1},
                     params=100, slow_ranks=[{"rank": 1, "host": "n1", "compute_ms": 9.0, "vs_median_pct": 50.0}]),
    "failed run": RunRecord(**BASE, workload="mnist", status="failed", error="rank 1: out of memory", metrics={},
                            failure={"kind": "oom", "steps_done": 2, "rank": 1, "host": "n1", "signal": None,
                                     "stalled_s": None, "peers": {"0": "gone"}}),
    "sweep_point": SweepPointRecord(kind="sweep_point", sweep="s1", key="z1 off=none fp32 mbs=8",
                                    point=Layout(1, "none", "fp32", 8).to_dict(), repeat=0, status="ok", reason=None,
                                    unit="images/s", throughput=250.0, peak_mem_bytes=2**28, busy=BUSY, wall_s=3.5),
    "scaling": ScalingRecord(**BASE, kind="scaling", scaling="abc", status="ok", workload="mnist",
                             baseline_world_size=1, notes=["n"], points=[
                                 {"world_size": 1, "nodes": 1, "ranks_per_node": 1, "hosts": ["localhost"],
                                  "status": "ok", "reason": None, "samples_per_s_per_device": 10.0, "efficiency": 1.0,
                                  "busy": BUSY}]),
    "comm": CommRecord(**BASE, kind="comm", status="ok", problems=[], world_size=2, hosts=["n1", "n1"],
                       backend="gloo", results=[{"scope": "world", "group": "all ranks", "collective": "all_reduce",
                                                 "size_bytes": 1024, "count": 256, "time_us": 5.0,
                                                 "busbw_GBps": 0.2, "algbw_GBps": 0.2, "wrong": []}]),
    "capacity_probe": CapacityProbeRecord(kind="capacity_probe", capacity="c1", layout="pp1 z1 off=none fp32 mbs=1",
                                          index=0, member="gpt3-125m", run_args=["--size", "small"], params=125_000_000,
                                          status="oom", reason="rank 0: out of memory", busy=BUSY),
    "capacity": CapacityRecord(kind="capacity", capacity="c1", layout="pp1 z1 off=none fp32 mbs=1",
                               point=Layout(1, "none", "fp32", 1).to_dict(), world_size=2, status="ok",
                               largest={"member": "gpt3-125m", "params": 125_000_000, "peak_mem_bytes": 2**30},
                               next={"member": "gpt3-350m", "why": "oom", "reason": "out of memory"}),
    "doctor": DoctorRecord(kind="doctor", ranks=[{"rank": 0, "host": "n1"}], problems=[], allreduce_bytes=2**20,
                           allreduce_ms=1.5, busbw_GBps=None),
}


def test_the_committed_json_schema_is_what_ds_bench_schema_prints(capsys):
    assert cli.main(["schema"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed) == json_schema()
    assert printed == (REPO / "docs" / "record.schema.json").read_text(), \
        "docs/record.schema.json is stale: regenerate it with `ds-bench schema > docs/record.schema.json`"


@pytest.mark.parametrize("name", INLINE)
def test_inline_records_of_every_kind_validate_and_round_trip(name, tmp_path):
    path = tmp_path / "r.jsonl"
    store.append_record(str(path), INLINE[name])
    line = json.loads(path.read_text())
    assert line["schema_version"] == SCHEMA_VERSION and line["kind"] == INLINE[name].kind
    check_schema(line)
    (back,) = store.read_records(str(path))
    assert type(back) is type(INLINE[name])
    assert back.to_json_dict() == line
    assert "metrics" not in line or "peak_mem_reserved_bytes" not in line["metrics"]  # nothing invented


def test_the_json_schema_rejects_what_readers_would_trip_on():
    run = INLINE["run"].to_json_dict()
    for bad in ({**run, "metrics": {**run["metrics"], "peak_mem_bytes": "a lot"}},
                {**run, "world_size": 1.5},
                {k: v for k, v in INLINE["sweep_point"].to_json_dict().items() if k != "key"},
                {**INLINE["doctor"].to_json_dict(), "kind": "doctr"}):
        with pytest.raises(jsonschema.ValidationError):
            check_schema(bad)


# ---- records written before the schema ------------------------------------------------------------


def old_lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (OLD / f"{name}.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name, model", [("runs", RunRecord), ("sweep.runs", RunRecord), ("sweep", SweepPointRecord),
                                         ("scaling", ScalingRecord), ("scaling.runs", RunRecord),
                                         ("comm", CommRecord), ("doctor", DoctorRecord)])
def test_old_records_validate_and_parse_to_their_kind(name, model):
    for line in old_lines(name):
        assert "schema_version" not in line and ("kind" in line) == (model is not RunRecord)
        check_schema(line)
        record = parse_record(line)
        assert type(record) is model and record.schema_version == 0
        expected = {**line, "kind": record.kind, "schema_version": SCHEMA_VERSION}
        if model is RunRecord:  # an old run record is read with the layout its config and DeepSpeed config say
            assert record.layout_key and Layout.from_dict(record.layout).key == record.layout_key
            expected |= {"layout": record.layout, "layout_key": record.layout_key}
        assert record.to_json_dict() == expected


@pytest.mark.parametrize("name, shows", [("runs", "| mnist "), ("scaling.runs", "| mnist "),
                                         ("sweep", "recommended: z0 off=none fp32 mbs=8"),
                                         ("scaling", "mnist weak scaling")])
def test_ds_bench_report_reads_old_files(name, shows, tmp_path, capsys):
    path = tmp_path / f"{name}.jsonl"
    shutil.copy(OLD / f"{name}.jsonl", path)
    assert cli.main(["report", str(path)]) == 0
    assert shows in capsys.readouterr().out


def test_the_sweeps_end_report_writes_the_recommended_config_from_an_old_ledger(tmp_path, capsys):
    from ds_bench.report.sweep_report import report_sweep

    shutil.copy(OLD / "sweep.jsonl", tmp_path / "s.jsonl")
    assert report_sweep(str(tmp_path / "s.jsonl")) == 0
    assert "measured at 2 rank(s)" in capsys.readouterr().out
    assert json.loads((tmp_path / "s-recommended.json").read_text())["train_micro_batch_size_per_gpu"] == 8


def test_the_sweep_resumes_from_an_old_ledger_and_its_runs():
    sweep_id = old_lines("sweep")[0]["sweep"]
    done = load_ledger(str(OLD / "sweep.jsonl"), sweep_id)
    point = ledger.final(done, ("z0 off=none fp32 mbs=8", 0))
    assert point is not None and point.status == "ok" and point.peak_mem_bytes > 0 and point.busy is not None
    tag = old_lines("sweep.runs")[0]["tag"]
    runs = [r for r in store.read_records(str(OLD / "sweep.runs.jsonl"), RunRecord) if r.tag == tag]
    assert outcome.classify(runs, 0, False, 60) == ("ok", None)
    assert peak_memory.calibrate(runs[0], Layout.from_dict(point.point), 2, 2, "cpu") is not None


def test_the_comm_verdict_reads_an_old_comm_record():
    line = old_lines("comm")[0]
    hosts = sorted(set(line["hosts"]))  # as a run passes them: its distinct hosts
    found = comm_bound.latest_comm_record(str(OLD / "comm.jsonl"), hosts, line["world_size"], line["backend"])
    assert isinstance(found, CommRecord) and found.run_id == line["run_id"]
    busbw = comm_bound.busbw_from_comm_record(found)
    assert set(busbw) >= {"all_reduce", "all_gather", "reduce_scatter"}
    for collective, figure in busbw.items():  # each is the old line's own figure at its largest message
        rows = [r for r in line["results"] if r["collective"] == collective and r.get("scope", "world") == "world"]
        assert figure == max(rows, key=lambda r: r["size_bytes"])["busbw_GBps"]
    verdict = comm_bound.judge({"all_reduce": 1e6}, busbw, "old", step_ms=100.0)
    assert verdict["comm_ms_lower_bound"] == pytest.approx(1e6 / (busbw["all_reduce"] * 1e9) * 1e3)
    assert verdict["fraction_of_step"] == pytest.approx(verdict["comm_ms_lower_bound"] / 100.0)


def test_an_old_failed_run_record_is_classified_by_its_failure():
    """The shape ``run.run_record.failure_record`` wrote before ``kind`` and ``schema_version``."""
    base = {k: v for k, v in old_lines("runs")[0].items() if k not in ("metrics", "status", "error")}
    oom = {**base, "status": "failed", "error": "rank 1: out of memory at step 2", "metrics": {},
           "failure": {"kind": "oom", "steps_done": 2, "rank": 1, "host": "vm", "signal": None, "stalled_s": None,
                       "peers": {}}}
    peer = {**oom, "error": "peer gone", "failure": {**oom["failure"], "kind": "error", "peers": {"1": "gone"}}}
    for line in (oom, peer):
        check_schema(line)
    records = [parse_record(line) for line in (peer, oom)]
    assert outcome.classify(records, 1, False, 60) == ("oom", "rank 1: out of memory at step 2")
    assert outcome.classify(records[:1], 1, False, 60) == ("crashed", "peer gone")


def test_the_capacity_search_writes_valid_probe_and_layout_records(tmp_path):
    """The capacity writers' ok path, in-process (the first part of ``ds-bench capacity`` cannot run a
    member yet): a probe from an ok run record, then the layout's record naming it and the next size."""
    from types import SimpleNamespace

    from ds_bench.capacity import search
    from ds_bench.capacity.driver import LayoutSearch, probe_record
    from ds_bench.capacity.family import scaled_family
    from ds_bench.jobs.spawn import JobEnd

    members = scaled_family("hidden", 2, 64, 2, 2, seq_len=64)
    layout = Layout(1, "none", "fp32", 1)
    fake = SimpleNamespace(spec=SimpleNamespace(members=members, family="hidden", scale="hidden", seq_len=64),
                           capacity_id="c1", layout=layout, world=2, capacity=2**31, probes={}, predict=lambda m: None,
                           member=lambda i: members[i], _write_largest_config=lambda best: None)
    run = RunRecord(workload="gpt2", status="ok", run_id="r1", params=members[0].params, ds_config={"a": 1},
                    metrics={"step_ms_median": 250.0, "tokens_per_s": 512.0, "peak_mem_bytes": 2**29,
                             "baseline_mem_bytes": 2**27, "tflops_per_device": 0.01})
    end = JobEnd(0, False, 10.0, 12.5)
    ok = probe_record(fake, 0, SimpleNamespace(run=run, status="ok", reason=None, log="l", job=end, busy=BUSY, slurm=None))
    oom = probe_record(fake, 1, SimpleNamespace(run=None, status="oom", reason="out of memory", log="l", job=end,
                                                busy=BUSY, slurm=None))
    fake.probes = {0: ok, 1: oom}
    layout_record = LayoutSearch.summary(fake, search.Answer(0, 1, "oom"))
    path = tmp_path / "c.jsonl"
    for record in (ok, oom, layout_record):
        store.append_record(str(path), record)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        check_schema(line)
    assert lines[0]["step_s"] == 0.25 and lines[0]["peak_mem_bytes"] == 2**29 and lines[1]["peak_mem_bytes"] is None
    assert lines[2]["largest"]["member"] == members[0].name and lines[2]["largest"]["tokens_per_s"] == 512.0
    assert lines[2]["next"] == {**dict.fromkeys(("peak_mem_bytes", "predicted_mem_bytes", "step_s", "tokens_per_s",
                                                 "tflops_per_device", "run_id")),
                                "member": members[1].name, "params": members[1].params, "status": "oom",
                                "why": "oom", "reason": "out of memory"}

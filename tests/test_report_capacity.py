"""``ds-bench report`` of capacity searches (text and ``--html``): the chart plots what the search scaled (tokens
per sequence under ``--scale seq``, parameters for a model-size search); the probes that ran out of memory are the
search's bound, not failures (a probe that timed out still is one); a resident peak above the ``--cpu-mem-limit``
cap is marked and explained. The records are written here: a seq search on two layouts, one with a probe over
its cap's resident size, and the runs of its probes as ``ds-bench run`` records them."""

import json
import re
from contextlib import contextmanager

import matplotlib
import pytest

from ds_bench import cli
from ds_bench.config.layout import Layout
from ds_bench.record.schema import CapacityRecord
from ds_bench.report import capacity_table, html_capacity

matplotlib.use("Agg")

GIB = 2**30
CAP = int(1.10 * GIB)
SEQ, SP_SEQ = "z3 off=none fp32 mbs=1", "sp2 z3 off=none fp32 mbs=1"


def probe(layout, seq_len, status, run_id, peak=None, reason=None):
    return {"kind": "capacity_probe", "capacity": "s1", "layout": layout, "index": seq_len, "member": f"seq {seq_len}",
            "seq_len": seq_len, "params": 3_347_840, "status": status, "run_id": run_id, "peak_mem_bytes": peak,
            "capacity_bytes": CAP, "reason": reason, "step_s": 0.5 if status == "ok" else None}


def answer(layout, point, longest, peak, nxt):
    return {"kind": "capacity", "capacity": "s1", "layout": layout, "point": point, "world_size": 2,
            "data_parallel_size": 2 if layout == SEQ else 1, "scale": "seq", "family": "longest sequence of llama tiny",
            "status": "ok", "capacity_bytes": CAP,
            "largest": {"member": f"seq {longest}", "seq_len": longest, "params": 3_347_840, "peak_mem_bytes": peak,
                        "status": "ok", "step_s": 0.5},
            "next": {"member": f"seq {nxt}", "seq_len": nxt, "why": "oom"}}


def run(run_id, kind, tag=f"capacity-s1-{SEQ}-r0-abc123"):
    return {"kind": "run", "workload": "llama", "status": "failed", "run_id": run_id, "tag": tag,
            "failure": {"kind": kind}, "error": "DefaultCPUAllocator: can't allocate memory"}


RECORDS = [
    probe(SEQ, 1024, "ok", "a1", int(0.9 * GIB)), probe(SEQ, 2048, "oom", "a2"), probe(SEQ, 1536, "oom", "a3"),
    probe(SEQ, 1280, "ok", "a4", int(1.13 * GIB)),
    probe(SP_SEQ, 2048, "ok", "b1", int(0.8 * GIB)), probe(SP_SEQ, 4096, "timeout", "b2", reason="step timed out"),
    probe(SP_SEQ, 3072, "ok", "b3", int(1.0 * GIB)),
    answer(SEQ, Layout(3, "none", "fp32", 1).to_dict(), 1280, int(1.13 * GIB), 1536),
    answer(SP_SEQ, Layout(3, "none", "fp32", 1, sequence_parallel=2).to_dict(), 3072, int(1.0 * GIB), 4096),
    run("a2", "oom"), run("a2", "terminated"), run("a3", "oom"),
    run("elsewhere", "oom", tag="mine"),  # an out-of-memory run of no search: a failure
]


@pytest.fixture
def results(tmp_path):
    path = tmp_path / "capacity.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


@pytest.fixture
def page(results, tmp_path):
    out = tmp_path / "report.html"
    assert cli.main(["report", "--html", str(out), str(results)]) == 0
    return out.read_text()


def part(page: str, section_id: str) -> str:
    return re.search(rf'<section id="{section_id}">.*?</section>', page, re.S).group(0)


def charts(monkeypatch, records) -> list:
    """The axes of every chart the capacity section draws."""
    import matplotlib.pyplot as plt

    drawn = []

    @contextmanager
    def keep(parts, *_, figsize, title=""):
        fig, ax = plt.subplots(figsize=figsize)
        drawn.append(ax)
        yield fig, ax

    monkeypatch.setattr(html_capacity, "svg_plot", keep)
    html_capacity.capacity([CapacityRecord.model_validate(r) for r in records])
    return drawn


def test_a_seq_search_charts_the_longest_sequence_in_tokens(monkeypatch):
    (ax,) = charts(monkeypatch, [r for r in RECORDS if r["kind"] == "capacity"])
    assert [bar.get_width() for bar in ax.patches] == [1280, 3072]
    assert ax.get_xlabel() == "longest sequence that trained (tokens)" and "Longest sequence" in ax.get_title()


def test_a_model_size_search_charts_parameters_in_millions(monkeypatch):
    record = {**RECORDS[-5], "scale": "layers", "largest": {"member": "8 x 256 x 4", "params": 19_446_528}}
    (ax,) = charts(monkeypatch, [record])
    assert [bar.get_width() for bar in ax.patches] == [pytest.approx(19.446528)]
    assert "parameters" in ax.get_xlabel() and "millions" in ax.get_xlabel()


def test_the_html_names_lengths_and_its_chart_says_tokens(page):
    capacity = part(page, "capacity")
    assert "longest sequence</th>" in capacity and "largest that ran" not in capacity
    assert 'aria-label="longest sequence per layout"' in capacity and "(tokens)" in capacity


def test_oom_probes_are_the_searchs_bound_not_failures(page):
    failures, capacity = part(page, "failures"), part(page, "capacity")
    assert "probes over the limit: 2, first oom at 1,536 tokens" in capacity
    assert capacity.count("oom: over the limit") == 2 and 'class="oom"' not in capacity
    assert "a2" not in failures and "a3" not in failures  # the probes' runs, every rank's
    assert "elsewhere" in failures  # an out-of-memory run no search made
    assert "capacity probe" in failures and "step timed out" in failures  # a probe that timed out is a failure


def test_the_text_report_prints_the_bound(results, capsys):
    assert cli.main(["report", str(results)]) == 0
    out = capsys.readouterr().out
    assert f"{SEQ}: probes over the limit: 2, first oom at 1,536 tokens" in out
    assert "probes over the limit" not in out.split(SEQ + ":")[0]  # under the table, not in it


def test_a_resident_peak_above_the_cap_is_marked_and_explained(results, page):
    records = [CapacityRecord.model_validate(r) for r in RECORDS if r["kind"] == "capacity"]
    text = capacity_table.table(records)
    assert "1.13 / 1.10 *" in text and "1.00 / 1.10  " in text
    assert "RLIMIT_DATA" in text and "not on its resident memory" in text
    assert "RLIMIT_DATA" not in capacity_table.table(records[1:])  # within the cap: no note
    capacity = part(page, "capacity")
    assert "1.13 / 1.10 *" in capacity and "not on its resident memory" in capacity

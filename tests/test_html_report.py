"""``ds-bench report --html``: one self-contained page from every kind of results file, read in a real browser.

The inputs are real records of this machine (``tests/data/report/``: ``run_scripts/acceptance.sh``'s doctor,
comm, scaling, sweep and their runs; ``ds-bench roofline``; a capacity search; a ``plan --confirm`` of six layouts; a run that ran out of memory; ``comm --pairs``
over three network-namespace hosts with one slow cable; an empty file). Without a browser: every section
is there for its records, an empty file and a failed run are shown for what they are, the page names no
address outside itself, bad arguments are one-line errors that write nothing. In headless Chromium
(``tests/browser.py``): the DOM has every section, the numbers in the tables are the records' own, the
sortable tables sort, the recommended config downloads as the sweep would write it, there is no console
error and no request beyond the file itself, the plan's twelve columns fit a 1,400 px window; a screenshot is
saved (``results/report-screenshot.png``).
"""

import base64
import json
import re
import shutil
import statistics

import pytest

from ds_bench import cli
from ds_bench.config.deepspeed.prepare import portable
from ds_bench.record import store
from ds_bench.record.schema import (CapacityProbeRecord, CapacityRecord, CommRecord, PlanRecord, RooflineRecord,
                                    RunRecord, ScalingRecord, SweepPointRecord)
from ds_bench.report import ranking
from ds_bench.report.html_report import read, write_report
from ds_bench.report.summary import one_per_run
from tests import browser
from tests.conftest import REPO

DATA = REPO / "tests/data/report"
KINDS = ["doctor", "roofline", "comm", "pairs", "scaling", "sweep", "runs", "capacity", "plan", "failed", "empty"]
SECTIONS = ["machine", "doctor", "roofline", "comm", "scaling", "sweep", "capacity", "plan", "runs", "failures", "files"]


def paths(*names):
    return [str(DATA / f"{n}.jsonl") for n in names]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    out = tmp_path_factory.mktemp("html") / "report.html"
    assert cli.main(["report", "--html", str(out), *paths(*KINDS)]) == 0
    return out


def section_ids(text: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)"', text)


def test_every_kind_of_record_has_its_section(page):
    text = page.read_text()
    assert section_ids(text) == SECTIONS
    assert "suspect host hostc" in text and "hosta&lt;-&gt;hostc" in text  # the pairs' verdict, escaped
    assert "DefaultCPUAllocator: can&#x27;t allocate memory" in text  # the failed run's reason
    assert re.search(r"empty\.jsonl</td><td[^>]*>0</td><td>\(empty\)", text)


def test_an_empty_file_alone_makes_a_page_that_says_so(tmp_path):
    out = tmp_path / "empty.html"
    assert cli.main(["report", "--html", str(out), *paths("empty")]) == 0
    text = out.read_text()
    assert section_ids(text) == ["failures", "files"] and "nothing was measured yet" in text


def test_the_page_names_no_address_outside_itself(page):
    text = page.read_text()
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", text)
    assert "<link" not in text and "@import" not in text and not re.search(r"url\((?!#)", text)  # url(#id): in the page


def test_bad_arguments_are_one_line_errors_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert cli.main(["report", "--html", str(out), *paths("runs"), str(tmp_path / "missing.jsonl")]) == 2
    assert cli.main(["report", "--html", str(tmp_path / "no" / "r.html"), *paths("runs")]) == 2
    assert cli.main(["report", *paths("runs", "sweep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "missing.jsonl" in err[0] and "folder" in err[1] and "--html PATH" in err[2], err
    assert list(tmp_path.iterdir()) == []


def values(page, selector: str, key: str) -> list[float]:
    return [float(v) for v in page.eval_on_selector_all(f"{selector} td[data-key={key}][data-value]",
                                                        "cells => cells.map(c => c.dataset.value)")]


def read_kind(name, kind):
    return store.read_records(str(DATA / f"{name}.jsonl"), kind)


@pytest.fixture(scope="module")
def chromium():
    reason = browser.skip_reason()
    if reason:
        pytest.skip(reason)
    with browser.chromium() as b:
        yield b


@pytest.fixture(scope="module")
def visit(chromium, page):
    with browser.open_file(chromium, page) as v:
        yield v


def test_the_browser_renders_every_section_without_an_error_or_a_request(visit, page):
    ids = visit.page.eval_on_selector_all("section", "s => s.map(x => x.id)")
    assert ids == SECTIONS
    assert all(visit.page.is_visible(f"#{i} h2") for i in ids)
    assert visit.requests == [page.resolve().as_uri()]
    assert [m for m in visit.console if m[0] == "error"] == [] and visit.page_errors == []
    assert visit.page.locator("svg").count() >= 6  # busbw, pairs heat map, scaling, pareto, capacity, runs
    shot = REPO / "results" / "report-screenshot.png"
    shot.parent.mkdir(exist_ok=True)
    visit.page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 50_000


def test_the_numbers_shown_are_the_records(visit):
    p = visit.page
    runs = one_per_run(read_kind("runs", RunRecord) + read_kind("failed", RunRecord))
    assert values(p, "#runs-table", "samples_per_s") == [r.metrics.samples_per_s for r in runs
                                                         if r.metrics.samples_per_s is not None]
    (comm,) = read_kind("comm", CommRecord)
    assert values(p, "#comm-table-0", "busbw_GBps") == [row.busbw_GBps for row in comm.results]
    (scaling,) = read_kind("scaling", ScalingRecord)
    assert values(p, "#scaling-table-0", "efficiency") == [pt.efficiency for pt in scaling.points]
    sweep = read_kind("sweep", SweepPointRecord)
    ranked = ranking.rank(ranking.summarize_points(sweep))
    assert values(p, f"#sweep-table-{sweep[0].sweep}", "throughput") == [r.throughput_median for r in ranked.rows]
    largest = {r.layout: r.largest.params for r in read_kind("capacity", CapacityRecord)}
    assert values(p, "#capacity-table", "params") == list(largest.values())
    probes = read_kind("capacity", CapacityProbeRecord)
    assert values(p, "#capacity-probes-table", "probe_params") == [r.params for r in probes]
    (plan,) = read_kind("plan", PlanRecord)
    assert values(p, "#plan-table", "tokens_per_s_per_rank") == [r.tokens_per_s_per_rank for r in plan.ranked]
    assert values(p, "#plan-table", "measured_step_ms") == [r.confirmed.step_s * 1e3 for r in plan.ranked]
    (ceiling,) = read_kind("roofline", RooflineRecord)
    assert values(p, "#roofline-table", "roofline_median") == [row.median for row in ceiling.results]
    shown = p.inner_text("#runs-table tbody tr:first-child td:nth-child(9)")
    assert shown == f"{runs[0].metrics.samples_per_s:.4g}"


def test_the_plan_table_fits_a_1400_px_window_with_its_measured_column_in_view(chromium, page):
    """Twelve columns (the ranked layouts, predicted beside ``--confirm``'s measured): they wrap rather than scroll."""
    assert 'id="plan-table" class="sortable fit"' in page.read_text()
    with browser.open_file(chromium, page, width=1400) as v:
        box = v.page.evaluate("""() => { const t = document.querySelector('#plan-table'), s = t.parentElement;
            const th = [...t.querySelectorAll('th')].find(h => h.textContent === 'measured step ms');
            return {overflow: s.scrollWidth - s.clientWidth, right: th.getBoundingClientRect().right,
                    window: window.innerWidth, page_overflow: document.documentElement.scrollWidth - window.innerWidth}; }""")
    assert box["overflow"] <= 0 and box["page_overflow"] <= 0 and box["right"] <= box["window"], box


def test_a_click_on_a_header_sorts_the_table_both_ways(visit):
    p = visit.page
    header = p.locator("#runs-table th", has_text="samples/s").first
    header.click()
    up = values(p, "#runs-table", "samples_per_s")
    header.click()
    down = values(p, "#runs-table", "samples_per_s")
    assert up == sorted(up) and down == sorted(up, reverse=True) and len(up) >= 3


def test_the_recommended_config_downloads_as_the_sweep_writes_it(visit):
    href = visit.page.get_attribute("#sweep a[download]", "href")
    config = json.loads(base64.b64decode(href.split(",", 1)[1]))
    sweep = read_kind("sweep", SweepPointRecord)
    best = ranking.rank(ranking.summarize_points(sweep)).recommended
    assert config == portable(best.ds_config) and "train_batch_size" not in config


SLOWER_RGB, SAME_RGB = "rgb(164, 22, 26)", "rgb(23, 99, 23)"  # html_page's .slower and .same colours


def verdict_cells(page) -> list[tuple[str, str]]:
    """(text, computed colour) of each row's verdict cell, as the browser renders it."""
    return page_cells(page, "#compare-table tbody td:nth-last-child(2)")


def page_cells(page, selector: str) -> list[tuple[str, str]]:
    cells = page.eval_on_selector_all(selector, "c => c.map(x => [x.textContent, getComputedStyle(x).color])")
    return [tuple(cell) for cell in cells]


def test_compare_writes_its_page_and_the_browser_reads_the_verdicts(tmp_path, chromium):
    """A file against itself: every match the same, in the same colour; a real slowdown (``compare_base`` /
    ``compare_slow``: tests/test_compare.py's runs of 2026-11-26, 3 MNIST runs each, the slow ones beside a noisy
    neighbour on their core): slower, in red, with the change and the p of the records' own medians."""
    out = tmp_path / "compare.html"
    assert cli.main(["compare", *paths("runs", "runs"), "--html", str(out)]) == 0
    with browser.open_file(chromium, out) as v:
        cells = verdict_cells(v.page)
        assert cells and set(cells) == {("same (single sample)", SAME_RGB)}
        curves = page_cells(v.page, "#compare-table tbody td:last-child")
        assert curves and set(curves) == {("same curves (12 steps)", SAME_RGB)}  # a file against itself: its curves
        assert values(v.page, "#compare-table", "change_pct") == [0.0] * len(cells)
        assert [m for m in v.console if m[0] == "error"] == [] and len(v.requests) == 1
    slower = tmp_path / "slower.html"
    assert cli.main(["compare", *paths("compare_base", "compare_slow"), "--html", str(slower)]) == 1
    base, slow = (statistics.median(r.metrics.samples_per_s for r in read_kind(name, RunRecord))
                  for name in ("compare_base", "compare_slow"))
    with browser.open_file(chromium, slower) as v:
        assert verdict_cells(v.page) == [("slower", SLOWER_RGB)]
        (change,) = values(v.page, "#compare-table", "change_pct")
        assert change == pytest.approx(100 * (slow - base) / base) and change < -15
        assert v.page.inner_text("#compare-table tbody td:nth-child(8)") == "0.05"  # 3 against 3, fully apart
        assert [m for m in v.console if m[0] == "error"] == [] and len(v.requests) == 1


def test_chromium_is_there_when_make_test_set_it_up():
    """As root (CI's case) ``tools/setup.sh --test`` installs chromium: no silent skip of the browser tests."""
    if shutil.which("apt-get") and __import__("os").geteuid() == 0:
        assert browser.skip_reason() is None


def test_records_written_before_the_schema_render_too(tmp_path):
    """``tests/data/pre_schema/``: run, sweep, scaling, comm and doctor records from before ``schema_version``."""
    out = tmp_path / "old.html"
    old = sorted(str(p) for p in (REPO / "tests/data/pre_schema").glob("*.jsonl"))
    assert cli.main(["report", "--html", str(out), *old]) == 0
    assert {"machine", "doctor", "comm", "scaling", "sweep", "runs", "failures", "files"} <= set(section_ids(out.read_text()))


def test_sparse_and_hostile_records_render_escaped(tmp_path):
    """Records with most fields unset, every point failed, and record text that is markup: the page renders,
    the failures are listed and no record text becomes a tag."""
    evil = "<script>alert(1)</script>"
    lines = [{"kind": "run", "workload": "mnist", "status": "failed", "error": evil, "run_id": "r1"},
             {"kind": "sweep_point", "sweep": "s", "key": "z0 mbs=8", "status": "oom", "reason": evil,
              "point": {"stage": 0, "offload": "none", "precision": "fp32", "micro_batch": 8}},
             {"kind": "scaling", "scaling": "c", "status": "failed", "points": [{"world_size": 2, "status": "failed",
                                                                                 "reason": evil}]},
             {"kind": "comm", "status": "failed", "problems": [evil], "results": [
                 {"collective": "all_reduce", "size_bytes": 1024, "busbw_GBps": 0.1, "wrong": [evil]}]},
             {"kind": "capacity", "capacity": "k", "status": "failed", "reason": evil, "layout": "z3", "world_size": 2,
              "point": {"stage": 3, "offload": "none", "precision": "bf16", "micro_batch": 1}},
             {"kind": "doctor", "problems": [evil], "busbw_GBps": 1.0}]
    src = tmp_path / "sparse.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "sparse.html"
    assert cli.main(["report", "--html", str(out), str(src)]) == 0
    text = out.read_text()
    assert "<script>alert" not in text and text.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 6
    failures = text[text.index('<section id="failures"'):]
    assert all(what in failures for what in ("run", "sweep point", "scaling point", "comm", "capacity", "doctor"))


def test_html_with_a_terminal_only_flag_is_refused(tmp_path, capsys):
    assert cli.main(["report", "--html", str(tmp_path / "r.html"), "--tag", "x", *paths("runs")]) == 2
    assert "--tag and --plot are for the terminal report" in capsys.readouterr().err


def test_a_sweep_on_three_stacks_shows_each_judged_against_the_first_and_the_wrong_one_in_red(tmp_path, chromium):
    """``stacks_sweep``: a real sweep of this machine (2026-11-29, AMD EPYC, 2 CPU ranks, MNIST z2 fp32 mbs=8 ga=2,
    ``--deepspeed 0.18.4,installed,0.17.6``; installed 0.19.8). 0.17.6 has DeepSpeed #7718: its gradient norms
    are off from the first step; 0.18.4 and 0.19.8 agree to the last digit."""
    out = tmp_path / "stacks.html"
    assert cli.main(["report", "--html", str(out), *paths("stacks_sweep")]) == 0
    with browser.open_file(chromium, out) as v:
        assert v.page.inner_text("#stacks h2") == "Stacks: the same layouts on each"
        heads = v.page.eval_on_selector_all("#stacks h3", "h => h.map(x => x.textContent)")
        assert heads == ["ds0.18.4 (BASE) against ds0.19.8 (NEW)", "ds0.18.4 (BASE) against ds0.17.6 (NEW)"]
        same, wrong = (page_cells(v.page, f"#stacks-table-{i} tbody td:last-child") for i in (1, 2))
        assert same == [("same curves (6 steps)", SAME_RGB)]
        assert len(wrong) == 1 and wrong[0][1] == SLOWER_RGB
        assert wrong[0][0].startswith("gradient norm differs from step 1: 1.78571 vs 1.25893")
        assert [m for m in v.console if m[0] == "error"] == []

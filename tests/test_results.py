"""Results file: whole lines from concurrent writers, a full disk and a file-size limit, environment block."""

import json
import multiprocessing as mp
import resource
import signal
from collections import Counter

import pytest

from ds_bench.errors import UserError
from ds_bench.record.schema import DoctorRecord, Record, RunRecord
from ds_bench.record.store import append_record, read_records, versions
from tests.conftest import fill_up

PAD = 10_000  # ~10 KB lines: larger than a pipe's atomic write and a page, so interleaving would show


def _writer(path, k):
    for i in range(50):
        append_record(path, RunRecord(workload="w", writer=k, i=i, pad="x" * PAD))


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
    append_record(str(path), RunRecord(workload="first"))
    before = path.read_bytes()
    free = fill_up(small_tmpfs, leave_bytes=4096)
    assert 0 < free < PAD  # room for part of the next line only: the write is cut short, not refused
    with pytest.raises(UserError, match=r"r\.jsonl: could not append a whole results line: No space left on device"):
        append_record(str(path), RunRecord(workload="second", pad="x" * PAD))
    assert path.read_bytes() == before
    assert [r.workload for r in read_records(str(path))] == ["first"]


def _append_under_fsize_limit(path, limit, queue):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process at the limit
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        append_record(path, RunRecord(workload="second", pad="x" * PAD))
        queue.put("appended")
    except UserError as e:
        queue.put(str(e))


def test_file_size_limit_is_named_and_leaves_no_partial_line(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(str(path), RunRecord(workload="first"))
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
        append_record(str(tmp_path / "file" / "r.jsonl"), RunRecord(workload="w"))


def test_versions_name_the_stack():
    """The versions a record carries are the ones this process runs, package by package (the CPU build: no CUDA)."""
    import platform

    import deepspeed
    import mpi4py
    import torch
    import transformers

    v = versions()
    assert (v["python"], v["torch"], v["deepspeed"], v["transformers"], v["mpi4py"]) == (
        platform.python_version(), torch.__version__, deepspeed.__version__, transformers.__version__,
        mpi4py.__version__)
    assert v["cuda"] == torch.version.cuda and (v["nccl"] is None) == (not torch.cuda.is_available())


def test_reading_picks_a_kind_skips_unknown_ones_and_names_a_broken_line(tmp_path):
    import pytest

    from ds_bench.errors import UserError

    path = tmp_path / "r.jsonl"
    append_record(str(path), RunRecord(workload="mnist", status="ok"))
    append_record(str(path), DoctorRecord(kind="doctor", ranks=[]))
    with open(path, "a") as f:
        f.write('{"kind": "from_a_newer_version"}\n{"no": "kind and no workload"}\n')
    assert [r.workload for r in read_records(str(path), RunRecord)] == ["mnist"]
    assert [r.kind for r in read_records(str(path))] == ["run", "doctor"]  # unknown kinds skipped
    assert isinstance(read_records(str(path), Record)[1], DoctorRecord)
    with open(path, "a") as f:
        f.write('{"workload": "mnist", "sta')  # another node's job mid-append: not a line yet
    assert [r.workload for r in read_records(str(path), RunRecord)] == ["mnist"]
    with open(path, "a") as f:
        f.write("\n{half a line\n")
    with pytest.raises(UserError, match=r"r\.jsonl:5: not a JSON line"):
        read_records(str(path))


def test_a_record_that_does_not_fit_its_model_is_named(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"kind": "sweep_point", "sweep": "s", "key": "k", "status": "ok", "repeat": "first"}\n')
    with pytest.raises(UserError, match=r"r\.jsonl:1: not a valid sweep_point record: repeat: Input should be a valid"):
        read_records(str(path))
    assert read_records(str(path), RunRecord) == []  # another kind than asked: not validated


def test_append_takes_a_record_model(tmp_path):
    with pytest.raises(TypeError, match="record model"):
        append_record(str(tmp_path / "r.jsonl"), {"workload": "w"})
    assert not (tmp_path / "r.jsonl").exists()

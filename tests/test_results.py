"""Results file: whole lines from concurrent writers, environment block."""

import json
import multiprocessing as mp

from ds_bench.results import append_record, read_records, versions


def _writer(path, k):
    for i in range(50):
        append_record(path, {"workload": "w", "writer": k, "i": i, "pad": "x" * 5000})


def test_concurrent_appends_never_interleave(tmp_path):
    path = str(tmp_path / "sub" / "r.jsonl")
    procs = [mp.Process(target=_writer, args=(path, k)) for k in range(4)]
    [p.start() for p in procs]
    [p.join() for p in procs]
    lines = open(path).read().splitlines()
    assert len(lines) == 200
    assert all(json.loads(line)["pad"] == "x" * 5000 for line in lines)
    assert len(read_records(path)) == 200


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

"""Results file: whole lines from concurrent writers, environment block."""

import json
import multiprocessing as mp

from ds_bench.results import append_record, read_records, versions


def _writer(path, k):
    for i in range(50):
        append_record(path, {"writer": k, "i": i, "pad": "x" * 5000})


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

"""Tests for ds_bench.cluster.hostfile: parsing, loading, include/exclude filters, shipped examples."""

import re
from pathlib import Path

import pytest

from ds_bench.cluster.hostfile import (
    filter_slots,
    is_valid_hostname,
    load_hostfile,
    parse_hostfile,
    world_info,
)
from ds_bench.errors import UserError

REPO = Path(__file__).resolve().parent.parent


def test_parse_basic_keeps_order():
    assert parse_hostfile("node02 slots=4\nnode01 slots=2\n") == {"node02": 4, "node01": 2}
    assert list(parse_hostfile("b slots=1\na slots=1")) == ["b", "a"]


def test_parse_comments_blank_lines_and_whitespace():
    text = "# header\n\n  node01   slots=8  # trailing\n\t\nnode02 slots=8#tight\n   # indented\n"
    assert parse_hostfile(text) == {"node01": 8, "node02": 8}


def test_parse_accepts_fqdn_and_ip():
    text = "gpu-1.cluster.example.org slots=1\n10.0.0.5 slots=2\nNODE-A slots=3"
    assert parse_hostfile(text) == {"gpu-1.cluster.example.org": 1, "10.0.0.5": 2, "NODE-A": 3}


@pytest.mark.parametrize(
    "text, message",
    [
        ("node01\n", "h:1: missing slots in 'node01'; expected 'hostname slots=N'"),
        ("a slots=1\nslots=4\n", "h:2: missing hostname in 'slots=4'; expected 'hostname slots=N'"),
        ("node01 slots=4 extra", "h:1: malformed line 'node01 slots=4 extra'; expected 'hostname slots=N'"),
        ("node01 gpus=4", "h:1: malformed line 'node01 gpus=4'; expected 'hostname slots=N'"),
        ("node01 slots = 4", "h:1: malformed line 'node01 slots = 4'; expected 'hostname slots=N'"),
        ("node01 slots=four", "h:1: slots must be an integer in 'node01 slots=four', got 'four'"),
        ("node01 slots=", "h:1: slots must be an integer in 'node01 slots=', got ''"),
        ("node01 slots=2.5", "h:1: slots must be an integer in 'node01 slots=2.5', got '2.5'"),
        ("\nnode01 slots=0", "h:2: zero slots in 'node01 slots=0'; expected slots=N with N >= 1"),
        ("node01 slots=-1", "h:1: negative slots in 'node01 slots=-1'; expected slots=N with N >= 1"),
        (
            "node_1! slots=2",
            "h:1: bad hostname 'node_1!' in 'node_1! slots=2'; "
            "expected letters, digits, '-' and '.' (RFC 1123)",
        ),
        (
            "-node slots=2",
            "h:1: bad hostname '-node' in '-node slots=2'; expected letters, digits, '-' and '.' (RFC 1123)",
        ),
        (
            "a..b slots=2",
            "h:1: bad hostname 'a..b' in 'a..b slots=2'; expected letters, digits, '-' and '.' (RFC 1123)",
        ),
        (
            "# c\nnode01 slots=4\nnode02 slots=4\nnode01 slots=2  # again\n",
            "h:4: duplicate host 'node01' in 'node01 slots=2' (first on line 2)",
        ),
        ("", "h: no hosts found; expected 'hostname slots=N' on at least one line"),
        ("# only comments\n\n  \n", "h: no hosts found; expected 'hostname slots=N' on at least one line"),
    ],
)
def test_parse_errors(text, message):
    with pytest.raises(UserError, match="^" + re.escape(message) + "$"):
        parse_hostfile(text, source="h")


def test_parse_default_source_name():
    with pytest.raises(UserError, match=re.escape("<hostfile>:1: missing slots in 'x'")):
        parse_hostfile("x")


@pytest.mark.parametrize(
    "name, ok",
    [("node01", True), ("a", True), ("a-b.c-d", True), ("1.2.3.4", True), ("x" * 63, True),
     ("", False), ("x" * 64, False), ("a-", False), ("a_b", False), ("a.", False), (".a", False),
     ("ä", False)],
)
def test_is_valid_hostname(name, ok):
    assert is_valid_hostname(name) is ok


def test_load_hostfile_names_path_in_errors(tmp_path):
    good = tmp_path / "hf"
    good.write_text("node01 slots=2\n")
    assert load_hostfile(good) == {"node01": 2}
    assert load_hostfile(str(good)) == {"node01": 2}
    bad = tmp_path / "bad"
    bad.write_text("node01 slots=2\nnode01 slots=2\n")
    with pytest.raises(UserError, match=re.escape(f"{bad}:2: duplicate host 'node01'")):
        load_hostfile(bad)


def test_load_hostfile_missing_and_unreadable(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(UserError, match=re.escape(f"hostfile {missing}: not found; expected a file")):
        load_hostfile(missing)
    with pytest.raises(UserError, match=re.escape(f"hostfile {tmp_path}: cannot read (")):
        load_hostfile(tmp_path)


HOSTS = {"a": 4, "b": 2, "c": 3}


def test_filter_none_gives_all_slots():
    assert filter_slots(HOSTS) == {"a": [0, 1, 2, 3], "b": [0, 1], "c": [0, 1, 2]}


def test_include_keeps_hostfile_order_and_sorts_slots():
    assert filter_slots(HOSTS, include="c@a:2,0") == {"a": [0, 2], "c": [0, 1, 2]}


def test_include_repeated_host_is_union():
    assert filter_slots(HOSTS, include="a:3@a:1,1") == {"a": [1, 3]}


def test_exclude_slots_and_whole_hosts():
    assert filter_slots(HOSTS, exclude="a:1,2@c") == {"a": [0, 3], "b": [0, 1]}
    assert filter_slots(HOSTS, exclude="b:0,1") == {"a": [0, 1, 2, 3], "c": [0, 1, 2]}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"include": "a", "exclude": "b"}, "--include and --exclude are mutually exclusive; give only one"),
        ({"include": "z"}, "--include: host 'z' is not in the hostfile (hosts: a, b, c)"),
        ({"exclude": "a@zz:0"}, "--exclude: host 'zz' is not in the hostfile (hosts: a, b, c)"),
        ({"include": "b:2"}, "--include: slot 2 out of range for host 'b' (slots 0..1)"),
        ({"exclude": "b:-1"}, "--exclude: slot -1 out of range for host 'b' (slots 0..1)"),
        ({"include": "a:x"}, "--include: slot 'x' for host 'a' is not an integer"),
        ({"include": "a:0,,1"}, "--include: slot '' for host 'a' is not an integer"),
        ({"include": "a@@b"}, "--include: empty host or slot list in 'a@@b'; expected 'host1@host2:0,2'"),
        ({"include": "a:"}, "--include: empty host or slot list in 'a:'; expected 'host1@host2:0,2'"),
        ({"exclude": "a@b@c"}, "--exclude: 'a@b@c' removes every slot; nothing is left to run on"),
    ],
)
def test_filter_errors(kwargs, message):
    with pytest.raises(UserError, match="^" + re.escape(message) + "$"):
        filter_slots(HOSTS, **kwargs)


def test_world_info():
    assert world_info({"a": [0, 2], "b": [0, 1, 2]}) == (2, 5)
    assert world_info({"a": [1], "b": []}) == (1, 1)
    assert world_info({}) == (0, 0)
    assert world_info(filter_slots(HOSTS, exclude="c")) == (2, 6)


def test_shipped_examples():
    assert load_hostfile(REPO / "hostfiles" / "example_2nodes_4gpus") == {"node01": 4, "node02": 4}
    assert load_hostfile(REPO / "hostfiles" / "localhost_2") == {"localhost": 2}


def test_every_shipped_hostfile_parses():
    files = sorted(p for p in (REPO / "hostfiles").iterdir() if p.is_file())
    assert files, "hostfiles/ should ship examples"
    for path in files:
        assert load_hostfile(path), path

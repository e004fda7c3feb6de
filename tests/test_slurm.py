"""Tests for ds_bench.cluster.slurm: host list expansion and tasks-per-node expansion."""

import re

import pytest

from ds_bench.cluster.slurm import expand_nodelist, tasks_per_node
from ds_bench.errors import UserError


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node01", ["node01"]),
        ("  node01 ", ["node01"]),
        ("node01,node02", ["node01", "node02"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("node[8-11]", ["node8", "node9", "node10", "node11"]),
        ("node[098-101]", ["node098", "node099", "node100", "node101"]),
        ("node[3]", ["node3"]),
        ("a[1-2],b[3,5]", ["a1", "a2", "b3", "b5"]),
        ("gpu-[1-2]-ib", ["gpu-1-ib", "gpu-2-ib"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("x[1-2]y,z", ["x1y", "x2y", "z"]),
        ("login.cluster.org,c[1-2].cluster.org", ["login.cluster.org", "c1.cluster.org", "c2.cluster.org"]),
        ("[1-2]", ["1", "2"]),
        ("host_a", ["host_a"]),
    ],
)
def test_expand_nodelist(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize(
    "text",
    ["", ",", "a,,b", "a,", "node[", "node[1-2", "node]", "node[1-2]]", "node[[1]]", "node[]",
     "node[a-b]", "node[3-1]", "node[1-]", "node[-1]", "node[1,]", "no de", "node!", "node[1-2-3]"],
)
def test_expand_nodelist_errors(text):
    message = (f"SLURM_NODELIST={text!r}: not a Slurm host list; "
               "expected e.g. 'node01' or 'node[01-04,07]'")
    with pytest.raises(UserError, match="^" + re.escape(message) + "$"):
        expand_nodelist(text)


def test_expand_nodelist_names_given_variable():
    with pytest.raises(UserError, match=re.escape("SLURM_STEP_NODELIST='x[': not a Slurm host list")):
        expand_nodelist("x[", var="SLURM_STEP_NODELIST")


@pytest.mark.parametrize(
    "text, counts",
    [("4(x2),3", [4, 4, 3]), ("8", [8]), ("2,1,2", [2, 1, 2]), ("1(x3)", [1, 1, 1]), (" 4 ", [4])],
)
def test_tasks_per_node(text, counts):
    assert tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "4(x)", "4x2", "4(x2", "a", "4,,3", "-1", "4(x0)", "4(2)"])
def test_tasks_per_node_errors(text):
    message = f"SLURM_TASKS_PER_NODE={text!r}: not a task count list; expected e.g. '4(x2),3'"
    with pytest.raises(UserError, match="^" + re.escape(message) + "$"):
        tasks_per_node(text)


def test_tasks_per_node_names_given_variable():
    with pytest.raises(UserError, match=re.escape("SLURM_STEP_TASKS_PER_NODE='z'")):
        tasks_per_node("z", var="SLURM_STEP_TASKS_PER_NODE")

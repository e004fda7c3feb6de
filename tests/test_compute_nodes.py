"""Where a study's jobs run, from Slurm's node records and ``--compute-node`` (``jobs.compute_nodes``,
``machine.compute_node``): pure functions on inline records. The real Slurm's side: tests/test_slurm_compute_nodes.py.
"""

from __future__ import annotations

import argparse

import pytest

from ds_bench.errors import UserError
from ds_bench.jobs.compute_nodes import (
    cpu_bf16,
    gpu_bf16,
    gpu_memory,
    node_of,
    parse_gres,
    parse_records,
    with_job_gpus,
)
from ds_bench.machine.compute_node import ComputeNode, parse_override, with_override

GiB = 2**30
RECORDS = """\
gpu001|gpu|gpu:h100:4(S:0-1)|(null)|64|512000
gpu002|gpu|gpu:h100:4(S:0-1)|(null)|64|512000
cn001|cpu*|(null)|avx2,avx512f,avx512_bf16|128|256000
old01|volta|gpu:v100:8,shard:16|(null)|40|380000
mix01|mixed|gpu:a100:4|(null)|32|200000
mix02|mixed|gpu:a100:2|(null)|64|100000
"""


@pytest.mark.parametrize("gres, expected", [
    ("gpu:h100:4(S:0-1)", (4, "h100")), ("gpu:2", (2, None)), ("(null)", (0, None)),
    ("gpu:v100:8,shard:16", (8, "v100")), ("gpu:a100:2(S:0),gpu:a100:2(S:1)", (4, "a100")), ("shard:8", (0, None)),
    ("gpu:a100:4(S:0,2)", (4, "a100")), ("gpu:a100:4(S:0-1),gpu:a100:4", (8, "a100")),
])
def test_gres_gives_the_gpus_and_their_type(gres, expected):
    assert parse_gres(gres) == expected


@pytest.mark.parametrize("features, expected", [
    ("avx2,avx512f,avx512_bf16", True), ("amx-bf16,avx2", True), ("avx2,avx512f", False), ("ib,rack3", None), ("", None),
])
def test_cpu_features_say_bf16_only_when_they_list_cpu_flags(features, expected):
    assert cpu_bf16(frozenset(f.replace("-", "_") for f in features.split(",") if f)) is expected


def test_a_gpu_partition_is_its_gpus_their_memory_and_bf16():
    node = node_of(parse_records(RECORDS), "gpu", gpu_memory)
    assert (node.gpus, node.gpu_name, node.gpu_memory_bytes, node.native_bf16, node.cpus, node.memory_bytes) == (
        4, "h100", 80 * GiB, True, 64, 512000 * 2**20)
    assert (node.device_type, node.default_ranks(), node.rank_memory_bytes(4)) == ("cuda", 4, 80 * GiB)
    assert node.line() == ("compute nodes: partition gpu (2 node(s): gpu001,gpu002): 4 GPU(s) per node (h100, 80 GiB "
                           "each), bf16 native, 64 CPUs, 500 GiB per node (from Slurm's node records)")


def test_the_default_partition_is_taken_without_partition_and_its_cpu_features_count():
    node = node_of(parse_records(RECORDS), None, gpu_memory)
    assert (node.device_type, node.native_bf16, node.default_ranks(), node.rank_memory_bytes(2)) == (
        "cpu", True, 2, 256000 * 2**20 // 2)
    assert node.rank_memory_bytes(2, cpu_mem_limit=3 * GiB) == 3 * GiB


def test_a_pre_ampere_gpu_has_no_bf16_and_nodes_that_differ_count_as_the_least():
    volta = node_of(parse_records(RECORDS), "volta", gpu_memory)
    assert (volta.gpus, volta.native_bf16, volta.runs_bf16) == (8, False, False)
    mixed = node_of(parse_records(RECORDS), "mixed", gpu_memory)
    assert (mixed.gpus, mixed.cpus, mixed.memory_bytes) == (2, 32, 100000 * 2**20)
    assert "they differ: the least of each" in mixed.line()


def test_a_partition_without_nodes_names_the_ones_there_are():
    with pytest.raises(UserError, match=r"^--partition gpux: Slurm lists no node in it \(partitions: cpu, gpu, mixed, "
                                        r"volta\)$"):
        node_of(parse_records(RECORDS), "gpux", gpu_memory)


def test_compute_node_overrides_the_records_and_a_gpu_family_gives_its_memory():
    cpu = node_of(parse_records(RECORDS), "cpu", gpu_memory)
    gpu = with_override(cpu, parse_override("gpus=8, gpu=H200"), gpu_memory, gpu_bf16)
    assert (gpu.gpus, gpu.gpu_name, gpu.gpu_memory_bytes, gpu.source) == (
        8, "H200", 140 * GiB, "Slurm's node records and --compute-node")
    assert with_override(cpu, parse_override("bf16=emulated,memory=64GiB"), gpu_memory, gpu_bf16).rank_memory_bytes(2) == 32 * GiB
    assert with_override(gpu, parse_override("gpus=0"), gpu_memory, gpu_bf16).device_type == "cpu"


@pytest.mark.parametrize("text, message", [
    ("gpus", r"'gpus' is not KEY=VALUE with a key of gpus, gpu, gpu-memory, bf16, cpus, memory"),
    ("ram=4GiB", r"'ram=4GiB' is not KEY=VALUE"),
    ("gpus=-1", r"gpus=-1: expected a whole number$"),
    ("cpus=0", r"cpus=0: expected a whole number >= 1$"),
    ("bf16=yes", r"bf16=yes: expected native or emulated$"),
    (",", r"give KEY=VALUE pairs"),
])
def test_a_bad_compute_node_names_the_flag_and_the_key(text, message):
    with pytest.raises(UserError, match=rf"^--compute-node '{text}': .*{message}"):
        parse_override(text)


def test_a_memory_is_a_size_with_its_unit():
    with pytest.raises(UserError, match=r"^--compute-node memory 'lots': expected a size such as 4GiB"):
        parse_override("memory=lots")
    with pytest.raises(UserError, match=r"^--compute-node gpu-memory 80: give a unit, e.g. 80GiB"):
        parse_override("gpu-memory=80")


def test_a_gpu_family_on_nodes_without_gpus_asks_for_their_count():
    with pytest.raises(UserError, match=r"gpu=H100 on nodes with no GPU known: give gpus=N too"):
        with_override(ComputeNode(gpus=0, native_bf16=True), parse_override("gpu=H100"), gpu_memory, gpu_bf16)


def test_slurm_jobs_ask_for_the_records_gpus_unless_gpus_per_node_says():
    from ds_bench.config.study_flags import SlurmOptions

    slurm = SlurmOptions(nodes=1, partition="gpu", account=None, gpus_per_node=0, mpi=None, max_jobs=None,
                         queue_timeout_s=60)
    node = ComputeNode(gpus=4, native_bf16=True)
    assert with_job_gpus({"slurm": slurm}, node)["slurm"].gpus_per_node == 4
    given = argparse.Namespace(**{**slurm.__dict__, "gpus_per_node": 2})
    assert with_job_gpus({"slurm": SlurmOptions(**vars(given))}, node)["slurm"].gpus_per_node == 2
    assert with_job_gpus({"slurm": None}, node) == {"slurm": None}


@pytest.mark.parametrize("name, bf16", [
    ("h100", True), ("v100", False), ("tesla_v100-sxm2-32gb", False), ("tesla_t4", False), ("rtx6000ada", True),
    ("nvidia_a100-sxm4-80gb", True), (None, None),
])
def test_a_gpu_type_anywhere_in_nvmls_name_says_its_bf16(name, bf16):
    assert gpu_bf16(name) is bf16


def test_nvmls_gpu_names_find_their_family_memory():
    assert gpu_memory("nvidia_a100-sxm4-80gb") == 80 * GiB and gpu_memory("nvidia_h100_80gb_hbm3") == 80 * GiB
    assert gpu_memory("big") is None


MIXED = """\
a1|mix|gpu:a100:4|(null)|64|512000
v1|mix|gpu:v100:4|(null)|64|512000
c1|part|gpu:a100:4|(null)|64|512000
c2|part|(null)|(null)|64|1
g1|gpu|gpu:h100:4|(null)|64|512000
g2|gpu2|gpu:h100:4|(null)|64|512000
g1|gpu2|gpu:h100:4|(null)|64|512000
"""


def test_mixed_gpu_types_take_the_least_bf16_and_a_node_without_gpus_leaves_no_type():
    mix = node_of(parse_records(MIXED), "mix", gpu_memory)
    assert (mix.gpus, mix.gpu_name, mix.native_bf16, mix.gpu_memory_bytes) == (4, None, False, None)
    part = node_of(parse_records(MIXED), "part", gpu_memory)
    assert (part.gpus, part.gpu_name, part.gpu_memory_bytes, part.memory_bytes) == (0, None, None, None)
    assert with_override(part, parse_override("cpus=8"), gpu_memory, gpu_bf16).cpus == 8  # no gpu= asked for


def test_a_partition_list_is_every_node_of_its_partitions_once():
    node = node_of(parse_records(MIXED), "gpu,gpu2", gpu_memory)
    assert (node.gpus, node.gpu_name) == (4, "h100")
    assert node.where == "partition gpu,gpu2 (2 node(s): g1,g2)"


def test_a_device_changed_by_the_flag_takes_its_own_bf16():
    cpu = ComputeNode(gpus=0, native_bf16=False)
    assert with_override(cpu, parse_override("gpus=4,gpu=H100"), gpu_memory, gpu_bf16).native_bf16 is True
    gpu = ComputeNode(gpus=8, native_bf16=True, gpu_name="h100")
    assert with_override(gpu, parse_override("gpu=V100"), gpu_memory, gpu_bf16).native_bf16 is False
    assert with_override(gpu, parse_override("gpus=0"), gpu_memory, gpu_bf16).native_bf16 is None
    assert with_override(cpu, parse_override("gpus=4,bf16=emulated"), gpu_memory, gpu_bf16).native_bf16 is False

"""A parallel degree is a plug-in (issue 44): a phantom fifth degree, registered in this test alone
(``DEGREES.added``), is seen by run's flags and their checks, the legality table, a run record's layout,
compare's key, expectations' fields, a sweep's and a capacity search's axes and grid, and plan's candidates,
with no other edit; with its engine plan registered here too, the run path's mesh, a run record's ``degrees``
block and the run summary. Pure: nothing is launched."""

from __future__ import annotations

import argparse
import dataclasses
from typing import ClassVar

import pytest

from ds_bench.config import legality
from ds_bench.config.degrees import DEGREES, Degree
from ds_bench.config.layout import Layout, parse_key
from ds_bench.config.legality import Where
from ds_bench.config.run_flags import Parser, add_run_arguments, run_config
from ds_bench.engines.degrees.mesh import RESOLVERS, DegreePlan, register
from ds_bench.engines.degrees.mesh import resolve as resolve_mesh
from ds_bench.errors import UserError
from ds_bench.config import study_flags as study_flags
from ds_bench.perf.grid import families
from ds_bench.perf import space
from ds_bench.perf.datasheet import cluster_of
from ds_bench.perf.shapes import custom
from ds_bench.record.expect_file import ExpectFile, fields_of
from ds_bench.record.schema import RunRecord
from ds_bench.report.compare_match import samples
from ds_bench.report.degree_lines import degree_lines, replicas
from ds_bench.workloads import build_workload
from tests.conftest import REPO

PHANTOM = Degree(field="context_parallel", word="cp", flag="--context-parallel", metavar="C",
                 help="a phantom degree of this test", what="phantom context-parallel degree", called="phantom CP",
                 splits_replica=True, named="--context-parallel {context_parallel}",
                 deepspeed_only="the phantom is DeepSpeed's", deepspeed_only_source="this test",
                 divides_world="every replica needs a whole phantom group", compile="not measured yet",
                 divides_sequence="this test", candidates="world")
CONFIG = str(REPO / "ds_configs" / "zero1.json")
DS = {"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}


@pytest.fixture
def phantom():
    with DEGREES.added(PHANTOM):
        yield PHANTOM


def test_the_phantom_is_a_run_flag_checked_and_kept_in_the_run_config(phantom):
    p = Parser(prog="ds-bench run")
    add_run_arguments(p)
    cfg = run_config(p.parse_args(["--workload", "mnist", "--ds-config", CONFIG, "--context-parallel", "2"]))
    assert cfg.context_parallel == 2 and cfg.to_dict()["context_parallel"] == 2
    with pytest.raises(UserError, match="^--context-parallel must be a positive integer, got 0$"):
        run_config(p.parse_args(["--workload", "mnist", "--ds-config", CONFIG, "--context-parallel", "0"]))


def test_the_phantom_has_the_legality_tables_shared_rules(phantom):
    names = [r.name for r in legality.rules()]
    assert {"phantom CP is DeepSpeed's", "phantom CP and compile", "CP degree divides the ranks",
            "CP degree divides the sequence", "phantom CP and --breakdown"} <= set(names)
    layout = Layout(1, "none", "fp32", 2, context_parallel=3)
    assert legality.violation(layout, Where(world_size=4)) == (
        "--context-parallel 3 does not divide the world size 4: every replica needs a whole phantom group")
    ddp = Layout(0, "none", "fp32", 2, engine="ddp", context_parallel=2)
    assert legality.violation(ddp, Where(world_size=2)).startswith("--engine ddp with --context-parallel 2:")
    assert legality.violation(dataclasses.replace(layout, context_parallel=2, seq_len=1001), Where(world_size=4)) == (
        "--context-parallel 2 does not divide --seq-len 1001: every rank of a group holds an equal slice of the "
        "sequence")


def test_the_phantom_is_in_the_layout_key_the_run_record_and_compares_apart(phantom):
    layout = Layout(1, "none", "fp32", 2, context_parallel=2)
    assert layout.key == "cp2 z1 off=none fp32 mbs=2" and layout.model_parallel == 2 and layout.sequence_multiple == 2
    assert parse_key("cp2 z1 off=none fp32 mbs=2", layout) == layout and Layout.from_dict(layout.to_dict()) == layout

    def record(cp, tokens_per_s):
        return RunRecord(workload="gpt2", status="ok", world_size=2, config={"seq_len": 64, "context_parallel": cp},
                         ds_config=DS, metrics={"samples_per_s": 1.0, "tokens_per_s": tokens_per_s})
    with_cp, without = record(2, 100.0), record(None, 90.0)
    assert with_cp.layout["context_parallel"] == 2 and with_cp.layout_key == "cp2 z1 off=none fp32 mbs=2"
    assert without.layout["context_parallel"] == 1
    assert sorted(len(s.values) for s in samples([with_cp, record(2, 101.0), without]).values()) == [1, 2]


def test_the_phantom_is_an_expectation_field(phantom):
    assert "context_parallel" in fields_of("run") and "context_parallel" in fields_of("capacity")
    ExpectFile.model_validate({"expectations": [{"name": "cp", "kind": "run", "metric": "tokens_per_s",
                                                 "where": {"context_parallel": 2}, "at_least": 1}]})


def test_the_phantom_is_a_study_axis_in_the_sweep_and_capacity_grids(phantom):
    p = argparse.ArgumentParser()
    study_flags.add_degree_arguments(p)
    args = p.parse_args(["--context-parallel", "1,2"])
    degrees = study_flags.degrees_of(args)
    assert degrees["context_parallel"] == (1, 2)
    assert study_flags.axis_flags()["context_parallel"] == "--context-parallel"
    grid = families((1,), ("none",), ("fp32",), (1,), degrees=degrees)
    assert [f.context_parallel for f in grid] == [1, 2] and grid[1].family_label() == "cp2 z1 off=none fp32"


def test_the_phantom_is_among_plans_candidates(phantom):
    cluster = cluster_of("H100", 1, 4, "bf16")
    shape = custom("t", 4, 256, 4, vocab=1000, seq_len=128)
    values = space.degree_values(shape, cluster, space.Space())
    assert values["context_parallel"] == [1, 2, 4]
    picked = {c.layout.context_parallel for c in space.candidates(shape, cluster, space.Space(), 64)}
    assert picked == {1, 2, 4}


def test_without_the_phantom_nothing_knows_it():
    assert "context_parallel" not in DEGREES.fields()
    with pytest.raises(TypeError, match="unexpected keyword argument 'context_parallel'"):
        Layout(1, "none", "fp32", 2, context_parallel=2)


@dataclasses.dataclass(frozen=True)
class PhantomPlan(DegreePlan):
    """The phantom's engine side: groups of consecutive ranks sharing a replica, its one setting."""

    field: ClassVar[str] = "context_parallel"
    size: int

    def record_settings(self) -> dict:
        return {"ring": "phantom"}


@pytest.fixture
def phantom_plan(phantom):
    register("context_parallel")(lambda cfg, workload, world, local: cfg.context_parallel and PhantomPlan(cfg.context_parallel))
    try:
        yield
    finally:
        RESOLVERS.pop("context_parallel")


def test_the_phantom_joins_the_run_paths_mesh_its_record_block_and_the_summary(phantom_plan):
    """Resolved from the run's flags by the resolver its engine module registers, the phantom's plan is in the
    mesh the run path reads (data-parallel size, record blocks, batches of its replica), and a run record with its
    block is summarised with its word and setting."""
    p = Parser(prog="ds-bench run")
    add_run_arguments(p)
    cfg = run_config(p.parse_args(["--workload", "mnist", "--ds-config", CONFIG, "--context-parallel", "2"]))
    mesh = resolve_mesh(cfg, build_workload(cfg), 4, 4)
    assert [plan.field for plan in mesh.plans] == ["context_parallel"] and mesh.data_parallel_size == 2
    assert mesh.record_blocks() == {"context_parallel": {"size": 2, "settings": {"ring": "phantom"}}}

    class Replicas:
        def batches(self, rank, world_size, micro_batch):
            return iter([(rank, world_size)])
    assert [next(mesh.batches(Replicas(), rank, 2)) for rank in range(4)] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    record = RunRecord(workload="mnist", status="ok", world_size=4, data_parallel_size=2, config=cfg.to_dict(),
                       ds_config=DS, degrees=mesh.record_blocks())
    assert record.degree_size("context_parallel") == 2 and record.layout["context_parallel"] == 2
    assert degree_lines(record) == ["  cp           cp2, ring phantom"]
    assert replicas(record) == "2 data-parallel (cp2)"

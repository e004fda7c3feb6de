"""``ds-bench capacity`` over expert-parallel layouts (``--workload moe``).

Pure: a scaled moe family counts its members with ``moe_shapes`` (the router from ``--experts`` / ``--top-k``
after ``--``) and names the experts' share of each, which the prediction shards over EP; ``--scale seq`` takes a
moe size. The plan (``--dry-run``) lists the ep layouts, skipping what the legality table refuses (ZeRO-3 for
moe, EP > 1 at ZeRO-0), and refuses an EP a dense workload or the experts cannot take, in one line.
"""

from __future__ import annotations

import pytest

from ds_bench.capacity.family import scaled_family, seq_member
from ds_bench.record.schema import CapacityRecord
from ds_bench.report.capacity_table import layout_text
from ds_bench.workloads import moe_shapes
from tests.conftest import degree, ds_bench, explain, size_of


def test_a_scaled_moe_family_counts_with_the_routers_experts():
    members = scaled_family("layers", 2, 64, 4, 3, 32, workload="moe", router=(6, 3))
    assert [m.name for m in members] == ["2 x 64 x 4", "4 x 64 x 4", "6 x 64 x 4"]
    shapes = [moe_shapes.custom_shape(layers, 64, 4, 6, 3) for layers in (2, 4, 6)]
    assert [m.params for m in members] == [moe_shapes.param_count(s) for s in shapes]
    assert [m.expert_params for m in members] == [moe_shapes.expert_param_count(s) for s in shapes]
    assert members[0].expert_params == 2 * 6 * 3 * 64 * moe_shapes.custom_shape(2, 64, 4, 6, 3).expert_intermediate
    default = scaled_family("layers", 2, 64, 4, 1, 32, workload="moe")[0]
    assert default.params == moe_shapes.param_count(moe_shapes.custom_shape(2, 64, 4, 8, 2))  # Mixtral's 8, top-2
    assert members[0].largest_layer_params == moe_shapes.GPT2_VOCAB * 64 and members[0].vocab == moe_shapes.GPT2_VOCAB
    assert scaled_family("layers", 2, 64, 4, 1, 32)[0].expert_params == 0  # GPT-2: dense


def test_a_moe_size_is_a_base_of_scale_seq():
    m = seq_member("moe", ("--size", "tiny"), 4096, (None, None))
    assert (m.name, m.seq_len, m.params) == ("seq 4096", 4096, moe_shapes.param_count(moe_shapes.SHAPES["tiny"]))
    assert m.expert_params == moe_shapes.expert_param_count(moe_shapes.SHAPES["tiny"])


def test_the_table_labels_an_expert_parallel_layout_with_every_rank_data_parallel():
    point = {"stage": 1, "offload": "none", "precision": "fp32", "micro_batch": 1, "expert_parallel": 2}
    record = CapacityRecord(kind="capacity", capacity="x", point=point, data_parallel_size=2, status="ok")
    assert layout_text(record) == "ep2 dp2 z1 off=none fp32 mbs=1"


def plan(tmp_path, *args):
    return ds_bench("capacity", "--ds-config", "zero1.json", "--precision", "fp32", "--dry-run",
                    "--results", str(tmp_path / "c.jsonl"), *args, HF_HUB_OFFLINE="1")


def test_the_plan_lists_ep_layouts_and_skips_what_deepspeed_refuses(tmp_path):
    proc = plan(tmp_path, "--workload", "moe", "--stages", "0,1,2,3", "--expert-parallel", "1,2", "--scale", "layers",
                "--layers", "2", "--hidden", "256", "--heads", "4", "--max-scale", "2", "--", "--experts", "8",
                "--top-k", "2")
    assert proc.returncode == 0, explain(proc)
    layouts = proc.stdout.split("layouts:")[1].split("family")[0].splitlines()
    assert "  ep2 z1 off=none fp32 mbs=1" in layouts and "  ep2 z2 off=none fp32 mbs=1" in layouts
    assert "  z1 off=none fp32 mbs=1" in layouts
    assert any(line.startswith("  ep2 z0 off=none fp32 mbs=1  skipped: --expert-parallel 2 with ZeRO stage 0")
               for line in layouts)
    assert sum("skipped: --workload moe under ZeRO stage 3" in line for line in layouts) == 2
    first = moe_shapes.custom_shape(2, 256, 4, 8, 2)
    assert (f"{'2 x 256 x 4':<18} {moe_shapes.param_count(first) / 1e6:10.1f}M parameters, "
            f"{moe_shapes.expert_param_count(first) / 1e6:.1f}M of them in experts") in proc.stdout
    assert not (tmp_path / "c.jsonl").exists()


@pytest.mark.parametrize("args, message", [
    (("--workload", "gpt2", "--expert-parallel", "1,2", "--scale", "layers", "--layers", "2", "--hidden", "64",
      "--heads", "2"), "--expert-parallel: workload gpt2 has no experts (moe has)"),
    (("--workload", "moe", "--nproc", "4", "--expert-parallel", "4", "--scale", "layers", "--layers", "2", "--hidden",
      "64", "--heads", "2", "--", "--experts", "6"), "--expert-parallel 4 does not divide the model's 6 experts"),
    (("--workload", "moe", "--expert-parallel", "2", "--scale", "seq", "--size", "tiny", "--", "--top-k", "5"),
     "--top-k 5 is above the model's 4 experts"),
])
def test_the_plan_refuses_an_ep_its_model_cannot_take_in_one_line(tmp_path, args, message):
    proc = plan(tmp_path, *args)
    assert proc.returncode == 2, explain(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ds-bench: error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in proc.stderr, explain(proc)


@pytest.mark.dist
@pytest.mark.full  # make test's 15 minutes; CI runs it in the full tier
def test_a_real_ep2_search_counts_its_members_as_the_runs_do(tmp_path):
    """A real search (~30 s here: 2 probes of a 1- and a 2-block moe, 4 experts, on 2 CPU ranks at EP = 2): every
    probe is a run with its experts sharded (2 of 4 per rank), the family's parameters and experts' share are the
    runs' (``moe_shapes`` against the built model), the second probe is predicted from the first, and the table
    labels the layout ``ep2 dp2``."""
    from tests.conftest import records

    results = tmp_path / "c.jsonl"
    proc = ds_bench("capacity", "--ds-config", "zero1.json", "--workload", "moe", "--stages", "1", "--expert-parallel",
                    "2", "--precision", "fp32", "--scale", "layers", "--layers", "1", "--hidden", "64", "--heads", "4",
                    "--max-scale", "2", "--seq-len", "16", "--launcher", "torchrun", "--steps", "1", "--warmup", "0",
                    "--results", str(results), "--master-port", "29892", "--timeout", "3m", "--", "--experts", "4",
                    timeout=600, HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, explain(proc)
    recs, runs = records(results), records(results.with_suffix(".runs.jsonl"))
    (answer,) = [r for r in recs if r["kind"] == "capacity"]
    assert answer["status"] == "ok" and answer["largest"]["member"] == "2 x 64 x 4", answer
    assert answer["data_parallel_size"] == 2
    members = {m.name: m for m in scaled_family("layers", 1, 64, 4, 2, 16, workload="moe", router=(4, None))}
    by_run = {r["run_id"]: r for r in runs}
    probes = sorted((r for r in recs if r["kind"] == "capacity_probe"), key=lambda r: r["index"])
    assert [p["member"] for p in probes] == ["1 x 64 x 4", "2 x 64 x 4"]
    for p in probes:
        run, member = by_run[p["run_id"]], members[p["member"]]
        assert run["status"] == "ok" and size_of(run, "expert_parallel") == 2
        assert degree(run, "expert_parallel")["settings"]["local_experts"] == 2
        assert run["params"] == member.params and run["largest_layer_params"] == member.largest_layer_params
        assert run["build"]["rank_params_held"]["experts"] * 2 == member.expert_params
    assert probes[0]["predicted_mem_bytes"] is None and probes[1]["predicted_mem_bytes"] > 0
    assert "ep2 dp2 z1 off=none fp32 mbs=1" in proc.stdout

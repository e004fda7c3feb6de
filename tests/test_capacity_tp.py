"""``ds-bench capacity`` over tensor-parallel layouts (DeepSpeed AutoTP, ``--workload llama``).

Pure: the ``llama3`` family is Meta's published sizes in order, a scaled Llama family counts its members
with Llama's formula, the table labels a TP layout ``tp2 dp1``. The plan (``--dry-run``) lists the TP
layouts and refuses TP with a pipeline by name. The real search (``full`` tier: 6 probes, ~2 min) runs on
2 CPU ranks under a per-rank cap: ZeRO-1 over 2 data-parallel ranks against 2 AutoTP ranks, widths
256 .. 1536 of a 2-block Llama (fp32). TP must fit a strictly larger member (each TP rank holds half of
every projection and of the vocabulary-parallel embedding: 8 B per parameter against ZeRO-1's 12),
each answer a member that really trained as its layout says, the next one really out of memory.
Measured (AMD EPYC, 2 cores, cap 1.5 GiB): DP 2 x 768 x 12 (52.8M) at 1.40 GiB, TP 2 x 1024 x 16
(77.2M) at 1.34 GiB; 1 min 59 s.
"""

import pytest

from ds_bench.capacity.family import named_family, scaled_family
from ds_bench.record.schema import CapacityRecord
from ds_bench.report.capacity_table import layout_text
from ds_bench.workloads import llama_shapes
from tests.conftest import degree, ds_bench, explain, records, size_of

CAP_GIB = 1.5


def test_the_llama3_family_is_metas_sizes_smallest_first():
    members = named_family("llama3", 1024)
    assert [m.name for m in members] == ["llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "llama3.1-70b"]
    assert [m.params for m in members] == [1_235_814_400, 3_212_749_824, 8_030_261_248, 70_553_706_496]
    assert members[0].run_args == ("--size", "llama3.2-1b") and members[0].largest_layer_params == 128256 * 2048


def test_a_scaled_llama_family_counts_with_llamas_formula():
    members = scaled_family("hidden", 2, 256, 4, 3, 32, workload="llama")
    assert [m.name for m in members] == ["2 x 256 x 4", "2 x 512 x 8", "2 x 768 x 12"]
    assert [m.params for m in members] == [llama_shapes.param_count(llama_shapes.custom_shape(2, w, w // 64))
                                           for w in (256, 512, 768)]
    assert members != scaled_family("hidden", 2, 256, 4, 3, 32)  # GPT-2's shapes count otherwise


def test_the_table_labels_a_tensor_parallel_layout():
    point = {"stage": 1, "offload": "none", "precision": "fp32", "micro_batch": 1, "tensor_parallel": 2}
    record = CapacityRecord(kind="capacity", capacity="x", point=point, data_parallel_size=1, status="ok")
    assert layout_text(record) == "tp2 dp1 z1 off=none fp32 mbs=1"
    assert layout_text(record.model_copy(update={"point": {**point, "tensor_parallel": 1},
                                                 "data_parallel_size": 2})).startswith("dp2 z1")


def test_the_plan_lists_tensor_parallel_layouts_and_refuses_one_with_a_pipeline(tmp_path):
    proc = ds_bench("capacity", "--ds-config", "zero1.json", "--workload", "llama", "--family", "llama3",
                    "--tensor-parallel", "1,2", "--pipeline-stages", "1,2", "--precision", "fp32", "--dry-run",
                    "--results", str(tmp_path / "c.jsonl"))
    assert proc.returncode == 0, explain(proc)
    layouts = proc.stdout.split("layouts:")[1].split("family")[0]
    assert "  tp2 z1 off=none" in layouts and "  pp2 z1 off=none" in layouts
    assert "pp2 tp2 z1 off=none fp32 mbs=1  skipped: --tensor-parallel 2 with --pipeline-stages 2: AutoTP does not combine with DeepSpeed's pipeline" in layouts
    assert "llama3.1-70b" in proc.stdout and not (tmp_path / "c.jsonl").exists()


@pytest.mark.dist
@pytest.mark.full
def test_a_real_search_finds_tensor_parallelism_fits_a_larger_model(tmp_path):
    results = tmp_path / "c.jsonl"
    proc = ds_bench("capacity", "--ds-config", "zero1.json", "--workload", "llama", "--stages", "1",
                    "--tensor-parallel", "1,2", "--precision", "fp32", "--scale", "hidden", "--layers", "2",
                    "--hidden", "256", "--heads", "4", "--seq-len", "32", "--max-scale", "6",
                    "--cpu-mem-limit", f"{CAP_GIB}GiB", "--launcher", "torchrun", "--steps", "2", "--warmup", "1",
                    "--results", str(results), "--master-port", "29885", "--timeout", "4m",
                    timeout=900, HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, explain(proc)
    recs, runs = records(results), records(results.with_suffix(".runs.jsonl"))
    by_run = {r["run_id"]: r for r in runs if r.get("run_id")}
    summaries = {r["point"]["tensor_parallel"]: r for r in recs if r["kind"] == "capacity"}
    assert set(summaries) == {1, 2}
    for tp, summary in summaries.items():
        largest, nxt = summary["largest"], summary["next"]
        assert summary["status"] == "ok" and summary["data_parallel_size"] == 2 // tp, summary
        best_run = by_run[largest["run_id"]]
        assert best_run["status"] == "ok" and best_run["metrics"]["peak_mem_bytes"] <= CAP_GIB * 2**30
        assert (size_of(best_run, "tensor_parallel") or 1) == tp
        assert (degree(best_run, "tensor_parallel").get("comm") is not None) == (tp > 1)
        assert nxt is not None and nxt["why"] in ("oom", "predicted"), summary
        if nxt["why"] == "oom":
            assert any((r.get("failure") or {}).get("kind") == "oom" and (size_of(r, "tensor_parallel") or 1) == tp
                       for r in runs), nxt
    dp, tp = (summaries[t]["largest"] for t in (1, 2))
    print(f"largest under {CAP_GIB} GiB per rank: DP {dp['member']} ({dp['params']:,}), TP {tp['member']} "
          f"({tp['params']:,})")
    assert tp["params"] > dp["params"]
    assert "tp2 dp1 z1" in proc.stdout

"""Run records keep their parallel degrees in one map (``degrees``; issue 44): a record written before it, with the
degrees' old top-level keys (``pipeline_stages``, ``micro_batches``, ``tensor_parallel_comm``, ``expert_parallel``...),
is read with the same map a new record of its layout has, so the two compare as one measurement; the summary's lines
and a record's accessors read the map. Pure: inline records."""

from __future__ import annotations

from ds_bench.record.schema import RunRecord
from ds_bench.report.compare_match import samples
from ds_bench.report.degree_lines import degree_lines, replicas

DS = {"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "train_batch_size": 4}
EXPERTS = {"path": "moe-layer", "experts": 4, "local_experts": 2, "data_parallel_size": 2,
           "expert_data_parallel_size": 1, "top_k": 2, "capacity_factor": None, "drop_tokens": False,
           "aux_loss_weight": 0.02}


def _record(tokens_per_s: float, config: dict, **keys) -> RunRecord:
    return RunRecord(workload="llama", status="ok", world_size=2, engine="deepspeed", config={"seq_len": 64, **config},
                     ds_config=DS, metrics={"samples_per_s": 1.0, "tokens_per_s": tokens_per_s}, **keys)


def test_an_old_tensor_parallel_record_reads_as_a_new_one_and_pools_with_it():
    old = _record(100.0, {"tensor_parallel": 2}, tensor_parallel=2, data_parallel_size=1, tensor_parallel_comm={
        "all_reduce_ms": 12.5, "calls_per_step": 32, "share_of_step": 0.08, "bytes_per_step": 1e6})
    new = _record(110.0, {"tensor_parallel": 2}, data_parallel_size=1, degrees={"tensor_parallel": {
        "size": 2, "comm": {"collective": "all_reduce", "ms_per_step": 12.5, "calls_per_step": 32,
                            "share_of_step": 0.08, "bytes_per_step": 1e6}}})
    assert old.degrees == new.degrees and old.degree_size("tensor_parallel") == 2
    assert "tensor_parallel_comm" not in old.model_dump() and old.layout_key == new.layout_key
    assert [len(s.values) for s in samples([old, new]).values()] == [2]
    assert degree_lines(old) == degree_lines(new) == [
        "  tp           tp2",
        "  tp comm      12.5 ms per step in AutoTP's all-reduces (8.0% of rank 0's step), 32 all-reduces per step"]
    assert replicas(old) == "1 data-parallel (tp2)"


def test_an_old_pipeline_record_keeps_its_settings_in_its_block():
    old = _record(50.0, {"pipeline_stages": 2}, pipeline_stages=2, data_parallel_size=1, micro_batches=2,
                  partition="parameters", schedule_bubble=1 / 3)
    block = old.degrees["pipeline_stages"]
    assert (block.size, block.settings) == (2, {"micro_batches": 2, "partition": "parameters",
                                                 "schedule_bubble": 1 / 3})
    assert old.setting("schedule_bubble") == 1 / 3 and old.setting("no such setting") is None
    assert degree_lines(old) == ["  pp           pp2, 2 micro-batches per step, partition parameters, schedule bubble "
                                 "(P-1)/(m+P-1) = 33%"]


def test_an_old_moe_record_splits_its_comm_from_its_load_balance_and_another_router_is_another_measurement():
    comm = {"all_to_all_ms": 3.0, "calls_per_step": 16, "share_of_step": 0.02, "bytes_per_step": 2e5,
            "load_max_over_mean": 1.5, "load_max_over_mean_worst": 1.9, "dropped_share": 0.0}
    config = {"workload": "moe", "expert_parallel": 2}
    old = _record(10.0, config, expert_parallel={"size": 2, **EXPERTS}, expert_parallel_comm=comm)
    block = old.degrees["expert_parallel"]
    assert (block.size, block.settings, block.comm.collective, block.comm.ms_per_step) == (2, EXPERTS, "all_to_all", 3.0)
    assert block.measured == {"load_max_over_mean": 1.5, "load_max_over_mean_worst": 1.9, "dropped_share": 0.0}
    assert degree_lines(old)[1].endswith("16 all-to-alls per step; load max/mean 1.50 (worst step 1.90), 0.0% of "
                                         "routes dropped")
    heavier = _record(10.0, config, degrees={"expert_parallel": {"size": 2, "settings": {**EXPERTS,
                                                                                         "aux_loss_weight": 0.1}}})
    assert sorted(len(s.values) for s in samples([old, heavier]).values()) == [1, 1]


def test_a_data_parallel_record_has_no_degrees():
    plain = _record(1.0, {})
    assert plain.degrees is None and degree_lines(plain) == [] and replicas(plain) == "2"

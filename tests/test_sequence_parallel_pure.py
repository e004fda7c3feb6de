"""DeepSpeed-Ulysses sequence parallelism and ALST's tiling, the pure parts: the layout ``--sequence-parallel``
resolves to (``ds_bench.engines.degrees.sequence_parallel``), how a batch is sliced over a group, the config and
gradient scale DeepSpeed gets, the loss tiles (``ds_bench.engines.tiling``), the layout keys, the all-to-all
elements a workload sends and the comm-bound verdict's bytes for them. No process group: the 2-rank runs
that train with it are the engine's tests.
"""

from __future__ import annotations

import json

import pytest
import torch

from ds_bench.config.layout import Layout, parse_key
from ds_bench.config.run_config import RunConfig
from ds_bench.engines import tiling
from ds_bench.engines.degrees import sequence_parallel as sp
from ds_bench.engines.degrees.mesh import Mesh
from ds_bench.errors import UserError
from ds_bench.perf import bus_bytes, comm_bound
from ds_bench.workloads import build_workload
from tests.conftest import REPO

CONFIG = str(REPO / "ds_configs" / "zero1.json")


# --- resolve: S against the world, the heads, the KV heads and the sequence --------------------------------

def test_no_flag_is_no_plan():
    assert sp.resolve(None, 4, 4, 2, 64) is None


def test_a_plan_is_s_by_d_ranks_in_groups_of_consecutive_ranks():
    """4 ranks, S=2: D=2 replicas; ranks 0-1 share replica 0's sequences, ranks 2-3 replica 1's."""
    plan = sp.resolve(2, 4, 4, 2, 64)
    mesh = Mesh(4, (plan,))
    assert plan == sp.SequenceParallelPlan(2, 2) and mesh.data_parallel_size == 2
    assert mesh.record_blocks() == {"sequence_parallel": {"size": 2, "settings": None}}
    assert [mesh.data_parallel.replica(r) for r in range(4)] == [0, 0, 1, 1]
    assert [plan.group_rank(r) for r in range(4)] == [0, 1, 0, 1]
    assert sp.resolve(4, 8, 32, 8, 4096) == sp.SequenceParallelPlan(4, 2)


def test_s_must_divide_the_attention_heads():
    with pytest.raises(UserError, match=r"^--sequence-parallel 3 does not divide the model's 4 attention heads: Ulysses "
                                        r"gives every rank of a group an equal share of the heads$"):
        sp.resolve(3, 3, 4, 2, 33)


def test_kv_heads_divide_s_and_are_replicated_or_s_divides_them():
    """Tiny Llama's 2 KV heads over S=4: each replicated twice (KV divides S); Llama 3's 8 over S=4: split (S
    divides KV); 3 KV heads of 12 heads over S=2: neither, refused."""
    assert sp.resolve(4, 4, 4, 2, 64).size == 4
    assert sp.resolve(4, 4, 32, 8, 64).size == 4
    assert sp.resolve(6, 6, 12, 3, 60).size == 6  # 3 KV heads divide 6: replicated twice
    with pytest.raises(UserError, match=r"^--sequence-parallel 2 with the model's 3 KV heads: Ulysses needs the KV heads "
                                        r"to divide S \(they are replicated\) or S to divide them$"):
        sp.resolve(2, 2, 12, 3, 64)


def test_s_must_divide_the_sequence():
    with pytest.raises(UserError, match=r"^--sequence-parallel 2 does not divide --seq-len 33$"):
        sp.resolve(2, 2, 4, 2, 33)


# --- shard: one rank's slice of a batch ----------------------------------------------------------------

IDS = torch.arange(100, 116).reshape(2, 8)
"""A [batch 2, T 8] token batch: row 0 is 100..107, row 1 108..115."""


def test_each_rank_gets_its_slice_with_positions_in_the_whole_sequence():
    first, second = sp.shard(IDS, 0, 2), sp.shard(IDS, 1, 2)
    assert torch.equal(first["input_ids"], IDS[:, :4]) and torch.equal(second["input_ids"], IDS[:, 4:])
    assert first["position_ids"].tolist() == [[0, 1, 2, 3]] * 2
    assert second["position_ids"].tolist() == [[4, 5, 6, 7]] * 2
    assert all(t.is_contiguous() for t in (*first.values(), *second.values()) if isinstance(t, torch.Tensor))


def test_labels_are_shifted_before_the_split_and_only_the_last_rank_ends_in_ignore():
    """Rank 0's last label is rank 1's first token (the shift crosses the slice boundary); only the sequence's
    last position, on the last rank, has no next token."""
    first, second = sp.shard(IDS, 0, 2), sp.shard(IDS, 1, 2)
    assert first["shift_labels"].tolist() == [[101, 102, 103, 104], [109, 110, 111, 112]]
    assert second["shift_labels"].tolist() == [[105, 106, 107, sp.IGNORE], [113, 114, 115, sp.IGNORE]]
    four = [sp.shard(IDS, r, 4)["shift_labels"] for r in range(4)]
    assert [int((labels == sp.IGNORE).sum()) for labels in four] == [0, 0, 0, 2]
    assert torch.equal(torch.cat(four, dim=1)[:, :-1], IDS[:, 1:])


def test_the_loss_is_averaged_over_the_whole_batchs_predicted_tokens():
    """``tokens`` counts batch x (T-1), the same on every rank: the group's token sums over it are SP=1's mean."""
    for rank in range(2):
        batch = sp.shard(IDS, rank, 2, gradient_scale=2)
        assert (batch["tokens"], batch["gradient_scale"], batch["group_size"]) == (14, 2, 2)
        assert all(type(batch[k]) is int for k in ("tokens", "gradient_scale", "group_size"))  # host, no device sync
        assert float(sp.token_weight(batch)) == pytest.approx(2 / 14)
    alone = sp.shard(IDS, 0, 1)  # --tiled-loss without sequence parallelism: the whole sequence, S=1
    assert torch.equal(alone["input_ids"], IDS) and int((alone["shift_labels"] == sp.IGNORE).sum()) == 2


def test_shard_batches_slices_every_batch_of_the_stream():
    stream = iter([{"input_ids": IDS}, {"input_ids": IDS + 100}])
    out = list(sp.shard_batches(stream, 1, 2, 3))
    assert [b["input_ids"][0, 0].item() for b in out] == [104, 204] and int(out[0]["gradient_scale"]) == 3


def test_group_loss_of_one_rank_is_the_mean_and_back_propagates_the_weighted_sum():
    """S=1 (no all-reduce): the value is the token sum x 1 / tokens, the gradient the weighted sum's."""
    batch = sp.shard(IDS, 0, 1, gradient_scale=1)
    x = torch.tensor(3.0, requires_grad=True)
    weighted = x * 7 * sp.token_weight(batch)
    loss = sp.group_loss(weighted, batch)
    loss.backward()
    assert loss.detach().item() == pytest.approx(21 / 14) and x.grad.item() == pytest.approx(7 / 14)


# --- what DeepSpeed gets ----------------------------------------------------------------------------------

def test_deepspeed_config_adds_sequence_parallel_size_only_with_ulysses():
    ds_cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}}
    assert sp.deepspeed_config(None, ds_cfg) is ds_cfg
    assert sp.deepspeed_config(sp.SequenceParallelPlan(1, 4), ds_cfg) is ds_cfg
    assert sp.deepspeed_config(sp.SequenceParallelPlan(2, 2), ds_cfg) == {**ds_cfg, "sequence_parallel_size": 2}
    assert "sequence_parallel_size" not in ds_cfg


@pytest.mark.parametrize("stage,scale", [(0, 1), (1, 1), (2, 1), (3, 4)])
def test_gradient_scale_is_s_at_zero_3_only(stage, scale):
    """DeepSpeed 0.19.8 divides ZeRO-3's gradients by every rank of the group too (measured; module docstring)."""
    plan = sp.with_stage(sp.SequenceParallelPlan(4, 2), stage)
    assert plan.gradient_scale == scale and plan.zero_stage == stage and plan.size == 4


# --- tiling: the loss tiles --------------------------------------------------------------------------------

def test_loss_tiles_hold_at_most_the_tile_budget_of_fp32_logits():
    """256 MiB of fp32 logits per tile: one tile up to 67,108,864 logits, then one more per started budget."""
    budget = tiling.LOSS_TILE_BYTES // 4
    assert tiling.loss_tiles(1, 10) == 1
    assert tiling.loss_tiles(budget // 1024, 1024) == 1 and tiling.loss_tiles(budget // 1024 + 1, 1024) == 2
    assert tiling.loss_tiles(8192, 128256) == 16  # Llama 3 at 8K tokens: 3.9 GiB of logits
    assert tiling.loss_tiles(4096, 50257) == 4  # GPT-2's vocabulary at 4K tokens: 0.77 GiB, 3.07 budgets


# --- layout keys -------------------------------------------------------------------------------------------

def test_sequence_parallel_and_tiling_round_trip_through_the_key():
    layout = Layout(1, "none", "bf16", 4, sequence_parallel=2, seq_len=4096, tiled_mlp=True, tiled_loss=True)
    assert layout.key == "sp2 z1 off=none bf16 mbs=4 seq=4096 tiled-mlp tiled-loss"
    assert layout.label(2) == "sp2 dp2 z1 off=none bf16 mbs=4 seq=4096 tiled-mlp tiled-loss"
    assert layout.model_parallel == 2 and layout.data_parallel(8) == 4 and layout.degrees() == {"sequence_parallel": 2}
    assert parse_key(layout.key, Layout(0, "none", "fp32", 1)) == layout
    assert Layout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout
    assert layout.run_flags() == ["--sequence-parallel", "2", "--seq-len", "4096", "--tiled-mlp", "--tiled-loss"]
    only_loss = parse_key("z3 off=none bf16 mbs=1 tiled-loss", Layout(0, "none", "fp32", 1))
    assert (only_loss.tiled_loss, only_loss.tiled_mlp, only_loss.sequence_parallel) == (True, False, 1)


@pytest.mark.parametrize("word", ["sp0", "spx", "tiled-attn"])
def test_a_bad_sp_or_tiling_word_is_named_with_what_a_key_takes(word):
    with pytest.raises(ValueError, match=rf"^'{word}' is not .*ppN, tpN, spN, .*tiled-mlp, tiled-loss, .*sp-path=ulysses\|autosp, deepcompile, stack=LABEL$"):
        parse_key(f"z1 {word} mbs=2", Layout(0, "none", "fp32", 1))


# --- the all-to-alls a rank sends, and the comm-bound verdict ----------------------------------------------

def tiny_llama(**kw):
    return build_workload(RunConfig(workload="llama", ds_config=CONFIG, size="tiny", seq_len=64, **kw))


def test_all_to_all_elements_of_tiny_llama():
    """Tiny Llama (2 layers, 4 heads, 2 KV heads of width 16), micro-batch 2, T=64. S=2: a rank's slice is
    2 x 32 tokens; per layer and pass q and the output send 4 heads each, k and v 2 each: (8 + 4) x 16 x 64 =
    12,288 elements; 2 layers x (forward + backward) = 4 passes, 6 with activation checkpointing (the forward
    again). S=4: the 2 KV heads are replicated to 4 first, (8 + 8) x 16 x 2 x 16 = 8,192 per pass."""
    plain, ckpt = tiny_llama(), tiny_llama(activation_checkpointing=True)
    assert plain.sequence_parallel_all_to_alls() == 16 and ckpt.sequence_parallel_all_to_alls() == 24
    assert plain.sequence_parallel_all_to_all_elements(2, 2) == 4 * 12_288
    assert ckpt.sequence_parallel_all_to_all_elements(2, 2) == 6 * 12_288
    assert plain.sequence_parallel_all_to_all_elements(2, 4) == 4 * 8_192


PSI = 1_000_000
ELEMENTS = 4 * 12_288


def sp_entry(**kw):
    args = dict(stage=1, precision="bf16", ds_cfg={}, params=PSI, world_size=4, micro_steps=2, step_ms=1e3,
                hosts=["n1"], backend="gloo", busbw=None, comm_results="-", sequence_parallel=2,
                sp_all_to_all_elements=ELEMENTS)
    return comm_bound.for_run(**{**args, **kw})


def test_the_verdict_adds_a_ranks_all_to_alls_to_the_data_parallel_collectives():
    """SP=2 on 4 ranks, bf16, 2 micro-steps: ZeRO-1's collectives over all 4 ranks (every rank holds the whole
    model), and (S-1)/S x elements x 2 bytes x 2 micro-steps of all-to-all per rank, keyed sp_all_to_all."""
    entry = sp_entry(busbw=10.0)
    assert entry["bus_bytes_per_step"] == {**bus_bytes.bus_bytes_per_step(1, PSI, 2, 2, 4, 2),
                                           "sp_all_to_all": 0.5 * ELEMENTS * 2 * 2}
    assert bus_bytes.sequence_parallel_bus_bytes(4, 1000, 4, 3) == 0.75 * 1000 * 4 * 3
    assert entry["busbw_GBps"]["sp_all_to_all"] == 10.0


def comm_record(tmp_path, collectives: dict[str, float]):
    results = [{"scope": "world", "collective": c, "size_bytes": 2**22, "busbw_GBps": bw, "wrong": []}
               for c, bw in collectives.items()]
    path = tmp_path / "comm.jsonl"
    path.write_text(json.dumps({"kind": "comm", "status": "ok", "world_size": 4, "backend": "gloo",
                                "hosts": ["n1"] * 4, "run_id": "c1", "results": results}) + "\n")
    return str(path)


def test_the_all_to_alls_are_timed_at_the_comm_runs_all_to_all_busbw_else_at_all_reduces(tmp_path):
    with_a2a = sp_entry(comm_results=comm_record(tmp_path, {"all_reduce": 4.0, "reduce_scatter": 3.0,
                                                            "all_gather": 3.0, "all_to_all": 1.0}))
    assert with_a2a["busbw_GBps"] == {"reduce_scatter": 3.0, "all_gather": 3.0, "sp_all_to_all": 1.0}
    without = sp_entry(comm_results=comm_record(tmp_path, {"all_reduce": 4.0}))
    assert without["busbw_GBps"]["sp_all_to_all"] == 4.0
    moved = without["bus_bytes_per_step"]
    assert without["comm_ms_lower_bound"] == pytest.approx(sum(moved.values()) / 4e9 * 1e3)

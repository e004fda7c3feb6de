"""Expert parallelism's arithmetic and measurements, against DeepSpeed's own: the layout an ``--expert-parallel``
plan gives each rank (``ExpertParallelPlan``) against the groups DeepSpeed builds, the router's capacity against
``sharded_moe._capacity``, the dropped routes it implies against what DeepSpeed's gate drops, and the record's
load balance (``ds_bench.measure.expert_load``) on inline per-rank timers. Then one real 2-rank run, EP = 2 with
token dropping on (``--capacity-factor 1.0``): it trains, and records the layout, the all-to-alls, the load
balance, a dropped share above 0 and the whole model's parameters; in the full tier EP = 1 on the same 2 ranks
gives the same losses.

The model itself (HF's Mixtral at EP = 1, the placed build, its counts and FLOPs): tests/test_moe_model.py.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from ds_bench.engines.degrees.expert_parallel import ExpertParallelPlan, Router
from ds_bench.measure import expert_load
from ds_bench.measure.expert_load import DROPPED, ROUTED, TOKENS, load_balance, routes_dropped
from ds_bench.workloads import moe_shapes
from tests.conftest import OFFLINE, degree, explain, records, run_cmd, size_of

# ---- the plan against DeepSpeed's groups --------------------------------------------------------------------------


class FakeWorld:
    """What ``deepspeed.utils.groups`` asks of ``deepspeed.comm`` to build its expert groups, for one rank of a
    world that does not exist (``new_group`` returns the ranks)."""

    def __init__(self, world_size: int, rank: int):
        self.world_size, self.rank = world_size, rank

    def is_initialized(self):
        return True

    def get_world_size(self, group=None):
        return self.world_size

    def get_rank(self, group=None):
        return self.rank

    def new_group(self, ranks):
        return list(ranks)


def deepspeed_groups(monkeypatch, world_size: int, rank: int, ep: int) -> tuple[list[int], list[int]]:
    """(expert-parallel group, expert-data-parallel group) DeepSpeed gives ``rank`` (what ``MoE.set_deepspeed_
    parallelism`` builds: ``groups._create_expert_and_data_parallel``)."""
    from deepspeed.utils import groups

    monkeypatch.setattr(groups, "dist", FakeWorld(world_size, rank))
    monkeypatch.setattr(groups, "mpu", None)
    for name in ("_EXPERT_PARALLEL_GROUP", "_EXPERT_PARALLEL_GROUP_RANKS", "_EXPERT_DATA_PARALLEL_GROUP",
                 "_EXPERT_DATA_PARALLEL_GROUP_RANKS"):
        monkeypatch.setattr(groups, name, {})
    groups._create_expert_and_data_parallel(ep)
    name = f"ep_size_{ep}"
    return list(groups._EXPERT_PARALLEL_GROUP[name]), list(groups._EXPERT_DATA_PARALLEL_GROUP[name])


@pytest.mark.parametrize("world_size,ep", [(2, 1), (2, 2), (4, 2), (8, 4), (8, 8)])
def test_the_plan_is_deepspeeds_layout(monkeypatch, world_size, ep):
    """Every rank's first expert is its place in its DeepSpeed expert-parallel group x E / EP (the all-to-all
    sends chunk i of the [E, C, d] dispatch to the group's i-th rank), its experts' gradients are averaged over
    an expert-data-parallel group of ``expert_data_parallel_size`` ranks, and the rest over all of them."""
    experts = 8
    plan = ExpertParallelPlan(ep, world_size, experts, Router(2))
    assert (plan.local_experts, plan.data_parallel_size) == (experts // ep, world_size)
    held = {}
    for rank in range(world_size):
        ep_group, edp_group = deepspeed_groups(monkeypatch, world_size, rank, ep)
        assert len(ep_group) == ep and rank in ep_group and rank in edp_group
        assert plan.first_expert(rank) == ep_group.index(rank) * plan.local_experts
        assert plan.expert_data_parallel_size == len(edp_group)
        held[rank] = set(range(plan.first_expert(rank), plan.first_expert(rank) + plan.local_experts))
    for rank in range(world_size):  # each expert held by exactly its expert-data-parallel group
        holders = [r for r in range(world_size) if held[r] == held[rank]]
        assert holders == deepspeed_groups(monkeypatch, world_size, rank, ep)[1]
    assert set().union(*held.values()) == set(range(experts))
    assert plan.describe() == {"path": "moe-layer", "size": ep, "experts": experts, "local_experts": experts // ep,
                               "data_parallel_size": world_size, "expert_data_parallel_size": world_size // ep,
                               "top_k": 2, "capacity_factor": None, "drop_tokens": False, "aux_loss_weight": 0.0}


# ---- capacity and dropped routes against DeepSpeed's gate ------------------------------------------------------

CAPACITY_CASES = [(tokens, e, f, k) for tokens, e, f, k in itertools.product(
    [64, 100, 128, 1000, 4096], [3, 4, 8, 128], [0.1, 0.5, 1.0, 1.1, 1.25, 1.3, 2.0], [1, 2, 3, 8]) if k <= e]
"""Including products float32 rounds differently from float64 (100 / 4 x 1.1 x 2: 55 in DeepSpeed's float32)."""


def test_the_routers_capacity_is_deepspeeds():
    """``Router.capacity`` (the record's dropped routes and the all-to-all bytes are counted with it) is what
    DeepSpeed's gate computes, ``_capacity(gates, factor x k, min_capacity 0)``, over 400 cases, the float32
    roundings included; no capacity without dropping."""
    from deepspeed.moe.sharded_moe import _capacity

    wrong = [(t, e, f, k, int(_capacity(torch.empty(t, e), torch.tensor(f * k), torch.tensor(0))),
              Router(k, f).capacity(t, e)) for t, e, f, k in CAPACITY_CASES]
    wrong = [case for case in wrong if case[-2] != case[-1]]
    assert len(CAPACITY_CASES) > 400 and wrong == [], f"(tokens, E, factor, k, DeepSpeed's, ours): {wrong}"
    assert Router(2).capacity(128, 4) is None and not Router(2).drop_tokens and Router(2, 1.0).drop_tokens


@pytest.mark.parametrize("top_k,factor", [(2, 1.0), (2, 0.5), (3, 1.0), (3, 0.8)])
def test_the_dropped_routes_are_what_deepspeeds_gate_drops(top_k, factor):
    """DeepSpeed's gate (``top2gating``, and ``topkgating``'s default drop policy) with a capacity factor, on
    skewed logits: the routes it drops (its sparse routes flagged -1) are ``routes_dropped`` of the counts it
    reports (counted before dropping, what ``MoEBlock.counts`` keeps) at ``Router.capacity``, its capacity."""
    from deepspeed.moe.sharded_moe import TopKGate

    tokens, experts, hidden = 128, 4, 16
    gate = TopKGate(hidden, experts, top_k, factor, min_capacity=0, drop_tokens=True, use_rts=False,
                    top2_2nd_expert_sampling=False)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        gate.wg.weight.copy_(torch.randn(experts, hidden, generator=gen))
        gate.wg.weight[0] += 0.5  # a favoured expert: some routes over capacity
    x = torch.randn(tokens, hidden, generator=gen) + 0.5
    _, capacity, _, indices, _, _, counts = gate(x, None, True)
    router = Router(top_k, factor)
    dropped = int((indices < 0).sum())
    assert int(capacity) == router.capacity(tokens, experts)
    assert int(counts.sum()) == top_k * tokens and dropped > 0
    assert routes_dropped(counts, router.capacity(tokens, experts)) == dropped


def test_routes_dropped_is_what_passes_each_experts_capacity():
    assert routes_dropped([5, 3, 0, 8], 4) == 1 + 4
    assert routes_dropped(np.array([2, 2]), 2) == 0
    assert routes_dropped([100, 0], None) == 0  # no capacity: nothing dropped


# ---- the load balance -------------------------------------------------------------------------------------------

def timers(tokens: dict[tuple[int, int], list[float]], dropped: list[float] = (), routed: list[float] = ()) -> dict:
    """One rank's stage timers: ``tokens[(layer, expert)]`` per measured step."""
    out = {f"{TOKENS}.{layer}.{expert}": list(v) for (layer, expert), v in tokens.items()}
    out.update({"ep_all_to_all": [0.1] * 2, DROPPED: list(dropped), ROUTED: list(routed)})
    return out


def test_the_load_balance_is_the_jobs_tokens_per_expert():
    """Two ranks, two blocks of two experts, three steps: the job's tokens per expert are the ranks' sums; each
    step's worst block max / mean; the median and worst over steps; dropped over routed of every rank."""
    rank0 = timers({(0, 0): [6, 4, 5], (0, 1): [2, 4, 3], (1, 0): [4, 8, 4], (1, 1): [4, 0, 4]},
                   dropped=[1, 0, 0], routed=[16, 16, 16])
    rank1 = timers({(0, 0): [2, 4, 4], (0, 1): [6, 4, 4], (1, 0): [4, 4, 4], (1, 1): [4, 4, 4]},
                   dropped=[2, 1, 0], routed=[16, 16, 16])
    got = load_balance([rank0, rank1])
    # block 0: [8, 8], [8, 8], [9, 7] -> 1, 1, 1.125; block 1: [8, 8], [12, 4], [8, 8] -> 1, 1.5, 1
    assert got == {"load_max_over_mean": pytest.approx(1.125), "load_max_over_mean_worst": 1.5,
                   "dropped_share": pytest.approx(4 / 96)}
    idle = timers({(0, 0): [0, 0], (0, 1): [0, 0]})  # no tokens at all: even, not a division by zero
    assert load_balance([idle]) == {"load_max_over_mean": 1.0, "load_max_over_mean_worst": 1.0, "dropped_share": 0.0}
    assert load_balance([{"ep_all_to_all": [0.1]}]) is None


class CountingBlock:
    """A ``MoEBlock`` as ``ExpertTimer`` reads it: each forward's tokens per expert."""

    def __init__(self, *counts):
        self.counts = [torch.tensor(c) for c in counts]


class NoComm:
    def begin(self):
        pass

    def read(self):
        return {"ep_all_to_all": 0.0, "ep_all_to_all_calls": 0.0}


def test_the_expert_timer_sums_a_steps_micro_steps_and_counts_drops(monkeypatch):
    """Two micro-steps of 16 tokens, top-2 over 4 experts at factor 1.0 (capacity 8 per micro-step): the
    step's tokens per (block, expert) summed, and each micro-step's routes past capacity; ``begin`` clears."""
    monkeypatch.setattr(expert_load.layout_comm, "timer", lambda degree, clock: NoComm())
    blocks = [CountingBlock([10, 6, 8, 8], [8, 8, 8, 8]), CountingBlock([12, 12, 4, 4], [16, 16, 0, 0])]
    timer = expert_load.ExpertTimer(None, blocks, Router(2, 1.0), 4)
    got = timer.read()
    assert [got[f"{TOKENS}.0.{e}"] for e in range(4)] == [18, 14, 16, 16]
    assert [got[f"{TOKENS}.1.{e}"] for e in range(4)] == [28, 28, 4, 4]
    assert (got[DROPPED], got[ROUTED]) == (2 + 4 + 4 + 8 + 8, 4 * 32)
    timer.begin()
    assert all(b.counts == [] for b in blocks) and timer.read()[ROUTED] == 0


# ---- a real 2-rank run ------------------------------------------------------------------------------------------

RUN = ["-m", "ds_bench", "run", "--workload", "moe", "--size", "tiny", "--ds-config", "ds_configs/zero1.json",
       "--set", "bf16.enabled=false", "--seq-len", "64", "--micro-batch", "2", "--steps", "4", "--warmup", "1",
       "--capacity-factor", "1.0"]
PORTS = {1: 29941, 2: 29942}


@pytest.fixture(scope="module")
def dropping_runs(tmp_path_factory):
    """2 ranks under torchrun with token dropping at EP = ``ep`` (run once each, when a test asks): (record, stdout)."""
    done = {}

    def run(ep: int):
        if ep not in done:
            results = tmp_path_factory.mktemp(f"moe_ep{ep}") / "r.jsonl"
            proc = run_cmd(["torchrun", "--nproc_per_node", "2", "--master_port", str(PORTS[ep]), *RUN,
                            "--expert-parallel", str(ep), "--results", str(results)], timeout=300, **OFFLINE)
            assert proc.returncode == 0, explain(proc)
            (record,) = records(results)
            done[ep] = record, proc.stdout
        return done[ep]
    return run


@pytest.mark.dist
def test_two_expert_parallel_ranks_train_with_tokens_dropped(dropping_runs):
    """EP = 2 on 2 ranks, top-2 of 4 experts, capacity factor 1.0 (64 routes per expert and micro-step of 128
    tokens): the run finishes ``ok`` with finite losses and records its layout, the MoE all-to-alls timed
    (2 per block forward, 2 backward), the load balance, some routes dropped, and the whole model's
    parameters from a rank that holds half the experts."""
    r, _ = dropping_runs(2)
    shape = moe_shapes.SHAPES["tiny"]
    assert r["status"] == "ok" and r["world_size"] == 2
    assert all(math.isfinite(x) for x in r["metrics"]["loss_curve"]) and len(r["metrics"]["loss_curve"]) == 4
    block = degree(r, "expert_parallel")
    assert block["size"] == 2 and block["settings"] == {
        "path": "moe-layer", "experts": 4, "local_experts": 2, "data_parallel_size": 2, "expert_data_parallel_size": 1,
        "top_k": 2, "capacity_factor": 1.0, "drop_tokens": True, "aux_loss_weight": 0.02}
    comm, load = block["comm"], block["measured"]
    assert comm["collective"] == "all_to_all"
    print(comm)
    assert comm["calls_per_step"] == 4 * shape.n_layer
    assert 0 < comm["ms_per_step"] < r["metrics"]["step_ms_max"] and 0 < comm["share_of_step"] < 1
    assert 1.0 <= load["load_max_over_mean"] <= load["load_max_over_mean_worst"] <= shape.experts / shape.top_k
    assert 0 < load["dropped_share"] < 0.5
    assert r["params"] == moe_shapes.param_count(shape)
    experts = moe_shapes.expert_param_count(shape)
    assert r["build"]["rank_params_held"] == {"experts": experts // 2, "rest": moe_shapes.param_count(shape) - experts}
    # what rank 0 sends per step: 8 all-to-alls of [E, capacity 64, hidden 64], half of it leaving, fp32
    assert r["comm_bound"]["bus_bytes_per_step"]["ep_all_to_all"] == 8 * 4 * 64 * 64 / 2 * 4


@pytest.mark.dist
@pytest.mark.full
def test_one_expert_parallel_rank_gives_the_same_losses(dropping_runs):
    """The same 2 ranks at EP = 1 (every rank all 4 experts, no all-to-all) and at EP = 2: the same losses to
    1e-5 relative at every step, token dropping included (each rank's capacity is of its own tokens either
    way): the placement, the all-to-alls and ZeRO's reduction of the expert groups add up to one model."""
    one, _ = dropping_runs(1)
    two, _ = dropping_runs(2)
    assert size_of(one, "expert_parallel") == 1 and (degree(one, "expert_parallel").get("comm") or {}).get("calls_per_step", 0) == 0
    print(one["metrics"]["loss_curve"], two["metrics"]["loss_curve"])
    for a, b in zip(one["metrics"]["loss_curve"], two["metrics"]["loss_curve"], strict=True):
        assert b == pytest.approx(a, rel=1e-5)
    assert degree(one, "expert_parallel")["measured"]["dropped_share"] == pytest.approx(
        degree(two, "expert_parallel")["measured"]["dropped_share"])

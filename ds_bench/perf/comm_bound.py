"""Is a training run communication-bound? The bytes each rank must move per step for its ZeRO stage and its
layout's own collectives (``perf.bus_bytes``), divided by the busbw ``ds-bench comm`` measured on the same
ranks: a lower bound on the step's communication time, as a fraction of the measured step (pure apart from
``latest_comm_record``). ``for_run`` is the run record's ``comm_bound`` entry; the summary's sentence for it
is ``report.comm_bound``'s.

With T-way tensor parallelism (AutoTP) the data-parallel collectives (``perf.bus_bytes``) move a rank's 1/T
share of Psi over its n/T data-parallel ranks, and each T-rank group all-reduces activations in every
micro-step: 2 per block in the forward pass (after the attention output and the MLP down projections)
and, in the backward, one per column-parallel projection's input gradient: q, k, v, gate and up, 5 (Megatron-LM
fuses them into 2, Shoeybi et al. 2019 sec. 3; AutoTP does not, measured by ``ds_bench.measure.layout_comm``),
plus the vocabulary-parallel embedding's and LM head's 2 (``Workload.tensor_parallel_all_reduces``), each of
micro-batch x sequence x hidden elements in the compute dtype, 2(T-1)/T x S bus bytes; activation
checkpointing recomputes one of the forward's 2 (``perf.step.TP_RECOMPUTED``) (``tp_all_reduce``).

With S-way Ulysses sequence parallelism the data-parallel collectives stay over all n ranks (DeepSpeed
reduces gradients over the sequence-data-parallel group: every rank holds the whole model), and each rank
sends into all-to-alls in every micro-step: per layer 4 in forward (q, k, v to whole sequences of H/S heads,
the output back) and 4 in backward, 4 more with activation checkpointing
(``CausalLMWorkload.sequence_parallel_all_to_alls``, counted by ``ds_bench.measure.layout_comm``), its slice of
micro-batch x T/S tokens x heads x head width each (k and v: max(KV heads, S)); an all_to_all whose rank buffer
is S bytes moves (S-1)/S x S bus bytes (``sp_all_to_all``, timed at ``ds-bench comm``'s all_to_all busbw over
all its ranks: an S-rank group inside a node is faster than that across nodes, so the bound is pessimistic there).

With EP-way expert parallelism (``--workload moe``) each rank reduces the gradients of the parameters it holds:
the replicated rest over all n ranks, its E/EP experts over their n/EP holders only (none at n = EP), and it sends the MoE all-to-alls: per MoE block 2 in forward (dispatch,
combine) and 2 in backward, 2 more with activation checkpointing (counted by ``ds_bench.measure.layout_comm``), each the [E, capacity, hidden] dispatch buffer, capacity the
busiest expert's tokens over the EP group in that micro-step and block, or the capacity limit: the bytes are the
ones measured where the layer calls the all-to-all (``bytes_per_step``), (EP-1)/EP of them crossing a link
(``ep_all_to_all``, at the all_to_all busbw).

The bound takes each collective at the busbw of the comm run's largest message (its best case) and
counts no latency, no overlap penalty and no offload traffic (PCIe, not the network), so the true
communication time is at least this. A run is called communication-bound when the bound is at
least ``BOUND_FRACTION`` of the measured median step: half the step or more must go to moving data
even at full measured bandwidth, so a faster fabric, fewer bytes (a lower stage, a smaller
communication dtype) or more compute per byte (a larger micro-batch) would pay.
"""

from __future__ import annotations

import json
import os

from ds_bench.perf.bus_bytes import (
    bus_bytes_per_step,
    expert_parallel_bus_bytes,
    grad_bytes_of,
    sequence_parallel_bus_bytes,
    tensor_parallel_bus_bytes,
)
from ds_bench.perf.states import ELEMENT_BYTES
from ds_bench.record.schema import CommRecord, parse_record

BOUND_FRACTION = 0.5
COLLECTIVE_OF = {"tp_all_reduce": "all_reduce", "sp_all_to_all": "all_to_all", "ep_all_to_all": "all_to_all"}
"""The ``ds-bench comm`` collective whose busbw times a layout's own traffic."""


def busbw_from_comm_record(record: CommRecord) -> dict[str, float]:
    """Collective -> busbw (GB/s) at its largest message, over all ranks of a ``kind: comm`` record."""
    best: dict[str, float] = {}
    top: dict[str, int] = {}
    for row in record.results:
        if row.scope == "world" and not row.wrong and row.size_bytes > top.get(row.collective, -1):
            top[row.collective], best[row.collective] = row.size_bytes, row.busbw_GBps
    return {name: busbw for name, busbw in best.items() if busbw > 0}


def latest_comm_record(path: str, hosts: list[str], world_size: int, backend: str) -> CommRecord | None:
    """The newest ok ``comm`` record in ``path`` measured on the same hosts, rank count and backend; lines
    that are not JSON or not a valid record are passed over (a run must not fail on them)."""
    if not os.path.isfile(path):
        return None
    found = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = parse_record(json.loads(line))
            except ValueError:  # not JSON, or a pydantic.ValidationError
                continue
            if (isinstance(rec, CommRecord) and rec.status == "ok" and rec.world_size == world_size
                    and rec.backend == backend and sorted(set(rec.hosts)) == sorted(hosts)):
                found = rec
    return found


def judge(bytes_per_step: dict[str, float], busbw: dict[str, float], source: str, step_ms: float) -> dict:
    """The record's ``comm_bound`` entry. A collective without its own busbw is timed at
    all_reduce's (busbw is comparable across collectives by construction); none at all: a note."""
    fallback = busbw.get("all_reduce")
    used = {c: busbw.get(COLLECTIVE_OF.get(c, c), fallback) for c in bytes_per_step}
    if any(v is None or v <= 0 for v in used.values()):
        return {"note": f"no busbw for {', '.join(c for c, v in used.items() if not v)} in {source}",
                "bus_bytes_per_step": bytes_per_step}
    comm_ms = sum(bytes_per_step[c] / (used[c] * 1e9) for c in bytes_per_step) * 1e3
    fraction = comm_ms / step_ms
    return {"bus_bytes_per_step": bytes_per_step, "busbw_GBps": used, "busbw_source": source,
            "comm_ms_lower_bound": comm_ms, "step_ms_median": step_ms, "fraction_of_step": fraction,
            "communication_bound": fraction >= BOUND_FRACTION}


def for_run(*, stage: int, precision: str, ds_cfg: dict, params: int, world_size: int, micro_steps: int,
            step_ms: float, hosts: list[str], backend: str, busbw: float | None, comm_results: str,
            tensor_parallel: int = 1, tp_all_reduce_elements: int = 0, sequence_parallel: int = 1,
            sp_all_to_all_elements: int = 0, expert_parallel: int = 1, ep_all_to_all_bytes: float = 0.0,
            expert_params: int = 0) -> dict:
    """The ``comm_bound`` entry of a run record: with ``--busbw``, that figure for every collective;
    else the newest comm record of the same ranks in ``comm_results``; else a note saying how to get one.
    ``expert_params``: of ``params``, the experts this rank holds, whose gradients DeepSpeed reduces over their
    world / EP holders only (``stage_1_and_2.py``: the expert-data-parallel group of a MoE parameter group)."""
    if world_size == 1:
        return {"note": "1 rank: nothing crosses a link"}
    data_parallel = world_size // tensor_parallel
    e, grad_bytes = ELEMENT_BYTES[precision], grad_bytes_of(ds_cfg, precision)
    scatter = (ds_cfg.get("zero_optimization") or {}).get("reduce_scatter", True) is not False
    moved = bus_bytes_per_step(stage, -(-(params - expert_params) // tensor_parallel), e, grad_bytes,
                               data_parallel, micro_steps, scatter) if data_parallel > 1 else {}
    expert_holders = world_size // expert_parallel
    if expert_params and expert_holders > 1:
        for collective, value in bus_bytes_per_step(stage, expert_params, e, grad_bytes, expert_holders,
                                                    micro_steps).items():
            moved[collective] = moved.get(collective, 0.0) + value
    if tensor_parallel > 1:
        moved["tp_all_reduce"] = tensor_parallel_bus_bytes(tensor_parallel, tp_all_reduce_elements, e, micro_steps)
    if sequence_parallel > 1:
        moved["sp_all_to_all"] = sequence_parallel_bus_bytes(sequence_parallel, sp_all_to_all_elements, e, micro_steps)
    if expert_parallel > 1:  # (EP-1)/EP of the bytes one rank gave the all-to-alls in a step (measured)
        moved["ep_all_to_all"] = expert_parallel_bus_bytes(expert_parallel, ep_all_to_all_bytes)
    if busbw is not None:
        return judge(moved, {"all_reduce": busbw}, "--busbw", step_ms)
    record = latest_comm_record(comm_results, hosts, world_size, backend)
    if record is None:
        return {"note": f"no comm record of these {world_size} {backend} ranks in {comm_results}: run ds-bench comm "
                        "under the same launcher first, or pass --busbw", "bus_bytes_per_step": moved}
    return judge(moved, busbw_from_comm_record(record), f"comm run {record.run_id} of {record.time}", step_ms)

"""The bytes each collective moves through one rank's link per optimizer step (pure): the one copy the run's
comm-bound verdict (``perf.comm_bound``) and ``plan``'s step time (``perf.step``) both count.

Bus bytes, the quantity busbw is defined against (NVIDIA/nccl-tests ``doc/PERFORMANCE.md``): over n
ranks, an all_reduce of S bytes moves 2(n-1)/n x S through each rank's link, a reduce_scatter (input
S) or an all_gather (output S) (n-1)/n x S, an all_to_all whose rank buffer is S bytes (n-1)/n x S; at busbw
B that takes at least bus bytes / B.

Per optimizer step, with Psi parameters, P bytes per parameter in the compute dtype (2 for fp16 and
bf16, 4 for fp32), G bytes per gradient element as communicated (DeepSpeed's
``communication_data_type``, else P) and k micro-steps (gradient accumulation); volumes from the
ZeRO paper (Rajbhandari et al., SC'20, sec. 7 "Communication analysis of ZeRO-DP"), counted where
DeepSpeed communicates (``runtime/engine.py``, ``zero/stage_1_and_2.py``, ``zero/stage3.py``):

- stage 0 (data parallel): one all_reduce of the gradients per step: 2(n-1)/n x Psi G;
- stage 1: gradients reduced once per step and the updated parameters all-gathered: reduce_scatter
  Psi G + all_gather Psi P, (n-1)/n x Psi (G + P): the paper's 2 Psi, the all-reduce volume;
- stage 2: gradients reduce-scattered in every micro-step (each rank keeps only its partition, so a
  micro-step's gradients are reduced as they are produced), parameters all-gathered once:
  (n-1)/n x Psi (k G + P);
- stage 3: parameters all-gathered in every micro-step's forward and again in its backward,
  gradients reduce-scattered every micro-step: (n-1)/n x k Psi (2P + G), 1.5x stage 0 (the paper).

A layout's own collectives, given what one rank sends in them (how many, of what size, is the caller's: the
workload's hooks for a run, ``perf.shapes`` for ``plan``):

- T-way tensor parallelism: the group's activation all-reduces, 2(T-1)/T of their bytes (``tp_all_reduce``);
- S-way Ulysses sequence parallelism: the rank's all-to-alls, (S-1)/S of their bytes (``sp_all_to_all``);
- EP-way expert parallelism: the MoE layer's all-to-alls, (EP-1)/EP of their bytes (``ep_all_to_all``).
"""

from __future__ import annotations

from ds_bench.perf.states import ELEMENT_BYTES

COMM_DTYPE_BYTES = {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "half": 2, "bf16": 2, "bfloat16": 2}
"""Bytes per element of DeepSpeed's ``communication_data_type`` values."""


def bus_bytes_per_step(stage: int, params: int, param_bytes: int, grad_bytes: int, n: int,
                       micro_steps: int, reduce_scatter: bool = True) -> dict[str, float]:
    """Collective -> bus bytes through each rank's link per optimizer step (see the module doc); ``reduce_scatter``
    False (``zero_optimization.reduce_scatter``: Muon at ZeRO-3 needs it off) all-reduces ZeRO 1-3's gradients
    instead, twice the bytes (deepspeed 0.19.8 ``stage3.py`` ``__avg_scatter_contiguous_grads``,
    ``stage_1_and_2.py`` ``allreduce_bucket``)."""
    volumes = _volumes(stage, params, param_bytes, grad_bytes, n, micro_steps)
    if not reduce_scatter and "reduce_scatter" in volumes:
        volumes["all_reduce"] = 2 * volumes.pop("reduce_scatter")
    return volumes


def _volumes(stage: int, params: int, param_bytes: int, grad_bytes: int, n: int, micro_steps: int) -> dict[str, float]:
    split = (n - 1) / n
    if stage == 0:
        return {"all_reduce": 2 * split * params * grad_bytes}
    if stage == 1:
        return {"reduce_scatter": split * params * grad_bytes, "all_gather": split * params * param_bytes}
    if stage == 2:
        return {"reduce_scatter": split * micro_steps * params * grad_bytes,
                "all_gather": split * params * param_bytes}
    if stage == 3:
        return {"reduce_scatter": split * micro_steps * params * grad_bytes,
                "all_gather": split * micro_steps * 2 * params * param_bytes}
    raise ValueError(f"unknown ZeRO stage {stage}")


def grad_bytes_of(ds_cfg: dict, precision: str) -> int:
    """Bytes per gradient element as communicated: ``communication_data_type`` when set, else the
    compute dtype's (DeepSpeed's bf16 stage 0/1 path may reduce fp32 accumulators instead: then the
    bound is lower than the truth, still a lower bound)."""
    return COMM_DTYPE_BYTES.get(str(ds_cfg.get("communication_data_type") or "").lower(), ELEMENT_BYTES[precision])


def tensor_parallel_bus_bytes(t: int, all_reduce_elements: int, element_bytes: int, micro_steps: int) -> float:
    """Bus bytes of a T-rank group's activation all-reduces per optimizer step (module doc), given the
    elements all-reduced in one micro-step (``Workload.tensor_parallel_all_reduce_elements``)."""
    return 2 * (t - 1) / t * all_reduce_elements * element_bytes * micro_steps


def sequence_parallel_bus_bytes(s: int, all_to_all_elements: float, element_bytes: int, micro_steps: int) -> float:
    """Bus bytes of one rank's Ulysses all-to-alls per optimizer step (module doc), given the elements it sends
    in one micro-step (``Workload.sequence_parallel_all_to_all_elements``)."""
    return (s - 1) / s * all_to_all_elements * element_bytes * micro_steps


def expert_parallel_bus_bytes(ep: int, sent_bytes: float) -> float:
    """Bus bytes of one rank's MoE all-to-alls per optimizer step (module doc), given the bytes it gave them in a
    step (measured where the MoE layer calls the all-to-all, for a run)."""
    return (ep - 1) / ep * sent_bytes

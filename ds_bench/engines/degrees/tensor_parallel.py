"""DeepSpeed AutoTP training: the layout of a ``--tensor-parallel T`` run, checked before joining, and the
config ``deepspeed.initialize`` gets for it.

AutoTP (``"tensor_parallel": {"autotp_size": T}``, DeepSpeed >= 0.16.4, docs/_tutorials/autotp-training.md)
shards an HF model's linear layers Megatron-style inside ``deepspeed.initialize``: q/k/v and the MLP's
gate/up by output columns, the attention output and MLP down projections by input rows, each followed
by an all-reduce over the T ranks of its group (Shoeybi et al. 2019, "Megatron-LM", section 3). So T must
divide the attention heads, the KV heads, the hidden size and the MLP width (``Workload.tensor_parallel_divisors``).

Layout: T tensor-parallel x D data-parallel ranks, D = world size / T; a TP group is T consecutive
ranks (DeepSpeed's mesh, data-parallel outer), and every rank of a group must see the same batch
(DeepSpeed checks it): each reads its data-parallel replica's shard, ``rank // T`` of ``D``.
Batch arithmetic in ds_bench's terms: global batch = micro-batch x accumulation x D (``train_batch_size``
of the record, what throughput counts). This DeepSpeed (0.19.8) still checks train_batch_size = micro-batch
x accumulation x *world size*, TP ranks counted (measured: 2 TP ranks, micro-batch 2 fails at
train_batch_size 2 and passes at 4), so ``deepspeed_config`` hands it the global batch x T.

Refused (one line, exit 2): DDP/FSDP (torch's own tensor parallel is not wired: ``--engine deepspeed``),
a pipeline (AutoTP does not combine with DeepSpeed's pipeline engine, DeepSpeed #7147), a workload
AutoTP cannot shard (GPT-2: its fused ``Conv1D`` projections are on ``module_inject/auto_tp.py``'s
unsupported list), T not dividing the world or the model's widths.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from ds_bench.engines.degrees.mesh import DegreePlan, register
from ds_bench.errors import UserError

log = logging.getLogger("ds_bench")


@dataclass(frozen=True)
class TensorParallelPlan(DegreePlan):
    field: ClassVar[str] = "tensor_parallel"
    shards_layers: ClassVar[bool] = True
    comm_timed: ClassVar[bool] = True

    size: int
    """T: ranks that share each layer (``tensor_parallel.autotp_size``)."""
    data_parallel_size: int
    """D = world size / T."""

    def deepspeed_config(self, ds_cfg: dict) -> dict:
        return deepspeed_config(self, ds_cfg)

    def verdict_terms(self, workload, micro_batch: int, comm: dict | None, build: dict) -> dict:
        """AutoTP's activation all-reduces, micro-batch x sequence x hidden elements each."""
        return {"tensor_parallel": self.size,
                "tp_all_reduce_elements": workload.tensor_parallel_all_reduce_elements(micro_batch)}


@register("tensor_parallel")
def _from_run(cfg, workload, world_size: int, local_world_size: int | None) -> TensorParallelPlan | None:
    plan = resolve(cfg.tensor_parallel, world_size, workload.tensor_parallel_divisors)
    warning = across_nodes_warning(plan, local_world_size)
    if warning:
        log.warning(warning)
    return plan


def resolve(size: int | None, world_size: int, divisors: dict[str, int]) -> TensorParallelPlan | None:
    """The layout of ``--tensor-parallel`` on ``world_size`` ranks of a model AutoTP can shard
    (``Workload.check_tensor_parallel_flag``), whose widths are ``divisors`` (pure); None without it."""
    if size is None:
        return None
    for what, count in divisors.items():
        if count % size:
            raise UserError(f"--tensor-parallel {size} does not divide the model's {count} {what}: AutoTP gives "
                            "every rank an equal share of each layer")
    return TensorParallelPlan(size, world_size // size)


def across_nodes_warning(tp: TensorParallelPlan | None, ranks_per_node: int | None) -> str | None:
    """A warning when a tensor-parallel group would span nodes (pure): its all-reduces, 7 per block and
    micro-step, then cross the inter-node fabric; Megatron-LM keeps TP inside a node (NVLink)."""
    if tp is None or tp.size == 1 or not ranks_per_node or ranks_per_node % tp.size == 0:
        return None
    return (f"--tensor-parallel {tp.size} with {ranks_per_node} rank(s) per node: tensor-parallel groups span nodes, "
            "and their activation all-reduces (7 per block per micro-step) cross the inter-node fabric; keep T a "
            "divisor of the ranks per node, and scale across nodes with data (or pipeline) parallelism")


def deepspeed_config(tp: TensorParallelPlan | None, ds_cfg: dict) -> dict:
    """The config ``deepspeed.initialize`` gets (pure): with tensor parallelism, ``tensor_parallel.autotp_size``
    and train_batch_size counted over every rank, as this DeepSpeed checks it (module docstring)."""
    if tp is None or tp.size == 1:
        return ds_cfg
    return {**ds_cfg, "tensor_parallel": {**(ds_cfg.get("tensor_parallel") or {}), "autotp_size": tp.size},
            "train_batch_size": ds_cfg["train_batch_size"] * tp.size}

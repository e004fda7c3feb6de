"""DeepSpeed pipeline parallelism: the layout of a ``--pipeline-stages`` run, checked before joining.

A pipeline run hands ``deepspeed.initialize`` a ``deepspeed.pipe.PipelineModule`` (built by the workload,
each rank building only its own stage's layers); DeepSpeed then returns its ``PipelineEngine``, which
trains a whole step (every micro-batch's forward and backward, the sends and receives between stages,
the data-parallel all-reduce and the optimizer) in ``engine.train_batch``.

Layout: P stages x D data-parallel replicas, D = world size / P (DeepSpeed's ``PipeDataParallelTopology``:
global rank = stage x D + data-parallel rank). Micro-batches per step = ``gradient_accumulation_steps``
(the schedule's chunks), so ``train_batch_size`` = micro-batch x accumulation x D. The schedule is
1F1B (``TrainSchedule``); its idle share is (P - 1) / (m + P - 1) for m micro-batches (Narayanan et al.
2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", section 2.2.1).

What DeepSpeed refuses, refused here first (one line, exit 2): ZeRO stage 2 or 3 (``PipelineEngine``
asserts stage < 2), hence offload, which needs a ZeRO stage to offload from and is not supported with
a pipeline; P not dividing the world size (``PipelineModule`` raises); more stages than blocks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from ds_bench.engines.degrees.mesh import DegreePlan, register
from ds_bench.errors import UserError

log = logging.getLogger("ds_bench")

DEFAULT_PARTITION = "parameters"


@dataclass(frozen=True)
class PipelinePlan(DegreePlan):
    """The layout of a pipeline run."""

    field: ClassVar[str] = "pipeline_stages"
    builds_stages: ClassVar[bool] = True

    stages: int
    data_parallel_size: int
    partition: str
    """``PipelineModule``'s ``partition_method``: parameters, uniform or type:REGEX."""
    micro_batches: int = 0
    """Micro-batches per step (``gradient_accumulation_steps``); set by ``with_micro_batches``."""

    @property
    def size(self) -> int:
        return self.stages

    def bubble(self) -> float:
        """The schedule's idle share of a step: (P - 1) / (m + P - 1)."""
        return (self.stages - 1) / (self.micro_batches + self.stages - 1)

    def record_settings(self) -> dict:
        return {"micro_batches": self.micro_batches, "partition": self.partition, "schedule_bubble": self.bubble()}

    def with_config(self, ds_cfg: dict) -> PipelinePlan:
        return with_micro_batches(self, ds_cfg)

    def staged_batches(self, workload, engine, micro_batch: int):
        """A stage's batches: its replica's, by DeepSpeed's grid (global rank = stage x D + data-parallel rank)."""
        grid = engine.grid
        return workload.pipeline_batches(grid.get_data_parallel_rank(), grid.get_data_parallel_world_size(),
                                         micro_batch)


def resolve(stages: int | None, partition: str | None, world_size: int, n_blocks: int | None) -> PipelinePlan | None:
    """The layout of ``--pipeline-stages`` on ``world_size`` ranks; None without it."""
    if stages is None:
        return None
    if n_blocks is None:
        raise UserError(f"--pipeline-stages {stages}: this workload has no pipeline model (gpt2 has)")
    if stages > n_blocks:
        raise UserError(f"--pipeline-stages {stages} is more than the model's {n_blocks} transformer blocks")
    return PipelinePlan(stages, world_size // stages, partition or DEFAULT_PARTITION)


@register("pipeline_stages")
def _from_run(cfg, workload, world_size: int, local_world_size: int | None) -> PipelinePlan | None:
    return resolve(cfg.pipeline_stages, cfg.partition, world_size, workload.pipeline_blocks)


def with_micro_batches(pipe: PipelinePlan, ds_cfg: dict) -> PipelinePlan:
    """The ``PipelinePlan`` with the resolved config's micro-batch count, warning when fewer than its stages
    (the ZeRO stages and offload a pipeline refuses are ``config.legality``'s)."""
    micro_batches = ds_cfg["gradient_accumulation_steps"]
    if micro_batches < pipe.stages:
        log.warning("--pipeline-stages %d with %d micro-batch(es) per step (gradient_accumulation_steps): fewer "
                    "micro-batches than stages, the pipeline bubble (%.0f%% of the step idle) dominates",
                    pipe.stages, micro_batches, 100 * (pipe.stages - 1) / (micro_batches + pipe.stages - 1))
    return PipelinePlan(pipe.stages, pipe.data_parallel_size, pipe.partition, micro_batches)


def clip_on_the_whole_model(module) -> None:
    """Make DeepSpeed's fp32 gradient clipping (ZeRO-0, ``deepspeed.runtime.utils.clip_grad_norm_``) take the
    norm over every stage's gradients, not the first stage's alone.

    Under a pipeline the engine's ``mpu`` is the pipeline grid, whose model-parallel group is the replica's
    stages; ``clip_grad_norm_`` counts a parameter on model-parallel rank 0 (the first stage) or one marked
    ``model_parallel`` (Megatron's tensor-parallel convention: unmarked parameters are copies), then sums
    over that group. Unmarked, the other stages' gradients never enter the norm (measured, deepspeed 0.19.8:
    GPT-2 P=2 fp32 ZeRO-0 did not clip where P=1 did, 1.4e-4 relative apart in loss by step 5; unclipped,
    or under ZeRO-1, whose optimizer counts every stage, the curves agree to 1e-6). Marking each stage's
    own parameters counts them once; a tied layer's replica (``ds_pipe_replicated``) stays unmarked, so it is
    counted on its owning stage only. Nothing else in DeepSpeed reads the mark without tensor parallelism."""
    for param in module.parameters():
        if not getattr(param, "ds_pipe_replicated", False):
            param.model_parallel = True

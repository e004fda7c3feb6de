"""Data parallelism: the replicas the other degrees leave, as torchtitan's ``ParallelDims`` names ``dp``: world size
over the product of the sizes whose groups share one replica (groups of consecutive ranks: AutoTP's, Ulysses'; a
pipeline's stages are DeepSpeed's grid, ``pipeline.PipelinePlan.staged_batches``), which replica a rank belongs to
and the batches it reads. Every run has it, at one replica too, so it is not registered: the mesh builds it from
the active plans (``mesh.Mesh.data_parallel``). ZeRO shards within it; what ZeRO does is the DeepSpeed config's."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class DataParallel:
    size: int
    """Data-parallel replicas."""
    group: int = 1
    """Consecutive ranks that read one replica's batches (the product of the splitting degrees' sizes)."""

    def replica(self, rank: int) -> int:
        return rank // self.group

    def batches(self, workload, rank: int, micro_batch: int) -> Iterator:
        """This rank's replica's batches: its shard of the data, one of ``size``."""
        return workload.batches(self.replica(rank), self.size, micro_batch)

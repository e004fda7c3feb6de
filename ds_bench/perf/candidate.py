"""A candidate of ``ds-bench plan``: a ``Layout`` and whether each block's activations are recomputed
(``--activation-checkpointing``, a run option rather than a layout axis), with the words that name it."""

from __future__ import annotations

from dataclasses import dataclass

from ds_bench.config.layout import Layout


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    checkpointing: bool = False

    def label(self, world_size: int) -> str:
        """``tp2 dp4 z1 off=none bf16 mbs=2 ga=8 ckpt``: the layout's label (with its data-parallel degree)."""
        return self.layout.label(self.layout.data_parallel(world_size)) + (" ckpt" if self.checkpointing else "")

    def run_flags(self) -> list[str]:
        return ["--engine", self.layout.engine, *self.layout.run_flags(),
                *(["--activation-checkpointing"] if self.checkpointing else [])]

    def replicas(self, world_size: int) -> int:
        """Data-parallel replicas, each a sequence group's worth of sequences: world / (PP x TP x SP)."""
        return self.layout.data_parallel(world_size)

"""A candidate of ``ds-bench plan``: a ``Layout``, whether each block's activations are recomputed
(``--activation-checkpointing``, a run option rather than a layout axis) and whether the checkpointed blocks'
inputs wait in host memory (``--checkpoint-offload``, ALST's), with the words that name it."""

from __future__ import annotations

from dataclasses import dataclass

from ds_bench.config.layout import Layout


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    checkpointing: bool = False
    checkpoint_offload: bool = False
    """With ``checkpointing``: each checkpointed block's input in host memory until backward needs it."""
    selective: bool = False
    """With ``checkpointing``: torch's selective checkpointing, every other matmul's output and the attention's
    kept (``--selective-checkpointing``, ``workloads.checkpoint_policy``)."""

    def label(self, world_size: int) -> str:
        """``tp2 dp4 z1 off=none bf16 mbs=2 ga=8 ckpt``: the layout's label (with its data-parallel degree);
        ``ckpt-selective`` for selective checkpointing, ``+offload`` with the checkpoint offload."""
        ckpt = " ckpt-selective" if self.selective else " ckpt" if self.checkpointing else ""
        return self.layout.label(self.layout.data_parallel(world_size)) + ckpt + ("+offload" if self.checkpoint_offload
                                                                                 else "")

    def extras(self) -> int:
        """How many memory options it takes that cost nothing in the step model (the checkpoint offload, the tiled
        loss): between candidates of the same throughput, the one with fewer is ranked first."""
        return int(self.checkpoint_offload) + int(self.layout.tiled_loss)

    def option_flags(self) -> list[str]:
        """The ``ds-bench run`` flags of its run options: checkpointing and its offload."""
        return [*(["--activation-checkpointing"] if self.checkpointing else []),
                *(["--selective-checkpointing"] if self.selective else []),
                *(["--checkpoint-offload"] if self.checkpoint_offload else [])]

    def run_options(self) -> frozenset[str]:
        """The legality table's run options it sets (``config.legality.RUN_OPTIONS``)."""
        return frozenset(name for name, on in (("checkpoint_offload", self.checkpoint_offload),
                                               ("selective_checkpointing", self.selective)) if on)

    def run_flags(self) -> list[str]:
        return ["--engine", self.layout.engine, *self.layout.run_flags(), *self.option_flags()]

    def replicas(self, world_size: int) -> int:
        """Data-parallel replicas, each a sequence group's worth of sequences: world / (PP x TP x SP)."""
        return self.layout.data_parallel(world_size)

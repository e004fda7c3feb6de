"""The workload registry: one name -> one ``Workload`` class. Add a workload by adding a line to
``_registry``.

The classes (and torch, which they import) load on the first use of ``REGISTRY`` or ``build_workload``,
not with the package: the shape tables (``gpt2_shapes``, ``llama_shapes``) are read without them, e.g. by
``ds-bench capacity``'s flags, so ``ds-bench capacity --help`` does not import torch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from ds_bench.errors import UserError

if TYPE_CHECKING:
    from ds_bench.config.run_config import RunConfig
    from ds_bench.workloads.base import Workload

__all__ = ["REGISTRY", "build_workload"]


@functools.cache
def _registry() -> dict[str, type[Workload]]:
    from ds_bench.workloads.gpt2 import GPT2Workload
    from ds_bench.workloads.llama import LlamaWorkload
    from ds_bench.workloads.mnist import MnistWorkload
    from ds_bench.workloads.moe import MoEWorkload
    from ds_bench.workloads.resnet import ResNetWorkload

    return {
        MnistWorkload.name: MnistWorkload,
        ResNetWorkload.name: ResNetWorkload,
        GPT2Workload.name: GPT2Workload,
        LlamaWorkload.name: LlamaWorkload,
        MoEWorkload.name: MoEWorkload,
    }


def __getattr__(name: str):
    """``REGISTRY`` (name -> ``Workload`` class), built on first use."""
    if name == "REGISTRY":
        return _registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_workload(cfg: RunConfig) -> Workload:
    registry = _registry()
    try:
        cls = registry[cfg.workload]
    except KeyError:
        raise UserError(f"--workload {cfg.workload!r} is unknown; known: {', '.join(sorted(registry))}") from None
    return cls(cfg)

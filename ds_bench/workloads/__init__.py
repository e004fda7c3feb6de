"""The workload registry: one name -> one ``Workload`` class. Add a workload by adding a line."""

from __future__ import annotations

from ds_bench.config import RunConfig
from ds_bench.errors import UserError
from ds_bench.workloads.base import Workload
from ds_bench.workloads.mnist import MnistWorkload

REGISTRY: dict[str, type[Workload]] = {
    MnistWorkload.name: MnistWorkload,
}


def build_workload(cfg: RunConfig) -> Workload:
    try:
        cls = REGISTRY[cfg.workload]
    except KeyError:
        raise UserError(f"--workload {cfg.workload!r} is unknown; known: {', '.join(sorted(REGISTRY))}") from None
    return cls(cfg)

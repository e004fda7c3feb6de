"""The workload registry: one name -> one ``Workload`` class. Add a workload by adding a line."""

from __future__ import annotations

from ds_bench.config.run_config import RunConfig
from ds_bench.errors import UserError
from ds_bench.workloads.base import Workload
from ds_bench.workloads.gpt2 import GPT2Workload
from ds_bench.workloads.llama import LlamaWorkload
from ds_bench.workloads.mnist import MnistWorkload
from ds_bench.workloads.resnet import ResNetWorkload

REGISTRY: dict[str, type[Workload]] = {
    MnistWorkload.name: MnistWorkload,
    ResNetWorkload.name: ResNetWorkload,
    GPT2Workload.name: GPT2Workload,
    LlamaWorkload.name: LlamaWorkload,
}


def build_workload(cfg: RunConfig) -> Workload:
    try:
        cls = REGISTRY[cfg.workload]
    except KeyError:
        raise UserError(f"--workload {cfg.workload!r} is unknown; known: {', '.join(sorted(REGISTRY))}") from None
    return cls(cfg)

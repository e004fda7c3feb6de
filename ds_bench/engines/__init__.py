"""Training engines behind one surface: DeepSpeed (``deepspeed.initialize``), PyTorch DDP and FSDP2.

``choose`` resolves ``--engine`` against a prepared DeepSpeed config before the process group is
joined (bad combinations are ``UserError``s, exit 2); ``build`` wraps the model once ranks have
joined; under DeepSpeed ZeRO-3 ``partitioned_build`` is the context the model is built in
(``deepspeed.zero.Init``, ``ds_bench.engines.zero_init``). Every engine returns an object with
DeepSpeed's engine surface (``ds_bench.measure.loop`` calls ``engine(...)``, ``backward``, ``step``,
``device``; ``save_checkpoint`` / ``load_checkpoint``), so the loop, timing and records are the same
for all three. The parallel degrees are one ``Mesh`` of plans (``ds_bench.engines.degrees``), one module each:
``--tensor-parallel`` hands DeepSpeed an AutoTP config (``tensor_parallel``); ``--sequence-parallel`` a
``sequence_parallel_size`` and the Ulysses ``mpu`` (``sequence_parallel``); ``--workload moe`` DeepSpeed's MoE
layers or AutoEP (``expert_parallel``); with ``--pipeline-stages`` (``pipeline``) the model is a
``PipelineModule`` and DeepSpeed's ``PipelineEngine`` trains a whole step per ``train_batch`` call; the loop
drives it per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ds_bench.config.deepspeed import optim
from ds_bench.config.deepspeed import prepare as ds_config
from ds_bench.config.layout import ENGINES
from ds_bench.config.run_checks import check_engine
from ds_bench.engines import degrees  # noqa: F401  (each degree's module registers its resolver with the mesh)
from ds_bench.engines.degrees.mesh import Mesh
from ds_bench.engines.torch_engine import DTYPES, TorchEngine, wrap_ddp, wrap_fsdp
from ds_bench.engines.torch_settings import TorchSettings, torch_settings
from ds_bench.engines.zero_init import full_numel, is_partitioned, partitioned_build

__all__ = ["ENGINES", "EngineChoice", "choose", "build", "partitioned_build", "is_partitioned", "full_numel"]


@dataclass(frozen=True)
class EngineChoice:
    """An engine resolved against one config: what the record says and how to build it."""

    name: str
    zero_stage: int
    """The ZeRO stage the run is equivalent to (DDP: 0)."""
    model_dtype: torch.dtype
    """The dtype the model is cast to before wrapping: DeepSpeed trains in the compute dtype (fp32
    master weights in its optimizer); DDP and FSDP keep fp32 weights and cast per op/unit."""
    input_dtype: torch.dtype
    torch_settings: TorchSettings | None = None
    mesh: Mesh = Mesh(1)
    """The run's parallel degrees (``ds_bench.engines.degrees.mesh``); no plan: data parallelism only."""

    def describe(self) -> dict:
        """The record's ``engine_plan``: how the config was mapped (None for DeepSpeed: it reads it itself)."""
        return self.torch_settings.describe() if self.torch_settings else None

    def optimizer_record(self, ds_cfg: dict, device_type: str) -> dict:
        """The record's ``optimizer``: where it came from and the class that trains."""
        if self.torch_settings is None:
            return optim.describe(ds_cfg, device_type)
        source = "ds_config" if "optimizer" in ds_cfg else optim.DEFAULT_SOURCE
        return {"source": source, "type": f"torch.optim.{self.torch_settings.optimizer}"}


def choose(name: str, ds_cfg: dict, default_lr: float, where: str, mesh: Mesh | None = None) -> EngineChoice:
    """``--engine name`` against the resolved config, with the run's degrees (``mesh``) as that config sets them
    (the legality table already refused the degrees an engine does not run)."""
    check_engine(name)
    compute = DTYPES[ds_config.precision_of(ds_cfg)]
    mesh = (mesh or Mesh(1)).with_config(ds_cfg)
    if name == "deepspeed":
        return EngineChoice(name, ds_config.zero_stage(ds_cfg), compute, compute, mesh=mesh)
    settings = torch_settings(name, ds_cfg, default_lr, where)
    return EngineChoice(name, settings.zero_stage, torch.float32, torch.float32, settings, mesh=mesh)


def build(choice: EngineChoice, model: torch.nn.Module, ds_cfg: dict, device: torch.device, lr: float, mpu=None):
    """The engine for ``model`` (already cast to ``choice.model_dtype``), after the process group is joined.
    A ``PipelineModule`` (a staged mesh) gets DeepSpeed's ``PipelineEngine`` from the same call; ``mpu``: the
    model-parallel groups a degree gives (``Mesh.mpu``: Ulysses')."""
    if choice.name == "deepspeed":
        from ds_bench.engines.deepspeed_engine import config_for, initialize

        return initialize(model, config_for(choice, ds_cfg), lr, mpu)
    wrapped = wrap_ddp(model, device) if choice.name == "ddp" else wrap_fsdp(model, choice.torch_settings, device)
    return TorchEngine(wrapped, choice.torch_settings, device)


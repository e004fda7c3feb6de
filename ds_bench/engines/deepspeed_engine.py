"""The DeepSpeed engine: ``deepspeed.initialize`` with the config as resolved by ``ds_bench.config.deepspeed.prepare``
(and the parallel degrees' keys: ``config_for``) and, when the config names no optimizer, ds_bench's default client
optimizer (``ds_bench.config.deepspeed.optim``)."""

from __future__ import annotations

import torch

from ds_bench.config.deepspeed import optim
from ds_bench.engines import moe_layer
from ds_bench.engines.degrees import moe_sequence_parallel


def initialize(model: torch.nn.Module, ds_cfg: dict, lr: float, mpu=None):
    """``mpu``: model-parallel groups (Ulysses' ``parallel_state_sp``), or None. A model with DeepSpeed MoE layers
    gets its experts' parameters in groups of their own (``moe_layer.param_groups``), and under Ulysses' mpu a
    tensor-parallel size of 1 (``moe_sequence_parallel.compose``)."""
    import deepspeed

    moe_sequence_parallel.compose(mpu, model)
    params = moe_layer.param_groups(model) if moe_layer.moe_blocks(model) else list(model.parameters())
    client_optimizer = optim.default_optimizer(ds_cfg, params, lr)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_cfg,
                                           optimizer=client_optimizer, mpu=mpu)
    return engine


def config_for(choice, ds_cfg: dict) -> dict:
    """The config ``deepspeed.initialize`` and ``zero.Init`` get for ``choice`` (an ``EngineChoice``): the run's,
    with each of its parallel degrees' keys (``Mesh.deepspeed_config``)."""
    return choice.mesh.deepspeed_config(ds_cfg)

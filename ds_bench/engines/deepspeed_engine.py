"""The DeepSpeed engine: ``deepspeed.initialize`` with the config as resolved by ``ds_bench.config.deepspeed.prepare``
(and the parallel degrees' keys: ``config_for``) and, when the config names no optimizer, ds_bench's default client
optimizer (``ds_bench.config.deepspeed.optim``)."""

from __future__ import annotations

import torch

from ds_bench.config.deepspeed import optim
from ds_bench.engines import sequence_parallel, tensor_parallel


def initialize(model: torch.nn.Module, ds_cfg: dict, lr: float, mpu=None):
    """``mpu``: model-parallel groups (Ulysses' ``parallel_state_sp``), or None."""
    import deepspeed

    client_optimizer = optim.default_optimizer(ds_cfg, model.parameters(), lr)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg,
                                           optimizer=client_optimizer, mpu=mpu)
    return engine


def config_for(choice, ds_cfg: dict) -> dict:
    """The config ``deepspeed.initialize`` and ``zero.Init`` get for ``choice`` (an ``EngineChoice``): the run's,
    with its parallel degrees' keys (``tensor_parallel.deepspeed_config``, ``sequence_parallel.deepspeed_config``)."""
    return sequence_parallel.deepspeed_config(choice.sequence_parallel,
                                              tensor_parallel.deepspeed_config(choice.tensor_parallel, ds_cfg))

"""The DeepSpeed engine: ``deepspeed.initialize`` with the config as resolved by ``ds_bench.config.deepspeed.prepare``
and, when the config names no optimizer, ds_bench's default client optimizer (``ds_bench.config.deepspeed.optim``)."""

from __future__ import annotations

import torch

from ds_bench.config.deepspeed import optim


def initialize(model: torch.nn.Module, ds_cfg: dict, lr: float):
    import deepspeed

    client_optimizer = optim.default_optimizer(ds_cfg, model.parameters(), lr)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg,
                                           optimizer=client_optimizer)
    return engine

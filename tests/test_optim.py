"""Optimizer and scheduler checks against DeepSpeed's names and the classes' signatures; the default."""

import pytest
import torch

from ds_bench.config.deepspeed import optim
from ds_bench.errors import UserError


def check(cfg):
    optim.check_optimizer(cfg, "c.json")
    optim.check_scheduler(cfg, "c.json")


def test_deepspeed_and_torch_names_are_accepted():
    check({"optimizer": {"type": "ADAMW", "params": {"lr": 1e-3, "torch_adam": True}}})
    check({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}})
    check({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": None}}})
    check({"scheduler": {"type": "StepLR", "params": {"step_size": 10}}})


@pytest.mark.parametrize("cfg, pattern", [
    ({"optimizer": {"type": "Adamm"}}, r"optimizer\.type 'Adamm' is not an optimizer DeepSpeed knows.*adamw.*SGD"),
    ({"optimizer": {"type": "sgd"}}, r"'sgd' is not an optimizer.*torch\.optim \(exact case\)"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": "fast"}}}, r"optimizer\.params\.lr must be a number, got 'fast'"),
    ({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}}, r"optimizer\.params\.betas must be a list of 2"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": -1}}}, r"optimizer\.params\.lr must be >= 0"),
    ({"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}}, r"optimizer\.params\.momentum is not a param"),
    ({"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}}, r"use the top-level \"gradient_clipping\""),
    ({"scheduler": {"type": "WarmupLRR"}}, r"scheduler\.type 'WarmupLRR' is not a scheduler.*did you mean WarmupLR"),
    ({"scheduler": {"type": "WarmupLR", "params": {"warmup_steps": 5}}},
     r"scheduler\.params\.warmup_steps is not a parameter of .*WarmupLR \(did you mean warmup_num_steps\?\)"),
    ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "ten"}}},
     r"scheduler\.params\.warmup_num_steps must be an integer, got 'ten'"),
    ({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1}}}, r"cycle_max_lr is required by"),
])
def test_bad_sections_name_the_key(cfg, pattern):
    with pytest.raises(UserError, match=pattern):
        check(cfg)


def test_default_optimizer_follows_offload():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert optim.default_optimizer({"optimizer": {"type": "AdamW"}}, params, 1e-3) is None
    opt = optim.default_optimizer({}, params, 0.01)
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[0]["lr"] == 0.01
    assert opt.defaults["fused"] is True  # one kernel over all parameters (recorded: optim.describe)
    offload = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    assert optim.describe(offload) == {"source": "ds_bench default", "type": "deepspeed.ops.adam.DeepSpeedCPUAdam"}
    assert optim.describe({"optimizer": {"type": "SGD"}}) == {"source": "ds_config", "type": "SGD"}

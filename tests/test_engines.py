"""The DeepSpeed config -> DDP/FSDP mapping and the sweep's engine axis, on inline configs (pure).

The real 2-rank runs of every engine, and their loss parity with ZeRO-0 / ZeRO-3, are in
tests/test_distributed.py."""

import re

import pytest
import torch

from ds_bench.config import legality
from ds_bench.config.layout import Layout, parse_key
from ds_bench.config.legality import Where
from ds_bench.engines import choose
from ds_bench.engines.torch_engine import shard_units
from ds_bench.engines.torch_settings import torch_optimizer, torch_settings
from ds_bench.errors import UserError
from ds_bench.perf.grid import families, skip_reason

WHERE = "ds_configs/x.json"


def why(layout, device_type, world_size=None):
    """The reason a study skips ``layout``, as the sweep and capacity search say it."""
    return skip_reason(layout, Where(world_size, device_type))


def cfg(stage=0, precision="fp32", **extra):
    out = {"zero_optimization": {"stage": stage}, "bf16": {"enabled": precision == "bf16"},
           "fp16": {"enabled": precision == "fp16"}, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "torch_adam": True}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}}}
    out.update(extra)
    return out


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_ddp_runs_every_stage_as_replicated_data_parallelism(stage):
    p = torch_settings("ddp", cfg(stage), 1e-3, WHERE)
    assert (p.zero_stage, p.reshard_after_forward, p.cpu_offload) == (0, None, False)
    assert (p.optimizer, p.optimizer_params) == ("AdamW", {"lr": 1e-3, "betas": [0.9, 0.999]})  # torch_adam dropped
    assert (p.scheduler, p.scheduler_params, p.gradient_clipping) == ("WarmupLR", {"warmup_num_steps": 5}, 1.0)


def test_fsdp_maps_stage_3_to_reshard_after_forward_and_stage_2_to_keeping_parameters_gathered():
    assert torch_settings("fsdp", cfg(3), 1e-3, WHERE).reshard_after_forward is True
    assert torch_settings("fsdp", cfg(2), 1e-3, WHERE).reshard_after_forward is False
    assert torch_settings("fsdp", cfg(3), 1e-3, WHERE).zero_stage == 3


@pytest.mark.parametrize("stage", [0, 1])
def test_fsdp_refuses_stages_it_has_no_equivalent_of(stage):
    """The legality table's rule, which run and the studies both apply (``tests/test_legality.py``)."""
    said = legality.violation(Layout(stage, "none", "fp32", 8, engine="fsdp"), Where(2))
    assert said.startswith(f"--engine fsdp with ZeRO stage {stage}: FSDP always shards") and "use stage 2" in said


def test_offloads():
    param = {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}
    assert torch_settings("fsdp", cfg(zero_optimization=param), 1e-3, WHERE).cpu_offload is True
    assert "FSDP2's CPUOffloadPolicy moves parameters" in legality.violation(
        Layout(2, "optimizer", "fp32", 8, engine="fsdp"), Where(2))
    assert "DDP keeps parameters" in legality.violation(Layout(0, "optimizer", "fp32", 8, engine="ddp"), Where(2))


def test_precision_maps_to_autocast_for_ddp_and_a_mixed_precision_policy_for_fsdp():
    ddp, fsdp = torch_settings("ddp", cfg(0, "bf16"), 1e-3, WHERE), torch_settings("fsdp", cfg(3, "bf16"), 1e-3, WHERE)
    assert (ddp.precision, ddp.reduce_precision) == ("bf16", "fp32")  # autocast: fp32 weights, fp32 all-reduce
    assert (fsdp.precision, fsdp.reduce_precision) == ("bf16", "bf16")  # DeepSpeed reduces bf16 runs in bf16 too
    fp32_reduce = torch_settings("fsdp", cfg(3, "bf16", communication_data_type="fp32"), 1e-3, WHERE)
    assert fp32_reduce.reduce_precision == "fp32"
    fp16 = torch_settings("ddp", cfg(0, "fp16", fp16={"enabled": True, "initial_scale_power": 12, "loss_scale_window": 50}),
                1e-3, WHERE)
    assert fp16.loss_scale == {"init_scale": 4096.0, "growth_interval": 50}
    static = torch_settings("ddp", cfg(0, "fp16", fp16={"enabled": True, "loss_scale": 128}), 1e-3, WHERE)
    assert static.loss_scale["init_scale"] == 128.0 and static.loss_scale["growth_interval"] > 1e9
    assert torch_settings("ddp", cfg(0), 1e-3, WHERE).loss_scale is None


def test_optimizer_sections_as_torch_builds_them():
    assert torch_optimizer({}, 5e-4, WHERE) == ("AdamW", {"lr": 5e-4, "fused": True})  # no section: ds_bench's default
    adam = {"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "adam_w_mode": False}}}
    assert torch_optimizer(adam, 1.0, WHERE) == ("Adam", {"lr": 1e-3})
    sgd = {"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}}
    assert torch_optimizer(sgd, 1.0, WHERE) == ("SGD", {"lr": 0.1, "momentum": 0.9})
    with pytest.raises(UserError, match=r"optimizer\.type 'Lamb' is DeepSpeed's own; DDP and FSDP take"):
        torch_optimizer({"optimizer": {"type": "Lamb", "params": {}}}, 1.0, WHERE)


def test_choose_keeps_deepspeed_in_the_compute_dtype_and_torch_engines_in_fp32():
    ds, ddp = choose("deepspeed", cfg(2, "bf16"), 1e-3, WHERE), choose("ddp", cfg(2, "bf16"), 1e-3, WHERE)
    assert (ds.zero_stage, ds.model_dtype, ds.input_dtype, ds.describe()) == (2, torch.bfloat16, torch.bfloat16, None)
    assert (ddp.zero_stage, ddp.model_dtype, ddp.input_dtype) == (0, torch.float32, torch.float32)
    assert ddp.describe()["engine"] == "ddp"
    with pytest.raises(UserError, match="--engine 'zero' is unknown; known: deepspeed, ddp, fsdp"):
        choose("zero", cfg(), 1e-3, WHERE)


def test_fsdp_units_are_the_blocks_huggingface_marks_unsplittable():
    class Block(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(Block(2, 2), torch.nn.Linear(2, 2), Block(2, 2))
    model._no_split_modules = ["Block"]
    assert shard_units(model) == [model[0], model[2]]
    assert shard_units(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []  # MNIST's CNN: the root alone


def test_sweep_engine_axis():
    fams = families((0, 1, 2, 3), ("none", "optimizer"), ("fp32",), (1,), ("deepspeed", "ddp", "fsdp"))
    labels = [f.family_label() for f in fams]
    assert labels[:8] == [f"z{s} off={o} fp32" for s in range(4) for o in ("none", "optimizer")]
    assert labels[8:] == ["ddp z0 off=none fp32", "fsdp z2 off=none fp32", "fsdp z3 off=none fp32"]
    assert [f.family_label() for f in families((0, 1), ("all",), ("bf16",), (1,), ("fsdp",))] == ["fsdp z3 off=all bf16"]


def test_point_keys_round_trip_and_deepspeed_keys_are_unchanged():
    defaults = Layout(0, "none", "fp32", 32)
    assert Layout(2, "none", "fp32", 32).key == "z2 off=none fp32 mbs=32"  # ledgers from before the axis still match
    for text in ("ddp z0 off=none bf16 mbs=8", "fsdp z3 off=all fp32 mbs=16 ga=2", "z1 off=optimizer fp32 mbs=4"):
        assert parse_key(text, defaults).key == text
    assert parse_key("fsdp mbs=8", Layout(3, "none", "fp32", 1)).engine == "fsdp"
    assert Layout.from_dict({"stage": 1, "offload": "none", "precision": "fp32", "micro_batch": 2}).engine == "deepspeed"
    with pytest.raises(ValueError, match=re.escape("'megatron' is not ddp|fsdp, z0..z3")):
        parse_key("megatron", defaults)


@pytest.mark.parametrize("key, reason", [
    ("ddp z2 off=none fp32 mbs=8", "DDP replicates everything"),
    ("fsdp z1 off=none fp32 mbs=8", "--engine fsdp with ZeRO stage 1: FSDP always shards"),
    ("fsdp z2 off=optimizer fp32 mbs=8", "--engine fsdp with offload=optimizer: FSDP2's CPUOffloadPolicy"),
])
def test_invalid_engine_points_say_why(key, reason):
    assert why(parse_key(key, Layout(0, "none", "fp32", 1)), "cpu").startswith(reason)

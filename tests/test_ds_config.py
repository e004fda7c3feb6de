"""DeepSpeed config resolution: parsing, --set, unknown keys, "auto", batch arithmetic, precision."""

import json
import re
from pathlib import Path

import pytest

from ds_bench.config.deepspeed.prepare import (
    RunContext,
    apply_overrides,
    load_json,
    parse_override,
    precision_of,
    prepare,
    resolve_auto,
    unknown_keys,
)
from ds_bench.config.deepspeed.sections import check_flag_keys
from ds_bench.errors import UserError

CONFIGS = sorted((Path(__file__).parent.parent / "ds_configs").glob("*.json"))
CPU = RunContext(world_size=2, device_type="cpu", lr=1e-3, steps=50, warmup=5)


def write(tmp_path, cfg) -> str:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg) if not isinstance(cfg, str) else cfg)
    return str(path)


def test_invalid_json_reports_line_and_column(tmp_path):
    path = write(tmp_path, '{\n  "train_batch_size": 8,\n  "bf16": {"enabled": true,}\n}')
    with pytest.raises(UserError, match=r"c\.json:3:\d+: invalid JSON"):
        load_json(path)


def test_missing_and_non_object_configs(tmp_path):
    with pytest.raises(UserError, match="nope.json: cannot read DeepSpeed config"):
        load_json(str(tmp_path / "nope.json"))
    with pytest.raises(UserError, match="must be a JSON object, got list"):
        load_json(write(tmp_path, "[1, 2]"))


def test_binary_config_is_a_clear_error(tmp_path):
    path = tmp_path / "c.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(UserError, match="not UTF-8 text"):
        load_json(str(path))


def test_set_parses_json_values_and_dotted_paths():
    cfg = apply_overrides({"zero_optimization": {"stage": 1}},
                          ("zero_optimization.stage=3", "bf16.enabled=true", "optimizer.type=AdamW"))
    assert cfg == {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}, "optimizer": {"type": "AdamW"}}


@pytest.mark.parametrize("bad", ["zero_optimization.stage", "=3", "a..b=1", ".a=1"])
def test_bad_set_is_rejected(bad):
    with pytest.raises(UserError, match="expected KEY=VALUE"):
        parse_override(bad)


def test_set_through_a_scalar_is_rejected():
    with pytest.raises(UserError, match="train_batch_size is not a JSON object"):
        apply_overrides({"train_batch_size": 8}, ("train_batch_size.x=1",))


def test_unknown_keys_name_the_nearest_valid_one():
    cfg = {"zero_optimization": {"stage": 3, "stage3_param_persitence_threshold": 10},
           "gradient_acumulation_steps": 2, "totally_new": 1}
    found = unknown_keys(cfg)
    assert "zero_optimization.stage3_param_persitence_threshold (did you mean stage3_param_persistence_threshold?)" in found
    assert "gradient_acumulation_steps (did you mean gradient_accumulation_steps?)" in found
    assert "totally_new" in found


def test_unknown_key_error_from_prepare(tmp_path):
    path = write(tmp_path, {"zero_optimization": {"stage": 3, "stage3_param_persitence_threshold": 10}, **OPT})
    with pytest.raises(UserError, match=r"c\.json: unknown DeepSpeed key zero_optimization\.stage3_param_persitence_threshold "
                                        r"\(did you mean stage3_param_persistence_threshold\?\)"):
        prepare(path, (), CPU)


def test_auto_values_resolved_from_the_run():
    cfg = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "gradient_clipping": "auto", "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto"}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto", "warmup_max_lr": "auto"}},
           "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                 "stage3_param_persistence_threshold": "auto"}}
    ctx = RunContext(world_size=4, device_type="cpu", lr=3e-4, steps=20, warmup=3, micro_batch=8, hidden_size=100)
    out = resolve_auto(cfg, ctx, "c.json")
    assert (out["train_micro_batch_size_per_gpu"], out["gradient_accumulation_steps"], out["train_batch_size"]) == (8, 1, 32)
    assert out["optimizer"]["params"] == {"lr": 3e-4, "betas": [0.9, 0.999]}
    assert out["scheduler"]["params"] == {"warmup_num_steps": 3, "warmup_max_lr": 3e-4}
    assert out["zero_optimization"]["reduce_bucket_size"] == 10000
    assert out["zero_optimization"]["stage3_prefetch_bucket_size"] == 9000
    assert out["zero_optimization"]["stage3_param_persistence_threshold"] == 1000
    assert out["gradient_clipping"] == 1.0
    untimed_start = resolve_auto(cfg, RunContext(world_size=4, device_type="cpu", lr=3e-4, steps=1, warmup=0), "c.json")
    assert untimed_start["scheduler"]["params"]["warmup_num_steps"] == 1  # --warmup 0: WarmupLR needs at least 1


def test_auto_without_a_rule_is_named():
    with pytest.raises(UserError, match=r"no rule to resolve \"auto\" for aio\.block_size"):
        resolve_auto({"aio": {"block_size": "auto"}}, CPU, "c.json")


def test_batch_defaults_and_derivations():
    assert resolve_auto({}, CPU, "c")["train_batch_size"] == 64  # 32 x 1 x 2
    out = resolve_auto({"train_batch_size": 48, "gradient_accumulation_steps": 3}, CPU, "c")
    assert out["train_micro_batch_size_per_gpu"] == 8
    out = resolve_auto({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 16}, CPU, "c")
    assert out["gradient_accumulation_steps"] == 2


def test_batch_mismatch_shows_the_numbers():
    cfg = {"train_batch_size": 100, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2}
    with pytest.raises(UserError, match=r"train_batch_size \(100\) must equal train_micro_batch_size_per_gpu \(16\) "
                                        r"x gradient_accumulation_steps \(2\) x world size \(2\) = 64"):
        resolve_auto(cfg, CPU, "c.json")


def test_a_batch_written_for_another_world_size_names_it_and_the_way_out():
    """128 = 4 x 4 x 8 GPUs, run on 2: what it implies, and each way out it names is one resolve accepts."""
    cfg = {"train_batch_size": 128, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4}
    with pytest.raises(UserError) as e:
        resolve_auto(cfg, CPU, "c.json")
    assert str(e.value) == (
        "c.json: train_batch_size (128) must equal train_micro_batch_size_per_gpu (4) x gradient_accumulation_steps (4) "
        "x world size (2) = 32: it implies micro-batch 4 x accumulation 4 x world size 8; to run micro-batch 4 x "
        "accumulation 4 at world size 2 here, drop train_batch_size or --set train_batch_size=auto (it becomes 32), "
        "or keep 128 with --set gradient_accumulation_steps=16")
    for way_out in ("train_batch_size=auto", "gradient_accumulation_steps=16"):
        out = resolve_auto(apply_overrides(cfg, (way_out,)), CPU, "c.json")
        assert out["train_micro_batch_size_per_gpu"] == 4
        assert (out["gradient_accumulation_steps"], out["train_batch_size"]) == ((4, 32) if "auto" in way_out else (16, 128))
    dropped = resolve_auto({k: v for k, v in cfg.items() if k != "train_batch_size"}, CPU, "c.json")
    assert dropped["train_batch_size"] == 32


@pytest.mark.parametrize("cfg, why", [
    ({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2},
     "it cannot be split over this world size (micro-batch 16 x accumulation 2 x world size 2 does not divide 100)"),
    ({"train_batch_size": 99, "gradient_accumulation_steps": 3},
     "it cannot be split over this world size (accumulation 3 x world size 2 does not divide 99)"),
    ({"train_batch_size": 7}, "it cannot be split over this world size (world size 2 does not divide 7)"),
])
def test_a_batch_that_cannot_be_split_here_says_so(cfg, why):
    with pytest.raises(UserError, match=re.escape(why) + r"; to run micro-batch \d+ x accumulation \d+ at world size 2 "
                                        r"here, drop train_batch_size or --set train_batch_size=auto"):
        resolve_auto(cfg, CPU, "c.json")


@pytest.mark.parametrize("cfg, match", [
    ({"sequence_parallel_size": 4}, r"c\.json: sequence_parallel_size 4: give it as --sequence-parallel 4 instead, "
                                     r"which wraps the attention in Ulysses"),
    ({"tensor_parallel": {"autotp_size": 4}}, r"c\.json: tensor_parallel\.autotp_size 4: give it as --tensor-parallel 4 "
                                              r"instead, which lays out the batch"),
    ({"sequence_parallel_size": 0}, r"sequence_parallel_size must be an integer >= 1, got 0; a degree above 1 is "
                                    r"given as --sequence-parallel N"),
    ({"sequence_parallel_size": "2"}, r"sequence_parallel_size must be an integer >= 1, got '2'"),
    ({"tensor_parallel": {"autotp_size": -1}}, r"tensor_parallel\.autotp_size must be an integer >= 0, got -1"),
])
def test_a_parallel_degree_in_the_config_points_to_its_run_flag(cfg, match):
    with pytest.raises(UserError, match=match):
        check_flag_keys(cfg, "c.json")


@pytest.mark.parametrize("cfg", [{"sequence_parallel_size": 1}, {"tensor_parallel": {"autotp_size": 1}},
                                 {"tensor_parallel": {"autotp_size": 0}}, {"tensor_parallel": {}}, {}])
def test_a_degree_of_one_passes_quietly(cfg):
    check_flag_keys(cfg, "c.json")


def test_cli_micro_batch_wins_over_the_file():
    ctx = RunContext(world_size=2, device_type="cpu", lr=1e-3, steps=10, warmup=1, micro_batch=4)
    out = resolve_auto({"train_micro_batch_size_per_gpu": 16}, ctx, "c")
    assert out["train_micro_batch_size_per_gpu"] == 4 and out["train_batch_size"] == 8


def test_bad_batch_value():
    with pytest.raises(UserError, match="train_batch_size must be a positive integer or \"auto\", got -1"):
        resolve_auto({"train_batch_size": -1}, CPU, "c.json")


OPT = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


def test_a_config_without_optimizer_is_accepted_and_gets_a_default(tmp_path):
    from ds_bench.config.deepspeed import optim

    cfg = prepare(write(tmp_path, {"zero_optimization": {"stage": 1}}), (), CPU)
    assert "optimizer" not in cfg
    assert optim.describe(cfg) == {"source": "ds_bench default", "type": "torch.optim.AdamW", "fused": True}
    assert optim.describe(cfg, "hpu")["fused"] is False  # no fused kernel there: ds_bench passes fused=False
    offload = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    assert optim.describe(prepare(write(tmp_path, offload), (), CPU))["type"] == "deepspeed.ops.adam.DeepSpeedCPUAdam"


def test_legacy_bfloat16_section_means_bf16(tmp_path):
    cfg = prepare(write(tmp_path, {"bfloat16": {"enabled": True}, **OPT}), (), CPU)
    assert precision_of(cfg) == "bf16" and "bfloat16" not in cfg
    with pytest.raises(UserError, match="fp16.enabled and bf16.enabled are both true"):
        prepare(write(tmp_path, {"bfloat16": {"enabled": True}, "fp16": {"enabled": True}, **OPT}), (), CPU)
    with pytest.raises(UserError, match=r"both \"bf16\" and its legacy alias \"bfloat16\""):
        prepare(write(tmp_path, {"bfloat16": {"enabled": True}, "bf16": {"enabled": False}, **OPT}), (), CPU)


def test_values_deepspeed_coerces_mean_the_same_to_ds_bench(tmp_path):
    cfg = prepare(write(tmp_path, {"bf16": {"enabled": "true"}, "zero_optimization": {"stage": 2, "cpu_offload": True},
                                   **OPT}), (), CPU)
    assert precision_of(cfg) == "bf16"
    assert cfg["zero_optimization"]["offload_optimizer"] == {"device": "cpu"} and "cpu_offload" not in cfg["zero_optimization"]
    cfg = prepare(write(tmp_path, {"zero_optimization": True, "allgather_size": 1000, **OPT}), (), CPU)
    assert cfg["zero_optimization"]["stage"] == 1 and cfg["zero_optimization"]["allgather_bucket_size"] == 1000


def test_fp16_on_cpu_is_rejected_with_a_bf16_hint(tmp_path):
    path = write(tmp_path, {"fp16": {"enabled": True}, **OPT})
    with pytest.raises(UserError, match="fp16 is not supported on CPU.*--set bf16.enabled=true"):
        prepare(path, (), CPU)
    gpu = RunContext(world_size=2, device_type="cuda", lr=1e-3, steps=10, warmup=1)
    assert precision_of(prepare(path, (), gpu)) == "fp16"


def test_bad_stage(tmp_path):
    with pytest.raises(UserError, match="zero_optimization.stage must be 0, 1, 2 or 3, got 4"):
        prepare(write(tmp_path, {"zero_optimization": {"stage": 4}, **OPT}), (), CPU)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_resolves(path):
    device = "cuda" if "fp16" in path.name else "cpu"
    ctx = RunContext(world_size=2, device_type=device, lr=1e-3, steps=10, warmup=2, hidden_size=64)
    cfg = prepare(str(path), (), ctx)
    assert cfg["train_batch_size"] == 64
    assert precision_of(cfg) == ("fp16" if "fp16" in path.name else "bf16")


def test_deepspeed_model_errors_name_the_dotted_key(tmp_path):
    cases = {
        "offload device": ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}},
                           r"zero_optimization\.offload_optimizer\.device must be 'none', 'cpu' or 'nvme', got 'gpu'"),
        "bool": ({"bf16": {"enabled": "maybe"}}, r"bf16\.enabled must be a valid boolean.*got 'maybe'"),
        "ratio": ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}},
                  r"zero_optimization: Partial offloading only supported for ZeRO Stage 3"),
    }
    for cfg, pattern in cases.values():
        with pytest.raises(UserError, match=pattern):
            prepare(write(tmp_path, {**cfg, **OPT}), (), CPU)

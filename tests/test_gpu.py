"""GPU smoke tests: a real run on CUDA, skipped cleanly where there is none."""

import math

import pytest
import torch

from tests.conftest import ds_bench, explain, records

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]


@pytest.mark.parametrize("config", ["zero2.json", "zero3.json", "zero2_fp16.json"])
def test_mnist_on_one_gpu(tmp_path, config):
    results = tmp_path / "r.jsonl"
    proc = ds_bench("run", "--workload", "mnist", "--ds-config", f"ds_configs/{config}", "--steps", "20",
                    "--warmup", "5", "--results", str(results))
    assert proc.returncode == 0, explain(proc)
    r = records(results)[0]
    assert r["hardware"]["device_type"] == "cuda" and r["backend"] == "nccl"
    m = r["metrics"]
    assert m["peak_mem_kind"] == "allocated" and m["peak_mem_reserved_bytes"] >= m["peak_mem_bytes"] > 0
    assert m["samples_per_s"] > 0


def test_resnet50_on_one_gpu_reports_mfu(tmp_path):
    """ResNet-50 at 224 x 224, bf16 ZeRO-2: images/s, TFLOP/s and an MFU from the peak table."""
    results = tmp_path / "r.jsonl"
    proc = ds_bench("run", "--workload", "resnet", "--size", "resnet50", "--ds-config", "ds_configs/zero2.json",
                    "--micro-batch", "64", "--steps", "15", "--warmup", "5", "--results", str(results))
    assert proc.returncode == 0, explain(proc)
    r = records(results)[0]
    assert r["params"] == 25_557_032 and r["metrics"]["sample_unit"] == "images"
    _check_mfu(r)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gpt2_small_on_one_gpu_reports_tokens_and_mfu(tmp_path, checkpointing):
    """GPT-2 small, seq 1024, bf16 ZeRO-3: tokens/s and MFU (model FLOPs: recomputation not counted)."""
    results = tmp_path / "r.jsonl"
    proc = ds_bench("run", "--workload", "gpt2", "--size", "small", "--seq-len", "1024", "--ds-config",
                    "ds_configs/zero3.json", "--micro-batch", "8", "--steps", "15", "--warmup", "5",
                    "--results", str(results), *(["--activation-checkpointing"] if checkpointing else []),
                    HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    assert proc.returncode == 0, explain(proc)
    r = records(results)[0]
    m = r["metrics"]
    assert r["params"] == 124_439_808 and m["tokens_per_s"] == pytest.approx(m["samples_per_s"] * 1024)
    _check_mfu(r)


def _check_mfu(r):
    m = r["metrics"]
    assert r["status"] == "ok" and r["hardware"]["device_type"] == "cuda"
    assert m["model_flops_per_step"] > 0 and m["tflops_per_device"] > 0
    if m["peak_tflops"] is not None:  # a GPU in ds_bench.measure.peaks: MFU is a real fraction
        assert 0 < m["mfu"] < 1 and m["mfu"] == pytest.approx(m["tflops_per_device"] / m["peak_tflops"])
    else:
        assert m["mfu"] is None and "--peak-tflops" in m["mfu_note"]


@pytest.mark.parametrize("engine, config", [("ddp", "zero2_fp16.json"), ("fsdp", "zero3_fp16.json"),
                                            ("fsdp", "zero3.json"), ("ddp", "zero2.json")])
def test_ddp_and_fsdp_on_one_gpu(tmp_path, engine, config):
    """The torch engines on CUDA with the precisions CPU ranks cannot run (fp16: GradScaler /
    ShardedGradScaler) and the bf16 autocast / MixedPrecisionPolicy paths, through nccl."""
    results = tmp_path / "r.jsonl"
    proc = ds_bench("run", "--workload", "mnist", "--ds-config", f"ds_configs/{config}", "--engine", engine,
                    "--steps", "20", "--warmup", "5", "--results", str(results))
    assert proc.returncode == 0, explain(proc)
    r = records(results)[0]
    assert (r["engine"], r["backend"], r["hardware"]["device_type"]) == (engine, "nccl", "cuda")
    assert r["engine_plan"]["precision"] == ("fp16" if "fp16" in config else "bf16")
    m = r["metrics"]
    assert m["samples_per_s"] > 0 and m["peak_mem_bytes"] > 0 and all(math.isfinite(x) for x in m["loss_curve"])


def test_checkpoint_offload_and_tiling_on_one_gpu_keep_the_losses_and_lower_the_peak(tmp_path):
    """Llama at a long sequence, bf16 ZeRO-3, activation checkpointing: with ALST's checkpoint offload, tiled MLP
    and tiled loss the same losses (bf16: 1e-2) and a lower peak than without them."""
    base = ["run", "--workload", "llama", "--layers", "8", "--hidden", "1024", "--heads", "8", "--seq-len", "16384",
            "--micro-batch", "1", "--ds-config", "ds_configs/zero3.json", "--activation-checkpointing", "--steps", "4",
            "--warmup", "1"]
    out = {}
    for name, extra in (("plain", []), ("alst", ["--checkpoint-offload", "--tiled-mlp", "--tiled-loss"])):
        results = tmp_path / f"{name}.jsonl"
        proc = ds_bench(*base, *extra, "--results", str(results))
        assert proc.returncode == 0, explain(proc)
        out[name] = records(results)[0]
    plain, alst = out["plain"], out["alst"]
    print({k: (r["metrics"]["peak_mem_bytes"] / 2**30, r["metrics"]["tokens_per_s"]) for k, r in out.items()})
    assert alst["memory_options"] == ["activation_checkpointing", "checkpoint_offload", "tiled_mlp", "tiled_loss"]
    for a, b in zip(plain["metrics"]["loss_curve"], alst["metrics"]["loss_curve"]):
        assert b == pytest.approx(a, rel=1e-2)
    assert alst["metrics"]["peak_mem_bytes"] < plain["metrics"]["peak_mem_bytes"]


def test_moe_layer_on_one_gpu_against_hf_blocks(tmp_path):
    """A Mixtral-shaped model (8 experts, top-2), bf16 ZeRO-2, on one GPU: DeepSpeed's MoE layer at EP=1 and HF's
    own blocks, tokens/s side by side (what the MoE layer costs at EP=1), the router's load balance recorded, and
    model FLOPs from the active parameters (an MFU)."""
    base = ["run", "--workload", "moe", "--layers", "8", "--hidden", "1024", "--heads", "8", "--experts", "8",
            "--top-k", "2", "--seq-len", "2048", "--micro-batch", "4", "--ds-config", "ds_configs/zero2.json",
            "--steps", "12", "--warmup", "4"]
    out = {}
    for path in ("moe-layer", "hf"):
        results = tmp_path / f"{path}.jsonl"
        proc = ds_bench(*base, "--moe-path", path, "--results", str(results))
        assert proc.returncode == 0, explain(proc)
        out[path] = records(results)[0]
    print({k: (r["metrics"]["tokens_per_s"], r["metrics"]["peak_mem_bytes"] / 2**30) for k, r in out.items()})
    layer = out["moe-layer"]
    assert layer["expert_parallel"]["path"] == "moe-layer" and out["hf"]["expert_parallel"]["path"] == "hf"
    assert layer["expert_parallel_comm"]["load_max_over_mean"] >= 1.0
    _check_mfu(layer)

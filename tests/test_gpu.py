"""GPU tier, the checks: what ran on one CUDA GPU, not how fast (``make gpu-check`` runs this file 4 tests at a
time, so no figure is taken from it; the figures are ``tests/test_gpu_timed.py``'s). Skipped where there is no
CUDA. The commands are ``tests/gpu_commands.py``'s; each run's records go to the tier's folder (``gpu_out``).

Covered here: DeepSpeed fp16 with DeepSpeed's FusedAdam (its ``fused_adam`` CUDA op built on first use), ZeRO-2
with the optimizer offloaded (``cpu_adam`` and pinned host transfers), DDP and FSDP in fp16 (GradScaler,
ShardedGradScaler, FSDP's MixedPrecisionPolicy), ALST's tiling against plain activation checkpointing at 16k tokens,
DeepSpeed's MoE layer against HF's blocks, ``--attn flash_attention_2`` (run, or refused in one line without the
flash-attn package), and ``ds-bench comm`` through NCCL with CUDA-event timing. Every run also passes
``gpu_runs.check_cuda_run`` (peaks allocated / reserved, phases from CUDA events, nccl).
"""

from __future__ import annotations

import pytest
import torch

from ds_bench.machine.jit_ops import optimizer_op
from tests import gpu_commands as cmd
from tests.conftest import OFFLINE, degree, ds_bench, records
from tests.gpu_runs import check_mfu, gpu_command, gpu_run

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]


def test_deepspeed_fp16_with_deepspeeds_fused_adam(gpu_out):
    r = gpu_run(gpu_out, "mnist-fp16-fusedadam", cmd.CHECK_RUNS["mnist-fp16-fusedadam"], timeout=480)
    assert (r["engine"], r["precision"], r["zero_stage"]) == ("deepspeed", "fp16", 2)
    assert optimizer_op(r["ds_config"]) == "fused_adam" and r["optimizer"] == {"source": "ds_config", "type": "AdamW"}


def test_zero2_with_the_optimizer_offloaded_to_the_cpu(gpu_out):
    r = gpu_run(gpu_out, "mnist-offload", cmd.CHECK_RUNS["mnist-offload"], timeout=480)
    assert optimizer_op(r["ds_config"]) == "cpu_adam" and r["precision"] == "bf16"
    assert r["ds_config"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


@pytest.mark.parametrize("name", ["ddp-fp16", "fsdp-fp16"])
def test_ddp_and_fsdp_in_fp16(gpu_out, name):
    """The torch engines with the precision CPU ranks cannot run (fp16: GradScaler / ShardedGradScaler, FSDP's
    MixedPrecisionPolicy), through nccl."""
    r = gpu_run(gpu_out, name, cmd.CHECK_RUNS[name])
    assert r["engine"] == name.split("-")[0] and r["engine_plan"]["precision"] == "fp16"


def test_checkpoint_offload_and_tiling_keep_the_losses_and_lower_the_peak(gpu_out):
    """Llama at 16k tokens, bf16 ZeRO-3, activation checkpointing: with ALST's checkpoint offload, tiled MLP and tiled
    loss the same losses (bf16: 1e-2) and a lower peak than without them; recomputation counted in HFU, not MFU."""
    plain = gpu_run(gpu_out, "alst-plain", cmd.CHECK_RUNS["alst-plain"])
    alst = gpu_run(gpu_out, "alst-tiled", cmd.CHECK_RUNS["alst-tiled"])
    assert alst["memory_options"] == ["activation_checkpointing", "checkpoint_offload", "tiled_mlp", "tiled_loss"]
    for a, b in zip(plain["metrics"]["loss_curve"], alst["metrics"]["loss_curve"]):
        assert b == pytest.approx(a, rel=1e-2)
    assert alst["metrics"]["peak_mem_bytes"] < plain["metrics"]["peak_mem_bytes"]
    m = plain["metrics"]
    assert m["hardware_tflops_per_device"] > m["tflops_per_device"] and m["hfu"] > m["mfu"]


def test_moe_layer_against_hf_blocks(gpu_out):
    """A Mixtral-shaped model (8 experts, top-2), bf16 ZeRO-2: DeepSpeed's MoE layer at EP=1 and HF's own blocks
    (what the MoE layer costs at EP=1), the router's load balance recorded, MFU from the active parameters."""
    layer = gpu_run(gpu_out, "moe-layer", cmd.CHECK_RUNS["moe-layer"])
    hf = gpu_run(gpu_out, "moe-hf", cmd.CHECK_RUNS["moe-hf"])
    assert degree(layer, "expert_parallel")["settings"]["path"] == "moe-layer"
    assert degree(hf, "expert_parallel")["settings"]["path"] == "hf"
    assert degree(layer, "expert_parallel")["measured"]["load_max_over_mean"] >= 1.0
    check_mfu(layer)


def test_flash_attention_2_runs_or_is_refused_in_one_line(gpu_out):
    """With the flash-attn package the model runs FlashAttention-2 (the record reads it back from the model); without
    it the run stops before joining: exit 2, one line naming the package and the way out, nothing written."""
    argv = cmd.CHECK_RUNS["flash-attn"]
    if cmd.FLASH_ATTN:
        r = gpu_run(gpu_out, "flash-attn", argv)
        assert r["attn_implementation"] == "flash_attention_2"
        return
    results = gpu_out / "flash-attn.jsonl"
    proc = ds_bench("run", *argv, "--results", str(results), **OFFLINE)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ds-bench: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "needs the flash-attn package" in errors[0] and "--attn sdpa" in errors[0]
    assert not results.exists()


def test_comm_through_nccl_with_cuda_event_timing(gpu_out):
    """Every collective on one GPU, each result checked at every size (one rank: nothing crosses a link, busbw 0 by
    definition, and the record says so)."""
    gpu_command(gpu_out, "comm", cmd.COMM)
    r = records(gpu_out / "comm.jsonl")[-1]
    assert (r["status"], r["backend"], r["hardware"]["device_type"]) == ("ok", "nccl", "cuda"), r["problems"]
    assert {row["collective"] for row in r["results"]} >= {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    assert all(not row["wrong"] and row["time_us"] > 0 for row in r["results"])
    assert r["note"]

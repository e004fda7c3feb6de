"""GPU tier, the figures: the runs ``make gpu-check``'s figures page is made of (``ds_bench.report.gpu_figures``),
one at a time, in this order: the measured ceiling first (every later run in the folder reports
``mfu_vs_measured`` against it), ResNet-50, GPT-2 small and Llama 3.2-1B with the defaults, then with the best
options (``--compile``, DeepSpeed's FusedAdam, flash-attn where installed, a larger micro-batch), then
``ds-bench capacity`` on the one GPU. Skipped where there is no CUDA. Commands: ``tests/gpu_commands.py``.
"""

from __future__ import annotations

import pytest
import torch

from ds_bench.machine.jit_ops import optimizer_op
from ds_bench.report.gpu_figures import DEEPCOMPILE_STAGES, LM_MODELS, RESNET, deepcompile_name, lm_name
from ds_bench.workloads import gpt2_shapes, llama_shapes
from tests import gpu_commands as cmd
from tests.conftest import records
from tests.gpu_runs import check_mfu, check_vs_measured, gpu_command, gpu_run

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]

PARAMS = {"gpt2-small": gpt2_shapes.gpt2_param_count(12, 768, gpt2_shapes.VOCAB, 1024),
          "llama3.2-1b": llama_shapes.param_count(llama_shapes.SHAPES["llama3.2-1b"])}


def test_roofline_per_dtype_and_copy(gpu_out):
    """Dense matmul TFLOP/s of bf16, fp16 and fp32 (tensor cores: bf16 several times fp32, which runs without TF32)
    and the copy bandwidth, synchronized on the device around every sample."""
    gpu_command(gpu_out, "roofline", cmd.ROOFLINE)
    r = records(gpu_out / "roofline.jsonl")[-1]
    matmul = {row["dtype"]: row["median"] for row in r["results"] if row["test"] == "matmul"}
    copy = [row["median"] for row in r["results"] if row["test"] == "copy"]
    assert set(matmul) == {"bf16", "fp16", "fp32"} and all(row["device"] != "cpu" for row in r["results"])
    assert matmul["bf16"] > 2 * matmul["fp32"] > 0 and copy and copy[0] > 100, (matmul, copy)


def test_resnet50_images_per_s_and_mfu(gpu_out):
    r = gpu_run(gpu_out, RESNET, cmd.TIMED_RUNS[RESNET])
    assert r["params"] == 25_557_032 and r["metrics"]["sample_unit"] == "images"
    check_mfu(r)
    check_vs_measured(r, gpu_out)


@pytest.mark.parametrize("name", [n for n in cmd.TIMED_RUNS if n != RESNET])
def test_language_model_tokens_per_s_and_mfu(gpu_out, name):
    """GPT-2 small and Llama 3.2-1B from random weights at seq 1024, bf16 ZeRO-2: the defaults, then the best options.
    A best run's record must say that each option ran: compiled in the warm-up and never in the measured steps, the
    attention kernel the model ran, DeepSpeed's fused_adam op."""
    model, variant = next((m, v) for m in LM_MODELS for v in ("default", "best") if lm_name(m, v) == name)
    best = variant == "best"
    r = gpu_run(gpu_out, name, cmd.TIMED_RUNS[name], timeout=600 if best else 300,
                **({"TORCHDYNAMO_DISABLE": "0"} if best else {}))
    m = r["metrics"]
    assert r["params"] == PARAMS[model] and m["tokens_per_s"] == pytest.approx(m["samples_per_s"] * 1024)
    check_mfu(r)
    check_vs_measured(r, gpu_out)
    assert r["attn_implementation"] == (cmd.BEST_ATTN if best else "sdpa")
    if best:
        compiled = r["compile"]
        assert compiled["graphs"] >= 1 and compiled["compile_s"] > 0 and compiled["inside_window"] == 0, compiled
        assert optimizer_op(r["ds_config"]) == "fused_adam"
        assert r["micro_batch"] == cmd.LM_MICRO_BATCH[model][1]
    else:
        assert r["compile"] is None and r["optimizer"] == {"source": "ds_config", "type": "AdamW", "fused": True}


def test_capacity_per_layout_on_one_gpu(gpu_out):
    """The largest GPT-2-blocks model that trains at micro-batch 32 on the GPU's own memory, ZeRO-2 with and without
    the optimizer offloaded: each layout answered, every probe either trained or ran out of CUDA memory (classified
    ``oom``, not a crash), the capacity the GPU's total memory."""
    gpu_command(gpu_out, "capacity", cmd.CAPACITY, timeout=540)
    found = records(gpu_out / "capacity.jsonl")
    answers = [r for r in found if r["kind"] == "capacity"]
    newest = answers[-1]["capacity"]
    answers = [r for r in answers if r["capacity"] == newest]
    probes = [r for r in found if r["kind"] == "capacity_probe" and r["capacity"] == newest]
    assert sorted(r["layout"] for r in answers) == ["z2 off=none bf16 mbs=32", "z2 off=optimizer bf16 mbs=32"]
    total = torch.cuda.get_device_properties(0).total_memory
    for r in answers:
        assert r["status"] == "ok" and r["largest"]["member"] and r["capacity_bytes"] == total, r
        assert r["next"] is None or r["next"]["why"] in ("oom", "predicted"), r["next"]
    assert {p["status"] for p in probes} <= {"ok", "oom"}, [(p["member"], p["status"], p["reason"]) for p in probes]
    assert len(probes) <= 3 * len(answers)


@pytest.mark.parametrize("stage", DEEPCOMPILE_STAGES)
def test_deepcompile_against_eager(gpu_out, stage):
    """``--deepcompile`` at ZeRO-1 and ZeRO-3 beside the eager run of the same model, batches and steps: it compiled
    in the warm-up (DeepSpeed's passes in ``engine.compile()``), and the loss after 12 steps agrees with eager's to
    bf16's rounding (the figures page tables the speedup)."""
    eager = gpu_run(gpu_out, deepcompile_name(stage, False), cmd.DEEPCOMPILE_RUNS[deepcompile_name(stage, False)])
    on = gpu_run(gpu_out, deepcompile_name(stage, True), cmd.DEEPCOMPILE_RUNS[deepcompile_name(stage, True)],
                 timeout=600, TORCHDYNAMO_DISABLE="0")
    assert on["ds_config"]["compile"]["deepcompile"] is True and on["layout_key"].endswith("deepcompile")
    assert on["compile"]["graphs"] >= 1 and on["compile"]["inside_window"] == 0, on["compile"]
    assert on["metrics"]["loss_last"] == pytest.approx(eager["metrics"]["loss_last"], rel=2e-2)

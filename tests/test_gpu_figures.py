"""``ds_bench.report.gpu_figures``, the figures page of ``make gpu-check``, on inline records (pure): the header names
the date, command, GPU, driver and versions; each language model's default run beside its best one with MFU as a
percentage and the speed-up; what the record says ran (DeepSpeed's FusedAdam, compile); a missing or failed run
said in its row; the newest record of a tag, roofline record and capacity search winning."""

from __future__ import annotations

import pytest

from ds_bench.report import gpu_figures as g

V = {"python": "3.12.3", "torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.28.9", "deepspeed": "0.19.8",
     "transformers": "5.17.0", "datasets": None}
H100 = {"device": "NVIDIA H100 80GB HBM3", "device_type": "cuda"}
TORCH_ADAMW = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True, "fused": True}}}
DS_ADAMW = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
OFFLOADED = {**DS_ADAMW, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}


def run(name, tokens_per_s, mfu, mbs, ds_config=TORCH_ADAMW, compiled=None, **fields):
    return {"kind": "run", "tag": g.tag(name), "status": "ok", "precision": "bf16", "zero_stage": 2,
            "micro_batch": mbs, "attn_implementation": "sdpa", "compile": compiled, "ds_config": ds_config,
            "optimizer": {"source": "ds_config", "type": "AdamW", "fused": True}, "hardware": H100, "versions": V,
            "config": {"seq_len": 1024}, "git_sha": "0123456789abcdef",
            "metrics": {"tokens_per_s": tokens_per_s, "samples_per_s": tokens_per_s / 1024, "mfu": mfu,
                        "tflops_per_device": mfu * 989.4, "peak_mem_bytes": 10 * 2**30}, **fields}


def roofline(bf16):
    return {"kind": "roofline", "results": [
        {"test": "matmul", "dtype": "bf16", "size": 8192, "median": bf16, "low": bf16 - 5, "high": bf16 + 5,
         "device": H100["device"]},
        {"test": "matmul", "dtype": "fp32", "size": 8192, "median": 51.5, "low": 51.0, "high": 52.0,
         "device": H100["device"]},
        {"test": "gemm", "dtype": "bf16", "size": 4096, "median": 500.0, "low": 1, "high": 2, "device": "x"},
        {"test": "copy", "dtype": "fp32", "size": 2**30, "median": 2950.4, "low": 2900, "high": 3000,
         "device": H100["device"]},
        {"rank": 1, "test": "matmul", "dtype": "fp16", "size": 8192, "median": 1.0, "low": 1, "high": 1,
         "device": H100["device"]}]}


def capacity(search, layout, largest, why="oom"):
    return {"kind": "capacity", "capacity": search, "layout": layout, "status": "ok", "capacity_bytes": 80 * 2**30,
            "largest": {"member": largest, "params": 209_500_000, "peak_mem_bytes": 57 * 2**30},
            "next": {"member": "48 x 768 x 12", "why": why}}


RECORDS = [
    run("gpt2-small-default", 90_000.0, 0.05, 8),  # an older run of the same tag: the newer one below wins
    roofline(700.0),
    capacity("old", "z2 off=none bf16 mbs=32", "12 x 768 x 12"),
    run("gpt2-small-default", 100_000.0, 0.0632, 8),
    run("gpt2-small-best", 180_000.0, 0.11349, 32, ds_config=DS_ADAMW, compiled={"graphs": 3}),
    run("llama3.2-1b-default", 50_000.0, 0.2, 4),
    run("resnet50", 0.0, 0.031, 128, attn_implementation=None, ds_config=OFFLOADED),
    {"kind": "run", "tag": "a-sweep-point", "status": "ok", "metrics": {}},
    roofline(750.25),
    capacity("new", "z2 off=none bf16 mbs=32", "24 x 768 x 12"),
    capacity("new", "z2 off=optimizer bf16 mbs=32", "24 x 768 x 12"),
]
RECORDS[6]["metrics"]["samples_per_s"] = 1230.4


def page(records=RECORDS):
    return g.page(records, date="2026-12-01 10:00 UTC", command="make gpu-check",
                  machine={"driver": "580.159.04", "memory_mib": 81559, "gpu": "from nvidia-smi"},
                  notes=("pytest tests/test_gpu.py: 9 passed, 0 failed, 0 skipped in 91 s",))


def row(text, first_cell):
    found = [line for line in text.splitlines() if line.startswith(f"| {first_cell}")]
    assert len(found) == 1, (first_cell, text)
    return [cell.strip() for cell in found[0].strip("|").split("|")]


def test_the_header_names_the_date_command_gpu_driver_and_versions():
    head = page().split("\n## ")[0]
    assert head.startswith("# GPU check, 2026-12-01 10:00 UTC: NVIDIA H100 80GB HBM3\n")
    assert "- command: `make gpu-check`" in head
    assert "- hardware: NVIDIA H100 80GB HBM3, 81,559 MiB, driver 580.159.04" in head
    assert ("- software: Python 3.12.3, torch 2.11.0+cu130, CUDA 13.0, NCCL 2.28.9, deepspeed 0.19.8, "
            "transformers 5.17.0") in head
    assert "- ds_bench at 0123456789ab" in head and "- pytest tests/test_gpu.py: 9 passed" in head


def test_each_language_model_has_its_default_beside_its_best_with_mfu_in_percent_and_the_speed_up():
    text = page()
    head = row(text, "model | default")
    assert head == ["model", "default", "tokens/s", "MFU", "best", "tokens/s", "MFU", "best / default"]
    gpt2 = row(text, "GPT-2 small")
    assert gpt2 == ["GPT-2 small, seq 1024", "mbs 8, bf16 ZeRO-2, sdpa, eager, torch AdamW fused", "100,000", "6.3%",
                    "mbs 32, bf16 ZeRO-2, sdpa, compiled, DeepSpeed FusedAdam", "180,000", "11.3%", "1.80x"]


def test_a_missing_or_failed_run_is_said_in_its_row():
    llama = row(page(), "Llama 3.2-1B")
    assert llama[1:4] == ["mbs 4, bf16 ZeRO-2, sdpa, eager, torch AdamW fused", "50,000", "20.0%"]
    assert llama[4:] == ["missing: no run tagged gpu-check:llama3.2-1b-best", "-", "-", "-"]
    failed = run("llama3.2-1b-best", 0.0, 0.0, 8) | {"status": "failed", "error": "CUDA out of memory"}
    llama = row(page([*RECORDS, failed]), "Llama 3.2-1B")
    assert llama[4:] == ["failed: CUDA out of memory", "-", "-", "-"]
    empty = page([])
    assert row(empty, "GPT-2 small")[1] == "missing: no run tagged gpu-check:gpt2-small-default"
    assert row(empty, "ResNet-50")[1:] == ["missing: no run tagged gpu-check:resnet50", "-", "-", "-", "-"]
    assert "missing: no roofline record" in empty and "missing: no capacity record" in empty
    assert "# GPU check, 2026-12-01 10:00 UTC: from nvidia-smi" in empty


def test_resnet_images_per_s_and_an_offloaded_optimizer():
    assert row(page(), "ResNet-50") == ["ResNet-50, 224 x 224", "mbs 128, bf16 ZeRO-2, eager, DeepSpeed cpu_adam "
                                        "(offloaded)", "1,230", "30.7", "3.1%", "10.0"]


def test_the_newest_roofline_record_per_dtype_against_the_datasheet_and_its_copy():
    text = page()
    assert row(text, "matmul | bf16") == ["matmul", "bf16", "n = 8192", "750.2 TFLOP/s", "745.2-755.2", "76% of 989.4"]
    assert row(text, "matmul | fp32") == ["matmul", "fp32", "n = 8192", "51.5 TFLOP/s", "51.0-52.0", "77% of 66.9"]
    assert row(text, "copy") == ["copy", "fp32", "1 GiB", "2,950.4 GB/s", "2,900.0-3,000.0", "-"]
    assert "gemm" not in text and "700.0 TFLOP/s" not in text and "fp16" not in text  # rank 1's row


@pytest.mark.parametrize("why", ["oom", "predicted"])
def test_the_newest_capacity_search_per_layout(why):
    records = [*RECORDS[:-1], capacity("new", "z2 off=optimizer bf16 mbs=32", "24 x 768 x 12", why)]
    text = page(records)
    assert row(text, "z2 off=none") == ["z2 off=none bf16 mbs=32", "24 x 768 x 12", "209.5M", "57.0 / 80.0",
                                        "48 x 768 x 12", "oom"]
    assert row(text, "z2 off=optimizer")[-1] == why and "12 x 768 x 12" not in text

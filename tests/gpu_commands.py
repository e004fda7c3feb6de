"""The GPU tier's commands as data: every ``ds-bench`` argv the GPU tests run (``tests/test_gpu.py``,
``tests/test_gpu_timed.py``), without ``--results`` and ``--tag``, which the tests add. Kept apart so that
``tests/test_gpu_check.py`` can put each one through ``ds-bench``'s own checks on any machine, CPU included:
a typo in a flag fails in CI, not in the rare minutes a GPU is lent.

``BUDGET_S`` is what each is expected to cost on one H100 (docs/testing.md, "The GPU tier"): a ``ds-bench run``
there spends ~20 s before its first step (interpreter, torch, CUDA context, NCCL, DeepSpeed), a first
``--compile`` of a model and a first build of a DeepSpeed CUDA op much more.
"""

from __future__ import annotations

import importlib.util

from ds_bench.report.gpu_figures import DEEPCOMPILE_STAGES, RESNET, deepcompile_name, lm_name

FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None
"""Whether the flash-attn package is importable here: the best runs use it, else SDPA (and the refusal is checked)."""
BEST_ATTN = "flash_attention_2" if FLASH_ATTN else "sdpa"
FUSED_ADAM = 'optimizer.params={"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}'
"""``--set`` that turns a shipped config's torch AdamW (``torch_adam``, ``fused``) into DeepSpeed's own FusedAdam:
an Adam section without ``torch_adam`` is built by DeepSpeed from its ``fused_adam`` CUDA op (``jit_ops.optimizer_op``)."""
STEPS = ("--steps", "12", "--warmup", "4")
LM_SHAPES = {"gpt2-small": ("--workload", "gpt2", "--size", "small"),
             "llama3.2-1b": ("--workload", "llama", "--size", "llama3.2-1b")}
"""Random init, no download: the named sizes of ``ds_bench.workloads``."""
LM_MICRO_BATCH = {"gpt2-small": (8, 32), "llama3.2-1b": (4, 8)}
"""(default, best) per device: GPT-2 small at seq 1024 peaked at 10.3 / 36.0 GiB on an H100 (docs/gpu-h100.md); Llama
3.2-1B's 128,256-token logits and 1.24 B parameters' ZeRO-2 states put mbs 8 near 50 GiB (estimated)."""


def lm_run(model: str, variant: str) -> tuple[str, ...]:
    """``default``: the shipped zero2.json as it is (bf16, torch's fused AdamW, SDPA, eager); ``best``: the options
    a user would reach for on a GPU: a larger micro-batch, flash-attn where installed, ``--compile``, DeepSpeed's
    FusedAdam."""
    default, best = LM_MICRO_BATCH[model]
    base = (*LM_SHAPES[model], "--seq-len", "1024", "--ds-config", "ds_configs/zero2.json", *STEPS)
    if variant == "default":
        return (*base, "--micro-batch", str(default))
    return (*base, "--micro-batch", str(best), "--attn", BEST_ATTN, "--compile", "--set", FUSED_ADAM)


ALST = ("--workload", "llama", "--layers", "8", "--hidden", "1024", "--heads", "8", "--seq-len", "16384",
        "--micro-batch", "1", "--ds-config", "ds_configs/zero3.json", "--activation-checkpointing", "--steps", "4",
        "--warmup", "1")
ALST_OPTIONS = ("--checkpoint-offload", "--tiled-mlp", "--tiled-loss")
MOE = ("--workload", "moe", "--layers", "8", "--hidden", "1024", "--heads", "8", "--experts", "8", "--top-k", "2",
       "--seq-len", "2048", "--micro-batch", "4", "--ds-config", "ds_configs/zero2.json", *STEPS)

CHECK_RUNS: dict[str, tuple[str, ...]] = {
    "mnist-fp16-fusedadam": ("--workload", "mnist", "--ds-config", "ds_configs/zero2_fp16.json", "--set", FUSED_ADAM,
                             *STEPS),
    "mnist-offload": ("--workload", "mnist", "--ds-config", "ds_configs/zero2_offload.json", *STEPS),
    "ddp-fp16": ("--workload", "mnist", "--ds-config", "ds_configs/zero2_fp16.json", "--engine", "ddp", *STEPS),
    "fsdp-fp16": ("--workload", "mnist", "--ds-config", "ds_configs/zero3_fp16.json", "--engine", "fsdp", *STEPS),
    "alst-plain": ALST,
    "alst-tiled": (*ALST, *ALST_OPTIONS),
    "moe-layer": (*MOE, "--moe-path", "moe-layer"),
    "moe-hf": (*MOE, "--moe-path", "hf"),
    "flash-attn": ("--workload", "llama", "--size", "tiny", "--seq-len", "256", "--ds-config", "ds_configs/zero2.json",
                   "--attn", "flash_attention_2", *STEPS),
}
"""``tests/test_gpu.py``: runs whose assertions are about what ran, not how fast (make gpu-check runs them 4 at a
time on the one GPU)."""

TIMED_RUNS: dict[str, tuple[str, ...]] = {
    RESNET: ("--workload", "resnet", "--size", "resnet50", "--ds-config", "ds_configs/zero2.json", "--micro-batch",
             "128", *STEPS),
    **{lm_name(model, variant): lm_run(model, variant) for variant in ("default", "best") for model in LM_SHAPES},
}
"""``tests/test_gpu_timed.py``: the runs the figures come from, one at a time (defaults first: a best run that runs
out of the budget costs its own row only)."""

DEEPCOMPILE_RUNS: dict[str, tuple[str, ...]] = {
    deepcompile_name(stage, on): (*LM_SHAPES["gpt2-small"], "--seq-len", "1024", "--micro-batch", "8",
                                  "--ds-config", f"ds_configs/zero{stage}.json", *STEPS, *(("--deepcompile",) if on else ()))
    for stage in DEEPCOMPILE_STAGES for on in (False, True)}
"""``tests/test_gpu_timed.py``: GPT-2 small at ZeRO-1 and ZeRO-3, eager and under DeepCompile (issue 48): the speedup
and the two loss curves side by side (``gpu_figures.deepcompile_table``)."""

ROOFLINE = ("roofline", "--dtypes", "bf16,fp32,fp16", "--sizes", "8192", "--min-time", "0.5s", "--repeats", "3",
            "--copy-bytes", "1GiB")
COMM = ("comm", "--max-bytes", "64MiB", "--step-factor", "8")
CAPACITY = ("capacity", "--ds-config", "ds_configs/zero2.json", "--stages", "2", "--offload", "none,optimizer",
            "--scale", "layers", "--layers", "24", "--hidden", "768", "--heads", "12", "--max-scale", "3",
            "--micro-batch", "32", "--seq-len", "1024", "--steps", "3", "--warmup", "1", "--timeout", "4m")
"""GPT-2's blocks at micro-batch 32, where activations outweigh the model states: 24 blocks (~57 GiB by
docs/gpu-h100.md's 12-block figures) fit an 80 GB GPU, 48 do not (~100 GiB), and 72 are predicted above twice the
memory: two probes per layout (the second ends in CUDA's out-of-memory, classified ``oom``), ZeRO-2 with and without
its optimizer states offloaded to the CPU."""

BUDGET_S = {"install": 20, "checks": 100, "roofline": 15, RESNET: 25, "gpt2-small-default": 22,
            "llama3.2-1b-default": 28, "gpt2-small-best": 70, "llama3.2-1b-best": 100, "capacity": 85,
            "figures and page": 10}
"""Expected seconds on one H100 (docs/testing.md): the checks 4 at a time (the longest, MNIST with FusedAdam,
builds the ``fused_adam`` CUDA op; the offload run builds ``cpu_adam``, so the timed runs find both built); a best
run includes its first compile. 475 s in all, within tools/gpu_check.py's 540 s budget."""

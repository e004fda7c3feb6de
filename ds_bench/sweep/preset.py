"""This machine's default sweep (``ds-bench sweep`` with no ``--workload``; ``make bench``).

Both run DeepSpeed, DDP and FSDP (``--engines``), so the baselines sit beside ZeRO in one table.
CPU: MNIST over ZeRO 0-3 x two micro-batches, plus one optimizer-offload point, 2 ranks, in the
precision the CPU runs natively (fp32 where bf16 is only emulated: ~9x slower on AVX2-only CPUs,
``ds_bench.machine.cpu_features``), sized to finish in a few minutes on 2 cores. GPU: GPT-2 small at
sequence length 1024 in bf16 over ZeRO 0-3 x no offload / optimizer offload, micro-batch ``auto``.
"""

from __future__ import annotations

CPU = {"workload": "mnist", "ds_config": "zero1.json", "stages": "0,1,2,3", "offload": "none",
       "micro_batch": "32,128", "points": ["z2 off=optimizer mbs=128"], "engines": "deepspeed,ddp,fsdp"}
GPU = {"workload": "gpt2", "ds_config": "zero2.json", "stages": "0,1,2,3", "offload": "none,optimizer",
       "micro_batch": "auto", "precision": "bf16", "size": "small", "seq_len": 1024, "points": None,
       "engines": "deepspeed,ddp,fsdp"}


def apply(args, gpu: bool) -> list[str]:
    """Fill the arguments the user left out from the preset; returns lines saying what was chosen."""
    preset = GPU if gpu else CPU
    for name, value in preset.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    return [f"preset ({'GPU' if gpu else 'CPU'}): --workload {args.workload} --ds-config {args.ds_config} "
            f"--stages {args.stages} --offload {args.offload} --micro-batch {args.micro_batch} --engines {args.engines}"
            + "".join(f" --point '{p}'" for p in args.points or ())]

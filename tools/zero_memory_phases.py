"""Where a ZeRO stage's memory goes on CPU ranks: RSS and its high-water mark after each phase.

A bare DeepSpeed script (no ds_bench code in the measured path): HF GPT-2 built whole (stage 0-2) or
inside ``deepspeed.zero.Init`` (stage 3), ``deepspeed.initialize``, then forward / backward / step for
a few steps; rank 0 prints its RSS and VmHWM (MiB, from /proc/self/status, after ``malloc_trim``)
after each phase. Used for docs/results/capacity-cpu.md (why ZeRO-3 fits no larger model than
ZeRO-0 in fp32 on 2 CPU ranks, and 0.67x the peak in bf16)::

    torchrun --nproc_per_node 2 tools/zero_memory_phases.py --stage 3 [--bf16] [--max-live 1e6]
"""

from __future__ import annotations

import argparse
import ctypes
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402


def rss_mib() -> dict[str, int]:
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap pages back to the OS: RSS is what is held
    with open("/proc/self/status") as f:
        return {line.split(":")[0]: int(line.split()[1]) // 1024 for line in f if line.startswith(("VmRSS", "VmHWM"))}


def ds_config(args: argparse.Namespace) -> dict:
    hidden = args.hidden
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "bf16": {"enabled": args.bf16},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
            "zero_optimization": {"stage": args.stage, "reduce_bucket_size": hidden * hidden,
                                  "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                                  "stage3_param_persistence_threshold": 10 * hidden,
                                  "stage3_max_live_parameters": args.max_live,
                                  "stage3_max_reuse_distance": args.max_live,
                                  "contiguous_gradients": True, "overlap_comm": True}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", type=int, default=3)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--max-live", type=float, default=1e9, help="stage3_max_live_parameters and reuse distance")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    deepspeed.init_distributed("gloo")
    rank = torch.distributed.get_rank()

    def say(phase: str) -> None:
        if rank == 0:
            print(f"{phase:10} {rss_mib()}", flush=True)

    say("start")
    cfg, config = GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.heads,
                             n_positions=args.seq_len), ds_config(args)
    if args.stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = GPT2LMHeadModel(cfg)
    else:
        model = GPT2LMHeadModel(cfg)
    say("model")
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    say("engine")
    tokens = torch.randint(0, cfg.vocab_size, (1, args.seq_len))
    for step in range(args.steps):
        loss = engine(input_ids=tokens, labels=tokens).loss
        say(f"s{step} fwd")
        engine.backward(loss)
        say(f"s{step} bwd")
        engine.step()
        say(f"s{step} step")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

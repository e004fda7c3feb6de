"""Start-up yardstick: a bare, hand-written DeepSpeed script beside ``ds-bench run`` doing the same work,
both under torchrun on 2 ranks, as the time from each rank's process start to its first measured step.

    python tools/bare_startup.py [--repeats 3] [--warmup 5] [--precision fp32|bf16]

The bare script (this file, run by torchrun with ``--rank``) is what a user writes: import torch and
deepspeed, ``deepspeed.init_distributed``, the MNIST CNN of pytorch/examples, ``deepspeed.initialize``
with ZeRO-2 and fused torch AdamW (``ds_configs/zero2.json``'s choices), synthetic 28 x 28 batches of 32,
``--warmup`` steps. It imports nothing of ds_bench and reports, on rank 0, seconds from the process's
start (``psutil``'s create time, the kernel's) to the end of its warm-up: the moment ``ds-bench run``
opens its measured window, which its record gives as ``startup.total_s`` (``ds_bench.run.startup``).
The two alternate, ``--repeats`` times each, on an otherwise idle machine; the table gives medians,
min-max and ds-bench minus bare. The bare script loads DeepSpeed's JIT ops the stock way (its
TORCH_EXTENSIONS_DIR), so one untimed bare run goes first: the first load in a folder compiles (30-60 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bare_rank(warmup: int, precision: str) -> None:
    """One rank of the hand-written script; rank 0 prints its seconds to the first measured step."""
    import psutil

    started = psutil.Process().create_time()
    import time

    import deepspeed
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3)
            self.fc1, self.fc2 = nn.Linear(64 * 12 * 12, 128), nn.Linear(128, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
            return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    config = {"train_micro_batch_size_per_gpu": 32, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True, "fused": True}},
              "zero_optimization": {"stage": 2}, "bf16": {"enabled": precision == "bf16"}}
    model = Net().to(torch.bfloat16 if precision == "bf16" else torch.float32)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    images = torch.randn(32, 1, 28, 28, dtype=model.fc1.weight.dtype)
    labels = torch.randint(0, 10, (32,))
    for _ in range(warmup):
        loss = F.cross_entropy(engine(images), labels)
        engine.backward(loss)
        engine.step()
    if torch.distributed.get_rank() == 0:
        print(json.dumps({"bare_s": time.time() - started}), flush=True)
    torch.distributed.destroy_process_group()
    # After the measurement: gloo's worker threads can abort interpreter shutdown (SIGABRT, ~1 run in 10,
    # ../shared/ENVIRONMENT.md "Exit crash"), so the script leaves the way ds-bench's ranks do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def torchrun(port: int, *argv: str) -> subprocess.CompletedProcess:
    cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc_per_node", "2", "--master_port",
           str(port), *argv]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


def compare(repeats: int, warmup: int, precision: str) -> None:
    bare, ours = [], []
    untimed = torchrun(29968, os.path.abspath(__file__), "--rank", "--warmup", "1", "--precision", precision)
    if untimed.returncode != 0:
        sys.exit(f"bare script failed:\n{untimed.stderr[-3000:]}")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            proc = torchrun(29970 + 2 * i, os.path.abspath(__file__), "--rank", "--warmup", str(warmup),
                            "--precision", precision)
            lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith('{"bare_s"')]
            if proc.returncode != 0 or not lines:
                sys.exit(f"bare script failed:\n{proc.stderr[-3000:]}")
            bare.append(lines[0]["bare_s"])
            results = os.path.join(tmp, f"r{i}.jsonl")
            proc = torchrun(29971 + 2 * i, "-m", "ds_bench", "run", "--workload", "mnist", "--ds-config",
                            "ds_configs/zero2.json", "--micro-batch", "32", "--warmup", str(warmup), "--steps",
                            str(warmup + 1), "--set", f"bf16.enabled={'true' if precision == 'bf16' else 'false'}",
                            "--results", results)
            if proc.returncode != 0:
                sys.exit(f"ds-bench run failed:\n{proc.stderr[-3000:]}")
            with open(results, encoding="utf-8") as f:
                ours.append(json.loads(f.readline())["startup"]["total_s"])
    print(f"seconds from process start to the first measured step, 2 ranks under torchrun, MNIST CNN ZeRO-2 "
          f"{precision}, {warmup} warm-up steps, {repeats} runs each (median, min-max):")
    for name, values in (("bare DeepSpeed script", bare), ("ds-bench run", ours)):
        print(f"  {name:22s} {statistics.median(values):6.2f}  ({min(values):.2f}-{max(values):.2f})")
    print(f"  ds-bench - bare        {statistics.median(ours) - statistics.median(bare):+6.2f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # one rank of the bare script
    args = p.parse_args(argv)
    if args.rank:
        bare_rank(args.warmup, args.precision)
    else:
        compare(args.repeats, args.warmup, args.precision)


if __name__ == "__main__":
    main()

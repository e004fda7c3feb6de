"""Yardsticks: a bare, hand-written training loop beside ``ds-bench run`` of the same model, one device.

    python tools/yardstick.py --workload gpt2 --size small --seq-len 256 --micro-batch 4
    python tools/yardstick.py --workload resnet --size resnet50 --image-size 224 --micro-batch 32
    python tools/yardstick.py ... --bare-only          # the bare loop alone, e.g. under a profiler

The bare loop is plain PyTorch, the recipe a user's own script follows: fp32 weights, bf16 autocast
(fp32 on a CPU without native bf16, or ``--precision fp32``), fused AdamW, GPT-2 from transformers with
SDPA attention and the tanh GELU in one kernel (``gelu_pytorch_tanh``) and no dropout, ResNet in
channels-last; ``--compile`` adds ``torch.compile``. It imports nothing of ds_bench. Then ``ds-bench run``
trains the same shape on one process, with ZeRO-0 (``ds_configs/zero0.json``) and with ``--engine ddp``
(plus ``--channels-last`` for ResNet, ``--compile`` when given), one after the other on an otherwise idle
machine, and the table gives each as a ratio of the bare loop.

Throughput, for all of them: samples per measured step x measured steps / the sum of measured step
times (warm-up steps excluded; CUDA synchronized before each clock read), x tokens per sample for GPT-2;
each also prints its median step and min-max, and the ratio of medians (one slow step, e.g. another
process taking a core, moves the first ratio but not the second).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

GPT2_SIZES = {"tiny": (2, 64, 2), "small": (12, 768, 12), "medium": (24, 1024, 16)}
"""(layers, width, heads): HF GPT-2's own shapes (tiny: ds_bench's test size)."""
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", choices=("gpt2", "resnet"), default="gpt2")
    p.add_argument("--size", default=None, help="gpt2: tiny, small, medium (default small); resnet: resnet18..152")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--precision", choices=("bf16", "fp32"), default=None,
                   help="default: bf16 where the device runs it natively, else fp32")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--bare-only", action="store_true")
    return p.parse_args(argv)


def native_bf16(device) -> bool:
    import torch

    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def build(args, device):
    """The model, one synthetic batch, the loss function and the samples' unit size (tokens or 1)."""
    import torch

    if args.workload == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        layers, width, heads = GPT2_SIZES[args.size or "small"]
        cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=max(1024, args.seq_len),
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                         activation_function="gelu_pytorch_tanh")
        model = GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa").to(device)
        ids = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq_len), device=device)
        return model, (ids,), lambda m, ids: m(input_ids=ids, labels=ids).loss, args.seq_len
    from transformers import ResNetConfig, ResNetForImageClassification

    depths = {"resnet18": [2, 2, 2, 2], "resnet34": [3, 4, 6, 3], "resnet50": [3, 4, 6, 3],
              "resnet101": [3, 4, 23, 3], "resnet152": [3, 8, 36, 3]}
    size = args.size or "resnet50"
    basic = size in ("resnet18", "resnet34")
    cfg = ResNetConfig(depths=depths[size], layer_type="basic" if basic else "bottleneck",
                       hidden_sizes=[64, 128, 256, 512] if basic else [256, 512, 1024, 2048], num_labels=1000)
    model = ResNetForImageClassification(cfg).to(device).to(memory_format=torch.channels_last)
    images = torch.randn(args.micro_batch, 3, args.image_size, args.image_size, device=device)
    images = images.to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (args.micro_batch,), device=device)
    return model, (images, labels), lambda m, x, y: m(pixel_values=x, labels=y).loss, 1


def bare(args) -> dict:
    """The hand-written loop: samples/s (sum of step times) and the median step."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = args.precision or ("bf16" if native_bf16(device) else "fp32")
    torch.manual_seed(0)
    model, batch, loss_fn, unit = build(args, device)
    if args.compile:
        model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    step_s = []
    for step in range(args.steps):
        sync()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_fn(model, *batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # ds_configs' gradient_clipping
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        if step >= args.warmup:
            step_s.append(time.perf_counter() - start)
    per_s = args.micro_batch * unit * len(step_s) / sum(step_s)
    return {"name": f"bare loop ({precision}{', compiled' if args.compile else ''})", "per_s": per_s,
            "step_ms_median": 1e3 * statistics.median(step_s), "step_ms_min": 1e3 * min(step_s),
            "step_ms_max": 1e3 * max(step_s), "precision": precision}


def ds_bench_run(args, precision: str, name: str, *flags: str) -> dict:
    """One ``ds-bench run`` of the same shape on one process; its throughput from its record."""
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "r.jsonl")
        shape = (["--size", args.size or "small", "--seq-len", str(args.seq_len)] if args.workload == "gpt2"
                 else ["--size", args.size or "resnet50", "--image-size", str(args.image_size)])
        cmd = [sys.executable, "-m", "ds_bench", "run", "--workload", args.workload, *shape,
               "--ds-config", os.path.join(REPO, "ds_configs", "zero0.json"),
               "--set", f"bf16.enabled={'true' if precision == 'bf16' else 'false'}",
               "--micro-batch", str(args.micro_batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--results", results, *(["--compile"] if args.compile else []), *flags]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=REPO,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if proc.returncode != 0:
            return {"name": name, "per_s": None, "error": proc.stderr.strip().splitlines()[-1:]}
        with open(results) as f:
            m = json.loads(f.read().splitlines()[-1])["metrics"]
    per_s = m["tokens_per_s"] if args.workload == "gpt2" else m["samples_per_s"]
    return {"name": name, "per_s": per_s, "step_ms_median": m["step_ms_median"], "step_ms_min": m["step_ms_min"],
            "step_ms_max": m["step_ms_max"]}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    rows = [bare(args)]
    if not args.bare_only:
        precision = rows[0]["precision"]
        rows.append(ds_bench_run(args, precision, "ds-bench run, ZeRO-0"))
        ddp_flags = ("--engine", "ddp", *(["--channels-last"] if args.workload == "resnet" else []))
        rows.append(ds_bench_run(args, precision, "ds-bench run, --engine ddp", *ddp_flags))
    unit = "tokens/s" if args.workload == "gpt2" else "images/s"
    print(f"{args.workload} {args.size or ''} micro-batch {args.micro_batch}, {args.steps - args.warmup} measured "
          f"steps after {args.warmup}, one process")
    print(f"{'':<34}{unit:>12}{'vs bare':>9}{'median ms':>11}{'vs bare':>9}{'min-max ms':>16}")
    for row in rows:
        if row["per_s"] is None:
            print(f"{row['name']:<34}{'failed':>12}  {row['error']}")
            continue
        ratio = row["per_s"] / rows[0]["per_s"]
        by_median = rows[0]["step_ms_median"] / row["step_ms_median"]  # the same work per step: a speed ratio
        spread = f"{row['step_ms_min']:.0f}-{row['step_ms_max']:.0f}"
        print(f"{row['name']:<34}{row['per_s']:>12,.1f}{ratio:>9.2f}{row['step_ms_median']:>11.1f}{by_median:>9.2f}"
              f"{spread:>16}")
    return 0 if all(row["per_s"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

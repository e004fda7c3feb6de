"""Muon's clipping trap, measured bare: DeepSpeed's Muon at ZeRO-0 and ZeRO-1, with ``gradient_clipping`` 1.0 (DeepSpeed's
default) and 0, on the tiny Llama, one process (gloo, world size 1), 12 steps of the same batches. Prints, per case,
how far one attention projection moved and the loss at the last step, side by side: under ZeRO 1-3 DeepSpeed clips
the orthogonalised update (norm ~20-30 a matrix) instead of the gradient, so the clipped ZeRO-1 step is ~25-50x
shorter than ZeRO-0's. Why ``ds-bench run --optimizer muon`` sets ``gradient_clipping`` 0 and refuses a Muon config
that clips at ZeRO 1-3 (docs/options.md#muon). Bypasses ds_bench's checks on purpose: it calls
``deepspeed.initialize`` itself.

    python tools/muon_clipping.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's ds_bench

STEPS = 12


def train(stage: int, clipping: float) -> tuple[float, float]:
    """(how far ``layers.0.self_attn.q_proj.weight`` moved, Frobenius norm; the loss at the last step)."""
    import deepspeed
    import torch

    from ds_bench.config.run_config import RunConfig
    from ds_bench.workloads import build_workload

    cfg = RunConfig(workload="llama", ds_config="ds_configs/zero1.json", size="tiny", seq_len=64, micro_batch=4)
    torch.manual_seed(cfg.seed)
    workload = build_workload(cfg)
    model = workload.build_model()
    ds_cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": clipping,
              "zero_optimization": {"stage": stage}, "bf16": {"enabled": False},
              "optimizer": {"type": "Muon", "params": {"muon_lr": 0.02, "adam_lr": 3e-4, "momentum": 0.95,
                                                       "weight_decay": 0.0, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg)
    weight = dict(engine.module.named_parameters())["model.layers.0.self_attn.q_proj.weight"]
    before = weight.detach().clone()
    batches = workload.batches(0, 1, 4)
    for _ in range(STEPS):
        loss = workload.loss(engine, next(batches))
        engine.backward(loss)
        engine.step()
    return (weight.detach() - before).norm().item(), loss.item()


def main() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29877"), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    rows = [(stage, clipping, *train(stage, clipping)) for stage in (0, 1) for clipping in (1.0, 0.0)]
    print(f"Muon, tiny Llama, {STEPS} steps, 1 rank")
    print(f"{'ZeRO':>4}  {'clipping':>8}  {'q_proj moved':>12}  {'loss':>8}")
    for stage, clipping, moved, loss in rows:
        print(f"{stage:>4}  {clipping:>8.1f}  {moved:>12.4f}  {loss:>8.4f}")


if __name__ == "__main__":
    main()

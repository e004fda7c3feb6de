"""The model states one rank holds under DeepSpeed's MoE layer, by expert-parallel degree: live tensor bytes after
a few optimizer steps, against ``ds_bench.perf.states.model_states_bytes``.

A bare DeepSpeed script (no ds_bench code in the measured path): ``--dense`` replicated Linear layers (the
"rest") and one ``deepspeed.moe.layer.MoE`` of ``--experts`` two-layer experts sharded over ``--ep`` ranks, the
optimizer's parameter groups split as DeepSpeed's MoE needs (``split_params_into_different_moe_groups_for_optimizer``),
``deepspeed.initialize`` at ZeRO ``--stage``, then forward / backward / step. Rank 0 prints the bytes of every live
tensor storage (each counted once: flat buffers and their views are one) and the gradients the autograd engine
holds, minus those held before the model was built, beside the prediction::

    torchrun --nproc_per_node 2 tools/expert_states.py --stage 1 --ep 2 [--bf16]
"""

from __future__ import annotations

import argparse
import gc
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
from deepspeed.moe.layer import MoE  # noqa: E402
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer  # noqa: E402
from torch import nn  # noqa: E402


def live_tensor_bytes(model: nn.Module | None = None) -> int:
    """Bytes of every live tensor storage, each once; with ``model``, its parameters' gradients too."""
    seen, total = set(), 0
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    if model is not None:
        tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for t in tensors:
        if t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen and storage.nbytes():
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


class Net(nn.Module):
    def __init__(self, args: argparse.Namespace):
        super().__init__()
        d, f = args.hidden, args.ffn
        self.rest = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(args.dense))
        expert = nn.Sequential(nn.Linear(d, f, bias=False), nn.ReLU(), nn.Linear(f, d, bias=False))
        self.moe = MoE(d, expert=expert, num_experts=args.experts, ep_size=args.ep, k=2, drop_tokens=False,
                       use_rts=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.rest:
            x = layer(x)
        out, aux, _ = self.moe(x)
        return out.float().pow(2).mean() + aux


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--ffn", type=int, default=2048)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--dense", type=int, default=8, help="replicated d x d layers beside the experts")
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()
    deepspeed.init_distributed("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    before = live_tensor_bytes()
    model = Net(args)
    if args.bf16:
        model = model.to(torch.bfloat16)
    expert_params = sum(p.numel() for p in model.moe.parameters() if getattr(p, "allreduce", True) is False)
    params = sum(p.numel() for p in model.parameters()) + expert_params * (args.ep - 1)  # the whole model's
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
              "bf16": {"enabled": args.bf16},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
              "zero_optimization": {"stage": args.stage, "reduce_bucket_size": 5e5, "allgather_bucket_size": 5e5,
                                    "contiguous_gradients": True, "overlap_comm": False}}
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()),
                                                                   "name": "dense"})
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=groups)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    for _ in range(args.steps):
        loss = engine(torch.randn(4, 16, args.hidden, dtype=dtype))
        engine.backward(loss)
        engine.step()
    held = live_tensor_bytes(engine.module) - before
    if rank == 0:
        from ds_bench.config.layout import Layout
        from ds_bench.perf.states import ModelShape, model_states_bytes

        layout = Layout(args.stage, "none", "bf16" if args.bf16 else "fp32", 4, expert_parallel=args.ep)
        largest = max(args.hidden * args.hidden, args.hidden * args.ffn)
        shape = ModelShape(params, largest, expert_params * args.ep)
        predicted = model_states_bytes(shape, layout, world, world, "cpu")
        print(f"{layout.label(world)}: {params:,} parameters ({expert_params * args.ep:,} in experts, "
              f"{expert_params:,} on this rank): live {held / 2**20:.1f} MiB, predicted {predicted / 2**20:.1f} MiB "
              f"({predicted / held:.2f}x)", flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

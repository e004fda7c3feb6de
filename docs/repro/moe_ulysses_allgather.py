"""DeepSpeed's MoE layer under DeepSpeed-Ulysses' mpu takes the sequence-parallel group for a tensor-parallel one.

A plain reproduction for a DeepSpeed report (DeepSpeed alone, no ds_bench), verified with deepspeed 0.19.8,
torch 2.13.0 (CPU), gloo, 2 ranks:

    torchrun --nproc_per_node 2 docs/repro/moe_ulysses_allgather.py              # fails
    torchrun --nproc_per_node 2 docs/repro/moe_ulysses_allgather.py --override   # each rank's output is right

``runtime/sequence_parallel/parallel_state_sp.py`` sets ``get_model_parallel_world_size =
get_sequence_parallel_world_size``. ``deepspeed.initialize(mpu=parallel_state_sp)`` keeps it as ``groups.mpu``, and
``moe/sharded_moe.py`` and ``moe/mappings.py`` read the tensor-parallel size through
``utils/bwc.py bwc_tensor_model_parallel_world_size(groups.mpu)``: 2 here. ``MOELayer.forward`` then keeps half of
the capacity slots on each rank (``drop_tokens``) and all-gathers the experts' outputs over the sequence-parallel
group (``gather_tokens``), as if its ranks held the same tokens. Ulysses' ranks hold different slices of a sequence.
On gloo the gather fails: ``RuntimeError: ProcessGroupGloo::allgather: invalid tensor size at index 0`` (even with
ep_size=1, as here); on NCCL the shapes pass and the layer computes other ranks' tokens' outputs (training goes
wrong). ``groups._get_model_parallel_world_size`` already answers 1 for Ulysses' mpu (it has
``initialize_sequence_parallel``); ``bwc_tensor_model_parallel_world_size`` does not. ``--override`` makes the two
MoE modules' binding of it answer 1 for Ulysses' mpu: each rank's output then equals the layer's without any mpu.
"""

import argparse
import os

import torch

import deepspeed
import deepspeed.comm as dist
from deepspeed.moe.layer import MoE
from deepspeed.runtime.sequence_parallel import parallel_state_sp
from deepspeed.utils import groups

HIDDEN, EXPERTS, TOKENS = 16, 4, 12


def override() -> None:
    import deepspeed.moe.mappings as mappings
    import deepspeed.moe.sharded_moe as sharded_moe
    from deepspeed.utils.bwc import bwc_tensor_model_parallel_world_size as original

    def world_size(mpu=None):
        return 1 if mpu is not None and hasattr(mpu, "initialize_sequence_parallel") else original(mpu)

    sharded_moe.bwc_tensor_model_parallel_world_size = world_size
    mappings.bwc_tensor_model_parallel_world_size = world_size


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same weights on every rank
        expert = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 32), torch.nn.GELU(), torch.nn.Linear(32, HIDDEN))
        self.moe = MoE(HIDDEN, expert=expert, num_experts=EXPERTS, ep_size=1, k=2, drop_tokens=False,
                       top2_2nd_expert_sampling=False, use_rts=False)

    def forward(self, x):
        return self.moe(x)[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--override", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    parallel_state_sp.initialize_sequence_parallel(dist.get_world_size())
    if args.override:
        override()
    model = Model()
    config = {"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": dist.get_world_size(),
              "zero_optimization": {"stage": 1}, "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config,
                                      mpu=parallel_state_sp)
    x = torch.randn(1, TOKENS, HIDDEN, generator=torch.Generator().manual_seed(rank))  # this rank's slice
    with torch.no_grad():
        mpu, groups.mpu = groups.mpu, None
        alone = engine.module(x)  # the layer with no mpu: this rank's tokens only
        groups.mpu = mpu
        print(f"rank {rank}: groups.mpu tensor-parallel size as the MoE layer reads it: "
              f"{deepspeed.moe.sharded_moe.bwc_tensor_model_parallel_world_size(groups.mpu)}", flush=True)
        out = engine.module(x)  # fails on gloo without --override
    print(f"rank {rank}: max |out - alone| = {(out - alone).abs().max().item():.3g}", flush=True)


if __name__ == "__main__":
    main()

"""A bare torch.distributed all_reduce loop, to compare ``ds-bench comm`` against (no ds_bench code).

    torchrun --nproc_per_node 2 tools/bare_allreduce.py --min-bytes 1024 --max-bytes 268435456 --iters 20 --warmup 5

Per size: warm-up, barrier, ``iters`` timed all_reduces of float32 (wall clock; CUDA synchronized
on GPUs), each rank's mean time averaged over ranks, busbw = size / time x 2(n-1)/n in GB/s
(nccl-tests doc/PERFORMANCE.md). Prints one line per size.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--min-bytes", type=int, default=1024)
    p.add_argument("--max-bytes", type=int, default=2**28)
    p.add_argument("--step-factor", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    size = args.min_bytes
    while size <= args.max_bytes:
        x = torch.zeros(size // 4, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(x)
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        begin = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(x)
        if cuda:
            torch.cuda.synchronize()
        mean = torch.tensor([(time.perf_counter() - begin) / args.iters], dtype=torch.float64)
        dist.all_reduce(mean)
        seconds = mean.item() / n
        if rank == 0:
            print(f"{size:>12} B  {seconds * 1e6:12.1f} us  busbw {size / seconds / 1e9 * 2 * (n - 1) / n:8.3f} GB/s",
                  flush=True)
        size *= args.step_factor
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""DeepSpeed's JIT-compiled CPU ops: knowing whether they are built, and building them once.

On CPU ranks DeepSpeed compiles ``deepspeed_shm_comm`` at the first ``init_distributed`` (~30 s)
and ``cpu_adam`` at the first offload run (~40 s), caching them under TORCH_EXTENSIONS_DIR
(default ~/.cache/torch_extensions). ``python -m ds_bench.ops`` builds both up front, which
``make test`` does so the test suite never pays it inside a timed run.
"""

from __future__ import annotations

import glob
import logging
import os

log = logging.getLogger("ds_bench")

CPU_OPS = {"ShareMemCommBuilder": "deepspeed_shm_comm", "CPUAdamBuilder": "cpu_adam"}


def build_dir(op_name: str) -> str:
    from torch.utils import cpp_extension

    return cpp_extension._get_build_directory(op_name, verbose=False)


def is_built(op_name: str) -> bool:
    return bool(glob.glob(os.path.join(build_dir(op_name), f"{op_name}*.so")))


def announce_cpu_builds(device_type: str, optimizer_op: str | None) -> None:
    """Tell the user, before the silence, that the first run compiles DeepSpeed ops."""
    if device_type != "cpu":
        return
    names = ["deepspeed_shm_comm"] + ([optimizer_op] if optimizer_op else [])
    missing = [n for n in names if not is_built(n)]
    if missing:
        log.warning("first run on this machine: DeepSpeed compiles %s (~30-40 s each, once; cached in %s)",
                    ", ".join(missing), os.path.dirname(build_dir(missing[0])))


def build_all() -> None:
    from ds_bench.runtime import select_accelerator

    select_accelerator()
    from deepspeed.accelerator import get_accelerator

    for builder_name, op_name in CPU_OPS.items():
        builder = get_accelerator().create_op_builder(builder_name)
        if builder is None:
            continue
        state = "cached" if is_built(op_name) else "compiling (~30-40 s)"
        print(f"[ds_bench.ops] {op_name}: {state}", flush=True)
        builder.load(verbose=False)


if __name__ == "__main__":
    build_all()

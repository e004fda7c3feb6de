"""DeepSpeed's CPU ops built (or loaded from the op store) up front, before any run needs them:
``python -m ds_bench.machine.op_builds`` (``make``). How an op is built, loaded and stored is
``ds_bench.machine.jit_ops``'; leftover DeepSpeed shm buffers are removed first (``ds_bench.machine.shm``:
they are RAM, and a compile needs ~2 GB of it).
"""

from __future__ import annotations

from ds_bench.machine import jit_ops


def build_all() -> None:
    from ds_bench.logs import setup_logging
    from ds_bench.machine.environ import pin_jit_toolchain, select_accelerator
    from ds_bench.machine.shm import SHM_DIR, remove_leftovers

    setup_logging()
    pin_jit_toolchain()
    select_accelerator()
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return
    removed = remove_leftovers()
    if removed:
        print(f"[ds_bench.machine.op_builds] removed {len(removed)} leftover DeepSpeed shm buffer(s) from {SHM_DIR} "
              f"({sum(r.size_bytes for r in removed) / 2**30:.2f} GiB of RAM; ds_bench.machine.shm says why)", flush=True)
    for name in jit_ops.CPU_OPS:
        state = ("from the op store" if jit_ops.is_stored(name)
                 else f"cached in {jit_ops.build_dir(name)}" if jit_ops.is_built(name)
                 else f"compiling (~30-60 s) in {jit_ops.build_dir(name)}")
        print(f"[ds_bench.machine.op_builds] {name}: {state}", flush=True)
        jit_ops.ensure_loaded((name,))


if __name__ == "__main__":
    build_all()

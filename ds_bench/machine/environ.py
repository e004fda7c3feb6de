"""This process's environment: the one module that writes ``os.environ``.

What is written, and who decides it: the accelerator DeepSpeed should use (``select_accelerator``),
the JIT toolchain of this environment (``pin_jit_toolchain``, decided by ``ds_bench.machine.toolchain``),
the HuggingFace hub switched off for local data (``hub_offline``), and the rendezvous variables
(``export``, decided by ``ds_bench.cluster.rendezvous``). Written before a child process or DeepSpeed
reads them, so launchers and ranks started from here agree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ds_bench.machine.toolchain import this_environment_toolchain


def select_accelerator() -> None:
    """Name the CPU accelerator explicitly when there is no CUDA, instead of DeepSpeed guessing noisily."""
    import torch

    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


def pin_jit_toolchain() -> None:
    """One ninja and one op-build folder per environment, whatever PATH this process got
    (``ds_bench.machine.toolchain`` says why). Exported, so launchers and ranks started from here agree."""
    os.environ.update(this_environment_toolchain(os.environ))


def device_type() -> str:
    """``cpu``, ``cuda``, ... as DeepSpeed's accelerator names it (after ``select_accelerator``)."""
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name()


def hub_offline() -> None:
    """``--data`` names local files: keep ``datasets`` off the hub (a lookup may hang retrying on a
    machine with no route out). Values the user set are kept."""
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        os.environ.setdefault(key, "1")


def export(updates: Mapping[str, str]) -> None:
    """Set these variables in this process (and so in every process it starts)."""
    os.environ.update(updates)

"""Range checks of command-line values shared by the subcommands (bench, sweep, capacity, launch, report, doctor).

Each raises ``UserError`` naming the flag, the value and what is expected, so a subcommand can check
all of its arguments before it launches, joins or writes anything.
"""

from __future__ import annotations

import os

from ds_bench.errors import UserError


def at_least(flag: str, value: int | None, low: int) -> None:
    """``value`` (when given) is an integer >= ``low``."""
    if value is not None and value < low:
        what = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise UserError(f"{flag} must be {what}, got {value}")


def port(flag: str, value: int | None) -> None:
    if value is not None and not 1 <= value <= 65535:
        raise UserError(f"{flag} must be a TCP port in 1..65535, got {value}")


def steps(steps_flag: str, steps_value: int, warmup_value: int) -> None:
    """Positive steps, non-negative warm-up, and at least one measured step."""
    at_least(steps_flag, steps_value, 1)
    at_least("--warmup", warmup_value, 0)
    if steps_value <= warmup_value:
        raise UserError(f"{steps_flag} ({steps_value}) must be greater than --warmup ({warmup_value}): "
                        "at least one step must be measured")


def job_launcher(launcher: str | None, hostfile: str | None) -> None:
    """A launcher a sweep or capacity search can start each job with: torchrun and srun take no
    hostfile (torchrun starts this node only; srun's hosts are its allocation), mpirun needs one."""
    if hostfile and launcher in ("srun", "torchrun"):
        raise UserError(f"--hostfile is for --launcher deepspeed or mpirun, not {launcher}")
    if launcher == "mpirun" and not hostfile:
        raise UserError("--launcher mpirun needs --hostfile (the hosts and their slots)")


def output_folder(flag: str, path: str | None) -> None:
    """A file to be written: not a folder, and its folder exists."""
    if path is None:
        return
    if os.path.isdir(path):
        raise UserError(f"{flag} {path}: is a folder; expected a file path")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise UserError(f"{flag} {path}: folder {folder} does not exist")


def input_file(flag: str, path: str, what: str) -> None:
    if os.path.isdir(path):
        raise UserError(f"{flag} {path}: is a folder; expected {what}")
    if not os.path.isfile(path):
        raise UserError(f"{flag} {path}: no such file; expected {what}")

"""Rank-aware logging: one format carrying the rank; rank 0 at INFO, the others at WARNING."""

from __future__ import annotations

import logging
import os

FORMAT = "[ds_bench rank {rank}] %(levelname)s %(message)s"


def _rank() -> str:
    for var in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return os.environ[var]
    return "0"


def process_rank() -> int:
    """This process's rank as the launcher set it (torch, Open MPI, PMI, Slurm variables); 0 alone."""
    return int(_rank())


def setup_logging(verbose: bool = False) -> None:
    rank = _rank()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT.format(rank=rank)))
    log = logging.getLogger("ds_bench")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO if rank == "0" or verbose else logging.WARNING)


# DeepSpeed warnings that every run triggers and no user can act on, matched by their start.
NOISE = (
    "Attempting to get learning rate from scheduler before it has started",  # engine.get_lr before step 1
)


class DropMessages(logging.Filter):
    """Drop records whose message starts with one of ``prefixes``; everything else passes."""

    def __init__(self, prefixes: tuple[str, ...] = NOISE):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


def quiet_deepspeed() -> None:
    """DeepSpeed logs its whole config at INFO on every rank: keep its warnings only, minus ``NOISE``."""
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)
    if not any(isinstance(f, DropMessages) for f in logger.filters):
        logger.addFilter(DropMessages())

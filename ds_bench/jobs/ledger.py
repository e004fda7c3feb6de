"""The studies' one ledger: a study's results file is its state.

A re-run of the same study (same id: the sweep's, the capacity search's) reads its records back and keeps,
per unit of work (a sweep point's repeat, a capacity layout's member), the latest record; a unit whose
record is ``FINAL`` is not run again (re-running it would measure the same thing or fail the same way),
``timeout`` and ``crashed`` ones are, and the later record supersedes the earlier. Records are appended
whole (``record.store.append_record``), so an interrupted study leaves only finished work behind.
"""

from __future__ import annotations

import os
from typing import Callable, TypeVar

from ds_bench.record import store

FINAL = ("ok", "oom", "skipped")

R = TypeVar("R")


def load(path: str, kind: type[R], mine: Callable[[R], bool], unit: Callable[[R], tuple]) -> dict[tuple, R]:
    """The latest ``kind`` record of each unit (``unit(record)``) among the study's (``mine``) in ``path``."""
    if not os.path.isfile(path):
        return {}
    return {unit(r): r for r in store.read_records(path, kind) if mine(r)}


def final(done: dict[tuple, R], unit: tuple) -> R | None:
    """The unit's record when it need not run again."""
    r = done.get(unit)
    return r if r is not None and r.status in FINAL else None

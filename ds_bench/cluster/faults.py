"""Faults during a run: termination signals, a stalled step, a peer rank that died.

Owns the run's signal handlers and its step watchdog, and says what happened in one line:
- SIGTERM / SIGINT (Slurm's time limit and ``scancel``, a launcher stopping its ranks, Ctrl-C): the
  first raises ``Terminated`` in the main thread, so the run unwinds, records ``terminated by
  SIGTERM at step k`` with the steps done so far, and exits 128 + signal; a second signal ends the
  process at once, except a SIGTERM within ``DUPLICATE_S`` of the first one: at its time limit Slurm
  signals every task itself and srun forwards the SIGTERM it got too, so each rank gets two at once
  (measured on the real-Slurm bed: the ranks died before recording). While a results line is written
  (``deferred``), the first signal waits for it.
- ``StepWatchdog``: when no step finishes within ``--step-timeout`` seconds (a hang in data loading
  or in a collective whose peer is stuck), it dumps every thread's stack (faulthandler), records
  ``no step finished in N s`` and ends the process, so a benchmark never sits silently for hours.
- ``peer_states``: which ranks on this host have died or stopped (from /proc), so a failure caused
  by a vanished peer names it; ``peers_named_by``: which ranks on other hosts the error's own text
  points at (gloo names the address of the connection it lost: ``Read error [10.78.0.2]:41157:
  Connection reset by peer``), since /proc cannot see another host. Under Slurm the ranks are spread
  over nodes, and a rank killed there, or its whole node, shows on the survivors only as that error.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator

HANDLED = (signal.SIGTERM, signal.SIGINT)

_state = {"received": None, "received_at": 0.0, "deferring": 0, "pending": None}
DUPLICATE_S = 2.0
"""A SIGTERM this soon after the first is the same stop delivered twice (Slurm's stepd and srun), not a
second request; SIGKILL after Slurm's KillWait is its hard stop."""


class Terminated(BaseException):
    """A termination signal arrived (BaseException: no ``except Exception`` may swallow it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def install_signal_handlers() -> None:
    for signum in HANDLED:
        signal.signal(signum, _on_signal)


def received() -> int | None:
    """The first termination signal this process got, if any."""
    return _state["received"]


def _on_signal(signum: int, _frame) -> None:
    if _state["received"] is not None:  # the second signal: no more clean-up
        if signum == _state["received"] == signal.SIGTERM and time.monotonic() - _state["received_at"] < DUPLICATE_S:
            return
        os._exit(128 + signum)
    _state["received"], _state["received_at"] = signum, time.monotonic()
    if _state["deferring"]:
        _state["pending"] = signum
        return
    raise Terminated(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold a first termination signal until the block (a results write) is done; blocks may nest."""
    _state["deferring"] += 1
    try:
        yield
    finally:
        _state["deferring"] -= 1
    if _state["deferring"] == 0 and _state["pending"] is not None:
        pending, _state["pending"] = _state["pending"], None
        raise Terminated(pending)


class StepWatchdog:
    """A daemon thread that calls ``on_stall(steps_done)`` when no ``beat`` came for ``timeout_s``."""

    def __init__(self, timeout_s: float, on_stall: Callable[[int], None]):
        self.timeout_s = timeout_s
        self.on_stall = on_stall
        self.steps_done = 0
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ds_bench-step-watchdog", daemon=True)

    def beat(self, steps_done: int) -> None:
        self.steps_done = steps_done
        self._last = time.monotonic()

    def __enter__(self) -> StepWatchdog:
        self._last = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 10)):
            if time.monotonic() - self._last > self.timeout_s:
                print(f"ds_bench: no step finished in {self.timeout_s:g} s; stacks of every thread:",
                      file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                self.on_stall(self.steps_done)
                return


PF_EXITING = 0x4  # include/linux/sched.h: set by do_exit() before the process closes its files


def proc_state(pid: int, proc: str = "/proc") -> str:
    """``gone`` (no such process, zombie, dead or exiting), ``stopped`` or ``alive``, from /proc/PID/stat.

    A process killed mid-run closes its sockets inside ``do_exit()`` and only later turns zombie; under
    load a survivor can see the closed socket and read the dying peer's state in that gap. ``do_exit()``
    sets ``PF_EXITING`` (the flags field, 9th of proc(5)'s stat) before it closes anything, so an
    exiting process counts as gone.
    """
    try:
        with open(os.path.join(proc, str(pid), "stat"), encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        state = fields[0]
        exiting = len(fields) > 6 and int(fields[6]) & PF_EXITING
    except (OSError, IndexError, ValueError):
        return "gone"
    if exiting:
        return "gone"
    return {"Z": "gone", "X": "gone", "T": "stopped", "t": "stopped"}.get(state, "alive")


def peer_states(peers: list[dict], host: str, proc: str = "/proc") -> dict[int, str]:
    """Ranks on this host that are gone or stopped (``peers``: rank, host, pid of every rank)."""
    out = {}
    for p in peers:
        if p["host"] == host and p["pid"] != os.getpid():
            state = proc_state(p["pid"], proc)
            if state != "alive":
                out[p["rank"]] = state
    return out


_ADDRESS = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-fA-F:.]+\])(?::\d+)?")


def peers_named_by(error: BaseException | None, peers: list[dict], host: str) -> dict[int, str]:
    """Ranks on other hosts whose address the error, or one it was raised while handling, names: ``lost`` (pure).

    ``peers``: rank, host, pid and ``addrs`` (the host's IPv4 addresses) of every rank. Every rank at a
    named address counts: with several ranks on that host the error does not say which one went. The chain
    matters under Slurm: srun's SIGTERM to the survivors often lands while gloo's "connection reset" is
    unwinding, and the ``Terminated`` it raises then carries that error as its context."""
    named = {m.group(1).strip("[]") for e in _chain(error) for m in _ADDRESS.finditer(str(e))}
    return lost_at(named, peers, host)


def lost_at(addresses: set[str], peers: list[dict], host: str) -> dict[int, str]:
    """Ranks on other hosts at any of ``addresses``: ``lost`` (pure). An address names a host, not a process:
    with several ranks on that host, every one counts."""
    return {p["rank"]: "lost" for p in peers if p["host"] != host and addresses.intersection(p.get("addrs") or ())}


def _chain(error: BaseException | None) -> list[BaseException]:
    """``error`` and the exceptions it was raised from or while handling, each once."""
    out: list[BaseException] = []
    while error is not None and error not in out:
        out.append(error)
        error = error.__cause__ or error.__context__
    return out


def own_addresses() -> list[str]:
    """This host's IPv4 addresses but loopback (what a peer's error may name), for the peers exchange."""
    import psutil

    return sorted({a.address for entries in psutil.net_if_addrs().values() for a in entries
                   if a.family == socket.AF_INET and not a.address.startswith("127.")})


_NOTES = {"gone": "had exited", "stopped": "was stopped", "lost": "dropped its connection",
          "oom": "was killed by the kernel's OOM killer (out of memory)"}


def describe(*, rank: int, steps_done: int, steps: int, error: BaseException | None, signum: int | None,
             stalled_s: float | None, peers: list[dict], troubled: dict[int, str]) -> str:
    """One line saying why the run ended early (pure)."""
    if signum is not None:
        what = f"terminated by {signal.Signals(signum).name} at step {steps_done} of {steps}"
    elif stalled_s is not None:
        what = f"no step finished in {stalled_s:g} s (after step {steps_done} of {steps})"
    else:
        what = f"failed at step {steps_done} of {steps}: {error!r}"
    by_rank = {p["rank"]: p for p in peers}
    notes = [f"rank {r} (pid {by_rank[r]['pid']} on {by_rank[r]['host']}) "
             f"{_NOTES[state]}" for r, state in sorted(troubled.items())]
    return f"rank {rank}: {what}" + (f"; {', '.join(notes)}" if notes else "")

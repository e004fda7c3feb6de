"""``ds-bench run``'s flow (the command: ``ds_bench.commands.run``): one benchmark run as every rank
executes it: resolve -> join -> measure -> record. Rank 0 hands the record back; the command prints its
summary (``ds_bench.report.summary``).

Bad input is caught by ``resolve`` before the process group is joined (exit 2, no record). After
that, a failure is a measured outcome: each failing rank records why (``ds_bench.run.run_record``) and
the run exits non-zero (1, or 128 + signal; ``ds_bench.cluster.faults``).
"""

from __future__ import annotations

import os
import socket
import time

import torch

from ds_bench.cluster import faults, join, peer_links, process_group
from ds_bench.config.run_config import RunConfig
from ds_bench.errors import UserError
from ds_bench.logs import quiet_deepspeed
from ds_bench.machine import oom_kills
from ds_bench.record import store as results
from ds_bench.record.schema import RunRecord
from ds_bench.run import startup
from ds_bench.run.resolve import resolve
from ds_bench.run.run_record import record_failure, run_record
from ds_bench.run.state import Started
from ds_bench.run.training import measure


def run_benchmark(cfg: RunConfig) -> RunRecord | None:
    """Run it on this rank: rank 0 returns the ok record it appended to ``cfg.results``, the other ranks None."""
    marks = startup.begin()
    ready = resolve(cfg)
    marks["prepare_s"] = time.time() - marks["entered_at"]
    faults.install_signal_handlers()  # after the checks: a rejected run leaves the caller's handlers alone
    state = join.join(ready.rdzv, cfg.dist_timeout_s, cfg.connect_timeout_s, optimizer_op=ready.optimizer_op,
                      memory_cap=cfg.cpu_mem_limit, took=marks, spawned_ops=ready.spawned_ops)
    quiet_deepspeed()
    whoami = {"rank": state.rank, "host": socket.gethostname(), "pid": os.getpid(), "addrs": faults.own_addresses()}
    run = Started(cfg, ready.ds_cfg, ready.engine, state, ready.workload.size, _shared_run_id(),
                  process_group.gather(whoami), ckpt=ready.ckpt, startup=marks, layout=ready.layout,
                  oom_counts=oom_kills.read_counts())
    run.links = peer_links.links(peer_links.remote_addresses(run.peers, whoami["host"]))
    try:
        metrics, extra = measure(run, ready.workload)
    except UserError:
        raise
    except (Exception, faults.Terminated) as e:
        # Every failing rank records itself: launchers kill the other ranks as soon as one fails,
        # so rank 0 may never get the chance. ``report`` shows one row per run_id.
        record_failure(run, error=e)
        raise
    finally:
        run.ckpt.finish()  # a folder it created and left without a complete checkpoint goes
    if state.rank == 0:
        record = run_record(run, "ok", metrics=metrics, **extra)
        with faults.deferred():
            results.append_record(cfg.results, record)
        return record
    return None


def _shared_run_id() -> str:
    box = [results.new_run_id()]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]

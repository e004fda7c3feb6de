"""The records of one run: ``ok`` from rank 0, ``failed`` from every failing rank.

A failure after start-up is a measured outcome: each failing rank appends a ``status: failed``
record saying why in one line (an error, ``terminated by SIGTERM at step k``, ``no step finished
in N s``, a peer that had exited), the step reached and its own metrics so far
(``ds_bench.cluster.faults`` words the reason).
"""

from __future__ import annotations

import logging
import signal
import socket

from ds_bench.cluster import faults, peer_links
from ds_bench.config.deepspeed import prepare as ds_config
from ds_bench.errors import UserError
from ds_bench.machine import cpu_features, memory
from ds_bench.measure.metrics import RankReport, summarize
from ds_bench.record import store as results
from ds_bench.record.schema import Failure, RunMetrics, RunRecord
from ds_bench.run import oom_victims
from ds_bench.run.state import Started

log = logging.getLogger("ds_bench")


def rank_report(run: Started, compiled: dict | None = None) -> RankReport:
    """What this rank measured, to be reduced over ranks (``ds_bench.measure.metrics``)."""
    state, times = run.state, run.times
    return RankReport(rank=state.rank, host=socket.gethostname(), step_s=times.step_s, phase_s=times.phase_s,
                      losses=times.losses(), grad_norms=times.grad_norms(), compute_s=times.compute_s, window_s=times.window_s,
                      pipeline_stage=times.pipeline_stage, stage_s=times.stage_s, compiled=compiled,
                      peak_mem={**memory.peak_bytes(state.device), "baseline": run.baseline_bytes})


def record_failure(run: Started, error: BaseException | None = None, stalled_s: float | None = None) -> None:
    """This rank's ``failed`` record: why (one line), the step reached, and its own partial metrics.

    The whole of it runs with termination signals held: a launcher sends SIGTERM to the survivors
    moments after a peer dies, which must not cut short the record of why the run failed.
    """
    with faults.deferred():
        memory.lift_cap_for_record()  # an out-of-memory leaves the heap at the cap: room to say so
        signum = faults.received() if stalled_s is None else None  # what ended it, not a signal while recording
        troubled = troubled_peers(run, error)
        killed = oom_victims.victims(run, troubled)
        troubled.update({rank: "oom" for rank in killed})
        reason, record = failure_record(run, error, stalled_s, troubled, signum)
        records = [record]
        if killed and oom_victims.reports_them(run, killed):
            records += [oom_victims.victim_record(run, rank, kill, run_record) for rank, kill in sorted(killed.items())]
        try:
            for one in records:
                results.append_record(run.cfg.results, one)
        except (OSError, UserError) as e:  # keep the run's own failure as the one that propagates
            log.error("%s; the failed record could not be written: %s", reason, e)
            return
        for one in records:
            log.error("%s (recorded in %s)", one.error, run.cfg.results)


def troubled_peers(run: Started, error: BaseException | None) -> dict[int, str]:
    """Peers that died or stopped (this host, /proc), or whose connection dropped or the error names (others)."""
    host = socket.gethostname()
    links_now = peer_links.links({a for _local, (a, _port) in run.links})
    return {**peer_links.dropped(run.links, links_now, run.peers, host),
            **faults.peers_named_by(error, run.peers, host), **faults.peer_states(run.peers, host)}


def failure_record(run: Started, error: BaseException | None, stalled_s: float | None, troubled: dict[int, str],
                   signum: int | None) -> tuple[str, RunRecord]:
    state, times = run.state, run.times
    reason = faults.describe(rank=state.rank, steps_done=times.steps_done, steps=run.cfg.steps, error=error,
                             signum=signum, stalled_s=stalled_s, peers=run.peers, troubled=troubled)
    metrics = {}
    if times.step_s:  # what this rank measured before the end, not reduced over ranks
        metrics = summarize([rank_report(run)], run.ds_cfg["train_batch_size"])
        metrics["partial_from_rank"] = state.rank
    kind = ("oom" if memory.is_out_of_memory(error) else "stalled" if stalled_s is not None
            else "terminated" if signum else "error")
    failure = Failure(kind=kind, steps_done=times.steps_done, rank=state.rank, host=socket.gethostname(),
                      signal=signal.Signals(signum).name if signum else None, stalled_s=stalled_s,
                      peers={str(r): s for r, s in troubled.items()})
    return reason, run_record(run, "failed", metrics=metrics, error=reason, failure=failure)


def run_record(run: Started, status: str, metrics: dict | None = None, error: str | None = None,
               **extra) -> RunRecord:
    """The ``run`` record (``ds_bench.record.schema.RunRecord``): the resolved config, where it ran, and its
    metrics (``ds_bench.measure.metrics.summarize`` and ``ds_bench.run.run_metrics.run_metrics``)."""
    cfg, ds_cfg, state = run.cfg, run.ds_cfg, run.state
    return RunRecord(
        **results.base_record(run.run_id, cfg.to_dict()), status=status, error=error, workload=cfg.workload,
        size=run.size, tag=cfg.tag, world_size=state.world_size, launcher=state.launcher,
        master_addr=state.master_addr, rendezvous=state.rendezvous, backend=state.backend, engine=run.engine.name, engine_plan=run.engine.describe(), ds_config=ds_cfg,
        zero_stage=run.engine.zero_stage, precision=ds_config.precision_of(ds_cfg),
        **emulation_keys(ds_config.precision_of(ds_cfg), state.device.type),
        optimizer=run.engine.optimizer_record(ds_cfg, state.device.type),
        micro_batch=ds_cfg["train_micro_batch_size_per_gpu"],
        grad_accum=ds_cfg["gradient_accumulation_steps"], train_batch_size=ds_cfg["train_batch_size"],
        hardware=results.hardware(state.device), metrics=RunMetrics(**(metrics or {})), **run.ckpt.record_keys(),
        **{**_layout_keys(run), **extra})


def emulation_keys(precision: str, device_type: str) -> dict:
    """CPU runs: ``precision_emulated`` (and its note when True); GPU runs: nothing (the fields stay None)."""
    if device_type != "cpu":
        return {}
    note = cpu_features.emulated_precision_note(precision, device_type, cpu_features.this_cpu_flags())
    return {"precision_emulated": note is not None, "precision_note": note}


def _layout_keys(run: Started) -> dict:
    """The run's layout as resolved (``Resolved.layout``), its data-parallel replicas, its degrees' blocks
    (``Mesh.record_blocks``; rank 0's measurements complete them in an ok record: ``ds_bench.run.run_metrics``) and
    the memory options that ran."""
    options = [name for name in ("activation_checkpointing", "selective_checkpointing", "checkpoint_offload",
                                 "tiled_mlp", "tiled_loss") if getattr(run.cfg, name)]
    mesh = run.engine.mesh
    layout = {"layout": run.layout.to_dict(), "layout_key": run.layout.key} if run.layout else {}
    return {"data_parallel_size": mesh.data_parallel_size if mesh.plans else None,
            "degrees": mesh.record_blocks(), "memory_options": options or None, **layout}

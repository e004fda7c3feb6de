"""``ds-bench run``: one benchmark run as every rank executes it.

Order matters for honest errors: everything that can be wrong with the user's input (workload,
config file, ``--set``, batch arithmetic, data path) is checked before the process group is
joined, so bad input exits 2 at once and never leaves a record. After that, a failure is a
measured outcome: each failing rank appends a ``status: failed`` record saying why in one line
(an error, ``terminated by SIGTERM at step k``, ``no step finished in N s``, a peer that had
exited), the step reached and its own metrics so far, and the run exits non-zero
(1, or 128 + signal; ``ds_bench.cluster.faults``).
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, field

import torch

from ds_bench import engines
from ds_bench.cluster import faults, rendezvous
from ds_bench.cluster import process as runtime
from ds_bench.config import preflight
from ds_bench.config.deepspeed import prepare as ds_config
from ds_bench.config.deepspeed.prepare import RunContext
from ds_bench.config.run_config import RunConfig
from ds_bench.errors import UserError
from ds_bench.logs import quiet_deepspeed
from ds_bench.machine import jit_ops as ops
from ds_bench.machine import memory
from ds_bench.measure import checkpoint, peaks, slow_ranks
from ds_bench.measure.loop import DeviceClock, LoopTimes, run_loop, timing
from ds_bench.measure.metrics import RankReport, summarize
from ds_bench.record import store as results
from ds_bench.report import comm_bound as verdict
from ds_bench.report import summary
from ds_bench.workloads import build_workload

log = logging.getLogger("ds_bench")


@dataclass
class Started:
    """A run that has joined the process group: what its records are made of."""

    cfg: RunConfig
    ds_cfg: dict
    engine: engines.EngineChoice
    state: runtime.DistState
    size: str | None
    run_id: str
    peers: list[dict]
    """rank, host and pid of every rank, to name a peer that died."""
    times: LoopTimes = field(default_factory=LoopTimes)
    baseline_bytes: int = 0
    """Memory this rank held before the model was built (runtime, libraries, process group)."""
    ckpt: checkpoint.Checkpointer = field(default_factory=checkpoint.Checkpointer)
    """--checkpoint / --resume (``ds_bench.measure.checkpoint``); does nothing without them."""


def run_benchmark(cfg: RunConfig) -> int:
    workload, ds_cfg, choice, rdzv, ckpt = _prepare(cfg)
    faults.install_signal_handlers()  # after the checks: a rejected run leaves the caller's handlers alone
    state = runtime.init_distributed(rdzv, cfg.dist_timeout_s, cfg.connect_timeout_s)
    whoami = {"rank": state.rank, "host": socket.gethostname(), "pid": os.getpid()}
    run = Started(cfg, ds_cfg, choice, state, workload.size, _shared_run_id(), runtime.gather(whoami), ckpt=ckpt)
    try:
        metrics, extra = _measure(run, workload)
    except UserError:
        raise
    except (Exception, faults.Terminated) as e:
        # Every failing rank records itself: launchers kill the other ranks as soon as one fails,
        # so rank 0 may never get the chance. ``report`` shows one row per run_id.
        _record_failure(run, error=e)
        raise
    finally:
        run.ckpt.finish()  # a folder it created and left without a complete checkpoint goes
    if state.rank == 0:
        record = _record(run, "ok", metrics=metrics, **extra)
        with faults.deferred():
            results.append_record(cfg.results, record)
        print(summary.one_run(record, cfg.results), flush=True)
    return 0


def _prepare(cfg: RunConfig):
    """Everything that can be checked or built before joining the process group."""
    runtime.pin_jit_toolchain()
    workload = build_workload(cfg)
    runtime.select_accelerator()
    rdzv = rendezvous.resolve(os.environ, cfg.iface, cfg.dist_timeout_s)
    device_type = runtime.device_type()
    ctx = RunContext(world_size=rdzv.info.world_size, device_type=device_type, lr=cfg.lr or workload.default_lr,
                     steps=cfg.steps, warmup=cfg.warmup, micro_batch=cfg.micro_batch,
                     hidden_size=workload.hidden_size)
    ds_cfg = ds_config.prepare(cfg.ds_config, cfg.overrides, ctx)
    preflight.check(cfg, workload, rdzv.info.world_size, ds_cfg["train_micro_batch_size_per_gpu"])  # results, data
    choice = engines.choose(cfg.engine, ds_cfg, cfg.lr or workload.default_lr, cfg.ds_config)
    ckpt = checkpoint.plan(cfg, rdzv.info.world_size, ds_cfg["train_micro_batch_size_per_gpu"],
                           ds_cfg["gradient_accumulation_steps"])  # --checkpoint, --resume
    optimizer_op = ops.optimizer_op(ds_cfg) if choice.name == "deepspeed" else None  # DDP/FSDP: torch.optim
    ops.announce_cpu_builds(device_type, optimizer_op)
    ops.ensure_loaded(ops.ops_for_run(device_type, optimizer_op))
    if cfg.cpu_mem_limit:  # after the op builds: the compilers are not the run
        memory.cap_process_memory(cfg.cpu_mem_limit)
    quiet_deepspeed()
    return workload, ds_cfg, choice, rdzv, ckpt


def _shared_run_id() -> str:
    box = [results.new_run_id()]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _measure(run: Started, workload) -> tuple[dict, dict]:
    from deepspeed.accelerator import get_accelerator

    cfg, ds_cfg, state = run.cfg, run.ds_cfg, run.state
    if ds_config.precision_of(ds_cfg) == "fp32":  # fp32 means fp32: no TF32, so the fp32 peak is the right one
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(cfg.seed)
    _preload_libraries()
    run.baseline_bytes = memory.current_bytes(state.device)
    # DeepSpeed: cast before initialize (BatchNorm et al. must already be in the compute dtype); DDP/FSDP: fp32
    model = workload.build_model().to(run.engine.model_dtype)
    params = sum(p.numel() for p in model.parameters())
    largest_layer = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    flops_per_sample = workload.model_flops_per_sample(model)  # before ZeRO-3 partitions the weights
    hw_flops_per_sample = workload.hardware_flops_per_sample(model)
    engine = engines.build(run.engine, model, ds_cfg, state.device, cfg.lr or workload.default_lr)
    accel = get_accelerator()
    start = run.ckpt.attach(engine, sync=accel.synchronize, barrier=torch.distributed.barrier, gather=runtime.gather,
                            rank=state.rank, world_size=state.world_size)  # resumes: returns the step reached
    with faults.StepWatchdog(cfg.step_timeout_s, lambda done: _stalled(run)) as watchdog:
        batches = workload.batches(state.rank, state.world_size, ds_cfg["train_micro_batch_size_per_gpu"])
        batches = checkpoint.skip(batches, start * ds_cfg["gradient_accumulation_steps"])  # used before the resume
        batches = itertools.chain([next(batches)], batches)  # one-time loading (files, tokenizing) stays untimed
        loop_started_at = time.time()  # wall clock, for a sweep's per-point overhead (launch to first step)
        run_loop(engine, workload, batches, steps=cfg.steps, warmup=cfg.warmup,
                 grad_accum=ds_cfg["gradient_accumulation_steps"], float_dtype=run.engine.input_dtype,
                 sync=accel.synchronize, barrier=torch.distributed.barrier, times=run.times, beat=watchdog.beat,
                 clock=DeviceClock(state.device), breakdown=cfg.breakdown, after_step=run.ckpt.after_step,
                 on_window_open=lambda: log.info("warm-up done (%d steps): measuring %d steps",
                                                 cfg.warmup, cfg.steps - cfg.warmup))
        run.ckpt.load_back()
        reports = runtime.gather(_rank_report(run))
    if state.rank != 0:
        return {}, {}
    metrics = summarize(reports, ds_cfg["train_batch_size"])
    metrics["sample_unit"] = workload.sample_unit
    metrics.update(timing(cfg.breakdown, ds_cfg["gradient_accumulation_steps"]))
    metrics.update(_flops_metrics(cfg, flops_per_sample, metrics["samples_per_s"], state, ds_cfg))
    if hw_flops_per_sample != flops_per_sample:  # recomputation: report hardware FLOPs utilisation too
        hw = _flops_metrics(cfg, hw_flops_per_sample, metrics["samples_per_s"], state, ds_cfg)
        metrics.update(hardware_tflops_per_device=hw["tflops_per_device"], hfu=hw["mfu"])
    if workload.tokens_per_sample:
        metrics["tokens_per_s"] = metrics["samples_per_s"] * workload.tokens_per_sample
    hosts = sorted({r.host for r in reports})
    extra = {"loop_started_at": loop_started_at, "params": params, "largest_layer_params": largest_layer, "hosts": hosts,
             "slow_ranks": slow_ranks.from_metrics(metrics, cfg.slow_rank_threshold),
             "comm_bound": verdict.for_run(
                 stage=run.engine.zero_stage, precision=ds_config.precision_of(ds_cfg), ds_cfg=ds_cfg,
                 params=params, world_size=state.world_size, micro_steps=ds_cfg["gradient_accumulation_steps"],
                 step_ms=metrics["step_ms_median"], hosts=hosts, backend=state.backend, busbw=cfg.busbw,
                 comm_results=cfg.comm_results_path())}
    return metrics, extra


PRELOADED = ("torch._dynamo", "deepspeed.runtime.zero.muon.muon_optimizer")
"""Imported before the baseline on every rank, whatever the stage, so a CPU rank's RSS baseline holds
the libraries a run loads anyway, not model or activation memory (``ds_bench.jobs.predict``
calibrates on the difference). Measured with torch 2.13 CPU, deepspeed 0.19.8: constructing any
torch optimizer imports ``torch._dynamo`` (torch/_compile.py), ~830 modules, ~75 MiB RSS; ZeRO 1-3
import DeepSpeed's Muon optimizer, whose ``@torch.compile`` loads the compile stack, ~580 modules,
~48 MiB more. GPU peaks (``max_memory_allocated``) never counted them."""


def _preload_libraries() -> None:
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:  # another DeepSpeed version: nothing to preload
            pass


def _stalled(run: Started) -> None:
    """The step watchdog fired (in its own thread): record, then end the whole process."""
    _record_failure(run, stalled_s=run.cfg.step_timeout_s)
    runtime.exit_process(1)


def _record_failure(run: Started, error: BaseException | None = None, stalled_s: float | None = None) -> None:
    """This rank's ``failed`` record: why (one line), the step reached, and its own partial metrics.

    The whole of it runs with termination signals held: a launcher sends SIGTERM to the survivors
    moments after a peer dies, which must not cut short the record of why the run failed.
    """
    with faults.deferred():
        reason, record = _failure_record(run, error, stalled_s)
        try:
            results.append_record(run.cfg.results, record)
        except (OSError, UserError) as e:  # keep the run's own failure as the one that propagates
            log.error("%s; the failed record could not be written: %s", reason, e)
            return
        log.error("%s (recorded in %s)", reason, run.cfg.results)


def _failure_record(run: Started, error: BaseException | None, stalled_s: float | None) -> tuple[str, dict]:
    state, times = run.state, run.times
    signum = faults.received() if stalled_s is None else None
    troubled = faults.peer_states(run.peers, socket.gethostname())
    reason = faults.describe(rank=state.rank, steps_done=times.steps_done, steps=run.cfg.steps, error=error,
                             signum=signum, stalled_s=stalled_s, peers=run.peers, troubled=troubled)
    metrics = {}
    if times.step_s:  # what this rank measured before the end, not reduced over ranks
        metrics = summarize([_rank_report(run)], run.ds_cfg["train_batch_size"])
        metrics["partial_from_rank"] = state.rank
    kind = ("oom" if memory.is_out_of_memory(error) else "stalled" if stalled_s is not None
            else "terminated" if signum else "error")
    failure = {"kind": kind, "steps_done": times.steps_done, "rank": state.rank, "host": socket.gethostname(),
               "signal": signal.Signals(signum).name if signum else None, "stalled_s": stalled_s,
               "peers": {str(r): s for r, s in troubled.items()}}
    return reason, _record(run, "failed", metrics=metrics, error=reason, failure=failure)


def _flops_metrics(cfg: RunConfig, flops_per_sample: float | None, samples_per_s: float,
                   state: runtime.DistState, ds_cfg: dict) -> dict:
    if cfg.peak_tflops:
        peak, note = cfg.peak_tflops, "--peak-tflops"
    else:
        hw = results.hardware(state.device)
        peak, note = peaks.peak_tflops(hw["device"], hw["device_type"], ds_config.precision_of(ds_cfg))
    out = peaks.compute_metrics(flops_per_sample, samples_per_s, state.world_size, peak, note)
    out["model_flops_per_step"] = flops_per_sample * ds_cfg["train_batch_size"] if flops_per_sample else None
    return out


def _rank_report(run: Started) -> RankReport:
    state, times = run.state, run.times
    return RankReport(rank=state.rank, host=socket.gethostname(), step_s=times.step_s, phase_s=times.phase_s,
                      losses=times.losses(), compute_s=times.compute_s, window_s=times.window_s,
                      peak_mem={**memory.peak_bytes(state.device), "baseline": run.baseline_bytes})


def _record(run: Started, status: str, metrics: dict | None = None, error: str | None = None, **extra) -> dict:
    cfg, ds_cfg, state = run.cfg, run.ds_cfg, run.state
    record = results.base_record(run.run_id, cfg.to_dict())
    record.update(
        status=status, error=error, workload=cfg.workload, size=run.size, tag=cfg.tag,
        world_size=state.world_size, launcher=state.launcher, master_addr=state.master_addr,
        rendezvous=state.rendezvous,
        backend=state.backend, engine=run.engine.name, engine_plan=run.engine.describe(), ds_config=ds_cfg,
        zero_stage=run.engine.zero_stage, precision=ds_config.precision_of(ds_cfg),
        optimizer=run.engine.optimizer_record(ds_cfg),
        micro_batch=ds_cfg["train_micro_batch_size_per_gpu"],
        grad_accum=ds_cfg["gradient_accumulation_steps"], train_batch_size=ds_cfg["train_batch_size"],
        hardware=results.hardware(state.device), metrics=metrics or {}, **run.ckpt.record_keys(), **extra)
    return record

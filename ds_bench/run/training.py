"""The measured part of one run, on every rank: build the model and engine, run the timed loop,
reduce what the ranks measured into the run's metrics (rank 0).

How the loop times steps is ``ds_bench.measure.loop``'s business; this module wires the run's
pieces to it: the step watchdog, checkpoint saves and resume, the FLOPs of the workload. Rank 0's
metrics from the ranks' reports are ``ds_bench.run.run_metrics``'.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import time

import torch

from ds_bench import engines
from ds_bench.cluster import faults, process_exit, process_group
from ds_bench.config.deepspeed import prepare as ds_config
from ds_bench.engines import tiling
from ds_bench.engines.compiled import compile_engine, compiles
from ds_bench.engines.degrees.pipeline import clip_on_the_whole_model
from ds_bench.machine import memory
from ds_bench.measure import checkpoint, compile_stats, degree_blocks, optimizer_state
from ds_bench.measure.loop import DeviceClock, run_loop
from ds_bench.run.run_metrics import run_metrics
from ds_bench.run.run_record import rank_report, record_failure
from ds_bench.run.state import Built, Started

log = logging.getLogger("ds_bench")

PRELOADED = ("torch._dynamo",)
"""Imported before every run's memory baseline (and ``DEEPSPEED_PRELOADED`` under ``--engine deepspeed``)."""
DEEPSPEED_PRELOADED = ("deepspeed.runtime.zero.muon.muon_optimizer",)
"""Imported before the baseline on every rank (``DEEPSPEED_PRELOADED`` under ``--engine deepspeed`` only, whatever
the stage), so a CPU rank's RSS baseline holds the libraries a run loads anyway, not model or activation memory
(``ds_bench.perf.peak_memory`` calibrates on the difference); a workload adds those its build imports
(``Workload.preload``). Measured with torch 2.13 CPU, deepspeed 0.19.8: constructing any torch optimizer imports
``torch._dynamo`` (torch/_compile.py), ~830 modules, ~75 MiB RSS; ZeRO 1-3 (and DeepSpeed's bf16 optimizer) import
DeepSpeed's Muon optimizer, whose ``@torch.compile`` loads the compile stack, ~580 modules, ~48 MiB more, ~1 s of
a rank's start-up: the DDP and FSDP baselines never import it, so they do not load it. GPU peaks
(``max_memory_allocated``) never counted them."""


def measure(run: Started, workload) -> tuple[dict, dict]:
    """(metrics, extra record keys) on rank 0; empty dicts on the other ranks."""
    if ds_config.precision_of(run.ds_cfg) == "fp32":  # fp32 means fp32: no TF32, so the fp32 peak applies
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(run.cfg.seed)
    preload_started = time.perf_counter()
    engine_libraries = DEEPSPEED_PRELOADED if run.cfg.engine == "deepspeed" else ()
    _preload_libraries(PRELOADED + engine_libraries + workload.preload)
    run.startup["libraries_s"] = time.perf_counter() - preload_started
    run.baseline_bytes = memory.current_bytes(run.state.device)
    built = build(run, workload)
    reports, loop_started_at = train(run, workload, built.engine)
    if run.engine.name == "deepspeed" and built.build is not None:  # after the timed loop: it disturbs no step
        built.build["optimizer_state"] = optimizer_state.state_bytes(built.engine)
    if built.compile_backend:
        compile_stats.check_settled([r.compiled for r in reports], run.cfg.warmup)
    if run.state.rank != 0:
        return {}, {}
    return run_metrics(run, workload, built, reports, loop_started_at)


def build(run: Started, workload) -> Built:
    mesh = run.engine.mesh
    if mesh.staged is not None:
        return build_pipeline(run, workload)
    started = time.perf_counter()
    mesh.prepare(workload, run.state.rank)  # e.g. DeepSpeed MoE layers holding this rank's experts only
    with engines.partitioned_build(run.engine, run.ds_cfg, workload.partitioned_build):  # ZeRO-3: zero.Init
        # DeepSpeed: cast before initialize (BatchNorm et al. must already be in the compute dtype); DDP/FSDP: fp32
        model = workload.build_model().to(run.engine.model_dtype)
    model_built = time.perf_counter(), memory.held_bytes(run.state.device) - run.baseline_bytes
    partitioned = engines.is_partitioned(model)  # before the engine: DeepSpeed ZeRO-3 partitions any model
    params = mesh.whole_params(model, engines.full_numel)
    held = mesh.rank_params_held(model, engines.full_numel)
    largest = max((sum(engines.full_numel(p) for p in m.parameters(recurse=False)) for m in model.modules()),
                  default=0)
    flops, hw_flops = workload.model_flops_per_sample(model), workload.hardware_flops_per_sample(model)
    engine_started = time.perf_counter()
    mpu = mesh.mpu(model, run.ds_cfg["train_micro_batch_size_per_gpu"], workload)  # e.g. Ulysses' groups
    trained = tiling.with_tiled_loss(model) if run.cfg.tiled_loss else model  # the tiled loss is its forward
    engine = engines.build(run.engine, trained, run.ds_cfg, run.state.device, run.cfg.lr or workload.default_lr, mpu)
    backend = compile_engine(engine, run.engine.name) if compiles(run.cfg, run.ds_cfg) else None  # in step 1
    return Built(engine, params, largest, flops, hw_flops, compile_backend=backend, build={
        "partitioned": partitioned, "model_s": model_built[0] - started,
        "engine_s": time.perf_counter() - engine_started, "model_mem_bytes": model_built[1],
        "engine_mem_bytes": memory.held_bytes(run.state.device) - run.baseline_bytes,
        "rank_params": sum(engines.full_numel(p) for p in engine.module.parameters())
        if mesh.shards_layers else None,  # the layers were sharded inside initialize
        "rank_params_held": held}, settings=workload.model_settings(model))  # after the engine: what it left


def build_pipeline(run: Started, workload) -> Built:
    """This rank's stage as a ``PipelineModule`` (no rank builds the whole model) in DeepSpeed's ``PipelineEngine``.

    ``params`` is the whole model's: the stages' unique parameters summed (the tied copy counted once)."""
    pipe = run.engine.mesh.staged
    started = time.perf_counter()
    module = workload.build_pipeline(pipe.stages, pipe.partition).to(run.engine.model_dtype)
    clip_on_the_whole_model(module)
    layout = {**module.stage_layout(), "build_s": time.perf_counter() - started}
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in module.modules()), default=0)
    layouts = process_group.gather({**layout, "largest_layer_params": largest})
    stages = [next(entry for entry in layouts if entry["stage"] == s) for s in range(pipe.stages)]
    flops, hw_flops = workload.model_flops_per_sample(module), workload.hardware_flops_per_sample(module)
    engine = engines.build(run.engine, module, run.ds_cfg, run.state.device, run.cfg.lr or workload.default_lr)
    params = sum(stage["unique_params"] for stage in stages)
    largest = max(entry.pop("largest_layer_params") for entry in layouts)
    return Built(engine, params, largest, flops, hw_flops, stages, settings=workload.model_settings(module))


def train(run: Started, workload, engine) -> tuple[list, float]:
    """The timed loop under the step watchdog; every rank's report, and when the loop started."""
    from deepspeed.accelerator import get_accelerator

    cfg, ds_cfg, state = run.cfg, run.ds_cfg, run.state
    accel, accumulation = get_accelerator(), ds_cfg["gradient_accumulation_steps"]
    start = run.ckpt.attach(engine, sync=accel.synchronize, barrier=torch.distributed.barrier,
                            gather=process_group.gather, rank=state.rank,
                            world_size=state.world_size)  # resumes: returns the step reached
    clock = DeviceClock(state.device)
    timers = degree_blocks.timers(run.engine.mesh, engine, clock, workload)
    watch = compile_stats.CompileWatch() if compiles(cfg, ds_cfg) else None
    with faults.StepWatchdog(cfg.step_timeout_s, lambda done: _stalled(run)) as watchdog:
        batches = _batches(run, workload, engine)
        batches = checkpoint.skip(batches, start * accumulation)  # used before the resume
        first_batch = time.perf_counter()
        batches = itertools.chain([next(batches)], batches)  # one-time loading (files, tokenizing) stays untimed
        run.startup["data_s"] = time.perf_counter() - first_batch
        loop_started_at = time.time()  # wall clock, for a sweep's per-point overhead (launch to first step)
        if watch:
            watch.mark("start")
        run_loop(engine, workload, batches, steps=cfg.steps, warmup=cfg.warmup, grad_accum=accumulation,
                 float_dtype=run.engine.input_dtype, sync=accel.synchronize, barrier=torch.distributed.barrier,
                 times=run.times, beat=watchdog.beat, clock=clock, breakdown=cfg.breakdown,
                 after_step=_after_step(run, watch), pipeline=run.engine.mesh.staged is not None, stage_timers=timers,
                 on_window_open=lambda: _window_open(run, watch),
                 micro_step_context=tiling.checkpoint_offload if cfg.checkpoint_offload else None)
        if watch:
            watch.mark("end")
        run.ckpt.load_back()
        return process_group.gather(rank_report(run, watch and watch.block())), loop_started_at


def _after_step(run: Started, watch):
    if watch is None:
        return run.ckpt.after_step
    return lambda done: (watch.after_step(done), run.ckpt.after_step(done))


def _window_open(run: Started, watch) -> None:
    if watch:
        watch.mark("window")
        run.startup["compile_s"] = watch.marks["window"]["compile_s"] - watch.marks["start"]["compile_s"]
    run.startup["window_open_at"] = time.time()
    log.info("warm-up done (%d steps): measuring %d steps", run.cfg.warmup, run.cfg.steps - run.cfg.warmup)


def _batches(run: Started, workload, engine):
    """This rank's batches (``Mesh.batches``: its data replica's, each degree's part of them; a staged model's
    by the engine's grid); with ``--tiled-loss`` and no degree slicing them, whole sequences in the sliced form
    the tiled loss takes (``tiling.whole_sequences``)."""
    micro_batch, mesh = run.ds_cfg["train_micro_batch_size_per_gpu"], run.engine.mesh
    if mesh.staged is not None:
        return mesh.staged.staged_batches(workload, engine, micro_batch)
    batches = mesh.batches(workload, run.state.rank, micro_batch)
    if run.cfg.tiled_loss and not mesh.shards_batches:
        return tiling.whole_sequences(batches)
    return batches


def _preload_libraries(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:  # another DeepSpeed version: nothing to preload
            pass


def _stalled(run: Started) -> None:
    """The step watchdog fired (in its own thread): record, then end the whole process."""
    record_failure(run, stalled_s=run.cfg.step_timeout_s)
    process_exit.exit_process(1)

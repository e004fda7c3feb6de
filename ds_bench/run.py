"""``ds-bench run``: one benchmark run as every rank executes it.

Order matters for honest errors: everything that can be wrong with the user's input (workload,
config file, ``--set``, batch arithmetic, data path) is checked before the process group is
joined, so bad input exits 2 at once and never leaves a record. After that, a failure is a
measured outcome: rank 0 appends a ``status: failed`` record with the error, and the run exits 1.
"""

from __future__ import annotations

import itertools
import logging
import os
import resource
import socket

import torch

from ds_bench import ds_config, ops, peaks, preflight, rendezvous, results, runtime, summary
from ds_bench.config import RunConfig
from ds_bench.ds_config import RunContext
from ds_bench.errors import UserError
from ds_bench.logs import quiet_deepspeed
from ds_bench.metrics import RankReport, summarize
from ds_bench.trainer import LoopTimes, run_loop
from ds_bench.workloads import build_workload

log = logging.getLogger("ds_bench")


def run_benchmark(cfg: RunConfig) -> int:
    workload = build_workload(cfg)
    runtime.select_accelerator()
    rdzv = rendezvous.resolve(os.environ, cfg.iface, cfg.dist_timeout_s)
    info = rdzv.info
    device_type = _device_type()
    ctx = RunContext(world_size=info.world_size, device_type=device_type, lr=cfg.lr or workload.default_lr,
                     steps=cfg.steps, warmup=cfg.warmup, micro_batch=cfg.micro_batch,
                     hidden_size=workload.hidden_size)
    ds_cfg = ds_config.prepare(cfg.ds_config, cfg.overrides, ctx)
    preflight.check(cfg, workload, info.world_size, ds_cfg["train_micro_batch_size_per_gpu"])  # results path, data
    ops.announce_cpu_builds(device_type, _jit_optimizer_op(ds_cfg))
    quiet_deepspeed()
    state = runtime.init_distributed(rdzv, cfg.dist_timeout_s, cfg.connect_timeout_s)
    run_id = _shared_run_id()
    try:
        metrics, extra = _measure(cfg, workload, ds_cfg, state)
    except UserError:
        raise
    except Exception as e:
        # Every failing rank records itself: launchers kill the other ranks as soon as one fails,
        # so rank 0 may never get the chance. ``report`` shows one row per run_id.
        failed = _record(run_id, cfg, ds_cfg, state, "failed", workload.size, error=f"rank {state.rank}: {e!r}")
        results.append_record(cfg.results, failed)
        raise
    if state.rank == 0:
        record = _record(run_id, cfg, ds_cfg, state, "ok", workload.size, metrics=metrics, **extra)
        results.append_record(cfg.results, record)
        print(summary.one_run(record, cfg.results), flush=True)
    return 0


def _shared_run_id() -> str:
    box = [results.new_run_id()]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _measure(cfg: RunConfig, workload, ds_cfg: dict, state: runtime.DistState) -> tuple[dict, dict]:
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if ds_config.precision_of(ds_cfg) == "fp32":  # fp32 means fp32: no TF32, so the fp32 peak is the right one
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(cfg.seed)
    model = workload.build_model()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(ds_config.precision_of(ds_cfg), torch.float32)
    model = model.to(dtype)  # before initialize: BatchNorm et al. must already be in the compute dtype
    params = sum(p.numel() for p in model.parameters())
    flops_per_sample = workload.model_flops_per_sample(model)  # before ZeRO-3 partitions the weights
    hw_flops_per_sample = workload.hardware_flops_per_sample(model)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg)
    batches = workload.batches(state.rank, state.world_size, ds_cfg["train_micro_batch_size_per_gpu"])
    batches = itertools.chain([next(batches)], batches)  # one-time loading (files, tokenizing) stays untimed
    accel = get_accelerator()
    times = run_loop(engine, workload, batches, steps=cfg.steps, warmup=cfg.warmup,
                     grad_accum=ds_cfg["gradient_accumulation_steps"], float_dtype=dtype,
                     sync=accel.synchronize, barrier=torch.distributed.barrier)
    reports = runtime.gather(_rank_report(state, times))
    if state.rank != 0:
        return {}, {}
    metrics = summarize(reports, ds_cfg["train_batch_size"])
    metrics["sample_unit"] = workload.sample_unit
    metrics.update(_flops_metrics(cfg, flops_per_sample, metrics["samples_per_s"], state, ds_cfg))
    if hw_flops_per_sample != flops_per_sample:  # recomputation: report hardware FLOPs utilisation too
        hw = _flops_metrics(cfg, hw_flops_per_sample, metrics["samples_per_s"], state, ds_cfg)
        metrics.update(hardware_tflops_per_device=hw["tflops_per_device"], hfu=hw["mfu"])
    if workload.tokens_per_sample:
        metrics["tokens_per_s"] = metrics["samples_per_s"] * workload.tokens_per_sample
    extra = {"params": params, "hosts": sorted({r.host for r in reports})}
    return metrics, extra


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


def _rank_report(state: runtime.DistState, times: LoopTimes) -> RankReport:
    return RankReport(rank=state.rank, host=socket.gethostname(), step_s=times.step_s,
                      phase_s=times.phase_s, losses=times.losses, peak_mem=_peak_memory(state.device))


def _peak_memory(device: torch.device) -> dict[str, int]:
    if device.type == "cuda":
        return {"allocated": torch.cuda.max_memory_allocated(device),
                "reserved": torch.cuda.max_memory_reserved(device)}
    return {"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # Linux reports KiB


def _device_type() -> str:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name()


def _jit_optimizer_op(ds_cfg: dict) -> str | None:
    """The optimizer op DeepSpeed will JIT-compile: cpu_adam with optimizer offload, fused_adam
    for Adam/AdamW without ``torch_adam``, none otherwise."""
    offload = ds_cfg.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none")
    optimizer = ds_cfg.get("optimizer", {})
    if offload == "cpu":
        return "cpu_adam"
    if optimizer.get("type", "").lower() in ("adam", "adamw") and not optimizer.get("params", {}).get("torch_adam"):
        return "fused_adam"
    return None


def _record(run_id: str, cfg: RunConfig, ds_cfg: dict, state: runtime.DistState, status: str, size: str | None,
            metrics: dict | None = None, error: str | None = None, **extra) -> dict:
    record = results.base_record(run_id, cfg.to_dict())
    record.update(
        status=status, error=error, workload=cfg.workload, size=size, tag=cfg.tag,
        world_size=state.world_size, launcher=state.launcher, master_addr=state.master_addr,
        rendezvous=state.rendezvous,
        backend=state.backend, ds_config=ds_cfg, zero_stage=ds_config.zero_stage(ds_cfg),
        precision=ds_config.precision_of(ds_cfg), micro_batch=ds_cfg["train_micro_batch_size_per_gpu"],
        grad_accum=ds_cfg["gradient_accumulation_steps"], train_batch_size=ds_cfg["train_batch_size"],
        hardware=results.hardware(state.device), metrics=metrics or {}, **extra)
    return record

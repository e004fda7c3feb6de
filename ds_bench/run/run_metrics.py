"""Rank 0's metrics of a finished run: the ranks' reports reduced (``ds_bench.measure.metrics``), throughput,
model FLOPs and MFU against the device's peak and the measured ceiling (``ds-bench roofline``), slow ranks,
the comm-bound verdict (``ds_bench.perf.comm_bound``), and the record's extra blocks (start-up, build,
compile, pipeline stages), from the ``Built`` model ``ds_bench.run.training`` hands over (``ds_bench.run.state``).
"""

from __future__ import annotations

import socket

from ds_bench.cluster import process_group
from ds_bench.config.deepspeed import prepare as ds_config
from ds_bench.config.run_config import RunConfig
from ds_bench.measure import ceilings, compile_stats, degree_blocks, peaks, slow_ranks, stage_timers
from ds_bench.measure.loop import timing
from ds_bench.measure.metrics import summarize
from ds_bench.perf import comm_bound as verdict
from ds_bench.record import store as results
from ds_bench.record.schema import RooflineRecord
from ds_bench.run import startup
from ds_bench.run.state import Built, Started


def run_metrics(run: Started, workload, built: Built, reports: list, loop_started_at: float) -> tuple[dict, dict]:
    """Rank 0: the ranks' reports reduced, throughput, FLOPs and MFU, slow ranks, the comm-bound verdict."""
    cfg, ds_cfg, state = run.cfg, run.ds_cfg, run.state
    metrics = summarize(reports, ds_cfg["train_batch_size"])
    metrics["sample_unit"] = workload.sample_unit
    metrics.update(timing(cfg.breakdown, ds_cfg["gradient_accumulation_steps"], run.engine.mesh.staged is not None))
    metrics.update(_flops_metrics(cfg, built.flops_per_sample, metrics["samples_per_s"], state, ds_cfg))
    if built.hardware_flops_per_sample != built.flops_per_sample:  # recomputation: hardware FLOPs utilisation too
        hw = _flops_metrics(cfg, built.hardware_flops_per_sample, metrics["samples_per_s"], state, ds_cfg)
        metrics.update(hardware_tflops_per_device=hw["tflops_per_device"], hfu=hw["mfu"])
    if workload.tokens_per_sample:
        metrics["tokens_per_s"] = metrics["samples_per_s"] * workload.tokens_per_sample
    hosts = sorted({r.host for r in reports})
    extra = {"loop_started_at": loop_started_at, "params": built.params,
             "startup": startup.breakdown(run.startup, built.build, loop_started_at),
             "largest_layer_params": built.largest_layer_params, "build": built.build, "hosts": hosts,
             **(built.settings or {}),
             "compile": compile_stats.combine([r.compiled for r in reports], built.compile_backend)
             if built.compile_backend else None,
             "slow_ranks": slow_ranks.from_metrics(metrics, cfg.slow_rank_threshold),
             "degrees": degree_blocks.blocks(run.engine.mesh, reports)}
    extra["comm_bound"] = _comm_bound(run, workload, built, metrics, hosts, extra["degrees"] or {})
    if built.stages is not None:
        extra["pipeline_layout"] = stage_timers.per_stage(reports, built.stages)
    return metrics, extra


def _comm_bound(run: Started, workload, built: Built, metrics: dict, hosts: list[str], degrees: dict) -> dict:
    """The comm-bound verdict (``ds_bench.perf.comm_bound``): data-parallel collectives and each degree's own
    (``Mesh.verdict_terms``: AutoTP's activation all-reduces, Ulysses' and the experts' all-to-alls); not a
    pipeline's stage-to-stage sends."""
    cfg, ds_cfg, state = run.cfg, run.ds_cfg, run.state
    if run.engine.mesh.staged is not None:
        return {"note": "pipeline: the verdict models data-parallel collectives only, not stage-to-stage sends"}
    terms = run.engine.mesh.verdict_terms(workload, ds_cfg["train_micro_batch_size_per_gpu"],
                                          {field: block.get("comm") for field, block in degrees.items()}, built.build)
    held = built.build.get("rank_params_held")  # the gradients are of what this rank holds
    return verdict.for_run(stage=run.engine.zero_stage, precision=ds_config.precision_of(ds_cfg), ds_cfg=ds_cfg,
                           params=held["experts"] + held["rest"] if held else built.params, world_size=state.world_size,
                           micro_steps=ds_cfg["gradient_accumulation_steps"], step_ms=metrics["step_ms_median"],
                           hosts=hosts, backend=state.backend, busbw=cfg.busbw, comm_results=cfg.comm_results_path(),
                           **terms)


def _flops_metrics(cfg: RunConfig, flops_per_sample: float | None, samples_per_s: float,
                   state: process_group.DistState, ds_cfg: dict) -> dict:
    if cfg.peak_tflops:
        peak, note = cfg.peak_tflops, "--peak-tflops"
    else:
        hw = results.hardware(state.device)
        peak, note = peaks.peak_tflops(hw["device"], hw["device_type"], ds_config.precision_of(ds_cfg))
    out = peaks.compute_metrics(flops_per_sample, samples_per_s, state.world_size, peak, note)
    out["model_flops_per_step"] = flops_per_sample * ds_cfg["train_batch_size"] if flops_per_sample else None
    out.update(vs_measured(out["tflops_per_device"], results.hardware(state.device)["device"],
                           ds_config.precision_of(ds_cfg), cfg.roofline_results_path()))
    return out


def vs_measured(tflops: float | None, device: str, precision: str, path: str) -> dict:
    """``mfu_vs_measured`` against the newest ``ds-bench roofline`` record of this host in ``path``."""
    host = socket.gethostname()
    newest = [r for r in results.read_records(path, RooflineRecord, missing_ok=True) if r.host == host][-1:]
    best = ceilings.ceiling([row.model_dump() for row in newest[0].results], host, device, precision) if newest else None
    if best is None:
        return {"measured_note": f"no roofline record of {device} {precision} on {host} in {path}: run ds-bench roofline"}
    return {"measured_tflops": best, "mfu_vs_measured": tflops / best if tflops is not None else None,
            "measured_note": f"ds-bench roofline {newest[0].run_id} in {path}"}

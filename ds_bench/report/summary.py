"""Human-readable views of results records: one run's summary, and comparison tables.

Units: throughput in samples (or images, sequences, tokens) per second; times in milliseconds;
memory in MiB (2^20 bytes); TFLOP/s per device in 10^12 FLOP/s; checkpoint sizes in GB (10^9 bytes)
and their rates in GB/s.
"""

from __future__ import annotations

from tabulate import tabulate

from ds_bench.config.run_config import RunConfig
from ds_bench.record.schema import RunRecord
from ds_bench.report import comm_bound as verdict
from ds_bench.report.degree_lines import degree_lines, replicas
from ds_bench.report.numbers import number

MIB = 2**20

def config_name(record: RunRecord) -> str:
    path = record.config.get("ds_config") or "-"
    return path.rsplit("/", 1)[-1].removesuffix(".json")


COLUMNS = [
    ("workload", lambda r: r.workload + (f"/{r.size}" if r.size else "")),
    ("config", config_name),
    ("engine", lambda r: r.engine),
    ("zero", lambda r: r.zero_stage),
    ("prec", lambda r: r.precision),
    ("world", lambda r: r.world_size),
    ("mbs", lambda r: r.micro_batch),
    ("samples/s", lambda r: _m(r, "samples_per_s")),
    ("step ms p50", lambda r: _m(r, "step_ms_median")),
    ("step ms p90", lambda r: _m(r, "step_ms_p90")),
    ("peak MiB", lambda r: _m(r, "peak_mem_bytes", "{:.0f}", scale=1 / MIB)),
    ("TFLOP/s/dev", lambda r: _m(r, "tflops_per_device", "{:.3f}")),
    ("MFU", lambda r: _m(r, "mfu", "{:.1%}")),
    ("loss first", lambda r: _m(r, "loss_first", "{:.3f}")),
    ("loss last", lambda r: _m(r, "loss_last", "{:.3f}")),
    ("status", lambda r: r.status),
]


def _m(record: RunRecord, key: str, fmt: str | None = None, scale: float = 1.0) -> str:
    """A metric as its column writes it: ``fmt``, by default ``numbers.number``."""
    value = getattr(record.metrics, key, None)
    if value is None:
        return "-"
    return number(value * scale) if fmt is None else fmt.format(value * scale)


def one_per_run(records: list[RunRecord]) -> list[RunRecord]:
    """First record of each run_id: a failed run may be recorded by several of its ranks."""
    seen, out = set(), []
    for r in records:
        if r.run_id not in seen or r.run_id is None:
            seen.add(r.run_id)
            out.append(r)
    return out


def table(records: list[RunRecord], fmt: str = "github") -> str:
    rows = [[get(r) for _, get in COLUMNS] for r in one_per_run(records)]
    return tabulate(rows, headers=[name for name, _ in COLUMNS], tablefmt=fmt, disable_numparse=True)


def _engine(record: RunRecord) -> str:
    """``ZeRO-2`` (DeepSpeed), ``DDP``, ``FSDP (ZeRO-3 equivalent)``."""
    if record.engine == "deepspeed":
        return f"ZeRO-{record.zero_stage}"
    return "DDP" if record.engine == "ddp" else f"FSDP (ZeRO-{record.zero_stage} equivalent)"


def one_run(record: RunRecord, results_path: str) -> str:
    m = record.metrics
    unit = m.sample_unit or "samples"
    phases = " | ".join(f"{k} {v:.1f}" for k, v in (m.breakdown_ms_median or {}).items())
    lines = [
        f"ds_bench {record.workload}: {_engine(record)} {record.precision}, "
        f"{record.world_size} x {record.hardware['device_type']} rank(s) via {record.launcher}, "
        f"batch {record.micro_batch} x {record.grad_accum} accum x {replicas(record)} = {record.train_batch_size}",
        f"  throughput   {m.samples_per_s:.1f} {unit}/s ({m.samples_per_s_per_device:.1f} per device)"
        + (f", {m.tokens_per_s:.0f} tokens/s" if m.tokens_per_s else ""),
        f"  step time    median {number(m.step_ms_median)} ms, p90 {number(m.step_ms_p90)} ms over "
        f"{m.steps_measured} measured steps  [ms: {phases}]",
        f"  peak memory  {m.peak_mem_bytes / MIB:.0f} MiB on the largest rank ({m.peak_mem_kind})",
        f"  loss         {m.loss_first:.4f} -> {m.loss_last:.4f}",
    ]
    if record.build:
        b = record.build
        lines.append(f"  build        model {b.model_s:.2f} s{' (partitioned: zero.Init)' if b.partitioned else ''}, "
                     f"engine {b.engine_s:.2f} s; rank 0 held {b.model_mem_bytes / MIB:.0f} MiB over its baseline "
                     f"after the model, {b.engine_mem_bytes / MIB:.0f} MiB after the engine")
    lines += degree_lines(record)
    lines += [stage_line(stage, record.setting("schedule_bubble")) for stage in record.pipeline_layout or []]
    if record.memory_options:
        lines.append(f"  memory       {', '.join(o.replace('_', ' ') for o in record.memory_options)}")
    if record.startup is not None and record.startup.total_s is not None:
        lines.append(f"  start-up     {startup_line(record.startup)}")
    if record.compile is not None:
        c = record.compile
        lines.append(f"  compile      {c.backend}: {c.compile_s:.1f} s in warm-up (slowest rank {c.compile_s_max:.1f}), "
                     f"{c.graphs} graph(s), {c.graph_breaks} graph break(s), {c.recompilations} recompilation(s) "
                     f"after step 1, {c.inside_window} in the measured steps")
    if (record.optimizer or {}).get("source") == "ds_bench default":
        lines.append(f"  optimizer    none in the DeepSpeed config: ds_bench supplied {record.optimizer['type']}")
    if m.tflops_per_device is not None:
        mfu = f"{m.mfu:.1%}" if m.mfu is not None else f"n/a ({m.mfu_note})"
        measured = (f"; {m.mfu_vs_measured:.1%} of the measured {m.measured_tflops:.4g} TFLOP/s (ds-bench roofline)"
                    if m.mfu_vs_measured is not None else "")
        lines.append(f"  compute      {m.tflops_per_device:.3f} TFLOP/s per device, MFU {mfu}{measured}")
    threshold = record.config.get("slow_rank_threshold", RunConfig.slow_rank_threshold)
    for slow in record.slow_ranks or []:
        lines.append(f"  slow rank    rank {slow.rank} on {slow.host}: compute {slow.compute_ms:.1f} ms, "
                     f"{slow.vs_median_pct:.0f}% slower than the median rank (threshold {threshold:g}%)")
    if m.window_wall_s:
        lines.append(f"  timing       {m.timing_mode or 'step'} mode, {m.syncs_per_step} synchronize(s) "
                     f"per step; outside clock: window {m.window_wall_s:.3f} s wall, each rank's steps within "
                     f"{m.rank_steps_vs_wall_pct:+.2f}%, straggler steps {m.steps_vs_wall_pct:+.2f}%")
    lines += checkpoint_lines(record)
    if record.comm_bound:
        lines.append(f"  comm         {verdict.describe(record.comm_bound)}")
    lines.append(f"  results      {results_path} (run {record.run_id})")
    return "\n".join(lines)


STAGE_TIMERS = (("forward_compute", "forward-compute"), ("forward_recv", "forward-recv"),
                ("forward_send", "forward-send"), ("backward_compute", "backward-compute"),
                ("backward_recv", "backward-recv"), ("backward_send", "backward-send"),
                ("tied_grads_all_reduce", "backward-embedding-all-reduce"),
                ("grads_all_reduce", "backward-params-all-reduce"), ("optimizer", "optimizer"),
                ("batch_load", "batch-generator"), ("other", "other"))
"""The record's stage timers (``ds_bench.record.run_schema.StageTimes``) under Megatron-LM's names."""


def stage_line(stage, schedule_bubble: float) -> str:
    """One stage: its layout, then (records with timers) its timers in ms, measured bubble and peak memory."""
    blocks = f"blocks {stage.blocks[0]}-{stage.blocks[1]}" if stage.blocks else "no blocks"
    if stage.times_ms is None:
        return (f"    stage {stage.stage}    layers {stage.layers[0]}-{stage.layers[1] - 1}, {blocks}, "
                f"{stage.params / 1e6:.2f}M parameters, built in {stage.build_s:.2f} s")
    times = stage.times_ms
    timers = " | ".join(f"{name} {getattr(times, key):.1f}" for key, name in STAGE_TIMERS)
    return (f"    stage {stage.stage} (rank {stage.rank}, {blocks}, {stage.params / 1e6:.2f}M params): {timers} "
            f"of a {times.step:.1f} ms step; bubble {stage.bubble:.0%} (schedule {schedule_bubble:.0%}); "
            f"peak {stage.peak_mem_bytes / 2**30:.2f} GiB")


def checkpoint_lines(record: RunRecord) -> list[str]:
    """A run that resumed or saved checkpoints (``ds_bench.measure.checkpoint``): load and save times, GB/s."""
    lines, ck, resumed = [], record.checkpoint, record.resume
    if resumed:
        lines.append(f"  resumed      from step {record.resumed_from_step} ({resumed['tag']} in {resumed['dir']}), "
                     f"loaded in {resumed['load_s']:.3f} s, {resumed['load_GBps']:.2f} GB/s")
    if ck and ck["save_s"]:
        line = (f"  checkpoint   {len(ck['save_s'])} save(s) of {ck['bytes_total'] / 1e9:.3f} GB, median "
                f"{ck['save_s_median']:.3f} s: {ck['save_GBps']:.2f} GB/s aggregate, per rank min "
                f"{ck['save_GBps_per_rank_min']:.2f} / median {ck['save_GBps_per_rank_median']:.2f} GB/s")
        if ck.get("load_s") is not None:
            line += f"; load {ck['load_s']:.3f} s, {ck['load_GBps']:.2f} GB/s"
        lines.append(f"{line} ({ck['api']}; not in step times)")
    return lines


def startup_line(s) -> str:
    """``9.1 s to the first measured step: imports 2.4, prepare 0.3, ...`` (phases that were measured)."""
    phases = [("imports", s.imports_s), ("prepare", s.prepare_s), ("ops", s.ops_s),
              ("process group", s.process_group_s), ("libraries", s.libraries_s), ("model", s.model_build_s),
              ("engine", s.engine_s), ("data", s.data_s), ("compile", s.compile_s), ("warm-up", s.warmup_s),
              ("other", s.other_s)]
    return f"{s.total_s:.1f} s to the first measured step: " + ", ".join(
        f"{name} {value:.2f}" for name, value in phases if value is not None)

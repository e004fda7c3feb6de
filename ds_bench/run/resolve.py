"""What one run checks and builds before it joins the process group.

Order matters for honest errors: everything that can be wrong with the user's input (workload,
config file, ``--set``, batch arithmetic, data and results paths, checkpoint folders) is checked
here, so bad input exits 2 at once, never joins and never leaves a record. The run's configuration is
resolved once, into one ``Resolved`` value every later stage reads: the config file read and ``--set``
applied once (``prepare.read``; the legality table reads its layout from it), resolved once
(``prepare.resolve``: sections normalised once), its degrees' plans (``engines.degrees.mesh``) and its ``Layout``.
"""

from __future__ import annotations

import logging

from ds_bench import engines
from ds_bench.cluster import join
from ds_bench.config import legality, preflight, run_switches
from ds_bench.config.deepspeed.switch_sections import clipping
from ds_bench.config.deepspeed import prepare as ds_config
from ds_bench.config.deepspeed.derive import layout_of_run
from ds_bench.config.run_config import RunConfig
from ds_bench.engines.degrees import mesh as degree_mesh
from ds_bench.machine import cpu_features, environ, jit_ops
from ds_bench.measure import checkpoint
from ds_bench.run.state import Resolved
from ds_bench.workloads import build_workload

log = logging.getLogger("ds_bench")


def resolve(cfg: RunConfig) -> Resolved:
    """Every check of ``cfg`` against this machine and these ranks, before joining."""
    rdzv = join.find_rendezvous(cfg.iface, cfg.dist_timeout_s)
    read_cfg = ds_config.read(cfg.ds_config, cfg.overrides)  # the file, --set: once
    _warn_if_muon_unclips(cfg, read_cfg, rdzv.info.rank)
    read_cfg = run_switches.apply(read_cfg, cfg)  # --optimizer, --master-states, --sp-path, --deepcompile
    legality.refuse_run(cfg, rdzv.info.world_size, environ.device_type(), read_cfg)
    workload = build_workload(cfg)
    lr = cfg.lr or workload.default_lr
    mesh = degree_mesh.resolve(cfg, workload, rdzv.info.world_size, rdzv.info.local_world_size)
    data_world = mesh.data_parallel_size  # what the batch arithmetic counts
    ctx = ds_config.RunContext(world_size=data_world, device_type=environ.device_type(), lr=lr,
                               steps=cfg.steps, warmup=cfg.warmup, micro_batch=cfg.micro_batch,
                               hidden_size=workload.hidden_size)
    ds_cfg = ds_config.resolve(read_cfg, ctx, cfg.ds_config)
    _warn_if_emulated(ds_config.precision_of(ds_cfg), environ.device_type(), rdzv.info.rank)
    micro_batch, accumulation = ds_cfg["train_micro_batch_size_per_gpu"], ds_cfg["gradient_accumulation_steps"]
    preflight.check(cfg, workload, data_world, micro_batch)  # results, data (sharded over data-parallel ranks)
    choice = engines.choose(cfg.engine, ds_cfg, lr, cfg.ds_config, mesh)
    ckpt = checkpoint.resolve(cfg, rdzv.info.world_size, micro_batch, accumulation)  # --checkpoint, --resume
    optimizer_op = jit_ops.optimizer_op(ds_cfg) if choice.name == "deepspeed" else None
    spawned_ops = jit_ops.spawned_process_ops(ds_cfg) if choice.name == "deepspeed" else ()
    layout = layout_of_run(cfg.to_dict(), ds_cfg, {"engine": cfg.engine})  # what the record says ran
    return Resolved(workload, ds_cfg, choice, rdzv, ckpt, layout, optimizer_op, spawned_ops)


def _warn_if_emulated(precision: str, device_type: str, rank: int | None) -> None:
    """Once per run (rank 0), before it starts: a CPU run in a precision this CPU emulates."""
    if rank not in (0, None):
        return
    note = cpu_features.emulated_precision_note(precision, device_type, cpu_features.this_cpu_flags())
    if note:
        log.warning(note)


def _warn_if_muon_unclips(cfg: RunConfig, read_cfg: dict, rank: int | None) -> None:
    """``--optimizer muon`` turns the config's gradient clipping off (``switch_sections.optimizer_edit``): said once,
    and the record's config holds the 0."""
    if cfg.optimizer == "muon" and clipping(read_cfg) > 0 and rank in (0, None):
        log.warning("--optimizer muon: gradient_clipping %s of %s set to 0; under ZeRO 1-3 DeepSpeed would clip "
                    "Muon's orthogonalised update, not the gradient (docs/options.md#muon)", clipping(read_cfg),
                    cfg.ds_config)

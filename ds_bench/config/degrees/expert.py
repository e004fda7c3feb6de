"""Expert parallelism (``--expert-parallel EP``, the moe workload): DeepSpeed's MoE layer or AutoEP shards each
block's experts over EP ranks, tokens reaching them by all-to-all (``ds_bench.engines.degrees.expert_parallel``), timed as
``ep_all_to_all``. It does not split a data-parallel replica: the rest of the model is replicated on every rank.
A moe run under DeepSpeed engages its engine even at EP = 1 (``Where.engaged``)."""

from __future__ import annotations

import math

from ds_bench.config.degrees.protocol import DEEPSPEED, Degree, DegreeRule, active
from ds_bench.errors import UserError



def _ep(l, w) -> bool:
    return active("expert_parallel", l, w)


MOE_WORKLOAD = "moe"
MOE_PATHS = ("auto", "autoep", "moe-layer", "hf")
"""``--moe-path`` (``ds_bench.engines.degrees.expert_parallel.PATHS``)."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise UserError(message)


def check_moe_flags(cfg) -> None:
    """The moe flags' own values (against the model's experts: ``ds_bench.engines.degrees.expert_parallel.resolve``)."""
    for flag, value in (("--experts", cfg.experts), ("--top-k", cfg.top_k)):
        _require(value is None or value >= 1, f"{flag} must be a positive integer, got {value}")
    _require(math.isfinite(cfg.capacity_factor) and cfg.capacity_factor >= 0,
             f"--capacity-factor must be a finite number >= 0 (0: no token dropping), got {cfg.capacity_factor}")
    weight = cfg.aux_loss_weight
    _require(weight is None or (math.isfinite(weight) and weight >= 0),
             f"--aux-loss-weight must be a finite number >= 0, got {weight}")
    _require(cfg.moe_path in MOE_PATHS, f"--moe-path {cfg.moe_path!r}: expected {', '.join(MOE_PATHS)}")
    moe_flags = [f for f, v in (("--expert-parallel", cfg.expert_parallel), ("--experts", cfg.experts),
                                ("--top-k", cfg.top_k), ("--aux-loss-weight", cfg.aux_loss_weight)) if v is not None]
    moe_flags += ["--capacity-factor"] if cfg.capacity_factor else []
    moe_flags += ["--moe-path"] if cfg.moe_path != "auto" else []
    _require(not moe_flags or cfg.workload == MOE_WORKLOAD,
             f"{'/'.join(moe_flags)}: workload {cfg.workload} has no experts (moe has)")
    engine = getattr(cfg, "engine", "deepspeed")  # a study's flags have none: its points' engines are an axis
    if engine != "deepspeed":  # DDP and FSDP train HF's own blocks: no capacity, no path to choose
        _require(not cfg.capacity_factor, f"--capacity-factor with --engine {engine}: HF's own MoE blocks, "
                                          "which DDP and FSDP train, drop no tokens; the capacity is DeepSpeed's MoE "
                                          "layer's (--engine deepspeed)")
        _require(cfg.moe_path == "auto", f"--moe-path {cfg.moe_path} with --engine {engine}: DDP and FSDP "
                                         "train HF's own MoE blocks; the paths are DeepSpeed's (--engine deepspeed)")


def _moe_run(flags) -> bool:
    """A moe run (or study) engages the expert-parallel engine even at EP = 1: DeepSpeed's MoE layer, for its
    DeepSpeed layouts; not with ``--moe-path hf`` (HF's own blocks)."""
    return getattr(flags, "workload", None) == MOE_WORKLOAD and getattr(flags, "moe_path", "auto") != "hf"


def _summary(size: int, e: dict) -> str:
    router = f"top-{e['top_k']}, " + (f"capacity factor {e['capacity_factor']:g}" if e["drop_tokens"] else "no dropping")
    return (f"ep{size}: {e['local_experts']} of {e['experts']} experts per rank ({e['path']}), {router}, "
            f"aux loss x{e['aux_loss_weight']:g}")


EXPERT = Degree(
    field="expert_parallel", word="ep", flag="--expert-parallel", metavar="EP",
    help="moe: shard every block's experts over EP ranks with DeepSpeed (each holds experts / EP; tokens reach them "
         "by all-to-all); the rest of the model stays replicated on every rank. Default 1 (every rank holds every "
         "expert)",
    what="DeepSpeed expert-parallel degree (moe): ranks each block's experts are sharded over", called="the MoE layer", splits_replica=False,
    summary=_summary,
    named="--workload moe (--expert-parallel {expert_parallel})",
    deepspeed_only="expert parallelism is DeepSpeed's here (--engine deepspeed); DDP and FSDP train HF's own MoE "
                   "blocks, every expert on every rank",
    deepspeed_only_source="ds_bench: DDP and FSDP are run without an all-to-all dispatch",
    divides_world="every expert-parallel group holds every expert once",
    compile="not measured yet", compile_named="--workload moe",
    engaged_under_deepspeed_only=True,
    rules=(
        DegreeRule("DeepSpeed's MoE layer and ZeRO-3", lambda l, w: _ep(l, w) and l.stage == 3,
                   "--workload moe under ZeRO stage 3: DeepSpeed refuses its MoE layer there ('Native DeepSpeed MoE "
                   "is not supported with ZeRO Stage 3'; its AutoEP, which is, does not run with the transformers "
                   "installed here: --moe-path); use ZeRO stage 1 or 2", f"{DEEPSPEED}, deepspeed/runtime/engine.py "
                   "asserts it", {"expert_parallel": 2, "stage": 3}),
        DegreeRule("experts over ranks and ZeRO-0", lambda l, w: l.expert_parallel > 1 and l.stage == 0,
                   "--expert-parallel {expert_parallel} with ZeRO stage 0: DeepSpeed's stage-0 gradient clipping takes "
                   "the norm of this rank's experts only, so the update differs from EP=1's (measured); use ZeRO "
                   "stage 1 or 2", f"{DEEPSPEED}: 2 CPU ranks, gradient_clipping 1.0, EP=2 off EP=1 by 5e-5 after "
                   "one step; equal with clipping off or at ZeRO 1 and 2", {"expert_parallel": 2, "stage": 0}),
    ),
    comm="ep_all_to_all", candidates="experts", own_flags=check_moe_flags, engaged_by=_moe_run,
)

"""The legality table: every layout ds_bench refuses, why, and on whose word, as data.

One ``Rule`` per refused combination: the condition (over a ``Layout`` and where it would run:
``Where``), the one sentence said about it, its source (a DeepSpeed assertion or issue and the
version it was verified with, or "not measured yet") and an example it refuses. ``ds-bench run``
refuses the first rule that holds before it joins the process group (``refuse``: exit 2, that
sentence); a sweep or capacity search skips a grid point with the same sentence (``violation``).
``tests/test_legality.py`` walks the table and checks both say the same. Before the table, a feature newer
than the stack's DeepSpeed or transformers release is refused (``ds_bench.config.stack_rules``).

Checks that need the model (a pipeline deeper than its blocks, a TP degree that does not divide the
heads) stay with the engine that splits it (``ds_bench.engines``); which workloads have a pipeline or
AutoTP model, with the workload (``ds_bench.workloads.base``). The rules of the parallel degrees, ``Where`` and
``Rule`` are ``ds_bench.config.legality_rules``'; the table is here.
"""

from __future__ import annotations

import dataclasses
import functools

from ds_bench.config.layout import DEGREES, Layout
from ds_bench.config.legality_rules import (DEEPSPEED, Rule, Where, _ex, _pp, _tiled, _tp, parallel_rules,
                                            run_option_rules, switch_rules)
from ds_bench.config.layout import SWITCHES
from ds_bench.errors import UserError

__all__ = ["rules", "Rule", "Where", "violation", "first_broken", "refuse", "refuse_run", "run_options"]

OTHER_RULES: tuple[Rule, ...] = (
    Rule("tiling is DeepSpeed's", lambda l, w: _tiled(l) and l.engine != "deepspeed",
         "--engine {engine} with " "{tiles}: DeepSpeed's tiled compute hands each weight's gradient to ZeRO once, "
         "after the last tile (ds_grad_is_ready); DDP and FSDP have no such hook (--engine deepspeed)",
         f"{DEEPSPEED}, ulysses_sp.py TiledMLP: 'DDP, FSDP will need something similar'",
         _ex(engine="ddp", stage=0, tiled_mlp=True)),
    Rule("tiling and a pipeline", lambda l, w: _tiled(l) and _pp(l, w),
         "{tiles} with --pipeline-stages {pipeline_stages}: a pipeline stage's blocks are not HF modules to tile",
         "ds_bench's pipeline GPT-2 is its own PipelineModule", _ex(tiled_loss=True, pipeline_stages=2)),
    Rule("tiling and AutoTP", lambda l, w: _tiled(l) and _tp(l, w),
         "{tiles} with --tensor-parallel {tensor_parallel}: not measured yet", "not measured yet",
         _ex(tiled_mlp=True, tensor_parallel=2)),
    Rule("the tiled loss and fp16", lambda l, w: l.tiled_loss and l.precision == "fp16",
         "--tiled-loss with fp16: DeepSpeed's TiledFusedLogitsLoss takes the LM head's gradient in forward, before "
         "fp16's loss scale multiplies the loss; use bf16 or fp32",
         f"{DEEPSPEED}, ulysses_sp.py TiledFusedLogitsLoss.backward scales only the hidden states' gradient",
         _ex(tiled_loss=True, precision="fp16")),
    Rule("tiling and compile", lambda l, w: _tiled(l) and l.compile,
         "{tiles} with --compile: not measured yet", "not measured yet", _ex(tiled_mlp=True, compile=True)),
    Rule("checkpoint offload and a pipeline", lambda l, w: "checkpoint_offload" in w.run_options and _pp(l, w),
         "--checkpoint-offload with --pipeline-stages {pipeline_stages}: a pipeline stage's blocks are not HF "
         "checkpointing layers, whose inputs DeepSpeed's offload marks", "ds_bench's pipeline GPT-2 is its own "
         "PipelineModule", _ex(pipeline_stages=2), frozenset({"checkpoint_offload"})),
    Rule("selective checkpointing and a pipeline",
         lambda l, w: "selective_checkpointing" in w.run_options and _pp(l, w),
         "--selective-checkpointing with --pipeline-stages {pipeline_stages}: DeepSpeed's PipelineModule checkpoints "
         "a stage's blocks with its own checkpoint function, which takes no selective policy",
         "ds_bench's pipeline GPT-2 is its own PipelineModule (activation_checkpoint_interval)",
         _ex(pipeline_stages=2), frozenset({"selective_checkpointing"})),
    Rule("selective checkpointing and the tiled MLP",
         lambda l, w: "selective_checkpointing" in w.run_options and l.tiled_mlp,
         "--selective-checkpointing with --tiled-mlp: TiledMLP's matmuls, one per tile, shift the policy's count of "
         "every other matmul (ds_bench.workloads.checkpoint_policy)", "not measured yet",
         _ex(tiled_mlp=True), frozenset({"selective_checkpointing"})),
    Rule("checkpoint offload needs a GPU",
         lambda l, w: "checkpoint_offload" in w.run_options and w.device_type == "cpu",
         "--checkpoint-offload on CPU ranks: their activations are in host memory already (DeepSpeed's "
         "CheckpointHiddenStatesOffload never offloads on a CPU accelerator)",
         f"{DEEPSPEED}, runtime/activation_checkpointing/offload_activations.py: 'cpu-like accelerators have no "
         "streams; offload_input never offloads there'", _ex(), frozenset({"checkpoint_offload"})),
    Rule("DDP does not offload", lambda l, w: l.engine == "ddp" and l.offload != "none",
         "--engine ddp with offload={offload}: DDP keeps parameters, gradients and optimizer state on the device; "
         "remove the offload, or use --engine deepspeed or fsdp", "torch DistributedDataParallel",
         _ex(engine="ddp", offload="optimizer")),
    Rule("FSDP shards", lambda l, w: l.engine == "fsdp" and l.stage < 2,
         "--engine fsdp with ZeRO stage {stage}: FSDP always shards parameters and gradients; use stage 2 "
         "(reshard_after_forward=False) or 3 (reshard_after_forward=True), or --engine ddp", "torch FSDP2 fully_shard",
         _ex(engine="fsdp", stage=1)),
    Rule("FSDP offloads all or nothing", lambda l, w: l.engine == "fsdp" and l.offload in ("optimizer", "zenflow"),
         "--engine fsdp with offload=optimizer: FSDP2's CPUOffloadPolicy moves parameters, gradients and the "
         "optimizer step together; offload all at stage 3, or none", "torch FSDP2 CPUOffloadPolicy",
         _ex(engine="fsdp", stage=3, offload="optimizer")),
    Rule("offload needs ZeRO", lambda l, w: l.offload != "none" and l.stage == 0,
         "offload={offload} with ZeRO stage 0: offloading (zero_optimization.offload_*) needs ZeRO stage 1, 2 or 3",
         f"{DEEPSPEED}, deepspeed/runtime/zero/config.py", _ex(stage=0, offload="optimizer")),
    Rule("parameter offload needs ZeRO-3", lambda l, w: l.offload == "all" and l.stage not in (0, 3),
         "offload=all with ZeRO stage {stage}: zero_optimization.offload_param needs ZeRO stage 3 (DeepSpeed "
         "ignores it below)", f"{DEEPSPEED}, deepspeed/runtime/zero/config.py", _ex(stage=2, offload="all")),
    Rule("ZenFlow and the parallel degrees", lambda l, w: l.offload == "zenflow" and any(
        d.active(l, w) for d in DEGREES), "offload=zenflow with {degrees}: not measured yet", "not measured yet",
         _ex(offload="zenflow", sequence_parallel=2)),
    Rule("no fp16 on CPU ranks", lambda l, w: l.precision == "fp16" and w.device_type == "cpu",
         "fp16 on CPU ranks: DeepSpeed's CPU accelerator has no fp16 (use bf16 or fp32)",
         f"{DEEPSPEED}: 'Type fp16 is not supported on your device'", _ex(precision="fp16")),
)
"""The rules of the memory switches, the engines, offload and precision, between the parallel degrees' and the run
options'."""


def rules() -> tuple[Rule, ...]:
    """The table, checked in this order (the first that holds is what is said): every run switch's rules
    (``config.run_switches``: a switch's refusal names the switch, not a degree it sits beside), every registered
    degree's rules and the pairs that do not compose (``legality_rules.parallel_rules``), ``OTHER_RULES``, then the
    run options a degree's engine does not take. Built once per set of registered degrees (the same ``Rule`` objects each call)."""
    return _table(tuple(map(id, DEGREES)))


@functools.lru_cache(maxsize=4)
def _table(degree_ids: tuple) -> tuple[Rule, ...]:
    return (*(r for s in SWITCHES for r in switch_rules(s)), *parallel_rules(), *OTHER_RULES, *run_option_rules())


def violation(layout: Layout, where: Where) -> str | None:
    """The sentence of the first feature of ``layout`` its stack's release is too old for (``config.stack_rules``:
    what the stack cannot run at all comes first), else of the first rule it breaks at ``where``, or None (pure but
    for reading this environment's versions)."""
    from ds_bench.config.stack_rules import too_old

    old = too_old(layout, where)
    if old is not None:
        return old
    rule = first_broken(layout, where)
    return rule.says(layout, where) if rule else None


def first_broken(layout: Layout, where: Where) -> Rule | None:
    return next((r for r in rules() if r.refused(layout, where)), None)


RUN_OPTIONS = ("breakdown", "checkpoint", "resume", "model_path", "checkpoint_offload", "selective_checkpointing")
"""``RunConfig`` fields beyond the layout that a rule may refuse."""


def refuse_run(cfg, world_size: int, device_type: str, read_cfg: dict | None = None) -> None:
    """``ds-bench run``'s check (before joining): ``cfg`` a ``RunConfig`` (or its parsed flags); its layout is
    its flags and its DeepSpeed config's own stage, offload and precision as read (``prepare.read``: ``--set``
    applied; ``read_cfg``, else read here)."""
    from ds_bench.config.deepspeed import prepare as ds_config
    from ds_bench.config.deepspeed.derive import axes_of
    from ds_bench.config.layout import from_run

    try:
        axes = axes_of(ds_config.read(cfg.ds_config, tuple(cfg.overrides)) if read_cfg is None else read_cfg)
    except (UserError, AttributeError, TypeError, ValueError):
        return  # a malformed config: ds_config.resolve names what is wrong with it
    axes.pop("switches")  # the rules name the switches' flags; what the config itself holds, its keys' checks name
    layout = dataclasses.replace(from_run(cfg, axes), seq_len=cfg.seq_len)  # the sequence a group slices
    refuse(layout, Where(world_size, device_type, run_options(cfg), engaged(cfg), getattr(cfg, "workload", "") or ""))


def engaged(flags) -> frozenset[str]:
    """The degrees whose engine a run's (or study's) flags use even at size 1 (``Degree.engaged``)."""
    return frozenset(d.field for d in DEGREES if d.engaged(flags))


def run_options(flags) -> frozenset[str]:
    """The ``RUN_OPTIONS`` a run's flags (a ``RunConfig``, or a study's parsed ``--`` tail) set."""
    return frozenset(name for name in RUN_OPTIONS if getattr(flags, name, None))


def refuse(layout: Layout, where: Where) -> None:
    """``UserError`` with the sentence of the first rule ``layout`` breaks (exit 2 before joining)."""
    message = violation(layout, where)
    if message is not None:
        raise UserError(message)

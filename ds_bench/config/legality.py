"""The legality table: every layout ds_bench refuses, why, and on whose word, as data.

One ``Rule`` per refused combination: the condition (over a ``Layout`` and where it would run:
``Where``), the one sentence said about it, its source (a DeepSpeed assertion or issue and the
version it was verified with, or "not measured yet") and an example it refuses. ``ds-bench run``
refuses the first rule that holds before it joins the process group (``refuse``: exit 2, that
sentence); a sweep or capacity search skips a grid point with the same sentence (``violation``).
``tests/test_legality.py`` walks the table and checks both say the same.

Checks that need the model (a pipeline deeper than its blocks, a TP degree that does not divide the
heads) stay with the engine that splits it (``ds_bench.engines``); which workloads have a pipeline or
AutoTP model, with the workload (``ds_bench.workloads.base``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from ds_bench.config.layout import DEGREES, SWITCHES, Layout
from ds_bench.errors import UserError

DEEPSPEED = "deepspeed 0.19.8"
PIPE_ENGINE = f"{DEEPSPEED}, deepspeed/runtime/pipe/engine.py asserts zero_stage < 2 and no offload"


@dataclass(frozen=True)
class Where:
    """What a layout's legality depends on beyond itself."""

    world_size: int | None = None
    """Ranks of the job; None: not known yet (the divisibility rules wait)."""
    device_type: str = "cpu"
    run_options: frozenset[str] = frozenset()
    """``RunConfig`` fields a run sets beyond its layout (``RUN_OPTIONS``)."""
    engaged: frozenset[str] = frozenset()
    """Degrees whose engine a run uses even at 1 (``--pipeline-stages 1``: a one-stage pipeline module)."""


@dataclass(frozen=True)
class Rule:
    name: str
    refused: Callable[[Layout, Where], bool]
    message: str
    """One sentence, ``str.format``-ed with the layout's fields and ``world_size``."""
    source: str
    example: Layout
    """A layout this rule refuses (tests and docs)."""
    example_options: frozenset[str] = field(default_factory=frozenset)

    def says(self, layout: Layout, where: Where) -> str:
        return self.message.format(world_size=where.world_size, tiles=_tiles(layout), **layout.to_dict())


def _ex(**fields) -> Layout:
    return Layout(**{"stage": 1, "offload": "none", "precision": "fp32", "micro_batch": 2, **fields})


def _pp(l: Layout, w: Where) -> bool:
    return l.pipeline_stages > 1 or "pipeline_stages" in w.engaged


def _tp(l: Layout, w: Where) -> bool:
    return l.tensor_parallel > 1 or "tensor_parallel" in w.engaged


def _sp(l: Layout, w: Where) -> bool:
    return l.sequence_parallel > 1 or "sequence_parallel" in w.engaged


def _ep(l: Layout, w: Where) -> bool:
    """Expert parallelism's engine in use: EP > 1, or a moe run under DeepSpeed (its MoE layer even at EP = 1)."""
    return l.expert_parallel > 1 or ("expert_parallel" in w.engaged and l.engine == "deepspeed")


def _tiled(l: Layout) -> bool:
    return l.tiled_mlp or l.tiled_loss


def _tiles(l: Layout) -> str:
    return " ".join(f"--{s.word}" for s in SWITCHES if getattr(l, s.field))


def _indivisible(l: Layout, w: Where, degree: str) -> bool:
    return w.world_size is not None and w.world_size % getattr(l, degree) != 0


RULES: tuple[Rule, ...] = (
    Rule("tensor parallelism is DeepSpeed's", lambda l, w: _tp(l, w) and l.engine != "deepspeed",
         "--engine {engine} with --tensor-parallel {tensor_parallel}: tensor parallelism is DeepSpeed's AutoTP "
         "here (--engine deepspeed)", "ds_bench: DDP and FSDP are run without a TP plan", _ex(engine="ddp", stage=0,
                                                                                                tensor_parallel=2)),
    Rule("AutoTP and a pipeline", lambda l, w: _tp(l, w) and _pp(l, w),
         "--tensor-parallel {tensor_parallel} with --pipeline-stages {pipeline_stages}: AutoTP does not combine with "
         "DeepSpeed's pipeline engine (DeepSpeed #7147)", f"{DEEPSPEED}; github.com/deepspeedai/DeepSpeed/issues/7147",
         _ex(tensor_parallel=2, pipeline_stages=2)),
    Rule("AutoTP and compile", lambda l, w: _tp(l, w) and l.compile,
         "--compile with --tensor-parallel {tensor_parallel}: not measured yet (DeepSpeed has its own AutoTP "
         "compile pass)", "not measured yet", _ex(tensor_parallel=2, compile=True)),
    Rule("TP degree divides the ranks", lambda l, w: _tp(l, w) and _indivisible(l, w, "tensor_parallel"),
         "--tensor-parallel {tensor_parallel} does not divide the world size {world_size}: every data-parallel "
         "replica needs a whole tensor-parallel group", "arithmetic", _ex(tensor_parallel=3)),
    Rule("the pipeline is DeepSpeed's", lambda l, w: _pp(l, w) and l.engine != "deepspeed",
         "--engine {engine} with --pipeline-stages {pipeline_stages}: the pipeline is DeepSpeed's own engine "
         "(--engine deepspeed)", "ds_bench: DDP and FSDP are run without a pipeline schedule",
         _ex(engine="fsdp", stage=3, pipeline_stages=2)),
    Rule("a pipeline takes ZeRO 0 or 1", lambda l, w: _pp(l, w) and l.stage > 1,
         "--pipeline-stages {pipeline_stages} with ZeRO stage {stage}: DeepSpeed's pipeline engine allows ZeRO stage "
         "0 or 1 only (--set zero_optimization.stage=1)", PIPE_ENGINE, _ex(pipeline_stages=2, stage=2)),
    Rule("a pipeline does not offload", lambda l, w: _pp(l, w) and l.offload != "none",
         "--pipeline-stages {pipeline_stages} with offload={offload}: DeepSpeed's pipeline engine does not offload",
         PIPE_ENGINE, _ex(pipeline_stages=2, offload="optimizer")),
    Rule("a pipeline and compile", lambda l, w: _pp(l, w) and l.compile,
         "--compile with --pipeline-stages {pipeline_stages}: not measured yet (DeepSpeed's PipelineEngine runs "
         "stage by stage)", "not measured yet", _ex(pipeline_stages=2, compile=True)),
    Rule("a pipeline needs causal masking", lambda l, w: _pp(l, w) and l.attn == "eager",
         "--attn eager with --pipeline-stages {pipeline_stages}: a stage's blocks get no attention mask, which only "
         "sdpa and flash_attention_2 apply causally; use --attn sdpa",
         "ds_bench's pipeline GPT-2 passes no mask between stages", _ex(pipeline_stages=2, attn="eager")),
    Rule("pipeline stages divide the ranks", lambda l, w: _pp(l, w) and _indivisible(l, w, "pipeline_stages"),
         "--pipeline-stages {pipeline_stages} does not divide the world size {world_size}: every data-parallel "
         "replica needs all the stages", "arithmetic", _ex(pipeline_stages=3)),
    Rule("sequence parallelism is DeepSpeed's", lambda l, w: _sp(l, w) and l.engine != "deepspeed",
         "--engine {engine} with --sequence-parallel {sequence_parallel}: sequence parallelism is DeepSpeed-Ulysses "
         "here (--engine deepspeed)", "ds_bench: DDP and FSDP are run without a sequence-parallel attention",
         _ex(engine="ddp", stage=0, sequence_parallel=2)),
    Rule("Ulysses and a pipeline", lambda l, w: _sp(l, w) and _pp(l, w),
         "--sequence-parallel {sequence_parallel} with --pipeline-stages {pipeline_stages}: DeepSpeed's pipeline "
         "engine takes no sequence-parallel groups", f"{DEEPSPEED}: PipelineEngine builds its own grid, no Ulysses mpu",
         _ex(sequence_parallel=2, pipeline_stages=2)),
    Rule("Ulysses and AutoTP", lambda l, w: _sp(l, w) and _tp(l, w),
         "--sequence-parallel {sequence_parallel} with --tensor-parallel {tensor_parallel}: DeepSpeed's Ulysses "
         "groups (parallel_state_sp) have no tensor-parallel dimension to combine with AutoTP's",
         f"{DEEPSPEED}, deepspeed/runtime/sequence_parallel/parallel_state_sp.py: sequence and data groups only",
         _ex(sequence_parallel=2, tensor_parallel=2)),
    Rule("Ulysses needs a causal kernel", lambda l, w: _sp(l, w) and l.attn == "eager",
         "--attn eager with --sequence-parallel {sequence_parallel}: Ulysses drops the 4-D attention mask eager "
         "needs (O(n^2) memory); use --attn sdpa or flash_attention_2",
         f"{DEEPSPEED}, ulysses_sp.py register_with_transformers refuses eager",
         _ex(sequence_parallel=2, attn="eager")),
    Rule("Ulysses and compile", lambda l, w: _sp(l, w) and l.compile,
         "--compile with --sequence-parallel {sequence_parallel}: not measured yet", "not measured yet",
         _ex(sequence_parallel=2, compile=True)),
    Rule("SP degree divides the ranks", lambda l, w: _sp(l, w) and _indivisible(l, w, "sequence_parallel"),
         "--sequence-parallel {sequence_parallel} does not divide the world size {world_size}: every data-parallel "
         "replica needs a whole sequence-parallel group", "arithmetic", _ex(sequence_parallel=3)),
    Rule("SP degree divides the sequence", lambda l, w: _sp(l, w) and l.seq_len % l.sequence_parallel != 0,
         "--sequence-parallel {sequence_parallel} does not divide --seq-len {seq_len}: every rank of a group holds "
         "an equal slice of the sequence", f"{DEEPSPEED}, ulysses_sp.py reshapes to [S, T/S, ...]",
         _ex(sequence_parallel=2, seq_len=1001)),
    Rule("expert parallelism is DeepSpeed's", lambda l, w: l.expert_parallel > 1 and l.engine != "deepspeed",
         "--engine {engine} with --expert-parallel {expert_parallel}: expert parallelism is DeepSpeed's here "
         "(--engine deepspeed); DDP and FSDP train HF's own MoE blocks, every expert on every rank",
         "ds_bench: DDP and FSDP are run without an all-to-all dispatch", _ex(engine="ddp", stage=0, expert_parallel=2)),
    Rule("experts and a pipeline", lambda l, w: _ep(l, w) and _pp(l, w),
         "--expert-parallel {expert_parallel} with --pipeline-stages {pipeline_stages}: ds_bench's pipeline model "
         "is GPT-2's, which has no experts", "ds_bench's pipeline GPT-2 is its own PipelineModule",
         _ex(expert_parallel=2, pipeline_stages=2)),
    Rule("experts and AutoTP", lambda l, w: _ep(l, w) and _tp(l, w),
         "--expert-parallel {expert_parallel} with --tensor-parallel {tensor_parallel}: DeepSpeed's MoE layer takes "
         "its tensor-parallel groups from a Megatron mpu, which AutoTP does not give",
         f"{DEEPSPEED}, deepspeed/moe/layer.py _create_process_groups reads groups.mpu",
         _ex(expert_parallel=2, tensor_parallel=2)),
    Rule("experts and Ulysses", lambda l, w: _ep(l, w) and _sp(l, w),
         "--expert-parallel {expert_parallel} with --sequence-parallel {sequence_parallel}: not measured yet "
         "(Ulysses runs on llama, experts on moe)", "not measured yet", _ex(expert_parallel=2, sequence_parallel=2)),
    Rule("DeepSpeed's MoE layer and ZeRO-3", lambda l, w: _ep(l, w) and l.stage == 3,
         "--workload moe under ZeRO stage 3: DeepSpeed refuses its MoE layer there ('Native DeepSpeed MoE is not "
         "supported with ZeRO Stage 3'; its AutoEP, which is, does not run with the transformers installed here: "
         "--moe-path); use ZeRO stage 1 or 2", f"{DEEPSPEED}, deepspeed/runtime/engine.py asserts it",
         _ex(expert_parallel=2, stage=3)),
    Rule("experts over ranks and ZeRO-0", lambda l, w: l.expert_parallel > 1 and l.stage == 0,
         "--expert-parallel {expert_parallel} with ZeRO stage 0: DeepSpeed's stage-0 gradient clipping takes the "
         "norm of this rank's experts only, so the update differs from EP=1's (measured); use ZeRO stage 1 or 2",
         f"{DEEPSPEED}: 2 CPU ranks, gradient_clipping 1.0, EP=2 off EP=1 by 5e-5 after one step; equal with "
         "clipping off or at ZeRO 1 and 2", _ex(expert_parallel=2, stage=0)),
    Rule("experts and compile", lambda l, w: _ep(l, w) and l.compile,
         "--compile with --workload moe: not measured yet", "not measured yet", _ex(expert_parallel=2, compile=True)),
    Rule("EP degree divides the ranks", lambda l, w: l.expert_parallel > 1 and _indivisible(l, w, "expert_parallel"),
         "--expert-parallel {expert_parallel} does not divide the world size {world_size}: every expert-parallel "
         "group holds every expert once", "arithmetic", _ex(expert_parallel=3)),
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
    Rule("FSDP offloads all or nothing", lambda l, w: l.engine == "fsdp" and l.offload == "optimizer",
         "--engine fsdp with offload=optimizer: FSDP2's CPUOffloadPolicy moves parameters, gradients and the "
         "optimizer step together; offload all at stage 3, or none", "torch FSDP2 CPUOffloadPolicy",
         _ex(engine="fsdp", stage=3, offload="optimizer")),
    Rule("offload needs ZeRO", lambda l, w: l.offload != "none" and l.stage == 0,
         "offload={offload} with ZeRO stage 0: offloading (zero_optimization.offload_*) needs ZeRO stage 1, 2 or 3",
         f"{DEEPSPEED}, deepspeed/runtime/zero/config.py", _ex(stage=0, offload="optimizer")),
    Rule("parameter offload needs ZeRO-3", lambda l, w: l.offload == "all" and l.stage not in (0, 3),
         "offload=all with ZeRO stage {stage}: zero_optimization.offload_param needs ZeRO stage 3 (DeepSpeed "
         "ignores it below)", f"{DEEPSPEED}, deepspeed/runtime/zero/config.py", _ex(stage=2, offload="all")),
    Rule("no fp16 on CPU ranks", lambda l, w: l.precision == "fp16" and w.device_type == "cpu",
         "fp16 on CPU ranks: DeepSpeed's CPU accelerator has no fp16 (use bf16 or fp32)",
         f"{DEEPSPEED}: 'Type fp16 is not supported on your device'", _ex(precision="fp16")),
    *(Rule(f"a pipeline and {flag}", lambda l, w, o=option: _pp(l, w) and o in w.run_options,
           f"{flag} with --pipeline-stages {{pipeline_stages}}: {why}", source, _ex(pipeline_stages=2),
           frozenset({option}))
      for option, flag, why, source in (
        ("breakdown", "--breakdown", "it times the phases of each micro-step, and a pipeline runs them all inside "
                                     "train_batch", "DeepSpeed's PipelineEngine.train_batch"),
        ("checkpoint", "--checkpoint", "not measured yet", "not measured yet"),
        ("resume", "--resume", "not measured yet", "not measured yet"),
        ("model_path", "--model", "pretrained weights are not loaded into pipeline stages yet; use --size or "
                                  "--layers", "not built yet"))),
    *(Rule(f"{name} and {flag}", lambda l, w, o=option, engaged=engaged: engaged(l, w) and o in w.run_options,
           f"{flag} with --{degree.replace('_', '-')} {{{degree}}}: not measured yet", "not measured yet",
           _ex(**{degree: 2}), frozenset({option}))
      for name, degree, engaged in (("AutoTP", "tensor_parallel", _tp), ("Ulysses", "sequence_parallel", _sp),
                                    ("the MoE layer", "expert_parallel", _ep))
      for option, flag in (("breakdown", "--breakdown"), ("checkpoint", "--checkpoint"), ("resume", "--resume"))),
)
"""Checked in this order; the first that holds is what is said."""


def violation(layout: Layout, where: Where) -> str | None:
    """The sentence of the first rule ``layout`` breaks at ``where``, or None (pure)."""
    rule = first_broken(layout, where)
    return rule.says(layout, where) if rule else None


def first_broken(layout: Layout, where: Where) -> Rule | None:
    return next((r for r in RULES if r.refused(layout, where)), None)


RUN_OPTIONS = ("breakdown", "checkpoint", "resume", "model_path", "checkpoint_offload")
"""``RunConfig`` fields beyond the layout that a rule may refuse."""


def refuse_run(cfg, world_size: int, device_type: str) -> None:
    """``ds-bench run``'s check (before joining): ``cfg`` a ``RunConfig`` (or its parsed flags); its layout is
    its flags and its DeepSpeed config's own stage, offload and precision (``--set`` applied)."""
    from ds_bench.config.deepspeed import prepare as ds_config
    from ds_bench.config.deepspeed import sections
    from ds_bench.config.deepspeed.derive import axes_of
    from ds_bench.config.layout import from_run

    path = cfg.ds_config
    try:  # DeepSpeed's own reading of the sections: legacy spellings (cpu_offload, bfloat16) count
        ds_cfg = sections.normalize_sections(sections.rename_aliases(
            ds_config.apply_overrides(ds_config.load_json(path), tuple(cfg.overrides)), path), path)
        axes = axes_of(ds_cfg)
    except (UserError, AttributeError, TypeError, ValueError):
        return  # a malformed config: ds_config.prepare names what is wrong with it
    engaged = frozenset(d.field for d in DEGREES if getattr(cfg, d.field) is not None) | moe_engaged(cfg)
    layout = dataclasses.replace(from_run(cfg, axes), seq_len=cfg.seq_len)  # the sequence a group slices
    refuse(layout, Where(world_size, device_type, run_options(cfg), engaged))


MOE_WORKLOAD = "moe"


def moe_engaged(flags) -> frozenset[str]:
    """A moe run (or study) engages the expert-parallel engine even at EP = 1: DeepSpeed's MoE layer, for its
    DeepSpeed layouts (``_ep``)."""
    return frozenset({"expert_parallel"}) if getattr(flags, "workload", None) == MOE_WORKLOAD else frozenset()


def run_options(flags) -> frozenset[str]:
    """The ``RUN_OPTIONS`` a run's flags (a ``RunConfig``, or a study's parsed ``--`` tail) set."""
    return frozenset(name for name in RUN_OPTIONS if getattr(flags, name, None))


def refuse(layout: Layout, where: Where) -> None:
    """``UserError`` with the sentence of the first rule ``layout`` breaks (exit 2 before joining)."""
    message = violation(layout, where)
    if message is not None:
        raise UserError(message)

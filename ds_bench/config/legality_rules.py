"""The legality table's vocabulary and its parallel-layout rules: ``Where`` a layout would run, a ``Rule``,
the predicates the rules share, and the rules of each parallel degree (pipeline, AutoTP, Ulysses, experts) and of
the run options a degree's engine does not take yet. ``ds_bench.config.legality`` puts them in the one table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ds_bench.config.layout import SWITCHES, Layout

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




PARALLEL_RULES: tuple[Rule, ...] = (
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
         "--workload moe (--expert-parallel {expert_parallel}) with --pipeline-stages {pipeline_stages}: ds_bench's "
         "pipeline model is GPT-2's, which has no experts", "ds_bench's pipeline GPT-2 is its own PipelineModule",
         _ex(expert_parallel=2, pipeline_stages=2)),
    Rule("experts and AutoTP", lambda l, w: _ep(l, w) and _tp(l, w),
         "--workload moe (--expert-parallel {expert_parallel}) with --tensor-parallel {tensor_parallel}: DeepSpeed's "
         "MoE layer takes its tensor-parallel groups from a Megatron mpu, which AutoTP does not give",
         f"{DEEPSPEED}, deepspeed/moe/layer.py _create_process_groups reads groups.mpu",
         _ex(expert_parallel=2, tensor_parallel=2)),
    Rule("experts and Ulysses", lambda l, w: _ep(l, w) and _sp(l, w),
         "--workload moe (--expert-parallel {expert_parallel}) with --sequence-parallel {sequence_parallel}: not "
         "measured yet (Ulysses runs on llama, experts on moe)", "not measured yet", _ex(expert_parallel=2, sequence_parallel=2)),
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
)
"""The parallel degrees' rules, in the table's order."""

RUN_OPTION_RULES: tuple[Rule, ...] = (
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
           f"{flag} with {said}: not measured yet", "not measured yet", _ex(**{degree: 2}), frozenset({option}))
      for name, degree, engaged, said in (
        ("AutoTP", "tensor_parallel", _tp, "--tensor-parallel {tensor_parallel}"),
        ("Ulysses", "sequence_parallel", _sp, "--sequence-parallel {sequence_parallel}"),
        ("the MoE layer", "expert_parallel", _ep, "--workload moe (--expert-parallel {expert_parallel})"))
      for option, flag in (("breakdown", "--breakdown"), ("checkpoint", "--checkpoint"), ("resume", "--resume"))),
)
"""Run options (``--breakdown``, ``--checkpoint``...) a degree's engine does not take yet."""

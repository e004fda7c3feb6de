"""Pipeline stages (``--pipeline-stages P``): DeepSpeed's pipeline engine over gpt2's ``PipelineModule``
(``ds_bench.engines.degrees.pipeline``). What it refuses of its own: ZeRO above 1, offload, eager attention, and the run
options its ``train_batch`` does not take."""

from __future__ import annotations

import re

from ds_bench.config.degrees.protocol import DEEPSPEED, Degree, DegreeRule, active
from ds_bench.errors import UserError

PIPE_ENGINE = f"{DEEPSPEED}, deepspeed/runtime/pipe/engine.py asserts zero_stage < 2 and no offload"
OWN_MODULE = "ds_bench's pipeline GPT-2 is its own PipelineModule"


def _pp(l, w) -> bool:
    return active("pipeline_stages", l, w)


def check_partition(method: str | None) -> None:
    """``parameters``, ``uniform`` or ``type:REGEX`` (a regular expression over layer class names)."""
    if method is None or method in ("parameters", "uniform"):
        return
    if not (method.startswith("type:") and method[5:]):
        raise UserError(f"--partition {method!r}: expected parameters, uniform or type:REGEX (e.g. type:GPT2Block)")
    try:
        re.compile(method[5:])
    except re.error as e:
        raise UserError(f"--partition {method!r}: not a regular expression ({e})") from None


def _partition_flag(cfg) -> None:
    """``--partition`` splits layers over stages: only with ``--pipeline-stages``."""
    if cfg.pipeline_stages is None and cfg.partition is not None:
        raise UserError("--partition needs --pipeline-stages (it splits layers over pipeline stages)")
    check_partition(cfg.partition)


def _summary(stages: int, settings: dict) -> str:
    return (f"pp{stages}, {settings['micro_batches']} micro-batches per step, partition {settings['partition']}, "
            f"schedule bubble (P-1)/(m+P-1) = {settings['schedule_bubble']:.0%}")


PIPELINE = Degree(
    field="pipeline_stages", word="pp", flag="--pipeline-stages", metavar="P",
    help="train through DeepSpeed's pipeline engine with P stages (gpt2: a PipelineModule, engine.train_batch); "
         "data-parallel degree = world size / P, micro-batches per step = gradient_accumulation_steps; ZeRO stage 0 "
         "or 1, no offload. Default: no pipeline",
    what="DeepSpeed pipeline stages (gpt2)", called="a pipeline", splits_replica=True, named="--pipeline-stages {pipeline_stages}",
    summary=_summary,
    deepspeed_only="the pipeline is DeepSpeed's own engine (--engine deepspeed)",
    deepspeed_only_source="ds_bench: DDP and FSDP are run without a pipeline schedule",
    divides_world="every data-parallel replica needs all the stages",
    compile="not measured yet (DeepSpeed's PipelineEngine runs stage by stage)",
    unmeasured_options=(
        ("breakdown", "--breakdown", "it times the phases of each micro-step, and a pipeline runs them all inside "
                                     "train_batch", "DeepSpeed's PipelineEngine.train_batch"),
        ("checkpoint", "--checkpoint", "not measured yet", "not measured yet"),
        ("resume", "--resume", "not measured yet", "not measured yet"),
        ("model_path", "--model", "pretrained weights are not loaded into pipeline stages yet; use --size or "
                                  "--layers", "not built yet")),
    rules=(
        DegreeRule("a pipeline takes ZeRO 0 or 1", lambda l, w: _pp(l, w) and l.stage > 1,
                   "--pipeline-stages {pipeline_stages} with ZeRO stage {stage}: DeepSpeed's pipeline engine allows "
                   "ZeRO stage 0 or 1 only (--set zero_optimization.stage=1)", PIPE_ENGINE,
                   {"pipeline_stages": 2, "stage": 2}),
        DegreeRule("a pipeline does not offload", lambda l, w: _pp(l, w) and l.offload != "none",
                   "--pipeline-stages {pipeline_stages} with offload={offload}: DeepSpeed's pipeline engine does not "
                   "offload", PIPE_ENGINE, {"pipeline_stages": 2, "offload": "optimizer"}),
        DegreeRule("a pipeline needs causal masking", lambda l, w: _pp(l, w) and l.attn == "eager",
                   "--attn eager with --pipeline-stages {pipeline_stages}: a stage's blocks get no attention mask, "
                   "which only sdpa and flash_attention_2 apply causally; use --attn sdpa",
                   "ds_bench's pipeline GPT-2 passes no mask between stages", {"pipeline_stages": 2, "attn": "eager"}),
    ),
    candidates="layers", own_flags=_partition_flag,
)

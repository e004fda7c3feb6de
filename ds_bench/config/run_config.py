"""The run configuration: every knob of one `ds-bench run`, validated once at load.

Precedence, as in torchtitan: command-line flag > DeepSpeed config file > default here. The
DeepSpeed JSON itself is resolved by ``ds_bench.config.deepspeed.prepare``; this module owns only ds_bench's own
settings. Anything invalid raises ``UserError`` naming the flag and what is expected.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from ds_bench.config import argcheck
from ds_bench.config.run_checks import (
    _require,
    check_attention,
    check_compile,
    check_compile_environment,
    check_engine,
    check_timeout,
)
from ds_bench.config.degrees import DEGREES
from ds_bench.config.degrees.protocol import with_degree_keywords
from ds_bench.config.run_switches import SWITCHES
from ds_bench.config.parsers import flag_type, parse_count, parse_duration, parse_memory
from ds_bench.errors import UserError

IFACE_HELP = ("network interface the ranks meet on (the rendezvous and gloo/NCCL; under mpirun Open MPI's own traffic "
              "too); default: chosen by ds_bench, docs/multi-node.md")
"""The help of every ``--iface`` (``ds-bench run``'s, and ``run_flags.add_iface_argument``'s)."""
REQUIRED = dataclasses.MISSING
"""``option``'s default for a flag the user must give."""


def option(default, flag: str, parse=None, **argparse_kwargs):
    """A ``RunConfig`` field that is also the ``ds-bench run`` flag ``flag`` (its argparse keyword
    arguments beside it); ``default`` is both the field's and the flag's. ``parse``: a ``parsers.parse_*`` of
    a value with a unit (a count, a duration, a memory cap), the flag's type."""
    if parse is not None:
        argparse_kwargs["type"] = flag_type(parse, flag)
    metadata = {"flag": flag, "argparse": argparse_kwargs}
    if default is REQUIRED:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@with_degree_keywords(unset=None)
@dataclass(frozen=True)
class RunConfig:
    """One benchmark run, as every rank executes it. Each field is also its ``ds-bench run`` flag
    (``ds_bench.config.run_flags`` builds the parser from these fields and their ``option`` metadata)."""

    workload: str = option(REQUIRED, "--workload", help="mnist | resnet | gpt2 | llama | moe")
    """Registered workload name (``ds_bench.workloads.REGISTRY``)."""
    ds_config: str = option(REQUIRED, "--ds-config", help="DeepSpeed JSON config (ds_configs/)")
    """Path of the DeepSpeed JSON config."""
    steps: int = option(50, "--steps", help="total steps, warm-up included (default 50)")
    """Total optimizer steps, warm-up included."""
    warmup: int = option(5, "--warmup", help="leading steps not timed (default 5)")
    """Leading steps excluded from every timing statistic."""
    micro_batch: int | None = option(None, "--micro-batch", help="per-device micro-batch (default: config, else 32)")
    """Samples per device per micro-step; None: the config's value, else 32."""
    data: str = option("synthetic", "--data", help="synthetic (default) or a data path")
    """``synthetic`` or a path the workload knows how to read."""
    results: str = option("results/results.jsonl", "--results", help="JSON-lines results file")
    """JSON-lines file rank 0 appends one record per run to."""
    seed: int = option(0, "--seed")
    overrides: tuple[str, ...] = option((), "--set", action="append", metavar="KEY=VALUE",
                                        help="override a DeepSpeed config key by dotted path, e.g. "
                                             "zero_optimization.stage=3")
    """``--set KEY=VALUE`` DeepSpeed overrides, dotted keys."""
    size: str | None = option(None, "--size", help="named model size of the workload")
    """Named model size (workload flavour); None: the workload's default."""
    layers: int | None = option(None, "--layers", metavar="L", help="custom shape (gpt2, llama): transformer blocks "
                                                                    "(with --hidden and --heads; not with --size)")
    """Blocks of a custom GPT-2 shape (``ds_bench.workloads.gpt2_shapes``); None: a named size."""
    hidden: int | None = option(None, "--hidden", metavar="H", help="custom shape: width (divisible by --heads)")
    heads: int | None = option(None, "--heads", metavar="A", help="custom shape: attention heads")
    seq_len: int = option(1024, "--seq-len", parse_count, metavar="TOKENS",
                          help="sequence length, e.g. 1024 or 8k (k = 2^10; default 1024)")
    image_size: int | None = option(None, "--image-size", help="ResNet input side (default 224)")
    num_classes: int | None = option(None, "--num-classes", help="ResNet classes (default 1000)")
    model_path: str | None = option(None, "--model", help="local pretrained weights folder")
    activation_checkpointing: bool = option(False, "--activation-checkpointing")
    attn: str | None = option(None, "--attn", metavar="{sdpa,eager,flash_attention_2}",
                              help="gpt2 and llama: attention implementation (default sdpa); flash_attention_2 needs the "
                                   "flash-attn package. The record states the one the model used")
    """HF ``attn_implementation`` for workloads with attention; None: the workload's default (sdpa)."""
    compile: bool = option(False, "--compile",
                           help="torch.compile the model (DeepSpeed: engine.compile(); DDP/FSDP: the wrapped module). "
                                "Compiling happens in the warm-up steps and is recorded apart (seconds, graphs, graph "
                                "breaks, recompilations); a run that compiles inside its measured steps fails "
                                "(raise --warmup)")
    """``torch.compile`` through each engine's own route (``ds_bench.engines.compiled``)."""
    channels_last: bool = option(False, "--channels-last",
                                 help="resnet under --engine ddp: weights and inputs in channels-last (NHWC) memory format")
    """ResNet's convolutions in NHWC (``torch.channels_last``), the layout GPU tensor cores and oneDNN prefer."""
    peak_tflops: float | None = option(None, "--peak-tflops", help="per-device dense peak for MFU")
    """Override of the per-device peak used for MFU (dense TFLOP/s)."""
    lr: float | None = option(None, "--lr", help="learning rate where the config says auto")
    """Learning rate used where the config says "auto"; None: the workload's default."""
    tag: str | None = option(None, "--tag", help="label stored in the record")
    """Free label stored in the record; ``ds-bench sweep`` finds each point's run records by it."""
    iface: str | None = option(None, "--iface", help=IFACE_HELP)
    """Network interface for the rendezvous (``--iface``); None: chosen automatically."""
    dist_timeout_s: float = option(300.0, "--dist-timeout", parse_duration, metavar="DURATION",
                                   help="how long process-group init or a collective waits before it gives up, e.g. "
                                        "90s or 5m (default 5m)")
    """Timeout of process-group initialisation and of every collective."""
    connect_timeout_s: float = option(30.0, "--connect-timeout", parse_duration, metavar="DURATION",
                                      help="how long a rank tries to reach MASTER_ADDR:MASTER_PORT (default 30s)")
    """How long a non-zero rank tries to reach MASTER_ADDR:MASTER_PORT before failing."""
    step_timeout_s: float = option(1800.0, "--step-timeout", parse_duration, metavar="DURATION",
                                   help="time without a finished step before the run dumps every thread's "
                                        "stack and fails, e.g. 90s or 30m (default 30m)")
    """The step watchdog: a run in which no step finishes for this long dumps stacks and fails."""
    cpu_mem_limit: int | None = option(None, "--cpu-mem-limit", parse_memory, metavar="SIZE",
                                       help="cap each rank's memory (RLIMIT_DATA), e.g. 4GiB (a unit is needed; "
                                            "GiB, G = 2^30, GB = 10^9): on CPU ranks a "
                                            "micro-batch that does not fit then fails to allocate and is recorded "
                                            "as an out-of-memory")
    """Bytes of private writable memory each rank may map (``ds_bench.machine.memory``); None: no cap."""
    slow_rank_threshold: float = option(10.0, "--slow-rank-threshold", metavar="PCT",
                                        help="name ranks whose compute time (forward + backward) is more than "
                                             "PCT%% above the median rank's, in the summary and the record "
                                             "(default 10)")
    """Percent above the median rank's compute time that names a rank slow (``ds_bench.measure.slow_ranks``)."""
    breakdown: bool = option(False, "--breakdown",
                             help="synchronize the device after every phase (data, forward, backward, optimizer) "
                                  "of every micro-step for an exact per-phase breakdown; costs what that "
                                  "serializes (overlapped communication, prefetch, optimizer launches), so steps "
                                  "can be slower than without it. Default: one synchronize per step, phases from "
                                  "non-blocking device events")
    """Synchronize after every phase (``ds_bench.measure.loop``'s ``breakdown`` mode) instead of once per step."""
    engine: str = option("deepspeed", "--engine", metavar="{deepspeed,ddp,fsdp}",
                         help="what trains the model, from the same DeepSpeed config (default deepspeed): ddp = "
                              "torch DistributedDataParallel, fsdp = torch FSDP2 (fully_shard; ZeRO stage 3 -> "
                              "reshard after forward, 2 -> keep gathered); docs/engines-and-layouts.md's Engines "
                              "table gives the whole mapping")
    """``deepspeed``, ``ddp`` or ``fsdp`` (``ds_bench.engines``): what trains the model, from the same config."""
    partition: str | None = option(None, "--partition", metavar="parameters|uniform|type:REGEX",
                                   help="with --pipeline-stages: how layers are split over stages (DeepSpeed's "
                                        "partition_method; default parameters: balanced by parameter count)")
    """PipelineModule ``partition_method``; None: ``parameters``."""
    experts: int | None = option(None, "--experts", metavar="E",
                                 help="moe: experts per block (default: the size's own; 8 with --layers)")
    top_k: int | None = option(None, "--top-k", metavar="K",
                               help="moe: experts the router picks per token (default: the size's own; 2 with --layers)")
    capacity_factor: float = option(0.0, "--capacity-factor", metavar="F",
                                    help="moe: each expert takes at most ceil(K x tokens / E x F) tokens per "
                                         "micro-step and the rest are dropped (DeepSpeed's capacity). Default 0: no "
                                         "dropping, as Mixtral and Qwen3-MoE train")
    aux_loss_weight: float | None = option(None, "--aux-loss-weight", metavar="W",
                                           help="moe: weight of the router's load-balancing loss in the loss "
                                                "(default: the size's published router_aux_loss_coef; 0: none)")
    moe_path: str = option("auto", "--moe-path", metavar="{auto,autoep,moe-layer,hf}",
                           help="moe under --engine deepspeed: autoep = DeepSpeed's AutoEP on the HF model, "
                                "moe-layer = the HF blocks as deepspeed.moe.layer.MoE with the same weights, hf = "
                                "HF's own blocks (no expert parallelism: what EP=1 costs is moe-layer's time against "
                                "this); auto "
                                "(default): AutoEP where the installed DeepSpeed and transformers work together, "
                                "else moe-layer. The record says which ran")
    """How expert parallelism runs (``PATHS`` of the expert-parallel engine module, ``ds_bench.engines``)."""
    tiled_mlp: bool = option(False, "--tiled-mlp",
                             help="compute each block's MLP in sequence tiles with DeepSpeed's TiledMLP (ALST), "
                                  "recomputing it in backward: the MLP's activations of one tile, not the sequence")
    """ALST's tiled MLP (``ds_bench.engines.tiling``)."""
    tiled_loss: bool = option(False, "--tiled-loss",
                              help="compute the LM head and loss in sequence tiles with DeepSpeed's "
                                   "TiledFusedLogitsLoss (ALST): no full-vocabulary logits tensor")
    """ALST's tiled logits and loss (``ds_bench.engines.tiling``)."""
    optimizer: str | None = option(None, "--optimizer", metavar="{adamw,muon}",
                                   help="the optimizer, written into the DeepSpeed config: adamw, or muon (DeepSpeed's "
                                        "Muon on the hidden matrices, AdamW on the rest; gradient clipping off: "
                                        "docs/options.md#muon). Default: the config's")
    """``config.run_switches`` (``Switch`` ``optimizer``); None: the config's optimizer."""
    master_states: str | None = option(None, "--master-states", metavar="{fp32,bf16,bf16-weights}",
                                       help="bf16 runs: the master weights, their gradients and the optimizer state "
                                            "in fp32, all in bf16, or the master weights and gradients in bf16 "
                                            "(bf16-weights; needs optimizer offload). Default: the config's")
    """``config.run_switches`` (``master_states``); None: the config's."""
    sp_path: str | None = option(None, "--sp-path", metavar="{ulysses,autosp}",
                                 help="with --sequence-parallel: ulysses (DeepSpeed-Ulysses on the HF attention; "
                                      "default) or autosp (DeepSpeed's AutoSP compiler pass; ZeRO 0/1, sdpa)")
    """``config.run_switches`` (``sp_path``); None: Ulysses."""
    deepcompile: bool = option(False, "--deepcompile",
                               help="DeepSpeed's DeepCompile: ZeRO's collectives scheduled inside the compiled graph "
                                    "(compile.deepcompile, engine.compile(); CUDA, ZeRO 1-3)")
    """``config.run_switches`` (``deepcompile``)."""
    selective_checkpointing: bool = option(False, "--selective-checkpointing",
                                           help="with --activation-checkpointing: keep every other matmul's output and "
                                                "the attention kernel's, recompute the rest (torchtitan's op-level "
                                                "selective checkpointing)")
    """torch's selective activation checkpointing (``ds_bench.workloads.checkpoint_policy``)."""
    checkpoint_offload: bool = option(False, "--checkpoint-offload",
                                      help="with --activation-checkpointing: keep each checkpointed block's input in "
                                           "host memory between forward and backward (DeepSpeed's "
                                           "CheckpointHiddenStatesOffload, ALST; GPU ranks)")
    """ALST's activation-checkpoint offload (``ds_bench.engines.tiling.checkpoint_offload``)."""
    busbw: float | None = option(None, "--busbw", metavar="GBPS",
                                 help="busbw for the comm-bound verdict (default: the newest ds-bench comm record "
                                      "of the same ranks in --comm-results)")
    """busbw (GB/s) for the comm-bound verdict (``ds_bench.perf.comm_bound``); None: a comm record's."""
    comm_results: str | None = option(None, "--comm-results", metavar="PATH",
                                      help="ds-bench comm records to take busbw from (default: comm.jsonl beside "
                                           "--results)")
    """Where to find ``ds-bench comm`` records; None: ``comm.jsonl`` beside ``results``."""
    checkpoint: str | None = option(None, "--checkpoint", metavar="DIR",
                                    help="save a checkpoint into DIR/global_step<k> once after the last step (or "
                                         "see --checkpoint-every), timed barrier to barrier and left out of step "
                                         "times; then load the last one back, timed. The record and summary give "
                                         "seconds, bytes per rank and GB/s (1e9 bytes/s). Checkpoints made are "
                                         "kept, none is overwritten (a tag already in DIR is an error); a save "
                                         "that fails is removed")
    """Folder to save timed checkpoints in (``ds_bench.measure.checkpoint``); None: no checkpoint I/O."""
    checkpoint_every: int | None = option(None, "--checkpoint-every", metavar="K",
                                          help="with --checkpoint: save after every global step that is a "
                                               "multiple of K instead")
    """Save after every global step that is a multiple of this; None: once, after the last step."""
    resume: str | None = option(None, "--resume", metavar="DIR",
                                help="before the first step, load the newest complete checkpoint in DIR (saved "
                                     "by --checkpoint DIR) and continue from its step k: this run's --steps are "
                                     "steps k+1.., each rank skips the k x accumulation micro-batches already "
                                     "used. Same --seed, world size, micro-batch and accumulation required")
    """Folder whose newest complete ds_bench checkpoint is loaded before the first step."""
    parallel: tuple[tuple[str, int], ...] = ()
    """The parallel degrees given (``ds_bench.config.degrees``: ``--pipeline-stages``, ``--tensor-parallel``,
    ``--sequence-parallel``, ``--expert-parallel``), ``(field, value)`` in registry order; read each as an
    attribute by its field (``getattr(cfg, field)``, None where not given). Their flags come from the registry
    (``ds_bench.config.run_flags``)."""

    def __post_init__(self) -> None:
        argcheck.steps("--steps", self.steps, self.warmup)
        if self.micro_batch is not None:
            _require(self.micro_batch > 0, f"--micro-batch must be positive, got {self.micro_batch}")
        _require(self.seq_len > 0, f"--seq-len must be positive, got {self.seq_len}")
        for name in ("image_size", "num_classes", "peak_tflops", "lr", "slow_rank_threshold", "busbw"):
            value = getattr(self, name)
            _require(value is None or (math.isfinite(value) and value > 0),
                     f"--{name.replace('_', '-')} must be a finite number > 0, got {value}")
        check_engine(self.engine)
        check_attention(self.attn)
        _require(not self.channels_last or self.engine == "ddp",
                 f"--channels-last with --engine {self.engine}: only DDP trains NHWC weights (deepspeed 0.19.8 fails "
                 "at its first step viewing them as bytes, FSDP2 refuses non-contiguous parameters); use --engine ddp")
        for d in DEGREES:
            d.check_flags(self)
        for sw in SWITCHES:
            value = getattr(self, sw.field)
            _require(not sw.choices or value is None or value in sw.choices,
                     f"{sw.option} {value!r} is unknown; known: {', '.join(sw.choices)}")
        for compiled, flag in ((self.deepcompile, "--deepcompile"), (self.sp_path == "autosp", "--sp-path autosp")):
            if compiled:
                _require(self.warmup >= 1, f"{flag} needs --warmup 1 or more: the first step compiles")
                check_compile_environment(flag)  # eager, AutoSP would give every rank the whole sequence, unsharded
        _require(not self.checkpoint_offload or self.activation_checkpointing,
                 "--checkpoint-offload needs --activation-checkpointing (it moves the checkpointed blocks' inputs)")
        _require(not self.selective_checkpointing or self.activation_checkpointing,
                 "--selective-checkpointing needs --activation-checkpointing (it chooses what checkpointing keeps)")
        check_compile(self)
        check_timeout("--dist-timeout", self.dist_timeout_s)
        check_timeout("--connect-timeout", self.connect_timeout_s)
        check_timeout("--step-timeout", self.step_timeout_s)
        if self.checkpoint_every is not None:
            _require(self.checkpoint is not None, "--checkpoint-every needs --checkpoint DIR (where to save)")
            _require(self.checkpoint_every > 0, f"--checkpoint-every must be a positive integer, got {self.checkpoint_every}")
        if self.data != "synthetic" and not os.path.exists(self.data):
            raise UserError(f"--data {self.data}: no such file or folder (or use --data synthetic)")
        if self.comm_results is not None and not os.path.isfile(self.comm_results):
            raise UserError(f"--comm-results {self.comm_results}: no such file (records of ds-bench comm)")
        if self.model_path is not None and not os.path.isdir(self.model_path):
            raise UserError(f"--model {self.model_path}: not a folder with pretrained weights")
        if os.path.isdir(self.ds_config):
            raise UserError(f"--ds-config {self.ds_config}: is a folder; expected a DeepSpeed JSON file, "
                            "e.g. ds_configs/zero2.json")
        if not os.path.isfile(self.ds_config):
            raise UserError(f"--ds-config {self.ds_config}: file not found")

    def to_dict(self) -> dict:
        """Every field, each registered degree by its own name (None where not given): a record's ``config``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "parallel"}
        return out | {d.field: getattr(self, d.field) for d in DEGREES}

    def roofline_results_path(self) -> str:
        """Where a run looks for ``ds-bench roofline`` records: beside its results."""
        return os.path.join(os.path.dirname(self.results), "roofline.jsonl")

    def comm_results_path(self) -> str:
        return self.comm_results or os.path.join(os.path.dirname(self.results), "comm.jsonl")

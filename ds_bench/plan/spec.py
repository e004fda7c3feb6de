"""``ds-bench plan``'s flags and its checked spec (``PlanSpec``): the model, the batch, the cluster (a device
family's datasheet, or this cluster's records), the axes searched, the output, and ``--confirm``'s jobs. Every
flag is checked here (the cluster's in ``plan.cluster_flags``), before anything is computed or run: one line
naming it, exit 2."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ds_bench.config import argcheck
from ds_bench.config.layout import ENGINES, OFFLOADS, PRECISIONS
from ds_bench.config.parsers import flag_type, parse_count, parse_list, parse_memory
from ds_bench.config.study_flags import StudySpec, add_degree_arguments, add_job_arguments, add_switch_arguments
from ds_bench.config.study_flags import degrees_of, job_options, switches_of
from ds_bench.errors import UserError
from ds_bench.jobs.compute_nodes import with_job_gpus
from ds_bench.machine.compute_node import ComputeNode
from ds_bench.perf.loss_memory import LOSSES
from ds_bench.perf.scale import AXES as SCALE_AXES
from ds_bench.plan.cluster_flags import CPU_RANKS, add_cluster_arguments, device_and_ranks

WORKLOADS = ("llama", "gpt2", "moe")
DEFAULT_SEQ = {"gpt2": 1024, "llama": 2048, "moe": 2048}


@dataclass(frozen=True)
class PlanSpec(StudySpec):
    workload: str = "llama"
    size: str | None = None
    shape_flags: dict = field(default_factory=dict)
    """``layers``, ``hidden``, ``heads``, ``experts``, ``top_k`` as given (None: the size's)."""
    seq_len: int = 2048
    global_batch_tokens: int = 0
    precision: str = "bf16"
    device: str = "cpu"
    nodes: int = 1
    per_node: int = CPU_RANKS
    peak_tflops: float | None = None
    device_memory: int | None = None
    nvlink_domain: int | None = None
    """GPUs one NVLink fabric joins; None: the device's (GB200: 72), else a node's."""
    host_memory: int | None = None
    """A node's host memory, bytes, which offloaded states share; None: the device's host (2 TiB; GB200 960 GiB)."""
    achieved: float | None = None
    calibrate: tuple[str, ...] = ()
    engines: tuple[str, ...] = ("deepspeed",)
    stages: tuple[int, ...] = (0, 1, 2, 3)
    offloads: tuple[str, ...] = OFFLOADS
    micro_batches: tuple[int, ...] | None = None
    checkpointing: tuple[bool, ...] = (False, True)
    checkpoint_offload: tuple[bool, ...] = (False,)
    selective: tuple[bool, ...] = (False,)
    switches: dict = field(default_factory=dict)
    """Each memory option's values (``config.study_flags.switches_of``): ``{"tiled_loss": (False, True)}``."""
    loss: str = "upcast"
    scale: str | None = None
    """``--scale``: ``layers``, ``hidden`` or ``seq`` (``ds_bench.plan.scale``); None: rank layouts at the size given."""
    norm: str = "eager"
    """How an RMSNorm runs (``Transformer.norm_kernel``)."""
    dropout: bool | None = None
    """Whether the model keeps dropout masks; None: the workload's (ds-bench's models have none)."""
    degrees: dict = field(default_factory=dict)
    headroom_pct: float = 10.0
    attn: str = ""
    top: int = 10
    show_dropped: bool = False
    ds_config: str = "zero1.json"
    confirm: int = 0
    steps: int = 12
    warmup: int = 4
    nproc: int | None = None
    run_args: tuple[str, ...] = ()
    cpu_mem_limit: int | None = None
    dry_run: bool = False

    @property
    def sequences(self) -> int:
        return self.global_batch_tokens // self.seq_len

    @property
    def world(self) -> int:
        return self.nodes * self.per_node

    def model_flags(self, seq_len: int, names: tuple[str, ...] | None = None) -> list[str]:
        """``ds-bench run``'s flags for the model as given (``--size`` and the shape flags; ``names``: only those
        shape flags, no size) at ``seq_len``."""
        given = [a for name, value in self.shape_flags.items()
                 if value is not None and (names is None or name in names)
                 for a in (f"--{name.replace('_', '-')}", str(value))]
        size = ["--size", self.size] if self.size and names is None else []
        return [*size, *given, "--seq-len", str(seq_len)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("the model and the batch")
    m.add_argument("--workload", default="llama", choices=WORKLOADS, help="the model's architecture (default llama)")
    m.add_argument("--size", default=None, help="a named size: llama3.1-70b, gpt3-13b, mixtral-8x7b ... (default: "
                                                "the workload's)")
    for flag in ("--layers", "--hidden", "--heads", "--experts", "--top-k"):
        m.add_argument(flag, type=int, default=None, help=f"a custom shape's {flag[2:]} (with --layers, --hidden and "
                                                          "--heads together)")
    m.add_argument("--seq-len", type=flag_type(parse_count, "--seq-len"), default=None, metavar="TOKENS",
                   help="tokens per sequence, e.g. 8k (k = 2^10; default 1024 gpt2, else 2048)")
    m.add_argument("--global-batch", type=flag_type(parse_count, "--global-batch"), default=None, metavar="TOKENS",
                   help="tokens per optimizer step, e.g. 4M (M = 2^20) or 4000000 (default: 8 sequences per rank)")
    m.add_argument("--precision", default=None, choices=PRECISIONS, help="default bf16 (fp32 on CPU ranks)")
    add_cluster_arguments(p)
    a = p.add_argument_group("what is searched (default: everything the legality table and the memory allow)")
    a.add_argument("--engines", default="deepspeed", help="deepspeed,ddp,fsdp (default deepspeed)")
    a.add_argument("--stages", default="0,1,2,3", help="ZeRO stages (default 0,1,2,3)")
    a.add_argument("--offload", default="none,optimizer,all",
                   help="none,optimizer,all,zenflow (default none,optimizer,all; ZenFlow's step is modelled as "
                        "classic offload's, an upper bound)")
    a.add_argument("--micro-batch", default="auto", help="e.g. 1,2,4 (default auto: powers of two)")
    a.add_argument("--activation-checkpointing", default="off,on", metavar="off|on|off,on",
                   help="recompute each block's activations in backward (default off,on)")
    a.add_argument("--selective-checkpointing", default="off,on", metavar="off|on|off,on",
                   help="with checkpointing, selective too: every other matmul's output and the attention's kept "
                        "(gpt2 and llama; default off,on)")
    a.add_argument("--checkpoint-offload", default=None, metavar="off|on|off,on",
                   help="with checkpointing, the checkpointed blocks' inputs in host memory (ALST; GPUs only; "
                        "default off,on on GPUs, off on CPU ranks)")
    add_switch_arguments(a, what="candidate", every_planned=True)
    a.add_argument("--loss", default="upcast", choices=LOSSES,
                   help="how the loss is computed without --tiled-loss: upcast (HF's and ds_bench's: fp32 logits, "
                        "12 bytes per logit) or fused (a fused cross-entropy kernel, e.g. flash-attn's or Liger's: "
                        "2 x the precision's bytes; ds_bench's runs cannot confirm it) (default upcast)")
    a.add_argument("--norm", default="eager", choices=("eager", "fused"),
                   help="how an RMSNorm runs (llama, moe): eager (HF's, op by op in fp32: it keeps 4 bytes an element "
                        "more) or fused (one kernel: Liger, Apex, a compiled block; ds_bench's runs cannot confirm "
                        "it) (default eager)")
    a.add_argument("--dropout", default=None, choices=("on", "off"),
                   help="whether the model trains with dropout (its masks are kept for backward; default off: "
                        "ds-bench builds its models without, as Llama and MPT train; Megatron's GPT has it)")
    add_degree_arguments(a, "candidate", default="auto")
    a.add_argument("--attn", default="", help="attention kernel (default: the workload's; eager keeps T x T scores)")
    a.add_argument("--headroom", type=float, default=10.0, help="%% of device memory a candidate must leave free")
    a.add_argument("--scale", default=None, choices=SCALE_AXES,
                   help="answer another question per layout: the most blocks, the widest model or the longest "
                        "sequence that fits (seq: one sequence per replica per step), ranked with its tokens/s there")
    o = p.add_argument_group("output and --confirm")
    o.add_argument("--top", type=int, default=10, help="ranked candidates printed and recorded (default 10)")
    o.add_argument("--show-dropped", action="store_true", help="print every dropped candidate with why")
    o.add_argument("--ds-config", default="zero1.json",
                   help="base DeepSpeed config of the recommended layout's config and of --confirm's runs (a file, "
                        "or a name in ds_configs/; default zero1.json)")
    o.add_argument("--confirm", type=int, default=0, metavar="K",
                   help="run the K best predicted distinct layouts (a layout's micro-batch variants count once) for "
                        "real on these ranks and print measured beside predicted")
    o.add_argument("--steps", type=int, default=12, help="--confirm: steps per run, warm-up included (default 12)")
    o.add_argument("--warmup", type=int, default=4)
    o.add_argument("--cpu-mem-limit", type=flag_type(parse_memory, "--cpu-mem-limit"), default=None, metavar="SIZE",
                   help="--confirm: cap each CPU rank's memory, e.g. 3GiB")
    add_job_arguments(p, results="results/plan.jsonl", master_port=29800, gpus_help=(
        "devices per node of the planned cluster (default: --nproc, else this machine's GPUs, else 8; --device cpu: "
        f"{CPU_RANKS} ranks); under "
        "--executor slurm also what each --confirm job asks for"))
    p.set_defaults(gpus_per_node=None)  # left out, not 0: the planned cluster has at least one device per node


def spec_from_args(args: argparse.Namespace, node: ComputeNode) -> PlanSpec:
    """The checked spec (module docstring); ``--device`` and the ranks per node default to ``node``'s."""
    from ds_bench.config.parsers import config_path

    for flag, value in (("--top", args.top), ("--seq-len", args.seq_len), ("--nodes", args.nodes),
                        ("--confirm", args.confirm or None)):
        argcheck.at_least(flag, value, 1 if flag != "--confirm" else 0)
    if not 0 <= args.headroom < 100:
        raise UserError(f"--headroom must be in [0, 100) %, got {args.headroom}")
    if args.confirm and args.norm != "eager":
        raise UserError("--confirm with --norm fused: ds_bench's runs train HF's eager RMSNorm, so they cannot confirm "
                        "a plan for a fused one; leave out --confirm or --norm")
    if args.selective_checkpointing == "on" and args.activation_checkpointing == "off":
        raise UserError("--selective-checkpointing on with --activation-checkpointing off: selective checkpointing "
                        "is a kind of checkpointing; give --activation-checkpointing on (or off,on)")
    if args.selective_checkpointing == "on" and args.workload == "moe":
        raise UserError("--selective-checkpointing on: plan models it for gpt2 and llama; an MoE's saved set depends "
                        "on its --moe-path (HF's stacked experts run no matmul the policy saves)")
    if args.confirm and args.dropout == "on":
        raise UserError("--confirm with --dropout on: ds-bench's models are built without dropout, so their runs "
                        "cannot confirm a plan with it; leave out --confirm or --dropout")
    if args.confirm and args.loss != "upcast":
        raise UserError(f"--confirm with --loss {args.loss}: ds_bench's runs compute the upcast loss (or --tiled-loss), "
                        "so they cannot confirm a plan for another loss; leave out --confirm or --loss")
    if args.confirm and args.scale in ("layers", "hidden") and not all((args.layers, args.hidden, args.heads)):
        raise UserError(f"--confirm with --scale {args.scale} runs each answer as a custom shape: give the model as "
                        "--layers, --hidden and --heads (a named --size's members are not ds-bench run sizes)")
    if args.confirm and args.confirm > args.top:
        raise UserError(f"--confirm {args.confirm} is more than --top {args.top}: the confirmed layouts are the ranked "
                        f"rows (--top {args.confirm} or more)")
    device, cpu, per_node = device_and_ranks(args, node)
    seq_len = args.seq_len or DEFAULT_SEQ[args.workload]
    nodes = args.nodes or 1
    tokens = _tokens(args.global_batch, seq_len, nodes * per_node)
    if args.confirm:
        argcheck.steps("--steps", args.steps, args.warmup)
    ds_config = config_path(args.ds_config)
    argcheck.input_file("--ds-config", ds_config, "DeepSpeed JSON config")
    if args.confirm and args.executor == "local" and nodes > 1 and not args.hostfile:
        raise UserError(f"--confirm runs the plan's layouts on these ranks: --nodes {nodes} needs --hostfile or "
                        "--executor slurm (or plan for this node: --nodes 1)")
    # --nodes and --gpus-per-node are the plan's cluster; under --executor slurm also what each job asks for
    local = args.executor == "local"
    jobs = {**vars(args), "gpus_per_node": args.gpus_per_node or 0,
            **({"nodes": None, "gpus_per_node": 0} if local else {})}
    options = with_job_gpus(job_options(argparse.Namespace(**jobs)), node)  # Slurm: the nodes' GPUs, unless given
    return PlanSpec(
        **options, workload=args.workload, size=args.size,
        shape_flags={k: getattr(args, k) for k in ("layers", "hidden", "heads", "experts", "top_k")},
        seq_len=seq_len, global_batch_tokens=tokens, precision=args.precision or ("fp32" if cpu else "bf16"),
        device=device, nodes=nodes, per_node=per_node, peak_tflops=args.peak_tflops,
        device_memory=args.device_memory, nvlink_domain=args.nvlink_domain, host_memory=args.host_memory, achieved=args.achieved,
        calibrate=tuple(args.calibrate), engines=parse_list("--engines", args.engines, allowed=ENGINES),
        stages=parse_list("--stages", args.stages, allowed=(0, 1, 2, 3), kind=int),
        offloads=parse_list("--offload", args.offload, allowed=OFFLOADS),
        micro_batches=None if args.micro_batch == "auto" else parse_list("--micro-batch", args.micro_batch, kind=int),
        checkpointing=tuple(v == "on" for v in parse_list("--activation-checkpointing", args.activation_checkpointing,
                                                          allowed=("off", "on"))),
        selective=tuple(v == "on" for v in parse_list("--selective-checkpointing", args.selective_checkpointing,
                                                      allowed=("off", "on"))),
        checkpoint_offload=tuple(v == "on" for v in parse_list(
            "--checkpoint-offload", args.checkpoint_offload or ("off" if cpu else "off,on"), allowed=("off", "on"))),
        switches=switches_of(args), loss=args.loss, norm=args.norm, scale=args.scale,
        dropout=None if args.dropout is None else args.dropout == "on",
        degrees=degrees_of(args), headroom_pct=args.headroom, attn=args.attn, top=args.top,
        show_dropped=args.show_dropped, ds_config=ds_config, confirm=args.confirm, steps=args.steps,
        warmup=args.warmup, nproc=per_node, run_args=tuple(args.run_args),
        cpu_mem_limit=args.cpu_mem_limit, dry_run=args.dry_run)


def _tokens(tokens: int | None, seq_len: int, world: int) -> int:
    """``--global-batch`` (parsed), a whole number of sequences; default 8 sequences per rank."""
    if tokens is None:
        return 8 * world * seq_len
    if tokens % seq_len:
        raise UserError(f"--global-batch {tokens} tokens is not a whole number of --seq-len {seq_len} "
                        f"sequences (e.g. {max(1, tokens // seq_len) * seq_len})")
    return tokens

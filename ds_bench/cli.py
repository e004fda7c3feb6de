"""Command line: ``ds-bench run | sweep | bench | comm | scaling | doctor | launch | report``
(also ``python -m ds_bench``).

Thin by design: parse, build a config, call one function, turn ``UserError`` into a one-line
message and exit code 2. The deepspeed launcher appends ``--local_rank=N`` to the module's
arguments; it is accepted and ignored (LOCAL_RANK is read from the environment).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback

from ds_bench.cluster.faults import Terminated
from ds_bench.config import argcheck
from ds_bench.config.run_config import RunConfig
from ds_bench.errors import UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        raise UserError(f"{self.prog}: {message}")


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", required=True, help="mnist | resnet | gpt2")
    p.add_argument("--ds-config", required=True, help="DeepSpeed JSON config (ds_configs/)")
    p.add_argument("--steps", type=int, default=50, help="total steps, warm-up included (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="leading steps not timed (default 5)")
    p.add_argument("--micro-batch", type=int, default=None, help="per-device micro-batch (default: config, else 32)")
    p.add_argument("--data", default="synthetic", help="synthetic (default) or a data path")
    p.add_argument("--results", default="results/results.jsonl", help="JSON-lines results file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a DeepSpeed config key by dotted path, e.g. zero_optimization.stage=3")
    p.add_argument("--size", default=None, help="named model size of the workload")
    p.add_argument("--seq-len", type=int, default=1024, help="GPT-2 sequence length (default 1024)")
    p.add_argument("--image-size", type=int, default=None, help="ResNet input side (default 224)")
    p.add_argument("--num-classes", type=int, default=None, help="ResNet classes (default 1000)")
    p.add_argument("--model", dest="model_path", default=None, help="local pretrained weights folder")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--peak-tflops", type=float, default=None, help="per-device dense peak for MFU")
    p.add_argument("--lr", type=float, default=None, help="learning rate where the config says auto")
    p.add_argument("--tag", default=None, help="label stored in the record")
    p.add_argument("--iface", default=None, help="network interface for the rendezvous")
    p.add_argument("--dist-timeout", dest="dist_timeout_s", type=float, default=300.0,
                   help="seconds before process-group init or a collective gives up (default 300)")
    p.add_argument("--connect-timeout", dest="connect_timeout_s", type=float, default=30.0,
                   help="seconds a rank tries to reach MASTER_ADDR:MASTER_PORT (default 30)")
    p.add_argument("--step-timeout", dest="step_timeout_s", type=float, default=1800.0,
                   help="seconds without a finished step before the run dumps every thread's stack "
                        "and fails (default 1800)")
    p.add_argument("--cpu-mem-limit", type=_size, default=None, metavar="SIZE",
                   help="cap each rank's memory (RLIMIT_DATA), e.g. 4GiB: on CPU ranks a micro-batch that "
                        "does not fit then fails to allocate and is recorded as an out-of-memory")
    p.add_argument("--slow-rank-threshold", type=float, default=10.0, metavar="PCT",
                   help="name ranks whose compute time (forward + backward) is more than PCT%% above the "
                        "median rank's, in the summary and the record (default 10)")
    p.add_argument("--breakdown", action="store_true",
                   help="synchronize the device after every phase (data, forward, backward, optimizer) of every "
                        "micro-step for an exact per-phase breakdown; costs what that serializes (overlapped "
                        "communication, prefetch, optimizer launches), so steps can be slower than without it. "
                        "Default: one synchronize per step, phases from non-blocking device events")
    p.add_argument("--engine", default="deepspeed", metavar="{deepspeed,ddp,fsdp}",
                   help="what trains the model, from the same DeepSpeed config (default deepspeed): ddp = torch "
                        "DistributedDataParallel, fsdp = torch FSDP2 (fully_shard; ZeRO stage 3 -> reshard after "
                        "forward, 2 -> keep gathered); the README's Engines table gives the whole mapping")
    p.add_argument("--busbw", type=float, default=None, metavar="GBPS",
                   help="busbw for the comm-bound verdict (default: the newest ds-bench comm record of the same "
                        "ranks in --comm-results)")
    p.add_argument("--comm-results", default=None, metavar="PATH",
                   help="ds-bench comm records to take busbw from (default: comm.jsonl beside --results)")
    p.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="save a checkpoint into DIR/global_step<k> once after the last step (or see "
                        "--checkpoint-every), timed barrier to barrier and left out of step times; then load "
                        "the last one back, timed. The record and summary give seconds, bytes per rank and "
                        "GB/s (1e9 bytes/s). Checkpoints made are kept, none is overwritten (a tag already in DIR "
                        "is an error); a save that fails is removed")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="K",
                   help="with --checkpoint: save after every global step that is a multiple of K instead")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="before the first step, load the newest complete checkpoint in DIR (saved by "
                        "--checkpoint DIR) and continue from its step k: this run's --steps are steps k+1.., "
                        "each rank skips the k x accumulation micro-batches already used. Same --seed, "
                        "world size, micro-batch and accumulation required")


def _size(text: str) -> int:
    from ds_bench.machine.memory import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ds-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="one benchmark run (what every rank executes)")
    _add_run_args(run)
    run.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    from ds_bench.sweep import spec as sweep_spec

    sweep_spec.add_arguments(sub.add_parser("sweep", help="find the fastest configuration that fits: stages x "
                                            "offload x precision x micro-batch, ranked, with a recommendation"))
    sweep_spec.add_arguments(sub.add_parser("bench", help="this machine's preset sweep (ds-bench sweep with no "
                                            "--workload; what make bench runs)"))
    from ds_bench.comm import spec as comm_spec

    comm_spec.add_arguments(sub.add_parser("comm", help="collective bandwidth (nccl-tests busbw) and correctness "
                                           "on the launched ranks"))
    from ds_bench.scaling import spec as scaling_spec

    scaling_spec.add_arguments(sub.add_parser("scaling", help="one config at 1, 2, 4, ... ranks (or nodes): per-device "
                                              "throughput and weak-scaling efficiency, table and plot"))
    doctor = sub.add_parser("doctor", help="per-rank network/device/version report and an all_reduce check")
    doctor.add_argument("--iface", default=None, help="network interface for the rendezvous")
    doctor.add_argument("--dist-timeout", dest="dist_timeout_s", type=float, default=60.0)
    doctor.add_argument("--connect-timeout", dest="connect_timeout_s", type=float, default=30.0)
    doctor.add_argument("--json", default=None, help="append the full report as a JSON line here")
    doctor.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    from ds_bench.jobs import launch

    launch.add_arguments(sub.add_parser("launch", help="build (and run) an mpirun/deepspeed/torchrun/srun command"))
    report = sub.add_parser("report", help="table (and plot) of a results file")
    report.add_argument("results", nargs="?", default="results/results.jsonl")
    report.add_argument("--tag", default=None, help="only records with this tag")
    report.add_argument("--plot", default=None, help="write a PNG plot here")
    return parser


def run_config(args: argparse.Namespace) -> RunConfig:
    names = set(RunConfig.__dataclass_fields__) - {"overrides"}
    values = {k: v for k, v in vars(args).items() if k in names}
    return RunConfig(overrides=tuple(args.overrides), **values)


def main(argv: list[str] | None = None) -> int:
    from ds_bench.logs import setup_logging

    setup_logging()
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        head, tail = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
        args = build_parser().parse_args(head)
        args.run_args = tail  # after "--": passed through (bench, scaling: to every run; launch: the ds-bench command)
        if tail and args.command not in ("sweep", "bench", "launch", "scaling"):
            raise UserError(f"ds-bench {args.command}: arguments after '--' are not used here: {' '.join(tail)}")
        if args.command == "run":
            from ds_bench.run.main import run_benchmark

            return run_benchmark(run_config(args))
        if args.command == "doctor":
            from ds_bench.comm.doctor import run_doctor
            from ds_bench.config.run_config import check_timeout

            check_timeout("--dist-timeout", args.dist_timeout_s)
            check_timeout("--connect-timeout", args.connect_timeout_s)
            argcheck.output_folder("--json", args.json)
            return run_doctor(args.iface, args.dist_timeout_s, args.connect_timeout_s, args.json)
        if args.command == "comm":
            from ds_bench.comm.main import main as comm_main

            return comm_main(args)
        if args.command == "scaling":
            from ds_bench.scaling.main import main as scaling_main

            return scaling_main(args)
        if args.command == "launch":
            from ds_bench.jobs import launch

            return launch.main(args)
        if args.command in ("sweep", "bench"):
            from ds_bench.sweep.main import main as sweep_main

            return sweep_main(args)
        from ds_bench.report.main import report_main

        return report_main(args)
    except UserError as e:
        print(f"ds-bench: error: {e}", file=sys.stderr, flush=True)
        return UserError.exit_code
    except Terminated as e:  # recorded by the run when it had started; no traceback for a signal
        print(f"ds-bench: terminated by {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception:  # a failed run: rank 0 has recorded it; show the cause, exit 1 through exit_process
        traceback.print_exc()
        return 1


def entry() -> None:
    """Console-script entry: a distributed run ends through ``runtime.exit_process``."""
    from ds_bench.cluster.process import exit_process

    code = main()
    logging.getLogger("ds_bench").debug("exit %s", code)
    exit_process(code)

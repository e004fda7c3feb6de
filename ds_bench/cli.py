"""Command line: ``ds-bench run | sweep | bench | comm | scaling | capacity | roofline | plan | doctor | launch | report | compare | schema``
(also ``python -m ds_bench``).

A router only: each command is a module of ``ds_bench.commands`` giving ``add_arguments(parser)`` and
``main(args) -> int``. This module builds the parser with every command's help line but only the chosen
command's flags (so ``ds-bench --help``, ``ds-bench run --help`` and a mistyped flag import one light
module and no torch), calls that command's ``main``, and turns ``UserError`` into a one-line message and
exit code 2. Nothing imports it. The deepspeed launcher appends ``--local_rank=N`` to the module's
arguments; it is accepted and ignored (LOCAL_RANK is read from the environment).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback

from ds_bench.cluster.faults import Terminated
from ds_bench.config.run_flags import Parser, add_local_rank
from ds_bench.errors import UserError, say
from ds_bench.record import expect_gate

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("ds_bench.commands.run", "one benchmark run (what every rank executes)"),
    "sweep": ("ds_bench.commands.sweep", "find the fastest configuration that fits: stages x offload x precision x "
                                         "micro-batch, ranked, with a recommendation"),
    "bench": ("ds_bench.commands.bench", "this machine's preset sweep (ds-bench sweep with no --workload; what "
                                         "make bench runs)"),
    "comm": ("ds_bench.commands.comm", "collective bandwidth (nccl-tests busbw) and correctness on the launched "
                                       "ranks"),
    "scaling": ("ds_bench.commands.scaling", "one config at 1, 2, 4, ... ranks (or nodes): per-device throughput "
                                             "and weak-scaling efficiency, table and plot"),
    "capacity": ("ds_bench.commands.capacity", "the largest model of a family (or, --scale seq, the longest "
                                               "sequence) that trains on these ranks, per layout (ZeRO stage, "
                                               "offload, parallel degrees, memory options)"),
    "roofline": ("ds_bench.commands.roofline", "measured ceiling of every device of the job: dense matmul TFLOP/s "
                                               "per dtype and copy GB/s (runs then report mfu_vs_measured)"),
    "plan": ("ds_bench.commands.plan", "the best layouts for a model on a cluster (e.g. 512 GPUs), predicted from the "
                                       "datasheet or this cluster's records; --confirm K runs the best"),
    "doctor": ("ds_bench.commands.doctor", "per-rank network/device/version report and an all_reduce check"),
    "launch": ("ds_bench.commands.launch", "build (and run) an mpirun/deepspeed/torchrun/srun command"),
    "report": ("ds_bench.commands.report", "table (and plot) of a results file; --html: one page of any results "
                                           "files"),
    "compare": ("ds_bench.commands.compare", "did anything get slower between two results files (noise-aware "
                                             "verdict)"),
    "schema": ("ds_bench.commands.schema", "print the JSON Schema of every record kind (docs/record.schema.json)"),
}
"""Command name -> (module with ``add_arguments`` and ``main``, help line)."""
TAKES_TAIL = ("sweep", "bench", "launch", "scaling", "capacity", "plan")
"""Commands that take arguments after ``--``: run flags for every point (sweep, bench, scaling, capacity, plan's --confirm), the
ds-bench command to launch (launch)."""


NO_EXPECT = ("launch", "schema")
"""Commands that measure nothing themselves: no ``--expect`` (the command ``launch`` runs may take one)."""


def build_parser(argv: list[str] = ()) -> argparse.ArgumentParser:
    """The parser of ``argv``: every command's subparser, with flags only for the command ``argv`` names
    (its first word that is a command; the top level's only other tokens are options)."""
    chosen = next((word for word in argv if word in COMMANDS), None)
    parser = Parser(prog="ds-bench", description=__doc__.splitlines()[0])
    add_local_rank(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, (module, help_line) in COMMANDS.items():
        command = sub.add_parser(name, help=help_line)
        if name == chosen:
            importlib.import_module(module).add_arguments(command)
            if name not in NO_EXPECT:
                expect_gate.add_argument(command)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """The command's arguments, with what follows ``--`` as ``run_args``."""
    head, tail = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = build_parser(head).parse_args(head)
    args.run_args = tail
    if tail and args.command not in TAKES_TAIL:
        raise UserError(f"ds-bench {args.command}: arguments after '--' are not used here: {' '.join(tail)}")
    if tail and args.command == "launch":  # the command every rank will run must itself parse
        try:
            build_parser(tail).parse_args(tail)
        except UserError as e:
            raise UserError(f"the ds-bench command after '--' ({' '.join(tail)}): {e}") from None
    return args


def main(argv: list[str] | None = None) -> int:
    from ds_bench.logs import setup_logging

    setup_logging()
    try:
        args = parse(sys.argv[1:] if argv is None else list(argv))
        gate = expect_gate.open_gate(args)
        code = importlib.import_module(COMMANDS[args.command][0]).main(args)
        return code if gate is None else gate.close(code)
    except UserError as e:
        say(f"ds-bench: error: {e}")
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
    """Console-script entry: a distributed run ends through ``cluster.process_exit.exit_process``."""
    from ds_bench.cluster.process_exit import exit_process

    code = main()
    logging.getLogger("ds_bench").debug("exit %s", code)
    exit_process(code)

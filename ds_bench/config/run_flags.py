"""``ds-bench run``'s flags, built from ``RunConfig``'s fields (each flag is defined once, there), and the
one parser of a command's trailing run flags (``ds-bench sweep|scaling ... -- RUN OPTIONS``).

Errors are one line naming the flag (``UserError``, exit 2), as every ds_bench parser's.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from ds_bench.config.degrees import DEGREES
from ds_bench.config.parsers import flag_type, parse_duration
from ds_bench.config.run_config import IFACE_HELP, REQUIRED, RunConfig
from ds_bench.errors import UserError

RUN_PROG = "ds-bench run"


class Parser(argparse.ArgumentParser):
    """argparse whose own errors are one line and exit 2 (a ``UserError``), never a usage dump."""

    def error(self, message: str) -> typing.NoReturn:
        raise UserError(f"{self.prog}: {message}")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Every ``RunConfig`` field as its flag, with the field's default."""
    hints = typing.get_type_hints(RunConfig)
    for f in _flag_fields():
        kwargs = dict(f.metadata["argparse"])
        if f.default is REQUIRED:
            kwargs["required"] = True
        elif hints[f.name] is bool:
            kwargs.update(action="store_true", default=f.default)
        elif kwargs.get("action") == "append":
            kwargs["default"] = list(f.default)
        else:
            kwargs.setdefault("type", _scalar(hints[f.name]))
            kwargs["default"] = f.default
        p.add_argument(f.metadata["flag"], dest=f.name, **kwargs)
    for d in DEGREES:
        p.add_argument(d.flag, dest=d.field, type=int, default=None, metavar=d.metavar, help=d.help)
    add_local_rank(p)


def _flag_fields() -> list[dataclasses.Field]:
    """``RunConfig``'s fields that are flags of their own (its ``parallel`` degrees are the registry's flags)."""
    return [f for f in dataclasses.fields(RunConfig) if "flag" in f.metadata]


def _names() -> list[str]:
    """Every ``ds-bench run`` flag's destination: ``RunConfig``'s own fields, then each degree's."""
    return [f.name for f in _flag_fields()] + list(DEGREES.fields())


def add_iface_argument(p: argparse.ArgumentParser) -> None:
    """``--iface`` of every command but ``run`` (whose flags are ``RunConfig``'s fields): the studies pass it to
    each job, ``launch`` to the launcher and the ranks, comm, doctor and roofline rendezvous on it."""
    p.add_argument("--iface", default=None, help=IFACE_HELP)


def add_rendezvous_arguments(p: argparse.ArgumentParser, dist_timeout_s: float) -> None:
    """``--iface --dist-timeout --connect-timeout`` of the commands whose ranks meet themselves (comm, doctor,
    roofline; ``run``'s are ``RunConfig``'s fields)."""
    add_iface_argument(p)
    p.add_argument("--dist-timeout", dest="dist_timeout_s", type=flag_type(parse_duration, "--dist-timeout"),
                   default=dist_timeout_s, metavar="DURATION",
                   help=f"how long process-group init or a collective waits, e.g. 90s (default {dist_timeout_s:g}s)")
    p.add_argument("--connect-timeout", dest="connect_timeout_s", type=flag_type(parse_duration, "--connect-timeout"),
                   default=30.0, metavar="DURATION",
                   help="how long a rank tries to reach MASTER_ADDR:MASTER_PORT (default 30s)")


def add_local_rank(p: argparse.ArgumentParser) -> None:
    """The deepspeed launcher appends ``--local_rank=N``; accepted and ignored (LOCAL_RANK is read from
    the environment)."""
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)


def run_config(args: argparse.Namespace) -> RunConfig:
    """The validated ``RunConfig`` of parsed run flags."""
    values = {name: getattr(args, name) for name in _names()}
    return RunConfig(**{**values, "overrides": tuple(args.overrides)})


def parse_run_tail(head: list[str], tail: list[str]) -> tuple[argparse.Namespace, set[str]]:
    """Parse ``head + tail`` as ``ds-bench run`` flags: the namespace, and the fields whose values the
    tail changed from ``head`` alone (so a command can refuse flags it sets itself)."""
    parser = Parser(prog=RUN_PROG)
    add_run_arguments(parser)
    ns = parser.parse_args([*head, *tail])
    defaults = parser.parse_args(head)
    return ns, {name for name in _names() if getattr(ns, name) != getattr(defaults, name)}


def _scalar(hint) -> type:
    """``int | None`` -> ``int``: the argparse type of a field."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint

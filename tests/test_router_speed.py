"""The router answers fast: ``ds-bench --help``, ``ds-bench run --help`` and a mistyped flag take under
``BOUND_S`` each without importing torch, because ``ds_bench.cli`` builds only the chosen command's flags and
each command module (``ds_bench.commands``) imports its implementation only in ``main``.

Measured on the 2-core CI machine, idle (``python -m ds_bench``, best of 3): ``--help`` 0.13 s, ``run --help``
0.14 s, ``run --stpes 3`` 0.16 s (before the commands were lazy: 2.7, 3.1 and 3.5 s, torch imported each
time). The bound leaves ~3x for the suite's xdist workers sharing the cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, explain

BOUND_S = 0.5
"""Seconds one answer may take (the best of ``TRIES``)."""
TRIES = 3
HEAVY = ("torch", "deepspeed", "numpy", "pydantic", "transformers", "matplotlib", "tabulate")
"""Modules a command's flags never need: importing one before parsing is what made the router slow."""
ANSWERS = {
    "help": (["--help"], 0, "usage: ds-bench"),
    "run help": (["run", "--help"], 0, "usage: ds-bench run"),
    "mistyped flag": (["run", "--stpes", "3"], 2, "ds-bench: error: ds-bench run: "),
}


def _answer(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ds_bench", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    return time.perf_counter() - start, proc


@pytest.mark.parametrize("name", ANSWERS, ids=list(ANSWERS))
def test_the_router_answers_in_under_the_bound(name):
    argv, code, text = ANSWERS[name]
    timed = [_answer(argv) for _ in range(TRIES)]
    proc = timed[0][1]
    assert proc.returncode == code, explain(proc)
    assert text in proc.stdout + proc.stderr, explain(proc)
    if code:
        assert len(proc.stderr.splitlines()) == 1, explain(proc)
    best = min(seconds for seconds, _ in timed)
    assert best < BOUND_S, f"ds-bench {' '.join(argv)}: best of {TRIES} took {best:.2f} s (bound {BOUND_S} s)"


PROBE = """
import contextlib, io, json, sys
from ds_bench import cli
from ds_bench.errors import UserError

out = {}
for argv in json.loads(sys.argv[1]):
    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text):
            cli.parse(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    except UserError:
        code = 2
    out[" ".join(argv)] = [code, text.getvalue()[:200]]
print(json.dumps({"answers": out, "heavy": [m for m in json.loads(sys.argv[2]) if m in sys.modules]}))
"""


def test_every_command_parses_its_help_without_heavy_imports():
    """In one process: ``ds-bench --help``, a mistyped flag and every command's ``--help`` (the chosen
    command's module, its ``add_arguments`` and ``--expect``), and none of ``HEAVY`` imported after them."""
    from ds_bench import cli

    argvs = [["--help"], ["run", "--stpes", "3"], *[[name, "--help"] for name in cli.COMMANDS]]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs), json.dumps(HEAVY)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, explain(proc)
    found = json.loads(proc.stdout)
    assert found["heavy"] == [], found["heavy"]
    answers = found["answers"]
    assert answers["run --stpes 3"][0] == 2
    for name in cli.COMMANDS:
        code, text = answers[f"{name} --help"]
        assert code == 0 and text.startswith(f"usage: ds-bench {name}"), (name, code, text)


def test_every_command_is_a_module_with_add_arguments_and_main():
    import argparse
    import importlib

    from ds_bench import cli

    assert set(cli.COMMANDS) == {"run", "sweep", "bench", "comm", "doctor", "scaling", "capacity", "roofline",
                                 "launch", "report", "compare", "schema", "plan"}
    for name, (module, help_line) in cli.COMMANDS.items():
        assert module == f"ds_bench.commands.{name}" and help_line
        command = importlib.import_module(module)
        assert command.__doc__ and callable(command.add_arguments) and callable(command.main), module
        command.add_arguments(argparse.ArgumentParser())


def test_the_top_help_lists_every_command():
    _, proc = _answer(["--help"])
    from ds_bench import cli

    assert all(name in proc.stdout for name in cli.COMMANDS), proc.stdout

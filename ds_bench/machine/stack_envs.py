"""The environments of a study's stack axis (``ds_bench.config.stacks``): one virtual environment per stack,
built once, next to the project's own, and reused by every later study.

``python_of(stack)`` is the Python a stack's jobs run with: this one for the stack of this environment, else that
of ``<root>/<label>/`` (root: ``$DS_BENCH_STACKS``, else ``.venv-stacks`` beside this environment), built on first
use under a file lock (two studies never build one environment at once; a killed build leaves no environment
that looks ready, only its ready file says so):

1. ``uv venv`` with this Python (``--system-site-packages`` where this environment has them: a site's torch module);
2. this environment's requirements with the stack's pins (``deepspeed==0.18.4``), torch held at this environment's
   build through a constraints file unless the stack pins torch (the CPU wheel stays the CPU wheel), with uv and
   the machine's pip configuration (``machine.uv_config``; pip where uv cannot carry it over): uv's cache makes
   a second environment of the same packages hard links, ~30 s here;
3. ds_bench itself by a ``.pth`` file naming this checkout: every stack runs the same harness code;
4. DeepSpeed's CPU ops built with that Python (``python -m ds_bench.machine.op_builds``: the op store keys them
   by DeepSpeed version, so each version builds its own once);
5. the versions it really holds checked against the stack's and written to its ready file.

A version the registry does not have, or that does not install here, is a ``UserError`` naming the flag and
the installer's last line (exit 2), raised before the study runs anything.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from ds_bench.config.stacks import PACKAGES, Stack, installed_versions, public
from ds_bench.errors import UserError
from ds_bench.machine.locks import file_lock

READY = "ds_bench-stack.json"
BUILD_TIMEOUT_S = 1800.0
"""One environment's build, ops included: ~30 s to install with a warm uv cache, up to ~4 min to compile
DeepSpeed's two CPU ops on 2 cores; the rest is room for a cold cache."""
PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def stacks_root(environ=os.environ, prefix: str = sys.prefix) -> str:
    """``$DS_BENCH_STACKS``, else ``.venv-stacks`` beside this environment's folder (pure)."""
    return environ.get("DS_BENCH_STACKS") or os.path.join(os.path.dirname(os.path.abspath(prefix)), ".venv-stacks")


def env_path(stack: Stack, root: str) -> str:
    """A stack's environment folder: its pins, as a name (pure)."""
    return os.path.join(root, "-".join(f"{name}{version}" for name, version in stack.pins))


def python_of(stack: Stack, root: str | None = None) -> str:
    """The Python a stack's jobs run with, its environment built if missing (module docstring)."""
    if stack.own:
        return sys.executable
    path = env_path(stack, root or stacks_root())
    python = os.path.join(path, "bin", "python")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with file_lock(path + ".lock", BUILD_TIMEOUT_S):
        if _ready(path) is None:
            _build(stack, path)
    return python


def ready_versions(stack: Stack, root: str | None = None) -> dict | None:
    """What a built stack environment holds (its ready file), None while it is not built."""
    return None if stack.own else _ready(env_path(stack, root or stacks_root()))


def _ready(path: str) -> dict | None:
    try:
        with open(os.path.join(path, READY)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _build(stack: Stack, path: str) -> None:
    """Steps 1-5 of the module docstring, each failure one line naming the stack's flags."""
    flags = ", ".join(f"{p.flag} {v}" for p in PACKAGES for n, v in stack.pins if n == p.name)
    print(f"stack {stack.label}: building its environment {path} (once)", flush=True)
    shutil.rmtree(path, ignore_errors=True)
    python = _install(stack, path, flags)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    with open(os.path.join(site, "ds_bench_checkout.pth"), "w") as f:
        f.write(PROJECT + "\n")
    _step(flags, [python, "-m", "ds_bench.machine.op_builds"], dict(os.environ))
    held_there = _versions_in(python)
    wrong = [f"{n} {held_there.get(n)} (asked {v})" for n, v in stack.pins if public(held_there.get(n) or "") != v]
    if wrong:
        raise UserError(f"{flags}: its environment {path} holds {', '.join(wrong)}")
    with open(os.path.join(path, READY), "w") as f:
        json.dump({"stack": stack.label, "versions": held_there}, f)


def _install(stack: Stack, path: str, flags: str) -> str:
    """The environment at ``path`` with the project's requirements and the stack's pins; its Python."""
    env, uv = _installer_env()
    if _system_site_packages():
        uv = None  # uv would not count the system's packages (a site's torch) as installed: pip, as set-up does
    venv = [uv, "venv", "--quiet", "--python", sys.executable] if uv else [sys.executable, "-m", "venv"]
    _step(flags, [*venv, *(["--system-site-packages"] if _system_site_packages() else []), path], env)
    python = os.path.join(path, "bin", "python")
    constraints = os.path.join(path, "constraints.txt")
    held = installed_versions()
    with open(constraints, "w") as f:
        if "torch" not in dict(stack.pins) and held["torch"]:
            f.write(f"torch=={held['torch']}\n")
    env = {**env, "UV_CONSTRAINT": " ".join(filter(None, (env.get("UV_CONSTRAINT"), constraints))),
           "PIP_CONSTRAINT": constraints}
    install = [uv, "pip", "install", "--quiet", "--python", python] if uv else [python, "-m", "pip", "install", "-q"]
    # setuptools: torch's extension builder imports it before torch 2.9 (uv's environments start without it)
    _step(flags, [*install, *_requirements(), "setuptools", *stack.requirements()], env)
    return python


def _step(flags: str, argv: list[str], env: dict) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UserError(f"{flags}: building its environment timed out after {BUILD_TIMEOUT_S:.0f} s "
                        f"({' '.join(argv[:3])} ...)") from None
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        why = next((line for line in reversed(lines) if "error" in line.lower() or "No solution" in line),
                   lines[-1] if lines else f"exit {done.returncode}")
        raise UserError(f"{flags}: cannot be installed here: {why[:300]}")


def _installer_env() -> tuple[dict, str | None]:
    """The installer's environment and uv's path (None: pip), as ``tools/setup.sh`` chooses."""
    from ds_bench.machine import uv_config

    uv = shutil.which("uv", path=os.path.dirname(sys.executable)) or shutil.which("uv")
    if uv is None or os.environ.get("DS_BENCH_INSTALLER", "uv") != "uv":
        return dict(os.environ), None
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            timeout=60)
    try:
        return {**os.environ, **uv_config.uv_environment(uv_config.pip_settings(listed.stdout))}, uv
    except (uv_config.Untranslatable, ValueError, SyntaxError):
        return dict(os.environ), None


def _system_site_packages() -> bool:
    try:
        with open(os.path.join(sys.prefix, "pyvenv.cfg")) as f:
            return "include-system-site-packages = true" in f.read()
    except OSError:
        return False


def _requirements() -> list[str]:
    """This checkout's requirements file, else the installed ds_bench's declared requirements."""
    path = os.path.join(PROJECT, "requirements.txt")
    if os.path.isfile(path):
        return ["-r", path]
    from importlib import metadata

    return [r for r in (metadata.requires("ds_bench") or []) if "extra ==" not in r]


def _versions_in(python: str) -> dict:
    """``config.stacks.installed_versions`` as the environment of ``python`` answers it (ds_bench is there by its
    ``.pth``)."""
    code = "import json; from ds_bench.config.stacks import installed_versions; print(json.dumps(installed_versions()))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    return json.loads(out)

"""The software stack as a study axis: which DeepSpeed, PyTorch and transformers a study's points run with (pure).

``--deepspeed 0.18.4,0.19.8`` (and ``--torch``, ``--transformers``) lists release versions, ``installed`` standing
for the one this environment has; every combination of the lists is a ``Stack``, and each point of the study runs
once per stack, with the Python of an environment holding exactly those versions
(``ds_bench.machine.stack_envs``). A stack's ``label`` (``ds0.18.4``, ``ds0.19.8+torch2.14.1``) is the key word
``stack=`` of its points (``config.layout.Layout.stack``), so the ledger resumes each stack's points on their own
and ``ds-bench compare --stacks`` pairs the same layout between two stacks. Without the flags a study has one
stack, this environment, labelled ``""``: its points' keys are what they always were.

``SUPPORTED`` is the oldest release of each package ds_bench runs on, as measured (docs/stacks.md); a value below
it is refused before anything runs, as is a version string that is not one release.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from importlib import metadata

from ds_bench.errors import UserError

INSTALLED = "installed"


@dataclass(frozen=True)
class Package:
    name: str
    """The distribution's name, as pip installs it."""
    short: str
    """Its word in a stack's label: ``ds`` -> ``ds0.18.4``."""
    flag: str
    oldest: str
    """The oldest release ds_bench supports (``SUPPORTED``'s): measured, docs/stacks.md."""


PACKAGES = (
    Package("deepspeed", "ds", "--deepspeed", "0.16.0"),
    Package("torch", "torch", "--torch", "2.6.0"),
    Package("transformers", "tf", "--transformers", "4.52.0"),
)
SUPPORTED = {p.name: p.oldest for p in PACKAGES}


@dataclass(frozen=True)
class Stack:
    """One value of the stack axis: the version of each package a study's flags named, ``installed`` resolved."""

    versions: tuple[tuple[str, str], ...] = ()
    """``(package, version)`` for each package a stack flag named, in ``PACKAGES`` order; () without the flags."""
    pins: tuple[tuple[str, str], ...] = ()
    """Those that differ from this environment's: what its own environment installs; (): this environment."""

    @property
    def label(self) -> str:
        short = {p.name: p.short for p in PACKAGES}
        return "+".join(f"{short[name]}{version}" for name, version in self.versions)

    @property
    def own(self) -> bool:
        """Runs with this environment's Python (every version it names is the installed one)."""
        return not self.pins

    def requirements(self) -> list[str]:
        """``deepspeed==0.18.4``, ... : what its environment pins beyond the project's requirements."""
        return [f"{name}=={version}" for name, version in self.pins]


def installed_versions() -> dict[str, str | None]:
    """This environment's version of each package (its metadata: nothing imported, read once); None where missing."""
    return dict(_installed())


@functools.lru_cache(maxsize=1)
def _installed() -> tuple[tuple[str, str | None], ...]:
    out = {}
    for p in PACKAGES:
        try:
            out[p.name] = metadata.version(p.name)
        except metadata.PackageNotFoundError:
            out[p.name] = None
    return tuple(out.items())


def public(version: str) -> str:
    """A version without its local part: ``2.13.0+cpu`` -> ``2.13.0`` (what a pin or a label names)."""
    return version.split("+", 1)[0]


def parse_versions(flag: str, text: str, oldest: str) -> tuple[str, ...]:
    """``0.18.4,installed`` -> ``("0.18.4", "installed")``: each a single release (no range, no wildcard), not
    older than ``oldest``; else one line naming the flag (exit 2)."""
    from packaging.version import InvalidVersion, Version

    values = tuple(v.strip() for v in text.split(","))
    if len(set(values)) != len(values) or not all(values):
        raise UserError(f"{flag} {text}: each version once, comma-separated")
    for v in values:
        if v == INSTALLED:
            continue
        try:
            parsed = Version(v)
        except InvalidVersion:
            raise UserError(f"{flag} {v}: expected release versions such as 0.18.4, or {INSTALLED}") from None
        if parsed < Version(oldest):
            raise UserError(f"{flag} {v}: older than the oldest release ds-bench runs on, {oldest} "
                            "(docs/stacks.md says what each older one fails on)")
    return values


def stacks_of(given: dict[str, tuple[str, ...]], installed: dict[str, str | None]) -> tuple[Stack, ...]:
    """Every combination of the flags' versions (``given``: package -> its flag's values; a package left out
    is not varied), ``installed`` resolved to ``installed[package]``; in the flags' order."""
    names = [p.name for p in PACKAGES if given.get(p.name)]
    if not names:
        return (Stack(),)
    resolved = {}
    for p in PACKAGES:
        if p.name not in names:
            continue
        have = installed.get(p.name)
        if INSTALLED in given[p.name] and have is None:
            raise UserError(f"{p.flag} {INSTALLED}: {p.name} is not installed in this environment")
        resolved[p.name] = [public(have) if v == INSTALLED else v for v in given[p.name]]
        if len(set(resolved[p.name])) != len(resolved[p.name]):
            raise UserError(f"{p.flag} {','.join(given[p.name])}: {INSTALLED} is {public(have)} here, listed twice")
    out = []
    for combo in itertools.product(*(resolved[n] for n in names)):
        versions = tuple(zip(names, combo))
        pins = tuple((n, v) for n, v in versions if v != public(installed.get(n) or ""))
        out.append(Stack(versions, pins))
    return tuple(out)


def version_in(versions: tuple[tuple[str, str], ...], package: str) -> str | None:
    """The version of ``package`` a stack's ``versions`` name, else this environment's (None: not installed)."""
    named = dict(versions).get(package)
    if named is not None:
        return named
    return installed_versions().get(package)


def older_than(version: str | None, release: str) -> bool:
    """``version`` is a release before ``release`` (None, not installed: False, nothing to refuse by version)."""
    from packaging.version import Version

    return version is not None and Version(public(version)) < Version(release)

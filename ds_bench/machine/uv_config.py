"""The machine's pip configuration as uv's environment, so ``tools/setup.sh`` (and a study's stack environments,
``ds_bench.machine.stack_envs``) may install with uv (~5x faster than pip here) from exactly the indexes, links,
constraints and certificates pip would use; the repo names none. It imports nothing of ds_bench: set-up runs it as
a script before ds_bench is installed.

    python ds_bench/machine/uv_config.py   # prints ``export UV_...=...`` lines; exit 3, saying why, when uv cannot

pip's settings come from ``pip config list`` (its files, then ``PIP_*`` variables, which win). A setting this
module does not know how to translate makes it refuse (exit 3): setup.sh then installs with pip, as before.
"""

from __future__ import annotations

import ast
import shlex
import subprocess
import sys

# pip setting -> (uv's variable, how several values join); uv reads these variables (its docs, "Environment")
TRANSLATED = {
    "index-url": ("UV_INDEX_URL", None),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", None),
    "trusted-host": ("UV_INSECURE_HOST", " "),
    "timeout": ("UV_HTTP_TIMEOUT", None),
    "default-timeout": ("UV_HTTP_TIMEOUT", None),
    "no-index": ("UV_NO_INDEX", None),
    "proxy": ("HTTPS_PROXY", None),  # and HTTP_PROXY: pip's proxy serves both schemes
}
IGNORED = {"disable-pip-version-check", "no-cache-dir", "cache-dir", "progress-bar", "quiet", "verbose", "retries",
           "root-user-action", "no-input", "no-color", "no-warn-script-location", "require-virtualenv",
           "break-system-packages", "log", "no-python-version-warning", "config-file", "isolated"}
"""Settings of pip's own output and cache: nothing uv would install differently for."""
FIXED = {"UV_INDEX_STRATEGY": "unsafe-best-match", "UV_LINK_MODE": "hardlink", "UV_COMPILE_BYTECODE": "1",
         "UV_NO_CONFIG": "1"}
"""uv's own configuration files ignored (pip's is the machine's word); pip's resolution (the best version over
every index, not uv's first index that has the package); hard links from uv's cache into the venv (one copy of
torch's ~1.2 GB on disk, not two: a CI run copying failed with a full disk, 2026-11-26; uv copies, saying so,
where the cache is on another file system); and pip's bytecode compiled at install: without it, where
``PYTHONDONTWRITEBYTECODE`` is set (this project's machines), every process compiles torch's modules again: a
2-rank run's imports took 13-15 s against 5.3 s, and ``make test`` 20 min against 13 (2026-11-26)."""
SECTIONS = ("global", "install", ":env:")
"""Sections that apply to ``pip install``, in pip's order: a later one wins."""


class Untranslatable(Exception):
    pass


def pip_settings(config_list: str) -> dict[str, str]:
    """``pip config list`` output -> setting -> value, later sections winning (pure)."""
    found: dict[str, dict[str, str]] = {}
    for line in config_list.splitlines():
        name, sep, value = line.partition("=")
        section, dot, key = name.strip().rpartition(".")
        if not sep or not dot or section not in SECTIONS:
            continue
        found.setdefault(section, {})[key] = ast.literal_eval(value.strip())
    return {k: v for section in SECTIONS for k, v in found.get(section, {}).items()}


def uv_environment(settings: dict[str, str]) -> dict[str, str]:
    """The variables uv needs to install as pip would with ``settings`` (pure); ``Untranslatable`` names a
    setting it cannot carry over."""
    env = dict(FIXED)
    for key, value in settings.items():
        if key in IGNORED:
            continue
        if key not in TRANSLATED:
            raise Untranslatable(f"pip setting {key!r} has no uv equivalent here")
        variable, joiner = TRANSLATED[key]
        if key == "no-index":
            if value.strip().lower() in ("1", "true", "yes", "on"):
                env[variable] = "1"
            continue
        values = value.split()
        if joiner is None and len(values) > 1:
            raise Untranslatable(f"pip setting {key!r} has several values: {value!r}")
        env[variable] = (joiner or " ").join(values)
        if key == "proxy":
            env["HTTP_PROXY"] = env[variable]
    return env


def main() -> int:
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            timeout=60)
    if listed.returncode != 0:
        print(f"pip config list failed: {listed.stderr.strip()}", file=sys.stderr)
        return 3
    try:
        env = uv_environment(pip_settings(listed.stdout))
    except (Untranslatable, ValueError, SyntaxError) as exc:
        print(exc, file=sys.stderr)
        return 3
    for variable, value in sorted(env.items()):
        print(f"export {variable}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

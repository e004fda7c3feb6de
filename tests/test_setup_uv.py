"""``ds_bench/machine/uv_config.py``: the machine's pip configuration carried over to uv (``tools/setup.sh`` installs with uv only
when it can be), on inline ``pip config list`` output; and, for real, that the script reads this machine's pip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

from ds_bench.machine import uv_config as uv_env

LISTED = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.find-links='/opt/wheels'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/srv/old-wheels'
install.index-url='https://mirror.example/simple'
global.disable-pip-version-check='1'
user.index-url='https://ignored.example/simple'
"""


def test_pip_s_sections_apply_in_its_order_and_the_environment_wins():
    settings = uv_env.pip_settings(LISTED)
    assert settings["find-links"] == "/opt/wheels"  # PIP_FIND_LINKS over the file
    assert settings["index-url"] == "https://mirror.example/simple"  # the install section; user.* is no section here
    assert settings["constraint"] == "/etc/xdg/pip/constraints.txt"


def test_each_setting_becomes_uv_s_variable():
    env = uv_env.uv_environment(uv_env.pip_settings(LISTED))
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_FIND_LINKS": "/opt/wheels",
                   "UV_CONSTRAINT": "/etc/xdg/pip/constraints.txt",
                   "UV_EXTRA_INDEX_URL": "file:///opt/pypi/simple file:///opt/pypi-more/simple",
                   "UV_INDEX_URL": "https://mirror.example/simple", **uv_env.FIXED}
    assert uv_env.FIXED["UV_INDEX_STRATEGY"] == "unsafe-best-match"  # pip's best version over all indexes
    links = uv_env.uv_environment({"find-links": "/a\n/b"})
    assert links["UV_FIND_LINKS"] == "/a,/b"  # uv separates links by commas


@pytest.mark.parametrize("settings, named", [({"only-binary": ":all:"}, "only-binary"),
                                             ({"index-url": "https://a/simple https://b/simple"}, "several values")])
def test_a_setting_uv_cannot_honour_makes_setup_install_with_pip(settings, named):
    with pytest.raises(uv_env.Untranslatable, match=named):
        uv_env.uv_environment(settings)


def test_the_script_prints_exports_of_this_machine_s_pip_configuration():
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
    done = subprocess.run([sys.executable, str(REPO / "ds_bench" / "machine" / "uv_config.py")], capture_output=True, text=True,
                          timeout=60)
    try:
        expected = uv_env.uv_environment(uv_env.pip_settings(listed.stdout))
    except uv_env.Untranslatable as exc:
        assert done.returncode == 3 and str(exc) in done.stderr
        return
    assert done.returncode == 0, done.stderr
    printed = dict(line.removeprefix("export ").split("=", 1) for line in done.stdout.splitlines())
    assert set(printed) == set(expected) and "UV_INDEX_STRATEGY" in printed


def test_the_environment_s_packages_were_installed_with_their_bytecode():
    """uv compiles nothing unless told (``UV_COMPILE_BYTECODE``, as pip does by default): where
    ``PYTHONDONTWRITEBYTECODE`` is set, every process would compile torch's modules again (a run's imports 13-15 s
    against 5 s here)."""
    import importlib.util

    import deepspeed
    import torch

    for module in (torch, deepspeed):
        assert Path(importlib.util.cache_from_source(module.__file__)).is_file(), module.__file__

"""Slurm's compressed host lists and per-node task counts.

``expand_nodelist`` turns ``node[01-04,07]``, ``a[1-2],b[3,5]``, ``gpu-[1-2]-ib`` or
``r[1-2]n[01-02]`` into plain host names with python-hostlist, keeping zero padding, the given order
and duplicates; several bracket groups in one name expand as a cartesian product with the leftmost
group varying slowest, as ``scontrol show hostnames`` prints them. Before the library sees the
text, this module rejects what it would let through: empty items (``a,,b``, ``a,``, an empty list)
and characters host names do not have (``no de``, ``node!``). ``tasks_per_node`` expands
``SLURM_TASKS_PER_NODE`` (``4(x2),3``).

``python -m ds_bench.cluster.slurm VAR`` prints ``$VAR``'s hosts one a line (``localhost`` when unset),
or one ``ds-bench: error:`` line and exit 2: the scripts' fallback where there is no ``scontrol``.
"""

from __future__ import annotations

import re

import hostlist

from ds_bench.errors import UserError, say

_TASKS = re.compile(r"(\d+)(?:\(x(\d+)\))?")
# Comma-separated, non-empty items of host-name characters and brackets; the library checks the brackets.
_HOST_LIST = re.compile(r"[A-Za-z0-9._\[\]-]+(?:,[A-Za-z0-9._\[\]-]+)*")


def expand_nodelist(s: str, var: str = "SLURM_NODELIST") -> list[str]:
    """Expand a Slurm host list; ``var`` names the variable it came from, for error messages."""
    text = s.strip()
    try:
        if not _HOST_LIST.fullmatch(text):
            raise hostlist.BadHostlist("empty item or a character not in a host name")
        return hostlist.expand_hostlist(text, allow_duplicates=True, sort=False)
    except hostlist.BadHostlist:
        raise UserError(
            f"{var}={s!r}: not a Slurm host list; expected e.g. 'node01' or 'node[01-04,07]'"
        ) from None


def tasks_per_node(s: str, var: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expand ``4(x2),3`` into ``[4, 4, 3]``."""
    counts: list[int] = []
    for item in s.strip().split(","):
        match = _TASKS.fullmatch(item)
        if not match or match.group(2) == "0":
            raise UserError(f"{var}={s!r}: not a task count list; expected e.g. '4(x2),3'")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def main(argv: list[str]) -> int:
    """``VAR``: print the hosts of the host list in environment variable ``VAR``, one a line."""
    import os
    import sys

    var = argv[0] if argv else "SLURM_JOB_NODELIST"
    try:
        hosts = expand_nodelist(os.environ.get(var, "localhost"), var)
    except UserError as e:
        say(f"ds-bench: error: {e}")
        return UserError.exit_code
    print("\n".join(hosts))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))

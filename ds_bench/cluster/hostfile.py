"""DeepSpeed hostfiles and the ``--include`` / ``--exclude`` slot filters.

A hostfile holds one ``hostname slots=N`` per line; ``#`` starts a comment (whole line or
trailing) and blank lines are ignored. Filters use DeepSpeed's launcher syntax
``host1@host2:0,2@host3``: a host alone means all of its slots, ``host:i,j`` those slot indices.
"""

from __future__ import annotations

import re
from pathlib import Path

from ds_bench.errors import UserError

_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_EXPECTED = "expected 'hostname slots=N'"


def is_valid_hostname(name: str) -> bool:
    """RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens."""
    if not name or len(name) > 253:
        return False
    return all(_LABEL.fullmatch(label) for label in name.split("."))


def _parse_slots(token: str, loc: str, line: str) -> int:
    if not token.startswith("slots="):
        raise UserError(f"{loc}: malformed line {line!r}; {_EXPECTED}")
    value = token[len("slots="):]
    try:
        slots = int(value)
    except ValueError:
        raise UserError(f"{loc}: slots must be an integer in {line!r}, got {value!r}") from None
    if slots == 0:
        raise UserError(f"{loc}: zero slots in {line!r}; expected slots=N with N >= 1")
    if slots < 0:
        raise UserError(f"{loc}: negative slots in {line!r}; expected slots=N with N >= 1")
    return slots


def _parse_line(line: str, loc: str) -> tuple[str, int]:
    tokens = line.split()
    if tokens[0].startswith("slots="):
        raise UserError(f"{loc}: missing hostname in {line!r}; {_EXPECTED}")
    if len(tokens) == 1:
        raise UserError(f"{loc}: missing slots in {line!r}; {_EXPECTED}")
    if len(tokens) > 2:
        raise UserError(f"{loc}: malformed line {line!r}; {_EXPECTED}")
    host = tokens[0]
    if not is_valid_hostname(host):
        raise UserError(
            f"{loc}: bad hostname {host!r} in {line!r}; "
            "expected letters, digits, '-' and '.' (RFC 1123)"
        )
    return host, _parse_slots(tokens[1], loc, line)


def parse_hostfile(text: str, source: str = "<hostfile>") -> dict[str, int]:
    """Parse hostfile text into an insertion-ordered ``host -> slots`` mapping."""
    hosts: dict[str, int] = {}
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        loc = f"{source}:{lineno}"
        host, slots = _parse_line(line, loc)
        if host in hosts:
            raise UserError(
                f"{loc}: duplicate host {host!r} in {line!r} (first on line {first_line[host]})"
            )
        hosts[host] = slots
        first_line[host] = lineno
    if not hosts:
        raise UserError(f"{source}: no hosts found; {_EXPECTED} on at least one line")
    return hosts


def load_hostfile(path: str | Path) -> dict[str, int]:
    """Read and parse the hostfile at ``path``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(
            f"hostfile {path}: not found; expected a file of 'hostname slots=N' lines"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UserError(f"hostfile {path}: cannot read ({why})") from None
    return parse_hostfile(text, source=str(path))


def _parse_filter(text: str, flag: str, hosts: dict[str, int]) -> dict[str, list[int]]:
    """``host1@host2:0,2`` -> ``{host1: all slots, host2: [0, 2]}``, checked against ``hosts``."""
    chosen: dict[str, set[int]] = {}
    for entry in text.split("@"):
        name, sep, slot_text = entry.partition(":")
        if not name or (sep and not slot_text):
            raise UserError(
                f"{flag}: empty host or slot list in {text!r}; expected 'host1@host2:0,2'"
            )
        if name not in hosts:
            known = ", ".join(hosts)
            raise UserError(f"{flag}: host {name!r} is not in the hostfile (hosts: {known})")
        count = hosts[name]
        slots = chosen.setdefault(name, set())
        if not sep:
            slots.update(range(count))
            continue
        for token in slot_text.split(","):
            try:
                index = int(token)
            except ValueError:
                raise UserError(
                    f"{flag}: slot {token!r} for host {name!r} is not an integer"
                ) from None
            if not 0 <= index < count:
                raise UserError(
                    f"{flag}: slot {index} out of range for host {name!r} (slots 0..{count - 1})"
                )
            slots.add(index)
    return {host: sorted(slots) for host, slots in chosen.items()}


def filter_slots(
    hosts: dict[str, int], include: str = "", exclude: str = ""
) -> dict[str, list[int]]:
    """Apply DeepSpeed-style ``--include`` or ``--exclude``; hosts keep hostfile order.

    Hosts left with no slots are dropped. Giving both filters, or removing every slot, is an error.
    """
    if include and exclude:
        raise UserError("--include and --exclude are mutually exclusive; give only one")
    if include:
        picked = _parse_filter(include, "--include", hosts)
        return {host: picked[host] for host in hosts if host in picked}
    removed = _parse_filter(exclude, "--exclude", hosts) if exclude else {}
    result: dict[str, list[int]] = {}
    for host, count in hosts.items():
        left = [i for i in range(count) if i not in removed.get(host, ())]
        if left:
            result[host] = left
    if not result:
        raise UserError(f"--exclude: {exclude!r} removes every slot; nothing is left to run on")
    return result


def world_info(slots: dict[str, list[int]]) -> tuple[int, int]:
    """``(num_nodes, world_size)`` of a filtered slot map; hosts with no slots do not count."""
    used = [indices for indices in slots.values() if indices]
    return len(used), sum(len(indices) for indices in used)

"""Network interfaces: what this machine has, and which one the rendezvous should use.

``read_interfaces`` reads a /sys/class/net-style tree. ``kind`` comes from the name first, then
``<if>/type`` (1 ethernet, 32 InfiniBand/IPoIB, 772 loopback) and the ``device`` link that real
NICs have: ``lo`` is loopback; docker*, veth*, br-*, virbr*, cni*, flannel*, cali*, tun*, tap*
are virtual; ib* is InfiniBand even without type 32; eth*, en* and bond* are ethernet even without
a ``device`` link (as inside a network namespace); any other interface without one is virtual.
An interface is up when ``operstate`` is "up" or "unknown" (loopback and some tunnels report
"unknown"); a missing ``operstate`` counts as "unknown".

``choose_interface`` is pure and documents its order; ``env_for_choice`` says which socket
variables to export. Only ``read_interfaces`` (via psutil) and ``resolve_hostname_addr`` touch
the machine.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ds_bench.errors import UserError

_VIRTUAL_PREFIXES = ("docker", "veth", "br-", "virbr", "cni", "flannel", "cali", "tun", "tap")
_ETHERNET_PREFIXES = ("eth", "en", "bond")
_ARPHRD = {1: "ethernet", 32: "infiniband", 772: "loopback"}
_UNUSABLE_FOR_MULTI_HOST = ("loopback", "virtual")


@dataclass(frozen=True)
class Iface:
    """One network interface: its kind, IPv4 addresses and whether it is up."""

    name: str
    kind: str  # "infiniband" | "ethernet" | "loopback" | "virtual" | "other"
    addrs: tuple[str, ...]
    up: bool


@dataclass(frozen=True)
class IfaceChoice:
    """The interface picked for the rendezvous; ``reason`` says why, for the run log."""

    name: str | None
    addr: str
    reason: str


def classify(name: str, type_id: int | None, has_device: bool) -> str:
    """Kind of an interface from its name, ARPHRD type and whether it has a ``device`` link."""
    if name == "lo" or type_id == 772:
        return "loopback"
    if name.startswith(_VIRTUAL_PREFIXES):
        return "virtual"
    if type_id == 32 or name.startswith("ib"):
        return "infiniband"
    if name.startswith(_ETHERNET_PREFIXES):
        return "ethernet"
    if not has_device:
        return "virtual"
    return _ARPHRD.get(type_id, "other")


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _psutil_ipv4() -> dict[str, list[str]]:
    import psutil

    return {name: [a.address for a in entries if a.family == socket.AF_INET]
            for name, entries in psutil.net_if_addrs().items()}


def read_interfaces(sys_net: str = "/sys/class/net",
                    addrs: Mapping[str, Sequence[str]] | None = None) -> list[Iface]:
    """Interfaces under ``sys_net``, sorted by name; ``addrs`` defaults to psutil's IPv4 ones."""
    if addrs is None:
        addrs = _psutil_ipv4()
    try:
        names = sorted(os.listdir(sys_net))
    except OSError:
        return []
    result = []
    for name in names:
        path = os.path.join(sys_net, name)
        type_text = _read_text(os.path.join(path, "type"))
        type_id = int(type_text) if type_text and type_text.isdigit() else None
        kind = classify(name, type_id, os.path.exists(os.path.join(path, "device")))
        state = _read_text(os.path.join(path, "operstate")) or "unknown"
        result.append(Iface(name, kind, tuple(addrs.get(name, ())), state in ("up", "unknown")))
    return result


def _nccl_matches(name: str, spec: str) -> bool:
    """NCCL_SOCKET_IFNAME syntax: comma-separated prefixes, ``=`` exact, ``^`` exclude."""
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    patterns = [p for p in spec.split(",") if p]
    hit = any(name == p if exact else name.startswith(p) for p in patterns)
    return hit != exclude


def _describe(ifaces: Sequence[Iface]) -> str:
    parts = [f"{i.name} ({i.kind}, {'up' if i.up else 'down'}, {', '.join(i.addrs) or 'no IPv4'})"
             for i in ifaces]
    return "; ".join(parts) or "none"


def _requested(ifaces: Sequence[Iface], requested: str) -> IfaceChoice:
    found = {i.name: i for i in ifaces}.get(requested)
    where = f"interface {requested!r} (from --iface or DS_BENCH_IFACE)"
    if found is None:
        present = ", ".join(i.name for i in ifaces) or "none"
        raise UserError(f"{where} does not exist; interfaces present: {present}")
    if not found.addrs:
        raise UserError(f"{where} has no IPv4 address; expected an interface with one")
    if not found.up:
        raise UserError(f"{where} is down; expected an interface that is up")
    return IfaceChoice(found.name, found.addrs[0], f"--iface {found.name}")


def _from_env(usable: Sequence[Iface], env: Mapping[str, str]) -> IfaceChoice | None:
    nccl = env.get("NCCL_SOCKET_IFNAME", "").strip()
    if nccl:
        for iface in usable:
            if _nccl_matches(iface.name, nccl):
                return IfaceChoice(iface.name, iface.addrs[0], f"NCCL_SOCKET_IFNAME={nccl}")
    gloo = env.get("GLOO_SOCKET_IFNAME", "").strip()
    by_name = {i.name: i for i in usable}
    for name in filter(None, gloo.split(",")):
        if name in by_name:
            return IfaceChoice(name, by_name[name].addrs[0], f"GLOO_SOCKET_IFNAME={gloo}")
    return None


def _from_machine(usable: Sequence[Iface], hostname_addr: str | None,
                  multi_host: bool) -> IfaceChoice | None:
    for iface in usable:
        if iface.kind == "infiniband":
            return IfaceChoice(iface.name, iface.addrs[0], f"InfiniBand interface {iface.name}")
    skip_host = hostname_addr is None or (multi_host and hostname_addr.startswith("127."))
    for iface in [] if skip_host else usable:
        if hostname_addr in iface.addrs:
            return IfaceChoice(iface.name, hostname_addr,
                               f"hostname resolves to {hostname_addr} on {iface.name}")
    for iface in usable:
        if iface.kind == "ethernet":
            return IfaceChoice(iface.name, iface.addrs[0], f"first ethernet interface {iface.name}")
    return None


def choose_interface(ifaces: Sequence[Iface], *, requested: str | None, env: Mapping[str, str],
                     hostname_addr: str | None, multi_host: bool) -> IfaceChoice:
    """Pick the rendezvous interface; the first rule that yields one wins.

    1. ``requested`` (--iface or DS_BENCH_IFACE), taken as given: it must exist, be up and
       have an IPv4 address. The rules below consider only up interfaces with an IPv4 address,
       and for a multi-host run never loopback or virtual ones.
    2. NCCL_SOCKET_IFNAME (NCCL syntax), 3. GLOO_SOCKET_IFNAME (exact names, in its order),
    4. the first InfiniBand interface, 5. the interface holding ``hostname_addr`` (skipped when
    it is a loopback address on a multi-host run), 6. the first ethernet interface,
    7. single host only: loopback.
    """
    if requested:
        return _requested(ifaces, requested)
    usable = [i for i in ifaces if i.up and i.addrs
              and not (multi_host and i.kind in _UNUSABLE_FOR_MULTI_HOST)]
    choice = _from_env(usable, env) or _from_machine(usable, hostname_addr, multi_host)
    if choice is not None:
        return choice
    if not multi_host:
        loopback = next((i for i in usable if i.kind == "loopback"), None)
        name = None if loopback is None else loopback.name
        addrs = ("127.0.0.1",) if loopback is None else loopback.addrs
        addr = "127.0.0.1" if "127.0.0.1" in addrs else addrs[0]
        return IfaceChoice(name, addr, f"single host: loopback {name or addr}")
    raise UserError(f"no usable network interface for a multi-host run among: {_describe(ifaces)};"
                    " choose one with --iface NAME (or DS_BENCH_IFACE)")


def env_for_choice(choice: IfaceChoice, env: Mapping[str, str]) -> dict[str, str]:
    """GLOO_/NCCL_SOCKET_IFNAME to export for ``choice``; variables the user set are left alone."""
    if choice.name is None:
        return {}
    return {var: choice.name for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
            if not env.get(var, "").strip()}


def resolve_hostname_addr(name: str) -> str | None:
    """IPv4 address ``name`` resolves to, or None when it does not resolve."""
    try:
        return socket.gethostbyname(name)
    except (OSError, UnicodeError):
        return None

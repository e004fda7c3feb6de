"""Which ranks on other hosts closed their connection to this rank: the TCP links read from /proc.

A rank killed on another host shows on a survivor in two ways: gloo's error naming the lost address
(``faults.peers_named_by``) once the survivor's next collective fails, and, at once, the connections to
that host closing: the dead process's kernel closes its sockets, and gloo's event loop on the survivor
closes its end of each pair as soon as it reads the end of stream (measured: gone within 0.1 s of a
SIGKILL). Under Slurm the survivor often gets srun's SIGTERM while it computes, before any collective
fails, so its record would otherwise name no one. ``links`` snapshots the established connections to
other ranks' hosts once the process group is joined; ``dropped`` compares a later snapshot with it.
Links opened and closed inside the join (a rendezvous root's) are not in the snapshot; the ones in it
(gloo's pairs, the store's clients) last as long as the process group, so only a peer's end closes them.
"""

from __future__ import annotations

from ds_bench.cluster import faults

Link = tuple[tuple[str, int], tuple[str, int]]
"""(local address, port), (remote address, port) of one established TCP connection."""


def remote_addresses(peers: list[dict], host: str) -> set[str]:
    """The addresses of the hosts the other ranks run on, this host's excepted (pure)."""
    return {a for p in peers if p["host"] != host for a in p.get("addrs") or ()}


def links(addresses: set[str]) -> frozenset[Link]:
    """This process's established TCP connections to any of ``addresses`` (empty where /proc cannot say)."""
    import psutil

    if not addresses:
        return frozenset()
    try:
        conns = psutil.Process().net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return frozenset()
    return frozenset(((c.laddr.ip, c.laddr.port), (c.raddr.ip, c.raddr.port)) for c in conns
                     if c.raddr and c.raddr.ip in addresses and c.status == psutil.CONN_ESTABLISHED)


def dropped(before: frozenset[Link], now: frozenset[Link], peers: list[dict], host: str) -> dict[int, str]:
    """Ranks on other hosts one of whose connections open ``before`` is no longer established ``now``: ``lost``
    (pure). As with gloo's error, a closed link names its host, not a process: every rank on it counts."""
    return faults.lost_at({remote[0] for _local, remote in before - now}, peers, host)

"""Link classes of a multi-host job: which ranks to measure inside one host and across hosts (pure
apart from ``make_groups``).

With ranks on several hosts, a slow inter-node fabric hides in world-wide figures behind fast
intra-node links (or the other way round). ``link_groups`` splits the ranks as nccl-tests users do
by hand: ``intra-host`` is one group per host holding that host's ranks (measured at the same time,
as a single-node run would), ``inter-host`` is the first rank of every host (one rank per host, so
every byte crosses the network).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class LinkGroup:
    scope: str
    """``intra-host`` or ``inter-host``."""
    label: str
    """What the table shows: the host for intra-host groups, ``one rank per host`` otherwise."""
    ranks: tuple[int, ...]


def link_groups(hosts: list[str]) -> list[LinkGroup]:
    """``hosts[r]`` is rank r's host. Empty on one host; groups of one rank are left out."""
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    if len(by_host) < 2:
        return []
    intra = [LinkGroup("intra-host", host, tuple(ranks)) for host, ranks in by_host.items() if len(ranks) > 1]
    return intra + [LinkGroup("inter-host", "one rank per host", tuple(r[0] for r in by_host.values()))]


def make_groups(groups: list[LinkGroup], rank: int) -> list[tuple[LinkGroup, object | None]]:
    """Create every group on every rank (``new_group`` is collective, in the same order everywhere);
    returns each group with its process group handle where this rank belongs, else None."""
    out = []
    for group in groups:
        handle = dist.new_group(list(group.ranks))
        out.append((group, handle if rank in group.ranks else None))
    return out

"""``comm --pairs``: send/recv bandwidth between every pair of hosts, and the slow links named.

One bad cable or HCA slows only the links through it: world-wide collectives average it away and
the one-rank-per-host ring crosses only the links the ring happens to use. ``--pairs`` measures each
pair of hosts on its own. The first rank of each host stands for it; the pairs are scheduled in
rounds of disjoint pairs (the circle method of round-robin tournaments: H-1 rounds of H/2 pairs for
an even host count H, H rounds with one host idle for an odd H), so all H(H-1)/2 pairs take about H
rounds and no host is in two pairs at once. Within a pair both ranks send to and receive from each
other at once (``batch_isend_irecv``), as nccl-tests' sendrecv does on a two-rank ring, so busbw is
algbw (factor 1, ``ds_bench.comm.bandwidth``) per direction; every exchange is checked first.

Slow links: a link whose busbw at the largest size is below ``(1 - threshold/100)`` x the best
link's. The best link is the reference, not the median: with one bad host among three, two of the
three links are slow and the median is one of them. A host all of whose links (two or more) are
slow is named as the likely cause (its NIC/HCA, cable or switch port) rather than leaving the user
to intersect the list. With two hosts there is one link and nothing to compare it with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.distributed as dist

from ds_bench.comm import patterns, table
from ds_bench.comm.bandwidth import element_count
from ds_bench.comm.timing import RankSample, clock, exchange


def leaders(hosts: list[str]) -> dict[str, int]:
    """Host -> its first rank, hosts in order of first appearance (``hosts[r]`` is rank r's host)."""
    out: dict[str, int] = {}
    for rank, host in enumerate(hosts):
        out.setdefault(host, rank)
    return out


def pair_rounds(hosts: list[str]) -> list[list[tuple[str, str]]]:
    """Every pair of ``hosts`` exactly once, in rounds in which no host appears twice (pure)."""
    players: list[str | None] = list(hosts) + ([None] if len(hosts) % 2 else [])
    n, order = len(players), {h: i for i, h in enumerate(hosts)}
    rounds = []
    for _ in range(n - 1):
        pairs = [(players[i], players[n - 1 - i]) for i in range(n // 2)]
        rounds.append([tuple(sorted(p, key=order.__getitem__)) for p in pairs if None not in p])
        players = [players[0], players[-1], *players[1:-1]]  # keep the first, rotate the rest
    return [r for r in rounds if r]


def link_label(a: str, b: str) -> str:
    return f"{a}<->{b}"


def rank_samples(hosts: list[str], rank: int, sizes: list[int], dtype: torch.dtype, device: torch.device,
                 warmup: int, iters: int) -> list[tuple[str, dict]]:
    """This rank's (link, sample) for every exchange it took part in; every rank of the world must
    call it (each size of each round starts with a world barrier)."""
    lead = leaders(hosts)
    mine = []
    for round_ in pair_rounds(list(lead)):
        link, peer = _my_pair(round_, lead, rank)
        for size in sizes:
            ready = _link_exchange(size, dtype, device, rank, peer, warmup, link) if peer is not None else None
            dist.barrier()
            if ready is not None:
                run, sample = ready
                mine.append((link, dataclasses.asdict(dataclasses.replace(sample, seconds=clock(run, iters, device)))))
    return mine


def _my_pair(round_: list[tuple[str, str]], lead: dict[str, int], rank: int) -> tuple[str | None, int | None]:
    for a, b in round_:
        if rank in (lead[a], lead[b]):
            return link_label(a, b), lead[b] if rank == lead[a] else lead[a]
    return None, None


def _link_exchange(size_bytes: int, dtype: torch.dtype, device: torch.device, rank: int, peer: int, warmup: int,
             link: str) -> tuple[Callable[[], None], RankSample]:
    """The exchange with ``peer``, run once and checked, then warmed up; the sample's time is unset."""
    count = element_count("send_recv", size_bytes, 2, torch.empty(0, dtype=dtype).element_size())
    send = patterns.make_input("send_recv", rank, 2, count, dtype, device)
    recv = torch.empty_like(send)
    run = exchange(send, recv, peer, peer)
    run()
    want = patterns.values(peer, torch.arange(count)).double()
    index = patterns.first_mismatch(recv, want, dtype)
    wrong = None if index is None else (
        f"send_recv of {size_bytes} B on {link}: rank {rank} got {float(recv[index]):g} from rank {peer} "
        f"instead of {float(want[index]):g} at element {index}")
    for _ in range(warmup):
        run()
    return run, RankSample("send_recv", count * send.element_size(), count, 0.0, wrong)


def rows(everyone: list[list[tuple[str, dict]]]) -> list[dict]:
    """Table rows (scope ``pair``) from every rank's ``rank_samples``: one per link and size, the time
    the mean of the two ends' (pure)."""
    by_link: dict[str, list[list[dict]]] = {}
    for samples in everyone:
        mine: dict[str, list[dict]] = {}
        for link, sample in samples:
            mine.setdefault(link, []).append(sample)
        for link, ordered in mine.items():
            by_link.setdefault(link, []).append(ordered)
    return [{"scope": "pair", "group": link, **row} for link, ends in by_link.items() for row in table.rows(ends, 2)]


def slow_links(pair_rows: list[dict], threshold_pct: float) -> list[dict]:
    """Links whose largest-size busbw is more than ``threshold_pct``% below the best link's, slowest
    first (pure)."""
    top = table.largest(pair_rows, by="group")
    if len(top) < 2:
        return []
    best = max(row["busbw_GBps"] for row in top.values())
    return [{"link": link, "busbw_GBps": row["busbw_GBps"], "size_bytes": row["size_bytes"],
             "vs_best_pct": (row["busbw_GBps"] / best - 1) * 100}
            for link, row in sorted(top.items(), key=lambda item: item[1]["busbw_GBps"])
            if row["busbw_GBps"] < best * (1 - threshold_pct / 100)]


def suspect_hosts(pair_rows: list[dict], slow: list[dict]) -> list[str]:
    """Hosts with two or more links, every one of them slow (pure)."""
    slow_set = {s["link"] for s in slow}
    links_of: dict[str, list[str]] = {}
    for link in table.largest(pair_rows, by="group"):
        for host in link.split("<->"):
            links_of.setdefault(host, []).append(link)
    return [h for h, links in links_of.items() if len(links) >= 2 and all(x in slow_set for x in links)]


def describe(pair_rows: list[dict], slow: list[dict], suspects: list[str], threshold_pct: float) -> list[str]:
    """The lines printed after the table: the slowest links, which are slow, the suspect hosts."""
    top = sorted(table.largest(pair_rows, by="group").items(), key=lambda item: item[1]["busbw_GBps"])
    if not top:
        return ["pairs: one host, no host pairs to measure"]
    best_link, best = top[-1][0], top[-1][1]["busbw_GBps"]
    slow_set = {s["link"] for s in slow}
    lines = [f"pairs: {len(top)} links; best {best_link} {best:.3g} GB/s busbw at "
             f"{table.human_bytes(top[-1][1]['size_bytes'])}"]
    for link, row in top[:3]:
        mark = f"SLOW (more than {threshold_pct:g}% below the best)" if link in slow_set else "ok"
        lines.append(f"  {link}: {row['busbw_GBps']:.3g} GB/s ({(row['busbw_GBps'] / best - 1) * 100:+.0f}% vs best) "
                     f"{mark}")
    lines += [f"  suspect host {h}: every link through it is slow (its NIC/HCA, cable or switch port)" for h in suspects]
    return lines

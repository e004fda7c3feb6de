"""A rank on another host that dies closes its links: the survivor names it from its own /proc.

Real sockets and a real gloo process group over loopback; the "other host" is a label (the peers list
says which host each rank is on, and loopback is the address of that host here).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from ds_bench.cluster import peer_links
from ds_bench.cluster.rendezvous import free_port
from tests.conftest import REPO, child_env

PEERS = [{"rank": 0, "host": "a", "pid": 10, "addrs": ["10.0.0.1"]},
         {"rank": 1, "host": "b", "pid": 11, "addrs": ["10.0.0.2", "192.168.0.2"]},
         {"rank": 2, "host": "b", "pid": 12, "addrs": ["10.0.0.2", "192.168.0.2"]},
         {"rank": 3, "host": "c", "pid": 13, "addrs": ["10.0.0.3"]}]


def link(remote: str, port: int = 5000) -> peer_links.Link:
    return ("10.0.0.1", 40000 + port), (remote, port)


def test_a_closed_link_names_every_rank_on_its_host():
    before = frozenset({link("10.0.0.2"), link("10.0.0.3")})
    assert peer_links.remote_addresses(PEERS, "a") == {"10.0.0.2", "192.168.0.2", "10.0.0.3"}
    assert peer_links.dropped(before, before, PEERS, "a") == {}
    assert peer_links.dropped(before, frozenset({link("10.0.0.3")}), PEERS, "a") == {1: "lost", 2: "lost"}
    assert peer_links.dropped(before, frozenset(), PEERS, "a") == {1: "lost", 2: "lost", 3: "lost"}
    # a link opened after the snapshot (a later group) and closed says nothing; nor does this host's own
    assert peer_links.dropped(frozenset(), frozenset({link("10.0.0.2")}), PEERS, "a") == {}
    assert peer_links.dropped(frozenset({link("10.0.0.1")}), frozenset(), PEERS, "a") == {}


def test_a_killed_peer_s_socket_stops_being_established():
    """The end of stream without our close (CLOSE_WAIT) counts as closed, as much as a link gone."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        peer = subprocess.Popen([sys.executable, "-c", f"import socket, time; s = socket.create_connection("
                                 f"('127.0.0.1', {port})); print('on', flush=True); time.sleep(60)"],
                                stdout=subprocess.PIPE, text=True)
        try:
            conn, _ = server.accept()
            assert peer.stdout.readline().strip() == "on"
            peers = [{"rank": 0, "host": "a", "pid": 1, "addrs": []},
                     {"rank": 1, "host": "b", "pid": peer.pid, "addrs": ["127.0.0.1"]}]
            before = peer_links.links({"127.0.0.1"})
            assert any(remote[1] != port and local[1] == port for local, remote in before), before
            peer.kill()
            peer.wait(timeout=10)
            time.sleep(0.2)
            assert peer_links.dropped(before, peer_links.links({"127.0.0.1"}), peers, "a") == {1: "lost"}
            conn.close()
        finally:
            peer.kill()
            peer.wait(timeout=10)


RANK = """
import os, sys, time, torch, torch.distributed as dist
from ds_bench.cluster import peer_links
dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
dist.all_reduce(torch.ones(4))
peers = [{"rank": 0, "host": "a", "pid": 0, "addrs": []}, {"rank": 1, "host": "b", "pid": 0, "addrs": ["127.0.0.1"]}]
before = peer_links.links({"127.0.0.1"})
print("ready", os.getpid(), len(before), flush=True)
if dist.get_rank() == 1:
    time.sleep(120)
sys.stdin.readline()  # the test killed rank 1; rank 0 computes, in no collective
time.sleep(0.5)
print("dropped", peer_links.dropped(before, peer_links.links({"127.0.0.1"}), peers, "a"), flush=True)
"""


@pytest.mark.timeout(120)
def test_gloo_closes_its_links_to_a_killed_rank_before_any_collective_fails():
    """What the survivor of a rank killed under Slurm sees when srun's SIGTERM comes first: its gloo links
    (and the store's) to that rank are closed although it ran no collective since."""
    env = child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port(29700)), WORLD_SIZE="2")
    ranks = [subprocess.Popen([sys.executable, "-c", RANK], cwd=REPO, env={**env, "RANK": str(r)}, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE) for r in (0, 1)]
    try:
        ready = [p.stdout.readline().split() for p in ranks]
        assert ready[0][0] == "ready" and int(ready[0][2]) >= 1, ready
        ranks[1].send_signal(signal.SIGKILL)
        ranks[1].wait(timeout=10)
        out, _ = ranks[0].communicate("killed\n", timeout=60)
        assert "dropped {1: 'lost'}" in out, out
    finally:
        for p in ranks:
            p.kill()
            p.wait(timeout=10)

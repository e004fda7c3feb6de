"""Rendezvous planning on inline environments, and the reachability check against a dead port."""

import socket
import time

import pytest

from ds_bench.cluster.discovery import RankInfo
from ds_bench.cluster.netif import IfaceChoice
from ds_bench.cluster.rendezvous import Rendezvous, default_port, rendezvous_env, resolve, spans_hosts, wait_reachable
from ds_bench.errors import UserError


def info(**kw):
    base = dict(rank=1, world_size=4, local_rank=1, local_world_size=2, node_rank=0, master_addr="10.0.0.1",
                master_port=29500, source="openmpi", hosts=())
    return RankInfo(**{**base, **kw})


def test_spans_hosts_from_hosts_or_sizes():
    assert spans_hosts(info(hosts=("a", "b")))
    assert not spans_hosts(info(hosts=("a", "a")))
    assert spans_hosts(info())  # 4 ranks, 2 per node
    assert not spans_hosts(info(world_size=2))


def test_default_port_is_per_slurm_job():
    assert default_port({"SLURM_JOB_ID": "123456"}) == 20000 + 123456 % 20000
    assert default_port({}) == 29500


def test_rendezvous_env_sets_all_five_deepspeed_variables():
    env = rendezvous_env(info())
    assert env == {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_no_launcher_is_one_rank_on_loopback():
    r = resolve({}, None, 10)
    assert (r.info.source, r.info.rank, r.info.world_size, r.info.master_addr) == ("single", 0, 1, "127.0.0.1")
    assert 0 < r.info.master_port < 65536 and "GLOO_SOCKET_IFNAME" not in r.env


def test_torchrun_environment_keeps_its_master_and_exports_the_interface():
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29999", "TORCHELASTIC_RUN_ID": "x"}
    r = resolve(env, "lo", 10)
    assert (r.info.source, r.info.master_addr, r.info.master_port) == ("torchrun", "127.0.0.1", 29999)
    assert r.choice.name == "lo" and r.env["GLOO_SOCKET_IFNAME"] == "lo" and r.env["NCCL_SOCKET_IFNAME"] == "lo"
    kept = resolve({**env, "NCCL_SOCKET_IFNAME": "ib"}, "lo", 10)
    assert "NCCL_SOCKET_IFNAME" not in kept.env  # the user's own value is left alone


def test_unknown_iface_is_a_clear_error():
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    with pytest.raises(UserError, match="no_such_if"):
        resolve(env, "no_such_if", 10)


def test_refused_connections_wait_for_the_listen_timeout():
    with socket.socket() as s:  # a port that nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = Rendezvous(info(master_addr="127.0.0.1", master_port=port), IfaceChoice("eth0", "10.0.0.2", "--iface eth0"),
                   True, {})
    start = time.monotonic()
    with pytest.raises(UserError, match=rf"rank 1 \(.*\): 127\.0\.0\.1 answers but nothing listened on port {port} "
                                        r"within 2s; is rank 0 running"):
        wait_reachable(r, 0.5, 2)  # refused = reachable but not listening yet: waits for the longer limit
    assert 1.9 < time.monotonic() - start < 5


def test_silent_master_fails_within_the_connect_timeout_naming_address_and_interface():
    # A silent master on loopback: Linux drops SYNs to a listener whose accept queue is full, so
    # connects time out exactly as they do towards a firewalled port.
    with socket.socket() as server, socket.socket() as filler:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        filler.connect(("127.0.0.1", port))  # fills the queue; nobody accepts
        r = Rendezvous(info(master_addr="127.0.0.1", master_port=port),
                       IfaceChoice("eth0", "10.0.0.2", "--iface eth0"), True, {})
        start = time.monotonic()
        with pytest.raises(UserError, match=rf"rank 1 \(.*\) cannot reach MASTER_ADDR 127\.0\.0\.1:{port} within 1\.5s "
                                            r"\(timed out\).*interface is eth0 \(--iface eth0\).*Try --iface NAME"):
            wait_reachable(r, 1.5, 60)
        assert time.monotonic() - start < 4


def test_reachable_master_returns_at_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = Rendezvous(info(master_addr="127.0.0.1", master_port=s.getsockname()[1]), IfaceChoice("lo", "x", "y"),
                       False, {})
        start = time.monotonic()
        wait_reachable(r, 5, 5)
        assert time.monotonic() - start < 0.5  # one connect, no retry interval


def test_a_missing_iface_is_rejected_on_one_rank_too():
    with pytest.raises(UserError, match=r"interface 'nosuch0' \(from --iface or DS_BENCH_IFACE\) does not exist"):
        resolve({}, "nosuch0", 10)
    with pytest.raises(UserError, match="'nosuch1'.*does not exist"):
        resolve({"DS_BENCH_IFACE": "nosuch1"}, None, 10)
    assert resolve({}, "lo", 10).info.world_size == 1


def test_free_port_keeps_a_free_preferred_port_and_replaces_a_taken_one():
    import socket

    from ds_bench.cluster.rendezvous import free_port

    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        other = free_port(busy)
        assert other != busy and other > 0
    assert free_port(busy) == busy  # released now
    assert free_port() > 0

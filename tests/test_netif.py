"""Tests for ds_bench.cluster.netif: reading fake /sys/class/net trees and choosing the interface."""

import re

import pytest

from ds_bench.cluster.netif import (
    Iface,
    IfaceChoice,
    choose_interface,
    classify,
    env_for_choice,
    read_interfaces,
    resolve_hostname_addr,
)
from ds_bench.errors import UserError


def make_if(root, name, type_id=None, operstate=None, device=False):
    d = root / name
    d.mkdir(parents=True)
    if type_id is not None:
        (d / "type").write_text(f"{type_id}\n")
    if operstate is not None:
        (d / "operstate").write_text(f"{operstate}\n")
    if device:
        (d / "device").mkdir()


def test_read_interfaces_fake_sys_tree(tmp_path):
    make_if(tmp_path, "lo", 772, "unknown")
    make_if(tmp_path, "eno1", 1, "up", device=True)
    make_if(tmp_path, "ib0", 32, "up", device=True)
    make_if(tmp_path, "docker0", 1, "down")
    make_if(tmp_path, "wlp2s0", 1, "dormant", device=True)
    make_if(tmp_path, "mystery", 65534)
    addrs = {"lo": ["127.0.0.1"], "eno1": ["10.0.0.2", "10.0.0.3"], "ib0": ["192.168.1.2"],
             "docker0": ["172.17.0.1"]}
    assert read_interfaces(str(tmp_path), addrs) == [
        Iface("docker0", "virtual", ("172.17.0.1",), False),
        Iface("eno1", "ethernet", ("10.0.0.2", "10.0.0.3"), True),
        Iface("ib0", "infiniband", ("192.168.1.2",), True),
        Iface("lo", "loopback", ("127.0.0.1",), True),
        Iface("mystery", "virtual", (), True),
        Iface("wlp2s0", "ethernet", (), False),
    ]


def test_read_interfaces_network_namespace_and_odd_files(tmp_path):
    # Inside a container: eth0 is a veth peer with no device link; ib names need no type 32.
    make_if(tmp_path, "eth0", 1, "up")
    make_if(tmp_path, "ibp65s0", None, "up")
    make_if(tmp_path, "weird", None, None, device=True)
    (tmp_path / "weird" / "type").write_text("not-a-number")
    got = read_interfaces(str(tmp_path), {"eth0": ["172.18.0.5"]})
    assert got == [Iface("eth0", "ethernet", ("172.18.0.5",), True),
                   Iface("ibp65s0", "infiniband", (), True),
                   Iface("weird", "other", (), True)]


def test_read_interfaces_missing_dir(tmp_path):
    assert read_interfaces(str(tmp_path / "absent"), {}) == []


def test_read_interfaces_real_machine_uses_psutil():
    ifaces = read_interfaces()
    assert all(isinstance(i, Iface) for i in ifaces)
    lo = [i for i in ifaces if i.name == "lo"]
    assert len(lo) == 1 and lo[0].kind == "loopback" and "127.0.0.1" in lo[0].addrs, ifaces  # Linux always has lo


@pytest.mark.parametrize(
    "name, type_id, has_device, kind",
    [
        ("lo", 772, False, "loopback"), ("lo", None, False, "loopback"), ("xlo", 772, True, "loopback"),
        ("docker0", 1, False, "virtual"), ("veth12ab", 1, False, "virtual"),
        ("br-0a1b2c", 1, False, "virtual"), ("virbr0", 1, False, "virtual"),
        ("cni0", 1, False, "virtual"), ("flannel.1", 1, False, "virtual"),
        ("cali123", 1, False, "virtual"), ("tun0", 65534, False, "virtual"),
        ("tap0", 1, True, "virtual"), ("ib0", 32, True, "infiniband"), ("ib1", None, False, "infiniband"),
        ("hsn0", 32, True, "infiniband"), ("eth0", 1, False, "ethernet"), ("enp1s0f0", 1, True, "ethernet"),
        ("bond0", 1, False, "ethernet"), ("p1p1", 1, True, "ethernet"), ("foo0", 1, False, "virtual"),
        ("can0", 280, True, "other"),
    ],
)
def test_classify(name, type_id, has_device, kind):
    assert classify(name, type_id, has_device) == kind


LO = Iface("lo", "loopback", ("127.0.0.1",), True)
ETH0 = Iface("eth0", "ethernet", ("10.0.0.5",), True)
ETH1 = Iface("eth1", "ethernet", ("10.1.2.3",), True)
IB0 = Iface("ib0", "infiniband", ("192.168.0.5",), True)
IB1 = Iface("ib1", "infiniband", ("192.168.1.5",), True)
IB_DOWN = Iface("ib2", "infiniband", ("192.168.2.5",), False)
IB_NOADDR = Iface("ib3", "infiniband", (), True)
DOCKER = Iface("docker0", "virtual", ("172.17.0.1",), True)
ALL = [DOCKER, ETH0, ETH1, IB_DOWN, IB_NOADDR, IB0, IB1, LO]


def choose(ifaces=ALL, requested=None, env=None, hostname_addr=None, multi_host=True):
    return choose_interface(ifaces, requested=requested, env=env or {},
                            hostname_addr=hostname_addr, multi_host=multi_host)


def test_requested_wins_and_may_be_anything_present():
    env = {"NCCL_SOCKET_IFNAME": "ib", "GLOO_SOCKET_IFNAME": "eth1"}
    assert choose(requested="eth0", env=env) == IfaceChoice("eth0", "10.0.0.5", "--iface eth0")
    assert choose(requested="docker0") == IfaceChoice("docker0", "172.17.0.1", "--iface docker0")


@pytest.mark.parametrize(
    "requested, message",
    [
        ("ib9", "interface 'ib9' (from --iface or DS_BENCH_IFACE) does not exist; interfaces present: "
                "docker0, eth0, eth1, ib2, ib3, ib0, ib1, lo"),
        ("ib3", "interface 'ib3' (from --iface or DS_BENCH_IFACE) has no IPv4 address; "
                "expected an interface with one"),
        ("ib2", "interface 'ib2' (from --iface or DS_BENCH_IFACE) is down; expected an interface that is up"),
    ],
)
def test_requested_errors(requested, message):
    with pytest.raises(UserError, match="^" + re.escape(message) + "$"):
        choose(requested=requested)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("ib", "ib0"),            # prefix: first up interface with an address (ib2 down, ib3 none)
        ("ib1,eth", "eth0"),      # list of prefixes, interface order decides
        ("=ib1", "ib1"),          # exact match
        ("=ib", None),            # exact match only: no interface is called "ib"
        ("^eth,ib0,docker", "ib1"),  # exclude prefixes; lo/docker never for multi-host
        ("^=eth0", "eth1"),       # exclude exact names
        ("docker", None),         # virtual interfaces are never chosen for multi-host
    ],
)
def test_nccl_socket_ifname(value, expected):
    got = choose(env={"NCCL_SOCKET_IFNAME": value, "GLOO_SOCKET_IFNAME": "eth1"})
    if expected is None:
        assert got == IfaceChoice("eth1", "10.1.2.3", "GLOO_SOCKET_IFNAME=eth1")
    else:
        assert got == IfaceChoice(expected, next(i.addrs[0] for i in ALL if i.name == expected),
                                  f"NCCL_SOCKET_IFNAME={value}")


def test_gloo_socket_ifname_exact_names_in_list_order():
    assert choose(env={"GLOO_SOCKET_IFNAME": "eth,ib9,eth1,eth0"}) == IfaceChoice(
        "eth1", "10.1.2.3", "GLOO_SOCKET_IFNAME=eth,ib9,eth1,eth0")
    assert choose(env={"GLOO_SOCKET_IFNAME": "lo"}).name == "ib0"  # lo is not for multi-host


def test_infiniband_before_hostname_and_ethernet():
    assert choose(hostname_addr="10.1.2.3") == IfaceChoice("ib0", "192.168.0.5", "InfiniBand interface ib0")


def test_hostname_address():
    ifaces = [DOCKER, ETH0, ETH1, LO]
    assert choose(ifaces, hostname_addr="10.1.2.3") == IfaceChoice(
        "eth1", "10.1.2.3", "hostname resolves to 10.1.2.3 on eth1")
    assert choose(ifaces, hostname_addr="172.17.0.1").name == "eth0"  # virtual: skipped
    assert choose(ifaces, hostname_addr="10.9.9.9").name == "eth0"  # not on any interface


def test_hostname_on_loopback():
    ifaces = [LO, ETH1]
    assert choose(ifaces, hostname_addr="127.0.0.1") == IfaceChoice(
        "eth1", "10.1.2.3", "first ethernet interface eth1")
    assert choose(ifaces, hostname_addr="127.0.0.1", multi_host=False) == IfaceChoice(
        "lo", "127.0.0.1", "hostname resolves to 127.0.0.1 on lo")


def test_first_up_ethernet_with_address():
    eth_down = Iface("eth0", "ethernet", ("10.0.0.5",), False)
    eth_none = Iface("eth1", "ethernet", (), True)
    eth2 = Iface("eth2", "ethernet", ("10.2.0.1",), True)
    assert choose([eth_down, eth_none, eth2, LO]) == IfaceChoice(
        "eth2", "10.2.0.1", "first ethernet interface eth2")


def test_single_host_falls_back_to_loopback():
    assert choose([DOCKER, LO], multi_host=False) == IfaceChoice("lo", "127.0.0.1", "single host: loopback lo")
    odd_lo = Iface("lo", "loopback", ("127.0.0.2",), True)
    assert choose([odd_lo], multi_host=False) == IfaceChoice("lo", "127.0.0.2", "single host: loopback lo")
    assert choose([], multi_host=False) == IfaceChoice(None, "127.0.0.1", "single host: loopback 127.0.0.1")


def test_single_host_still_prefers_real_interfaces():
    assert choose([LO, ETH0], multi_host=False).name == "eth0"
    assert choose([LO, ETH0], env={"NCCL_SOCKET_IFNAME": "lo"}, multi_host=False) == IfaceChoice(
        "lo", "127.0.0.1", "NCCL_SOCKET_IFNAME=lo")


def test_multi_host_with_nothing_usable():
    ifaces = [DOCKER, Iface("eth0", "ethernet", ("10.0.0.5",), False), IB_NOADDR, LO]
    message = ("no usable network interface for a multi-host run among: "
               "docker0 (virtual, up, 172.17.0.1); eth0 (ethernet, down, 10.0.0.5); "
               "ib3 (infiniband, up, no IPv4); lo (loopback, up, 127.0.0.1); "
               "choose one with --iface NAME (or DS_BENCH_IFACE)")
    with pytest.raises(UserError, match="^" + re.escape(message) + "$"):
        choose(ifaces, hostname_addr="127.0.0.1")
    with pytest.raises(UserError, match=re.escape("among: none; choose one with --iface")):
        choose([])


def test_other_kind_only_via_hostname_or_env():
    other = Iface("hsn0", "other", ("10.5.0.1",), True)
    assert choose([other, LO], hostname_addr="10.5.0.1").name == "hsn0"
    assert choose([other, LO], env={"NCCL_SOCKET_IFNAME": "hsn"}).name == "hsn0"
    with pytest.raises(UserError):
        choose([other, LO])


def test_env_for_choice():
    choice = IfaceChoice("ib0", "192.168.0.5", "InfiniBand interface ib0")
    assert env_for_choice(choice, {}) == {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}
    assert env_for_choice(choice, {"NCCL_SOCKET_IFNAME": "^docker"}) == {"GLOO_SOCKET_IFNAME": "ib0"}
    assert env_for_choice(choice, {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "ib"}) == {}
    assert env_for_choice(choice, {"GLOO_SOCKET_IFNAME": ""}) == {
        "GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}
    assert env_for_choice(IfaceChoice(None, "127.0.0.1", "single host"), {}) == {}


def test_resolve_hostname_addr():
    assert resolve_hostname_addr("localhost") is not None
    assert resolve_hostname_addr("127.0.0.1") == "127.0.0.1"
    assert resolve_hostname_addr("no-such-host.invalid") is None
    assert resolve_hostname_addr("a" * 300) is None  # over-long label: UnicodeError, not a crash


def test_choices_and_ifaces_are_frozen():
    with pytest.raises(AttributeError):
        ETH0.name = "x"
    with pytest.raises(AttributeError):
        IfaceChoice("a", "b", "c").addr = "d"

"""Two hosts on one machine (Linux network namespaces, see tests/netns.py): eth0 drops all IPv4 and
is what `hostname -I` lists first and what the node names resolve to; ib0 works.

ds_bench under mpirun, one rank per host, must rendezvous over ib0 on its own (no RANK/MASTER_*
in the environment), and the control shows that the first `hostname -I` address, which stock
DeepSpeed's MPI discovery would take as MASTER_ADDR, fails within the connect timeout.
Skips with the reason where namespaces cannot be made (not root, no iproute2, no tc BPF...).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.netns import ADDRS, CONNECT_CODE, LISTEN_CODE, shape_link, skip_reason, switched_hosts, two_hosts

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
CONNECT_TIMEOUT = 5
HELLO = """
import os, socket, subprocess
from mpi4py import MPI
comm = MPI.COMM_WORLD
names = comm.allgather(MPI.Get_processor_name())  # crosses the BTL (pinned to ib0)
ips = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout.split()
line = " ".join(map(str, ("HELLO", comm.rank, comm.size, MPI.Get_processor_name(), socket.gethostname(),
                           ",".join(names), ",".join(ips), os.environ.get("OMPI_COMM_WORLD_RANK"))))
lines = comm.gather(line, root=0)  # one writer: two ranks printing at once can interleave within a line
if comm.rank == 0:
    print("\\n".join(lines), flush=True)
"""


@pytest.fixture(scope="module")
def bed():
    reason = skip_reason("dsb")
    if reason:
        pytest.skip(reason)
    with two_hosts("dsb") as b:
        yield b


@pytest.fixture(scope="module")
def mpi(bed):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun (Open MPI) not found")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py not installed")
    return bed


def first_hostname_i(bed, host):
    r = bed.run_on(host, ["hostname", "-I"], timeout=10)
    assert r.returncode == 0, r.explain()
    return r.stdout.split()[0]


def tcp_connect(bed, host, addr, port, timeout):
    r = bed.run_on(host, [PY, "-c", CONNECT_CODE, addr, str(port), str(timeout)], timeout=timeout + 15)
    assert r.returncode == 0, r.explain()
    return r.stdout.strip()


@pytest.mark.timeout(60)
def test_sanity_ib0_works_eth0_dropped(bed):
    r = bed.run_on("hosta", ["sh", "-c", "hostname; hostname -I; getent hosts hostb"], timeout=10)
    assert r.returncode == 0, r.explain()
    name, addrs, resolved = r.stdout.splitlines()[:3]
    assert name == "hosta"
    assert addrs.split() == [ADDRS["hosta"]["eth0"], ADDRS["hosta"]["ib0"]]
    assert resolved.split()[0] == ADDRS["hostb"]["eth0"]  # node names resolve to the blocked port
    listener = bed.popen_on("hosta", [PY, "-c", LISTEN_CODE, "5555", "20"])
    try:
        assert listener.stdout.readline().strip() == "listening"
        assert tcp_connect(bed, "hostb", ADDRS["hosta"]["ib0"], 5555, 2).startswith("connected")
        t = time.monotonic()
        out = tcp_connect(bed, "hostb", ADDRS["hosta"]["eth0"], 5555, 2)
        assert out.startswith("failed"), out
        assert time.monotonic() - t < 10
    finally:
        bed.cleanup_process(listener)


@pytest.mark.timeout(90)
def test_mpirun_one_rank_per_host(mpi):
    r = mpi.run_on("hosta", mpi.mpirun([PY, "-c", HELLO]), timeout=60, cwd=REPO)
    assert r.returncode == 0, r.explain()
    lines = sorted(line.split() for line in r.stdout.splitlines() if line.startswith("HELLO"))
    assert len(lines) == 2, r.explain()
    for rank, (line, host) in enumerate(zip(lines, ("hosta", "hostb"))):
        _, r_rank, size, proc_name, hostname, names, ips, env_rank = line
        assert (int(r_rank), int(size), proc_name, hostname, env_rank) == (rank, 2, host, host, str(rank))
        assert names == "hosta,hostb"
        assert ips.split(",")[0] == ADDRS[host]["eth0"]


def ds_bench_cmd(mpi, results, *extra):
    return mpi.mpirun([PY, "-m", "ds_bench", "run", "--workload", "mnist", "--ds-config", "ds_configs/zero0.json",
                       "--steps", "4", "--warmup", "1", "--results", str(results),
                       "--connect-timeout", f"{CONNECT_TIMEOUT}s", "--dist-timeout", "60s", *extra])


def read_records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


@pytest.mark.timeout(150)
def test_ds_bench_rendezvous_over_ib0(mpi, tmp_path):
    results = tmp_path / "r.jsonl"  # same filesystem for both hosts; only rank 0 writes
    r = mpi.run_on("hosta", ds_bench_cmd(mpi, results), timeout=120, cwd=REPO)
    assert r.returncode == 0, r.explain()
    recs = read_records(results)
    assert len(recs) == 1, r.explain()
    rec = recs[0]
    assert rec["status"] == "ok", rec.get("error")
    assert (rec["world_size"], rec["launcher"], rec["master_addr"]) == (2, "openmpi", ADDRS["hosta"]["ib0"])
    assert rec["hosts"] == ["hosta", "hostb"]


@pytest.mark.timeout(60)
def test_control_first_hostname_i_address_unreachable(bed):
    """Independent of ds_bench: the first `hostname -I` word on hosta is unreachable from hostb."""
    first = first_hostname_i(bed, "hosta")
    assert first == ADDRS["hosta"]["eth0"]  # what stock DeepSpeed's mpi_discovery takes as MASTER_ADDR
    listener = bed.popen_on("hosta", [PY, "-c", LISTEN_CODE, "5556", "20"])
    try:
        assert listener.stdout.readline().strip() == "listening"
        t = time.monotonic()
        out = tcp_connect(bed, "hostb", first, 5556, 5)
        assert out.startswith("failed"), out
        assert time.monotonic() - t < 5 + 10
    finally:
        bed.cleanup_process(listener)


# Rank 1 must report "cannot reach MASTER_ADDR 10.77.0.1:PORT within 5s" and end the job: it
# calls MPI Abort rather than MPI_Finalize (a collective fence in Open MPI that would wait for
# rank 0, itself stuck in TCPStore until --dist-timeout, 60 s here).
@pytest.mark.timeout(90)
@pytest.mark.full
def test_control_ds_bench_on_eth0_fails_fast(mpi, tmp_path):
    first = first_hostname_i(mpi, "hosta")
    results = tmp_path / "r.jsonl"
    r = mpi.run_on("hosta", ds_bench_cmd(mpi, results, "--iface", "eth0"), timeout=CONNECT_TIMEOUT + 25, cwd=REPO)
    assert "cannot reach" in r.stderr and first in r.stderr, r.explain()
    assert not r.timed_out, r.explain()  # i.e. done within connect timeout + 25 s
    assert r.returncode != 0, r.explain()


@pytest.mark.timeout(150)
def test_comm_across_two_hosts_over_ib0_reports_intra_and_inter_host_links(mpi, tmp_path):
    """Two ranks on each host: the world rows, then each host's pair and one rank per host apart."""
    results = tmp_path / "c.jsonl"
    argv = mpi.mpirun([PY, "-m", "ds_bench", "comm", "--collectives", "all_reduce,send_recv", "--min-bytes", "64KiB",
                       "--max-bytes", "1MiB", "--step-factor", "4", "--iters", "3", "--warmup", "1",
                       "--results", str(results), "--connect-timeout", f"{CONNECT_TIMEOUT}s", "--dist-timeout", "60s"],
                      hosts=("hosta:2", "hostb:2"), extra=("--oversubscribe",))
    argv[argv.index("-np") + 1] = "4"
    r = mpi.run_on("hosta", argv, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.explain()
    (rec,) = read_records(results)
    assert rec["status"] == "ok" and rec["hosts"] == ["hosta", "hosta", "hostb", "hostb"], rec["problems"]
    assert rec["rendezvous"]["master_addr"] == ADDRS["hosta"]["ib0"]
    scopes = {(row["scope"], row["group"]) for row in rec["results"]}
    assert scopes == {("world", "all ranks"), ("intra-host", "hosta"), ("intra-host", "hostb"),
                      ("inter-host", "one rank per host")}
    inter = [row for row in rec["results"] if row["scope"] == "inter-host"]
    assert {(row["collective"], row["size_bytes"]) for row in inter} == {
        (c, s) for c in ("all_reduce", "send_recv") for s in (65536, 262144, 1048576)}
    assert all(row["busbw_GBps"] > 0 and not row["wrong"] for row in rec["results"])
    assert "inter-host (one rank per host)" in r.stdout and "intra-host (hostb)" in r.stdout


@pytest.mark.timeout(120)
def test_doctor_across_two_hosts_checks_each_link_class(mpi):
    argv = mpi.mpirun([PY, "-m", "ds_bench", "doctor", "--connect-timeout", f"{CONNECT_TIMEOUT}s",
                       "--dist-timeout", "60s"], hosts=("hosta:2", "hostb:2"), extra=("--oversubscribe",))
    argv[argv.index("-np") + 1] = "4"
    r = mpi.run_on("hosta", argv, timeout=100, cwd=REPO)
    assert r.returncode == 0, r.explain()
    for link in ("intra-host (hosta)", "intra-host (hostb)", "inter-host (one rank per host)"):
        line = next(x for x in r.stdout.splitlines() if x.startswith(f"link {link}: all_reduce 64 MiB busbw "))
        assert float(line.split("busbw ")[1].split()[0]) > 0, line
    assert "OK: ranks agree on versions and all_reduce works" in r.stdout


@pytest.mark.timeout(150)
def test_pairs_name_the_shaped_link_and_its_host():
    """Three hosts on one switch, hostc's cable shaped to 200 Mbit/s with tc tbf (both ways): --pairs
    must name hostc's two links as slow, hosta<->hostb as not, and hostc as the suspect host."""
    if skip_reason("dsp") or shutil.which("mpirun") is None:
        pytest.skip(skip_reason("dsp") or "mpirun (Open MPI) not found")
    with switched_hosts("dsp") as bed, tempfile.TemporaryDirectory() as tmp:
        shape_link(bed, "hostc", "200mbit")
        results = Path(tmp) / "p.jsonl"
        argv = bed.mpirun([PY, "-m", "ds_bench", "comm", "--collectives", "all_reduce", "--pairs", "--min-bytes",
                           "64KiB", "--max-bytes", "1MiB", "--step-factor", "4", "--iters", "3", "--warmup", "1",
                           "--results", str(results), "--connect-timeout", f"{CONNECT_TIMEOUT}s",
                           "--dist-timeout", "60s"], hosts=("hosta", "hostb", "hostc"))
        r = bed.run_on("hosta", argv, timeout=120, cwd=REPO)
        assert r.returncode == 0, r.explain()
        (rec,) = read_records(results)
    links = {row["group"] for row in rec["results"] if row["scope"] == "pair"}
    assert links == {"hosta<->hostb", "hosta<->hostc", "hostb<->hostc"}
    assert {s["link"] for s in rec["slow_links"]} == {"hosta<->hostc", "hostb<->hostc"}, rec["slow_links"]
    assert rec["suspect_hosts"] == ["hostc"]
    assert "suspect host hostc" in r.stdout and "hosta<->hostb: " in r.stdout

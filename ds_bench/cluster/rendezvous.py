"""Rendezvous: from the launcher's environment to a complete, checked meeting point for all ranks.

1. ``discover`` reads the launcher's variables (deepspeed, torchrun, Open MPI, PMIx, PMI, MVAPICH,
   Slurm; see ``ds_bench.cluster.discovery``).
2. No launcher: one rank on 127.0.0.1 and a free port (an ``--iface`` given must still exist).
3. An MPI launcher that left fields unset (world size, local rank, master address): mpi4py fills
   them; rank 0 chooses the master address on its rendezvous interface (never the first word of
   ``hostname -I``, which is what stock DeepSpeed takes) and a free port, and broadcasts both.
4. Every rank chooses its interface by the same rule (``netif.choose_interface``) and exports
   GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME unless the user set them, because gloo and NCCL open
   their data connections by interface, not by MASTER_ADDR.
5. Before joining the process group, every non-zero rank checks it can open a TCP connection to
   MASTER_ADDR:MASTER_PORT, failing within ``--connect-timeout`` with a message that names the
   address, the interface and what to try.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ds_bench.cluster.discovery import RankInfo, discover
from ds_bench.cluster.mpi_discovery import complete_with_mpi
from ds_bench.cluster.netif import IfaceChoice, choose_interface, env_for_choice, read_interfaces, resolve_hostname_addr
from ds_bench.errors import UserError

MPI_SOURCES = frozenset({"openmpi", "pmix", "pmi", "mvapich"})
DEFAULT_PORT = 29500  # DeepSpeed's and torch's default


@dataclass(frozen=True)
class Rendezvous:
    info: RankInfo
    choice: IfaceChoice
    spans_hosts: bool
    env: dict[str, str]
    """Every variable to export before joining the process group."""

    def describe(self) -> dict:
        return {"master_addr": self.info.master_addr, "master_port": self.info.master_port,
                "iface": self.choice.name, "iface_addr": self.choice.addr, "reason": self.choice.reason,
                "spans_hosts": self.spans_hosts, "hosts": list(self.info.hosts),
                "exported": {k: v for k, v in self.env.items() if k.endswith("SOCKET_IFNAME")}}


def spans_hosts(info: RankInfo) -> bool:
    if info.hosts:
        return len(set(info.hosts)) > 1
    if info.world_size and info.local_world_size:
        return info.world_size > info.local_world_size
    return False


def default_port(env: Mapping[str, str]) -> int:
    """A port every rank derives alike without talking: per Slurm job, else DeepSpeed's default."""
    job = env.get("SLURM_JOB_ID", "")
    return 20000 + int(job) % 20000 if job.isdigit() else DEFAULT_PORT


def rendezvous_env(info: RankInfo) -> dict[str, str]:
    """The variables DeepSpeed and torch.distributed read (with all five set, DeepSpeed skips its own
    MPI discovery and its ``hostname -I`` guess)."""
    return {"RANK": str(info.rank), "WORLD_SIZE": str(info.world_size), "LOCAL_RANK": str(info.local_rank),
            "LOCAL_WORLD_SIZE": str(info.local_world_size), "MASTER_ADDR": str(info.master_addr),
            "MASTER_PORT": str(info.master_port)}


def free_port(preferred: int = 0) -> int:
    """``preferred`` when nothing listens there, else a port the kernel picks."""
    if preferred:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", preferred))
            return preferred
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def resolve(env: Mapping[str, str], requested_iface: str | None, timeout_s: float) -> Rendezvous:
    """Steps 1-4 of the module docstring (step 3 talks to the other ranks through MPI)."""
    info = discover(env)
    requested = requested_iface or env.get("DS_BENCH_IFACE") or None
    if info.source == "single":
        if requested:  # unused by one process, but a name that does not exist is still a mistake
            choose_interface(read_interfaces(), requested=requested, env=env, hostname_addr=None, multi_host=False)
        info = replace(info, rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                       master_addr=info.master_addr or "127.0.0.1", master_port=info.master_port or free_port())
        return Rendezvous(info, IfaceChoice(None, info.master_addr, "one process: loopback"), False,
                          rendezvous_env(info))

    def choose(multi_host: bool) -> IfaceChoice:
        return choose_interface(read_interfaces(), requested=requested, env=env,
                                hostname_addr=resolve_hostname_addr(short_hostname()), multi_host=multi_host)

    if info.source in MPI_SOURCES and (info.missing() or info.master_port is None):
        info = complete_with_mpi(info, lambda multi: (choose(multi).addr, free_port()), timeout_s)
    if info.master_port is None:
        info = replace(info, master_port=default_port(env))
    if info.missing():
        raise UserError(f"environment ({info.source}): cannot tell {', '.join(info.missing())}; "
                        "set RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR, or start under mpirun/srun")
    multi = spans_hosts(info)
    choice = choose(multi)
    return Rendezvous(info, choice, multi, {**rendezvous_env(info), **env_for_choice(choice, env)})


def wait_reachable(rdzv: Rendezvous, connect_timeout_s: float, listen_timeout_s: float) -> None:
    """Step 5: a non-zero rank retries a TCP connect to the master.

    Silence (a timeout, or host/network unreachable) for ``connect_timeout_s`` means the address
    is wrong for this rank: fail with advice. "Connection refused" means the path works and rank 0
    is not listening yet (it may still be importing or compiling ops): keep trying until
    ``listen_timeout_s``.
    """
    addr, port = rdzv.info.master_addr, rdzv.info.master_port
    start = time.monotonic()
    answered, last = False, None
    while time.monotonic() - start < (listen_timeout_s if answered else connect_timeout_s):
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                return
        except ConnectionRefusedError as e:
            answered, last = True, e
        except OSError as e:
            last = e
        time.sleep(0.2)
    where = f"rank {rdzv.info.rank} ({short_hostname()})"
    if answered:
        raise UserError(f"{where}: {addr} answers but nothing listened on port {port} within {listen_timeout_s:g}s; "
                        "is rank 0 running, and is MASTER_PORT free?")
    raise UserError(
        f"{where} cannot reach MASTER_ADDR {addr}:{port} within {connect_timeout_s:g}s ({last}); this rank's "
        f"interface is {rdzv.choice.name or '?'} ({rdzv.choice.reason}). Try --iface NAME (or DS_BENCH_IFACE) "
        "naming the interface that reaches rank 0's host, e.g. ib0, or set MASTER_ADDR; "
        "`ds-bench doctor` lists each rank's interfaces")

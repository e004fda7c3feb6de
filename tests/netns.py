"""A two-host test bed on one machine, made of Linux network namespaces (needs root).

Each "host" is a network namespace with its own hostname (``unshare --uts``) and its own
/etc/hosts (``unshare --mount`` + a bind mount). Both hosts have two links to each other:

    hosta  eth0 10.77.0.1/24  <-- veth, all IPv4 dropped -->  hostb  eth0 10.77.0.2/24
    hosta  ib0  10.78.0.1/24  <-- veth, working          -->  hostb  ib0  10.78.0.2/24

``eth0`` is created first, so ``hostname -I`` lists its address first (what stock DeepSpeed's MPI
discovery takes as MASTER_ADDR), and /etc/hosts maps the node names to the eth0 addresses: the
realistic trap of a cluster whose node names resolve to a blocked Ethernet port. IPv4 on eth0 is
dropped in both directions by a ``tc`` clsact qdisc with a classic BPF filter in direct-action mode
(this kernel has no netem/gact and there is no iptables/nft); ARP still passes, so a connect to
10.77.0.x times out rather than failing fast.

Open MPI starts remote ranks through ``bed.agent`` (``--mca plm_rsh_agent``), a script that takes
the place of ssh: it maps a host name to its namespace and runs the command there with the same
hostname and /etc/hosts wrapping that ``run_on`` uses. Traffic stays between the two namespaces.

    reason = skip_reason()
    if reason: pytest.skip(reason)
    with two_hosts("dsb") as bed:
        bed.run_on("hosta", ["hostname", "-I"], timeout=10)

``switched_hosts`` builds a second bed: hosta, hostb and hostc, each with one ib0 on a bridge in a
fourth namespace (the switch), and ``shape_link`` slows one host's cable with a ``tc tbf`` qdisc at
both ends, for ``comm --pairs``.

Every wait is bounded; leaving the context (error, timeout, Ctrl-C) kills whatever still runs in
the namespaces and deletes them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HOSTS = ("hosta", "hostb")
ETH_NET, IB_NET = "10.77.0", "10.78.0"
ADDRS = {
    "hosta": {"eth0": f"{ETH_NET}.1", "ib0": f"{IB_NET}.1"},
    "hostb": {"eth0": f"{ETH_NET}.2", "ib0": f"{IB_NET}.2"},
}

# Classic BPF, run by cls_bpf in direct-action mode, so the return value is the TC action:
#   ldh [SKF_AD_OFF + SKF_AD_PROTOCOL]   ; skb->protocol, host order (40 = BPF_LD|BPF_H|BPF_ABS)
#   jeq #0x0800, 0, 1                    ; IPv4? (21 = BPF_JMP|BPF_JEQ|BPF_K)
#   ret #2                               ; TC_ACT_SHOT: drop   (6 = BPF_RET|BPF_K)
#   ret #0                               ; TC_ACT_OK: pass (ARP, IPv6)
DROP_IPV4_BYTECODE = "4,40 0 0 4294963200,21 0 1 2048,6 0 0 2,6 0 0 0"

# Runs "$@" as host $1 with /etc/hosts replaced by file $2 (inside `unshare --uts --mount`).
_HOST_WRAPPER = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'

_CMD_TIMEOUT = 15  # seconds for any one ip/tc/unshare set-up command
_NS_PATTERN = r"^{prefix}_(?:a|b|c|sw|probe)_(\d+)$"
_STRIPPED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_", "OMPI_", "PMI",
                 "PMIX_", "SLURM_", "GLOO_", "NCCL_SOCKET", "DS_BENCH_IFACE")


class NetnsError(RuntimeError):
    """A set-up command failed."""


@dataclass
class Result:
    """What a command run on a host did. ``returncode`` is None when it was killed on timeout."""

    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    elapsed: float
    timed_out: bool

    def explain(self) -> str:
        status = f"timed out after {self.elapsed:.1f} s" if self.timed_out else f"exit {self.returncode}"
        return (f"$ {shlex.join(self.argv)}\n{status} ({self.elapsed:.1f} s)\n"
                f"--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-6000:]}")


def _sh(argv: Sequence[str], timeout: float = _CMD_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise NetnsError(f"{shlex.join(argv)}: no answer in {timeout} s") from e
    except OSError as e:
        raise NetnsError(f"{shlex.join(argv)}: {e}") from e
    if check and proc.returncode != 0:
        raise NetnsError(f"{shlex.join(argv)}: exit {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without launcher/rendezvous variables, the venv's bin first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_STRIPPED_ENV)}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
    env.update(extra or {})
    return env


def _default_sigint() -> None:
    """In the child: SIGINT back to default (a background job inherits it ignored), so that
    ``interrupt_then_kill`` can interrupt Python processes."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _ns_pids(ns: str) -> list[int]:
    proc = _sh(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def interrupt_then_kill(namespaces: Sequence[str], group: subprocess.Popen | None = None,
                        grace: float = 5.0) -> None:
    """Stop everything this harness runs in ``namespaces`` (and ``group``'s process group).

    Python processes get SIGINT first and ``grace`` seconds to leave: their ``finally`` blocks
    run, which releases torch's JIT-build lock (``torch_extensions/.../lock``). A SIGKILLed rank that
    held it leaves the lock behind and every later DeepSpeed run waits on it for ever. Then SIGKILL.
    """
    pythons = [pid for ns in namespaces for pid in _ns_pids(ns) if _comm(pid).startswith("python")]
    for pid in pythons:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    while pythons and time.monotonic() < deadline:
        pythons = [pid for pid in pythons if _pid_alive(pid) and not _is_zombie(pid)]
        time.sleep(0.1)
    if group is not None:
        _kill_group(group)
    for _ in range(3):
        pids = [pid for ns in namespaces for pid in _ns_pids(ns)]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _delete_ns(ns: str) -> None:
    """Stop what still runs in namespace ``ns`` (all started by this harness), then delete it."""
    interrupt_then_kill([ns])
    _sh(["ip", "netns", "del", ns], check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(prefix: str) -> list[str]:
    """Delete ``<prefix>_{a,b,c,sw,probe}_<pid>`` namespaces whose creating process is gone."""
    proc = _sh(["ip", "netns", "list"], check=False)
    pattern = re.compile(_NS_PATTERN.format(prefix=re.escape(prefix)))
    removed = []
    for line in proc.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = pattern.match(name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            _delete_ns(name)
            removed.append(name)
    return removed


_SKIP_CACHE: dict[str, str | None] = {}


def skip_reason(prefix: str = "dsb") -> str | None:
    """Why the test bed cannot be built here, or None when it can (probed once, then cached)."""
    if prefix not in _SKIP_CACHE:
        _SKIP_CACHE[prefix] = _probe(prefix)
    return _SKIP_CACHE[prefix]


def _probe(prefix: str) -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add, veth, tc)"
    for tool in ("ip", "tc", "unshare", "hostname", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (iproute2 / util-linux needed for the two-host test bed)"
    ns = f"{prefix}_probe_{os.getpid()}"
    steps = [
        ("ip netns add", ["ip", "netns", "add", ns]),
        ("veth pair", ["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"]),
        ("tc clsact qdisc", ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "p0", "clsact"]),
        ("tc classic-BPF filter (direct-action)",
         ["ip", "netns", "exec", ns, "tc", "filter", "add", "dev", "p0", "egress", "bpf", "bytecode",
          DROP_IPV4_BYTECODE, "da"]),
        ("unshare --uts --mount",
         ["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "sh", "-c",
          "hostname probe && mount --bind /dev/null /etc/hosts && test \"$(hostname)\" = probe"]),
    ]
    try:
        for what, argv in steps:
            proc = _sh(argv, check=False)
            if proc.returncode != 0:
                lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
                detail = lines[-1] if lines else f"exit {proc.returncode}"
                return f"cannot build network namespaces here: {what} failed ({detail})"
    except NetnsError as e:
        return f"cannot build network namespaces here: {e}"
    finally:
        _delete_ns(ns)
    return None


@dataclass
class TwoHosts:
    """The test bed: host name -> namespace, addresses, the /etc/hosts file and the rsh agent."""

    namespaces: dict[str, str]
    workdir: Path
    hosts_file: Path
    agent: Path
    addrs: dict[str, dict[str, str]] = field(default_factory=lambda: {h: dict(a) for h, a in ADDRS.items()})

    def wrap(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as a command line that runs on ``host`` (its namespace, hostname, /etc/hosts)."""
        ns = self.namespaces[host]
        return ["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "sh", "-c", _HOST_WRAPPER,
                "host-wrapper", host, str(self.hosts_file), *argv]

    def popen_on(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
                 cwd: str | os.PathLike | None = None) -> subprocess.Popen:
        """Start ``argv`` on ``host`` in its own process group (stdout/stderr piped, text)."""
        return subprocess.Popen(self.wrap(host, argv), env=clean_env(env), cwd=cwd, text=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=_default_sigint)

    def run_on(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
               timeout: float = 60, cwd: str | os.PathLike | None = None) -> Result:
        """Run ``argv`` on ``host``; on timeout kill its process group and report ``timed_out``."""
        start = time.monotonic()
        proc = self.popen_on(host, argv, env=env, cwd=cwd)
        try:
            out, err = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            interrupt_then_kill(list(self.namespaces.values()), proc)
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a grandchild still holds the pipes
                out, err = "", "(output lost: pipes still held after kill)"
            timed_out = True
        except BaseException:
            interrupt_then_kill(list(self.namespaces.values()), proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=5)
            raise
        finally:
            _kill_group(proc)  # leftovers of a finished command (e.g. an orphaned daemon)
        return Result(list(argv), None if timed_out else proc.returncode, out or "", err or "",
                      time.monotonic() - start, timed_out)

    def cleanup_process(self, proc: subprocess.Popen) -> None:
        """Kill a process started by ``popen_on`` (its whole group) and reap it."""
        _kill_group(proc)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=5)

    def mpirun(self, argv: Sequence[str], hosts: Sequence[str] = HOSTS, iface: str = "ib0",
               extra: Sequence[str] = ()) -> list[str]:
        """An ``mpirun`` command line for one rank per host, Open MPI's own traffic pinned to ``iface``."""
        return ["mpirun", "--allow-run-as-root", "-np", str(len(hosts)), "--host", ",".join(hosts),
                "--mca", "plm_rsh_agent", str(self.agent),
                "--mca", "plm_rsh_no_tree_spawn", "1",
                "--mca", "oob_tcp_if_include", iface,
                "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", iface,
                *extra, *argv]

    def cleanup(self) -> None:
        interrupt_then_kill(list(self.namespaces.values()))
        for ns in self.namespaces.values():
            _delete_ns(ns)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _agent_script(namespaces: Mapping[str, str], hosts_file: Path) -> str:
    cases = "\n".join(f"  {shlex.quote(h)}) ns={shlex.quote(ns)} ;;" for h, ns in namespaces.items())
    return f"""#!/bin/sh
# Open MPI launch agent for the two-host test bed, in place of ssh:
#   AGENT [ssh-style options] HOST COMMAND...
# Enters HOST's network namespace, gives the command HOST's hostname and /etc/hosts, and runs
# COMMAND the way sshd would: its words joined and handed to `sh -c`. The environment
# (PATH, the venv, OMPI_ALLOW_RUN_AS_ROOT...) passes through unchanged.
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i|-F) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || {{ echo "netns agent: usage: $0 HOST COMMAND..." >&2; exit 255; }}
host=${{1%%.*}}
shift
case "$host" in
{cases}
  *) echo "netns agent: unknown host '$host'" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts --mount sh -c {shlex.quote(_HOST_WRAPPER)} netns-agent \\
  "$host" {shlex.quote(str(hosts_file))} sh -c "$*"
"""


@contextlib.contextmanager
def two_hosts(prefix: str = "dsb") -> Iterator[TwoHosts]:
    """Build hosta/hostb (see the module docstring), yield them, always tear them down."""
    remove_stale(prefix)
    pid = os.getpid()
    namespaces = {"hosta": f"{prefix}_a_{pid}", "hostb": f"{prefix}_b_{pid}"}
    workdir = Path(tempfile.mkdtemp(prefix=f"{prefix}_netns_"))
    hosts_file = workdir / "hosts"
    agent = workdir / "agent.sh"
    bed = TwoHosts(namespaces, workdir, hosts_file, agent)
    a, b = namespaces["hosta"], namespaces["hostb"]
    restore = _raise_on_sigterm()
    try:
        hosts_file.write_text("127.0.0.1\tlocalhost\n"
                              + "".join(f"{ADDRS[h]['eth0']}\t{h}\n" for h in HOSTS))
        agent.write_text(_agent_script(namespaces, hosts_file))
        agent.chmod(0o755)
        for ns in (a, b):
            _sh(["ip", "netns", "add", ns])
        # eth0 first: lower ifindex, so `hostname -I` lists 10.77.0.x first.
        for link in ("eth0", "ib0"):
            _sh(["ip", "link", "add", link, "netns", a, "type", "veth", "peer", "name", link, "netns", b])
        for host, ns in namespaces.items():
            _sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            for link in ("eth0", "ib0"):
                _sh(["ip", "-n", ns, "addr", "add", f"{ADDRS[host][link]}/24", "dev", link])
                _sh(["ip", "-n", ns, "link", "set", link, "up"])
            _sh(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "clsact"])
            for direction in ("ingress", "egress"):
                _sh(["ip", "netns", "exec", ns, "tc", "filter", "add", "dev", "eth0", direction,
                     "bpf", "bytecode", DROP_IPV4_BYTECODE, "da"])
        yield bed
    finally:
        bed.cleanup()
        restore()


SWITCHED_HOSTS = ("hosta", "hostb", "hostc")


@contextlib.contextmanager
def switched_hosts(prefix: str = "dsb") -> Iterator[TwoHosts]:
    """Three hosts, each with one ``ib0`` (10.78.0.1-3/24) on a bridge in a fourth namespace (the
    switch); the node names resolve to the ib0 addresses. ``shape_link`` makes one host's cable slow.
    Yields the same bed object as ``two_hosts`` (``run_on``, ``mpirun``, the agent)."""
    remove_stale(prefix)
    pid = os.getpid()
    namespaces = {h: f"{prefix}_{h[-1]}_{pid}" for h in SWITCHED_HOSTS}
    switch = f"{prefix}_sw_{pid}"
    workdir = Path(tempfile.mkdtemp(prefix=f"{prefix}_netns_"))
    addrs = {h: {"ib0": f"{IB_NET}.{i + 1}"} for i, h in enumerate(SWITCHED_HOSTS)}
    bed = TwoHosts({**namespaces}, workdir, workdir / "hosts", workdir / "agent.sh", addrs)
    restore = _raise_on_sigterm()
    try:
        bed.hosts_file.write_text("127.0.0.1\tlocalhost\n" + "".join(f"{a['ib0']}\t{h}\n" for h, a in addrs.items()))
        bed.agent.write_text(_agent_script(namespaces, bed.hosts_file))
        bed.agent.chmod(0o755)
        _sh(["ip", "netns", "add", switch])
        bed.namespaces["switch"] = switch  # torn down with the hosts
        _sh(["ip", "-n", switch, "link", "add", "br0", "type", "bridge"])
        _sh(["ip", "-n", switch, "link", "set", "br0", "up"])
        for host, ns in namespaces.items():
            _sh(["ip", "netns", "add", ns])
            _sh(["ip", "link", "add", "ib0", "netns", ns, "type", "veth", "peer", "name", f"port_{host}",
                 "netns", switch])
            _sh(["ip", "-n", switch, "link", "set", f"port_{host}", "master", "br0"])
            _sh(["ip", "-n", switch, "link", "set", f"port_{host}", "up"])
            _sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            _sh(["ip", "-n", ns, "addr", "add", f"{addrs[host]['ib0']}/24", "dev", "ib0"])
            _sh(["ip", "-n", ns, "link", "set", "ib0", "up"])
        yield bed
    finally:
        bed.cleanup()
        restore()


def shape_link(bed: TwoHosts, host: str, rate: str) -> None:
    """Limit ``host``'s cable to ``rate`` (e.g. ``200mbit``) both ways: a token-bucket qdisc on its
    ib0 and on its switch port (tc tbf shapes egress only)."""
    for ns, dev in ((bed.namespaces[host], "ib0"), (bed.namespaces["switch"], f"port_{host}")):
        _sh(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
             "burst", "256kb", "latency", "100ms"])


def _raise_on_sigterm():
    """While the bed exists, SIGTERM raises (so ``finally`` deletes the namespaces); returns an undo."""
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


# A tiny TCP probe usable as `python -c` on a host: listen, or try to connect once.
LISTEN_CODE = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(8); s.settimeout(float(sys.argv[2]))
print("listening", flush=True)
try:
    while True:
        c, _ = s.accept(); c.close()
except OSError:
    pass
"""

CONNECT_CODE = """
import socket, sys, time
t = time.monotonic()
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print(f"connected {time.monotonic() - t:.2f}")
except OSError as e:
    print(f"failed {time.monotonic() - t:.2f} {e!r}")
"""

"""A real Slurm cluster on the two-host test bed (``tests/netns.py``; needs root).

``slurm_cluster(bed)`` starts, for the bed it is given:

- one ``munged`` (its own key, socket, pid and log files in the bed's folder; a path socket, so every
  namespace reaches it), run as the ``munge`` user;
- ``slurmctld`` on ``hosta`` (the controller and the login node: clients run there);
- one ``slurmd`` per host, each in its own network namespace with its own host name, spool, pid and log
  files (``%n`` in ``slurm.conf``); the nodes' addresses are their IB-named links (``NodeAddr``), as a
  cluster's admins would set them where the node names resolve to a blocked Ethernet port;

and stops all of them on the way out (error, timeout or Ctrl-C): no daemon is left running and every wait
is bounded. ``ensure_installed`` installs ``slurm-wlm`` and ``munge`` through apt when they are missing
(root), as ``tools/setup.sh`` does for Open MPI.

    with two_hosts("dsbs") as bed, slurm_cluster(bed) as slurm:
        slurm.run(["sbatch", "--wait", ...])   # a client command, on hosta, with SLURM_CONF set

Slurm 22.05 (Debian's), ``proctrack/linuxproc`` and ``task/none`` (no cgroups here), no accounting
database: a finished job's state is read from ``scontrol show job`` (kept ``MinJobAge`` seconds).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.netns import Result, TwoHosts, clean_env, skip_reason, two_hosts

CONTROLLER = "hosta"
PARTITION = "bed"
DAEMONS = ("slurmctld", "slurmd", "munged")
_START_S = 30.0  # the controller and nodes answer within ~3 s here


class SlurmBedError(RuntimeError):
    """A daemon did not start, or a client command failed during set-up."""


def missing_tools() -> list[str]:
    return [t for t in ("slurmctld", "slurmd", "sbatch", "munged") if shutil.which(t) is None]


def ensure_installed() -> str | None:
    """None when Slurm and munge are there (installing them through apt when missing and root), else why not."""
    if not missing_tools():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"Slurm not installed ({', '.join(missing_tools())} missing) and cannot apt-get install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "slurm-wlm", "munge"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0:  # a stale package index: refresh once
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=300, env=env)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    still = missing_tools()
    return f"apt-get install slurm-wlm munge failed: {proc.stderr.strip()[-300:]}" if still else None


def slurm_conf(workdir: Path, bed: TwoHosts, hosts: Sequence[str], cpus: int = 2, slurmd_timeout: int = 10,
               node_options: Mapping[str, str] | None = None, partitions: Mapping[str, str] | None = None) -> str:
    """The cluster's ``slurm.conf``: ``hosta`` controls, every host is a node addressed by its ib0; ``node_options``:
    more of a node's line (``Gres=gpu:h100:2``, ``Features=avx2``); ``partitions``: more partitions, name -> nodes."""
    node_options = node_options or {}
    nodes = "\n".join(f"NodeName={h} NodeAddr={bed.addrs[h]['ib0']} CPUs={cpus} RealMemory=8000 State=UNKNOWN "
                      f"{node_options.get(h, '')}".rstrip() for h in hosts)
    nodes += "".join(f"\nPartitionName={name} Nodes={members} MaxTime=INFINITE State=UP"
                     for name, members in (partitions or {}).items())
    gres = "GresTypes=gpu\n" if any("Gres=" in o for o in node_options.values()) else ""
    return f"""\
ClusterName=dsbbed
SlurmctldHost={CONTROLLER}({bed.addrs[CONTROLLER]['ib0']})
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={workdir}/munge/munge.sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
StateSaveLocation={workdir}/state
SlurmdSpoolDir={workdir}/spool/%n
SlurmctldPidFile={workdir}/slurmctld.pid
SlurmdPidFile={workdir}/slurmd.%n.pid
SlurmctldLogFile={workdir}/slurmctld.log
SlurmdLogFile={workdir}/slurmd.%n.log
ReturnToService=2
SlurmdTimeout={slurmd_timeout}
SlurmctldTimeout=10
MessageTimeout=10
KillWait=30
MinJobAge=3600
InactiveLimit=0
SchedulerParameters=sched_interval=2
{gres}{nodes}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmBed:
    """The running cluster: ``run`` a client command on the login node, ``env`` for commands that submit."""

    bed: TwoHosts
    workdir: Path
    conf: Path
    hosts: tuple[str, ...]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf), **(extra or {})}

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 30,
            cwd: str | os.PathLike | None = None, host: str = CONTROLLER) -> Result:
        """``argv`` on ``host``, in ``cwd`` or else the bed's folder: a job submitted there without ``--output``
        leaves Slurm's default ``slurm-<id>.out`` with the bed, not in the repository the suite runs from."""
        return self.bed.run_on(host, argv, env=self.env(env), timeout=timeout, cwd=self.workdir if cwd is None else cwd)

    def check(self, argv: Sequence[str], timeout: float = 30) -> str:
        res = self.run(argv, timeout=timeout)
        if res.returncode != 0:
            raise SlurmBedError(res.explain())
        return res.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o``'s fields (JobState, Reason, ExitCode, NodeList...)."""
        from ds_bench.jobs.slurm_batch import parse_fields

        return parse_fields(self.check(["scontrol", "show", "job", "-o", job_id]))

    def wait_job(self, job_id: str, timeout: float) -> dict[str, str]:
        """The job's fields once it has left PENDING/RUNNING/COMPLETING (raises after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
                return fields
            if time.monotonic() > deadline:
                raise SlurmBedError(f"job {job_id} still {fields.get('JobState')} after {timeout:.0f} s")
            time.sleep(0.5)

    def node_states(self) -> dict[str, str]:
        out = self.check(["sinfo", "-h", "-N", "-o", "%N %t"])
        return dict(line.split() for line in out.splitlines() if line.strip())

    def logs(self) -> str:
        """The daemons' log tails, for a failing test's message."""
        parts = []
        for log in sorted(self.workdir.glob("*.log")):
            text = log.read_text(errors="replace")
            parts.append(f"--- {log.name}\n{text[-3000:]}")
        return "\n".join(parts)

    def restart_slurmd(self, host: str, timeout: float = 40) -> None:
        """A fresh slurmd for ``host`` after its crash (its node returns to service: ReturnToService=2); stopped
        with the bed (``running_daemons``)."""
        _start_slurmd(self.bed, self.workdir, host)
        deadline = time.monotonic() + timeout
        while self.node_states().get(host) != "idle":
            if time.monotonic() > deadline:
                raise SlurmBedError(f"{host} not idle {timeout:.0f} s after its slurmd restarted\n{self.logs()}")
            time.sleep(1)

    def slurmd_pid(self, host: str) -> int | None:
        try:
            return int((self.workdir / f"slurmd.{host}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None


def _start_munged(workdir: Path) -> subprocess.Popen:
    for folder in (workdir.parent, workdir):  # munged checks every folder above its own (mkdtemp's is 0700)
        folder.chmod(0o755)
    munge_dir = workdir / "munge"
    munge_dir.mkdir(mode=0o700)
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    user = pwd.getpwnam("munge")
    for path in (munge_dir, key):
        os.chown(path, user.pw_uid, user.pw_gid)
    munge_dir.chmod(0o755)  # clients (root) reach the socket
    argv = ["runuser", "-u", "munge", "--", "munged", "--foreground", "--force",
            f"--socket={munge_dir}/munge.sock", f"--key-file={key}", f"--pid-file={munge_dir}/munged.pid",
            f"--log-file={munge_dir}/munged.log", f"--seed-file={munge_dir}/munged.seed"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(workdir / "munged.log", "ab"), start_new_session=True)
    _wait_for(lambda: (munge_dir / "munge.sock").exists(), "munged's socket", proc)
    return proc


def _cgroup_mounts() -> str:
    """Shell commands that mount this machine's cgroup hierarchies again under /sys/fs/cgroup.

    ``ip netns exec`` mounts a fresh sysfs on /sys, which hides them, and slurmd will not start without its
    cgroup plugin (even with ``proctrack/linuxproc`` and ``task/none``). Mounting a hierarchy again with the
    same options shares it; this happens in the daemon's own mount namespace only."""
    lines = ["mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup"]
    for entry in Path("/proc/self/mounts").read_text().splitlines():
        _, target, fstype, opts, *_ = entry.split()
        if target.startswith("/sys/fs/cgroup/") and fstype in ("cgroup", "cgroup2"):
            keep = ",".join(o for o in opts.split(",") if o not in ("rw", "relatime", "nosuid", "nodev", "noexec"))
            lines.append(f"mkdir -p {target} && mount -t {fstype} {'-o ' + keep if keep else ''} {fstype} {target}")
    return " && ".join(lines)


def _start_daemon(bed: TwoHosts, host: str, argv: Sequence[str], log: Path) -> subprocess.Popen:
    script = f"{_cgroup_mounts()} && exec \"$@\""
    with open(log, "ab") as out:
        return subprocess.Popen(bed.wrap(host, ["sh", "-c", script, "daemon", *argv]), env=clean_env(),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _wait_for(ready, what: str, proc: subprocess.Popen | None = None, timeout: float = _START_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise SlurmBedError(f"{what}: the daemon exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise SlurmBedError(f"{what}: not ready after {timeout:.0f} s")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _kill_leftovers(workdir: Path, timeout: float = 10) -> None:
    """SIGKILL the daemons still running (one forked away from its group, or a slurmd ``restart_slurmd`` started
    apart from the bed's) and wait until they are gone: a killed process lingers for a moment, and the bed's
    check that none outlived it ran into one (full tier, 2026-11-29)."""
    import psutil

    left = []
    for line in running_daemons(workdir):
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(int(line.split()[1]))
            process.kill()
            left.append(process)
    psutil.wait_procs(left, timeout=timeout)


def running_daemons(workdir: Path) -> list[str]:
    """``name pid`` of each daemon process whose command line names ``workdir`` (none after the bed stops)."""
    import psutil

    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["name"] in DAEMONS and str(workdir) in cmd:
            found.append(f"{p.info['name']} {p.pid}")
    return found


@contextlib.contextmanager
def slurm_cluster(bed: TwoHosts, hosts: Sequence[str] = ("hosta", "hostb"), cpus: int = 2,
                  slurmd_timeout: int = 10, node_options: Mapping[str, str] | None = None,
                  partitions: Mapping[str, str] | None = None, gres: Mapping[str, str] | None = None
                  ) -> Iterator[SlurmBed]:
    """Start munged, slurmctld (on hosta) and a slurmd per host of ``bed``; yield; stop them all. ``node_options``
    and ``partitions``: ``slurm_conf``'s; ``gres``: a node's ``gres.conf`` lines (``Name=gpu Type=h100 Count=2``:
    GPUs Slurm counts without devices behind them, as a node record says)."""
    workdir = bed.workdir / "slurm"
    for sub in ("state", *(f"spool/{h}" for h in hosts)):
        (workdir / sub).mkdir(parents=True)
    conf = workdir / "slurm.conf"
    conf.write_text(slurm_conf(workdir, bed, hosts, cpus, slurmd_timeout, node_options, partitions))
    cluster = SlurmBed(bed, workdir, conf, tuple(hosts))
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_start_munged(workdir))
        procs.append(_start_daemon(bed, CONTROLLER, ["slurmctld", "-D", "-i", "-f", str(conf)],
                                   workdir / "slurmctld.out"))
        for host in hosts:
            node_conf = _node_conf(workdir, conf, host)
            if gres and host in gres:
                _gres_conf(node_conf.parent, host, gres[host])
            procs.append(_start_slurmd(bed, workdir, host))
        _wait_for(lambda: _all_idle(cluster), "the nodes to come up idle", timeout=_START_S)
        yield cluster
    except SlurmBedError as e:
        raise SlurmBedError(f"{e}\n{cluster.logs()}") from None
    finally:
        for proc in reversed(procs):
            _stop(proc)
        _kill_leftovers(workdir)


@contextlib.contextmanager
def module_bed(prefix: str, **options) -> Iterator[SlurmBed]:
    """A test module's cluster: the two-host bed (network namespaces named from ``prefix``) running Slurm
    (``slurm_cluster``'s ``options``), the module skipped with the reason where namespaces or Slurm cannot be had;
    no daemon may outlive it."""
    reason = skip_reason(prefix) or ensure_installed()
    if reason:
        pytest.skip(reason)
    with two_hosts(prefix) as bed:
        with slurm_cluster(bed, **options) as cluster:
            yield cluster
        assert running_daemons(cluster.workdir) == [], "a Slurm daemon outlived the bed"


def _start_slurmd(bed: TwoHosts, workdir: Path, host: str) -> subprocess.Popen:
    """``host``'s slurmd, in its namespace, reading its own copy of the configuration (``_node_conf``)."""
    conf = workdir / "etc" / host / "slurm.conf"
    return _start_daemon(bed, host, ["slurmd", "-D", "-f", str(conf), "-N", host], workdir / f"slurmd.{host}.out")


def _node_conf(workdir: Path, conf: Path, host: str) -> Path:
    """A node's own copy of ``slurm.conf`` beside an ``mpi.conf`` that gives its PMIx folders a base of their
    own: the hosts share one /tmp here, and two slurmstepds of one step would both create
    ``/tmp/spmix_appdir_<uid>_<job>.<step>``."""
    folder = workdir / "etc" / host
    (workdir / "pmix" / host).mkdir(parents=True)
    folder.mkdir(parents=True)
    shutil.copy(conf, folder / "slurm.conf")
    (folder / "mpi.conf").write_text(f"PMIxCliTmpDirBase={workdir}/pmix/{host}\n")
    return folder / "slurm.conf"


def _gres_conf(folder: Path, host: str, line: str) -> None:
    """``host``'s gres.conf: ``line`` (``Name=gpu Type=h100 Count=2``) with a ``File`` per GPU, since slurmd counts
    GPUs by their device files: character devices that are /dev/null's (1, 3), named ``nvidia<i>`` as Slurm
    expects."""
    count = int(line.split("Count=")[1].split()[0])
    devices = folder / "dev"
    devices.mkdir()
    for i in range(count):
        os.mknod(devices / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    files = f"{devices}/nvidia[0-{count - 1}]" if count > 1 else f"{devices}/nvidia0"
    (folder / "gres.conf").write_text(f"NodeName={host} {line} File={files}\n")


def _all_idle(cluster: SlurmBed) -> bool:
    res = cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10)
    states = dict(line.split() for line in res.stdout.splitlines() if len(line.split()) == 2)
    return res.returncode == 0 and all(states.get(h) == "idle" for h in cluster.hosts)

#!/usr/bin/env bash
# Two "hosts" in network namespaces (tests/netns.py: eth0 drops IPv4 and is first in `hostname -I`,
# ib0 works), then ds_bench under mpirun, one rank per host, with any extra ds_bench arguments.
# Needs root. Namespaces are removed on exit, Ctrl-C included.
#   run_scripts/netns_demo.sh                 # rendezvous picks ib0 by itself: should succeed
#   run_scripts/netns_demo.sh --iface eth0    # the control: should fail within --connect-timeout
#   DRY_RUN=1 run_scripts/netns_demo.sh       # print what it would do and run; create nothing
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
exec "$PY" - "$@" <<'PY'
import os, shlex, sys, tempfile
from pathlib import Path
from tests.netns import TwoHosts, skip_reason, two_hosts

def command(bed, results):
    return bed.mpirun([sys.executable, "-m", "ds_bench", "run", "--workload", "mnist",
                       "--ds-config", "ds_configs/zero0.json", "--steps", "4", "--warmup", "1",
                       "--results", str(results), "--connect-timeout", "5s", "--dist-timeout", "60s",
                       *sys.argv[1:]])

if os.environ.get("DRY_RUN"):
    work = Path("NETNS_WORKDIR")
    bed = TwoHosts({"hosta": "dsbdemo_a_PID", "hostb": "dsbdemo_b_PID"}, work, work / "hosts", work / "agent.sh")
    print("# would create network namespaces dsbdemo_a_PID (hosta) and dsbdemo_b_PID (hostb) with eth0 "
          "(IPv4 dropped) and ib0 (tests/netns.py two_hosts), then run in hosta:")
    print(shlex.join(command(bed, "NETNS_WORKDIR/results.jsonl")))
    sys.exit(0)
reason = skip_reason()
if reason:
    sys.exit(f"netns_demo: {reason}")
results = Path(tempfile.mkdtemp(prefix="netns_demo_")) / "results.jsonl"
with two_hosts("dsbdemo") as bed:
    r = bed.run_on("hosta", command(bed, results), timeout=120, cwd=".")
    print(r.explain())
    print(f"--- {results}\n{results.read_text() if results.exists() else '(no record)'}")
    sys.exit(1 if r.timed_out else r.returncode)
PY

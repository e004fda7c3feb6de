#!/usr/bin/env bash
# Two "hosts" in network namespaces (tests/netns.py: eth0 drops IPv4 and is first in `hostname -I`,
# ib0 works), then ds_bench under mpirun, one rank per host, with any extra ds_bench arguments.
# Needs root. Namespaces are removed on exit, Ctrl-C included.
#   run_scripts/netns_demo.sh                 # rendezvous picks ib0 by itself: should succeed
#   run_scripts/netns_demo.sh --iface eth0    # the control: should fail within --connect-timeout
set -u
cd "$(dirname "$0")/.."
exec .venv/bin/python - "$@" <<'PY'
import sys, tempfile
from pathlib import Path
from tests.netns import skip_reason, two_hosts

reason = skip_reason()
if reason:
    sys.exit(f"netns_demo: {reason}")
results = Path(tempfile.mkdtemp(prefix="netns_demo_")) / "results.jsonl"
with two_hosts("dsbdemo") as bed:
    argv = bed.mpirun([sys.executable, "-m", "ds_bench", "run", "--workload", "mnist",
                       "--ds-config", "ds_configs/zero0.json", "--steps", "4", "--warmup", "1",
                       "--results", str(results), "--connect-timeout", "5", "--dist-timeout", "60",
                       *sys.argv[1:]])
    r = bed.run_on("hosta", argv, timeout=120, cwd=".")
    print(r.explain())
    print(f"--- {results}\n{results.read_text() if results.exists() else '(no record)'}")
    sys.exit(1 if r.timed_out else r.returncode)
PY

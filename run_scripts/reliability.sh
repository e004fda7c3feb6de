#!/usr/bin/env bash
# Exit hygiene at scale: N consecutive 2-rank CPU runs, rotating torchrun, the deepspeed launcher
# and Open MPI's mpirun over ZeRO stages 0-3 (every launcher x stage pair once in 12 runs). A run
# counts as failed when it exits non-zero (e.g. the SIGABRT-at-shutdown crash of stock gloo runs)
# or when it did not append exactly one whole, parseable `ok` record to the results file.
#   run_scripts/reliability.sh [N=40] [RESULTS=/tmp/ds_bench_reliability.jsonl]
# Print the commands only, run nothing: DRY_RUN=1 run_scripts/reliability.sh
set -u
n=${1:-40}
results=${2:-/tmp/ds_bench_reliability.jsonl}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$here/.venv/bin
export PATH="$bin:$PATH"
cd "$here"
failures=0
count_ok() {  # whole `ok` records in the results file; -1 when any line is torn
  "$bin/python" - "$results" <<'PY' || echo -1
import json, os, sys
path, ok = sys.argv[1], 0
if os.path.exists(path):
    for line in open(path, encoding="utf-8"):
        ok += json.loads(line)["status"] == "ok"  # a torn line raises
print(ok)
PY
}
for i in $(seq 1 "$n"); do
  stage=$(( (i / 3) % 4 ))
  args=(run --workload mnist --ds-config "ds_configs/zero${stage}.json" --set bf16.enabled=false
        --steps 8 --warmup 2 --results "$results")
  case $(( i % 3 )) in
    0) cmd=(torchrun --nproc_per_node 2 --master_port $((29600 + i % 50)) -m ds_bench "${args[@]}") ;;
    1) cmd=(deepspeed --num_gpus 2 --master_port $((29650 + i % 50)) --module ds_bench "${args[@]}") ;;
    2) cmd=(mpirun --allow-run-as-root --oversubscribe -np 2 -x PATH "$bin/python" -m ds_bench "${args[@]}") ;;
  esac
  if [ -n "${DRY_RUN:-}" ]; then echo "${cmd[*]}"; continue; fi
  before=$(count_ok)
  "${cmd[@]}" >/tmp/ds_bench_reliability_run.log 2>&1
  rc=$?
  after=$(count_ok)
  if (( rc != 0 || after != before + 1 )); then
    failures=$((failures + 1)); cp /tmp/ds_bench_reliability_run.log "/tmp/ds_bench_reliability_fail_$i.log"
  fi
  echo "run $i: ${cmd[0]} zero$stage exit $rc, ok records $before -> $after"
done
if [ -n "${DRY_RUN:-}" ]; then echo "DRY_RUN: $n commands printed, nothing run"; exit 0; fi
echo "reliability: $n runs, $failures failed (non-zero exit or not exactly one new whole ok record)"
(( failures == 0 ))

#!/usr/bin/env bash
# Exit-code reliability: N consecutive 2-rank CPU runs, alternating torchrun and the deepspeed
# launcher over ZeRO stages 0-3; prints each exit code and the failure count. Any non-zero exit
# (e.g. the SIGABRT-at-shutdown crash of stock gloo runs) counts as a failure.
#   run_scripts/reliability.sh [N=40] [RESULTS=/tmp/ds_bench_reliability.jsonl]
# Print the commands only: DRY_RUN=1 run_scripts/reliability.sh
set -u
n=${1:-40}
results=${2:-/tmp/ds_bench_reliability.jsonl}
bin=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin
export PATH="$bin:$PATH"
failures=0
for i in $(seq 1 "$n"); do
  stage=$(( i % 4 ))
  args=(run --workload mnist --ds-config "ds_configs/zero${stage}.json" --steps 8 --warmup 2 --results "$results")
  if (( i % 2 )); then
    cmd=(torchrun --nproc_per_node 2 --master_port $((29600 + i % 50)) -m ds_bench "${args[@]}")
  else
    cmd=(deepspeed --num_gpus 2 --master_port $((29650 + i % 50)) --module ds_bench "${args[@]}")
  fi
  if [ -n "${DRY_RUN:-}" ]; then echo "${cmd[*]}"; continue; fi
  "${cmd[@]}" >/tmp/ds_bench_reliability_run.log 2>&1
  rc=$?
  (( rc == 0 )) || { failures=$((failures + 1)); cp /tmp/ds_bench_reliability_run.log "/tmp/ds_bench_reliability_fail_$i.log"; }
  echo "run $i: ${cmd[0]} zero$stage exit $rc"
done
echo "reliability: $n runs, $failures failed"
(( failures == 0 ))

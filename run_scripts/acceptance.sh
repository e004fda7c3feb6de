#!/usr/bin/env bash
# A new allocation's acceptance run, one command: doctor -> comm --pairs -> scaling -> a short sweep ->
# report --html (with the expectations file). Every step runs even when one before it failed (a failure is
# a result the report shows); the exit code is 1 when a step failed or an expectation was not met.
#   bash run_scripts/acceptance.sh                 # here: 2 CPU ranks under torchrun, MNIST, ~3 min
#   DRY_RUN=1 bash run_scripts/acceptance.sh       # print the five commands, run nothing
#   sbatch run_scripts/acceptance.sbatch           # a Slurm allocation (sets the variables below)
# An upgrade's acceptance (docs/stacks.md): STACKS="--deepspeed installed,0.19.8" runs the sweep on the current
# and the candidate stack, adds `ds-bench compare --stacks` (exit 1: a layout slower, or its losses or gradient
# norms different) and the report's Stacks section, each layout's verdict.
set -uo pipefail
cd "$(dirname "$0")/.."

# --- what the .sbatch (or you) may set --------------------------------------------------------
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-results/acceptance-$(date +%Y%m%d-%H%M%S)}
EXPECT=${EXPECT:-docs/expect.cpu.yaml}  # the sbatch sets docs/expect.example.yaml
RANKS_LAUNCH=${RANKS_LAUNCH:-"torchrun --nproc-per-node 2 --master-port 29620"}  # ds-bench launch ARGS -- doctor/comm
COMM_ARGS=${COMM_ARGS:-"--collectives all_reduce,all_gather --min-bytes 64KiB --max-bytes 4MiB --iters 10"}
WORKLOAD=${WORKLOAD:-mnist}
DS_CONFIG=${DS_CONFIG:-ds_configs/zero1.json}
SCALING_ARGS=${SCALING_ARGS:-"--ranks 1,2 --launcher torchrun --master-port 29621"}
SWEEP_ARGS=${SWEEP_ARGS:-"--stages 1,2 --micro-batch 16,32 --precision fp32 --launcher torchrun --master-port 29622"}
RUN_ARGS=${RUN_ARGS:-"--steps 12 --warmup 3"}
STACKS=${STACKS:-}  # e.g. "--deepspeed installed,0.19.8" (--torch, --transformers likewise): the upgrade's sweep
# ----------------------------------------------------------------------------------------------

case "$PYTHON" in */*) export PATH="$(cd "$(dirname "$PYTHON")" && pwd):$PATH" ;; esac  # its launchers too
ds=("$PYTHON" -m ds_bench)
steps=(
  "${ds[*]} launch $RANKS_LAUNCH -- doctor --json $OUT/doctor.jsonl"
  "${ds[*]} launch $RANKS_LAUNCH -- comm --pairs $COMM_ARGS --results $OUT/comm.jsonl"
  "${ds[*]} scaling --workload $WORKLOAD --ds-config $DS_CONFIG $SCALING_ARGS --results $OUT/scaling.jsonl -- $RUN_ARGS"
  "${ds[*]} sweep --workload $WORKLOAD --ds-config $DS_CONFIG $SWEEP_ARGS${STACKS:+ $STACKS} --results $OUT/sweep.jsonl $RUN_ARGS"
)
[ -z "$STACKS" ] || steps+=("${ds[*]} compare $OUT/sweep.jsonl --stacks --html $OUT/upgrade.html")
report="${ds[*]} report --html $OUT/acceptance.html --expect $EXPECT $OUT/doctor.jsonl $OUT/comm.jsonl $OUT/scaling.jsonl $OUT/sweep.jsonl"

if [ -n "${DRY_RUN:-}" ]; then
  printf '%s\n' "${steps[@]}" "$report"
  exit 0
fi
mkdir -p "$OUT"
failed=0
for step in "${steps[@]}"; do
  echo "[acceptance] $step"
  $step || { echo "[acceptance] exit $? (the report shows why)"; failed=1; }
done
for f in doctor comm scaling sweep; do touch "$OUT/$f.jsonl"; done  # a step that wrote nothing: an empty file
echo "[acceptance] $report"
$report || failed=1
echo "[acceptance] report: $OUT/acceptance.html"
exit $failed

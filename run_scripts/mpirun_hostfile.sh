#!/bin/bash
# Open MPI across the hosts of a DeepSpeed hostfile (one rank per slot); ranks found through
# OMPI_COMM_WORLD_* + mpi4py, Open MPI's traffic and the rendezvous pinned to IFACE.
#   run_scripts/mpirun_hostfile.sh
#   DRY_RUN=1 run_scripts/mpirun_hostfile.sh                          # print the command only

# --- edit these -------------------------------------------------------------------------------
HOSTFILE=${HOSTFILE:-hostfiles/example_2nodes_4gpus}
INCLUDE=${INCLUDE:-}           # DeepSpeed syntax, e.g. node01@node02
IFACE=${IFACE:-}                # the interface that connects the nodes, e.g. ib0; empty or unset: ds_bench chooses
WORKLOAD=${WORKLOAD:-resnet}
DS_CONFIG=${DS_CONFIG:-ds_configs/zero2.json}
EXTRA=${EXTRA:-"--size resnet50 --steps 50 --warmup 10"}
RESULTS=${RESULTS:-results/results.jsonl}
# ----------------------------------------------------------------------------------------------

args=(launch mpirun --hostfile "$HOSTFILE" ${INCLUDE:+--include "$INCLUDE"} ${IFACE:+--iface "$IFACE"}
      ${DRY_RUN:+--dry-run} -- run --workload "$WORKLOAD" --ds-config "$DS_CONFIG" --results "$RESULTS" $EXTRA)
exec "${PYTHON:-python}" -m ds_bench "${args[@]}"

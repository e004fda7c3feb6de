#!/bin/bash
# torchrun on every node (run this script once per node, NODE_RANK 0..NNODES-1, e.g. from
# `srun --ntasks-per-node=1 run_scripts/torchrun_multi_node.sh` where NODE_RANK=$SLURM_NODEID).
#   NODE_RANK=0 MASTER_ADDR=node01-ib run_scripts/torchrun_multi_node.sh
#   DRY_RUN=1 run_scripts/torchrun_multi_node.sh                      # print the command only

# --- edit these -------------------------------------------------------------------------------
NNODES=${NNODES:-${SLURM_NNODES:-2}}
NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-0}}
GPUS_PER_NODE=${GPUS_PER_NODE:-4}
MASTER_ADDR=${MASTER_ADDR:-node01}   # rank 0's host, by its InfiniBand name or address
MASTER_PORT=${MASTER_PORT:-29500}
IFACE=${IFACE:-}                # the interface that connects the nodes, e.g. ib0; empty or unset: ds_bench chooses
WORKLOAD=${WORKLOAD:-gpt2}
DS_CONFIG=${DS_CONFIG:-ds_configs/zero2.json}
EXTRA=${EXTRA:-"--size small --steps 50 --warmup 10"}
RESULTS=${RESULTS:-results/results.jsonl}
# ----------------------------------------------------------------------------------------------

args=(launch torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" --node-rank "$NODE_RANK"
      --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" ${IFACE:+--iface "$IFACE"} ${DRY_RUN:+--dry-run}
      -- run --workload "$WORKLOAD" --ds-config "$DS_CONFIG" --results "$RESULTS" $EXTRA)
exec "${PYTHON:-python}" -m ds_bench "${args[@]}"

"""``ds-bench plan``'s cluster flags (the device family, its figures, the NVLink domain, the host memory, this
cluster's records) and the device and ranks per node they give, checked before anything is computed: one line
naming the flag, exit 2."""

from __future__ import annotations

import argparse
import math

from ds_bench.config.parsers import flag_type, parse_memory
from ds_bench.errors import UserError
from ds_bench.machine.compute_node import ComputeNode
from ds_bench.perf.devices import DEVICES, device_row

CPU_RANKS = 2
"""Ranks per node a plan for ``--device cpu`` takes when neither ``--gpus-per-node`` nor ``--nproc`` is given."""


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    c = p.add_argument_group("the cluster (--nodes and --gpus-per-node: the Slurm group's flags)")
    c.add_argument("--device", default=None, help="device family for the peaks and memory: "
                   f"{', '.join(d.family for d in DEVICES.values())}, cpu (default: this machine's)")
    c.add_argument("--peak-tflops", type=float, default=None, help="dense peak TFLOP/s per device at --precision")
    c.add_argument("--device-memory", type=flag_type(parse_memory, "--device-memory"), default=None, metavar="SIZE",
                   help="memory per device with its unit, e.g. 80GiB (GiB = 2^30, GB = 10^9)")
    c.add_argument("--host-memory", type=flag_type(parse_memory, "--host-memory"), default=None, metavar="SIZE",
                   help="a node's host memory, which its GPUs' offloaded states share, e.g. 2TiB (default: the "
                        "device's host, 2 TiB; GB200 960 GiB)")
    c.add_argument("--nvlink-domain", type=int, default=None, metavar="GPUS",
                   help="GPUs one NVLink fabric joins, a multiple of --gpus-per-node: tensor, sequence and expert "
                        "groups inside it run at the intra-node busbw across hosts (default: the device's, GB200 "
                        "72 over hosts of 4; else one node)")
    c.add_argument("--achieved", type=float, default=None,
                   help="fraction of the peak a training step's compute achieves (default: the family's constant)")
    c.add_argument("--calibrate", action="append", default=[], metavar="FILE",
                   help="this cluster's own figures: a results file with roofline / comm / run records, or an "
                        "expectations file (repeatable; docs/plan.md)")


def device_and_ranks(args: argparse.Namespace, node: ComputeNode) -> tuple[str, bool, int]:
    """(the device family, whether it is CPU ranks, ranks per node): ``--device`` and ``--gpus-per-node``, else
    ``node``'s; the figures given beside them checked."""
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise UserError(f"--gpus-per-node {args.gpus_per_node}: the planned cluster's devices per node, at least 1 "
                        "(leave it out for --nproc, else this machine's GPUs, else 8)")
    if args.achieved is not None and not (math.isfinite(args.achieved) and 0 < args.achieved <= 1):
        raise UserError(f"--achieved must be in (0, 1], got {args.achieved}")
    if args.peak_tflops is not None and not (math.isfinite(args.peak_tflops) and args.peak_tflops > 0):
        raise UserError(f"--peak-tflops must be a positive number, got {args.peak_tflops}")
    device = args.device or _compute_device(node)
    cpu = device.lower() == "cpu"
    per_node = args.gpus_per_node or args.nproc or (CPU_RANKS if cpu else _gpus_per_node(args.device, device, node))
    _check_domain(args.nvlink_domain, per_node, cpu)
    if cpu and args.host_memory is not None:
        raise UserError("--host-memory: CPU ranks offload nothing (their states are in the host's memory already); "
                        "leave it out with --device cpu")
    return device, cpu, per_node


def _gpus_per_node(given: str | None, device: str, node: ComputeNode) -> int:
    """GPUs per node when ``--gpus-per-node`` is left out: the compute nodes' when the plan is for their own GPU
    (no ``--device``), else the named family's host (8; GB200's 4)."""
    row = device_row(device)
    if node.gpus and not given:
        return node.gpus
    return row.per_node if row else (node.gpus or 8)


def _check_domain(domain: int | None, per_node: int, cpu: bool) -> None:
    if domain is None:
        return
    if cpu:
        raise UserError(f"--nvlink-domain {domain}: CPU ranks have no NVLink; leave it out with --device cpu")
    if domain < per_node or domain % per_node:
        raise UserError(f"--nvlink-domain {domain}: GPUs one NVLink fabric joins, a whole number of nodes of "
                        f"--gpus-per-node {per_node} (e.g. {per_node * max(1, domain // per_node)})")


def _compute_device(node: ComputeNode) -> str:
    """``--device``'s default: the compute nodes' GPU (this machine's, or Slurm's GRES type), else ``cpu``."""
    if not node.gpus:
        return "cpu"
    if node.gpu_name is None:
        raise UserError(f"--device: {node.where} has GPUs of a type {node.source} does not name; give it, e.g. "
                        "--device H100")
    return node.gpu_name

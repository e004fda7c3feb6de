"""What the performance model knows of a device family and of a cluster of them (pure).

A ``Device`` row is a family's datasheet (memory, HBM bandwidth; the dense peaks are ``measure.peaks``'), the
nccl-tests-level bus bandwidth of its nodes (``intra_busbw_GBps``: all ranks of one node; ``nic_GBps``: the
inter-node share of one GPU, busbw a cross-node group reaches per rank it has on each node), the fraction of
peak its training matmuls achieve (``achieved``: one constant per family, docs/plan.md says from which runs)
and what a process holds beyond the model (``reserve_bytes``: CUDA context, NCCL buffers, allocator slack).
A ``Cluster`` is N nodes of G of them, each figure either the family's or this cluster's own measurement
(``ds_bench.perf.calibrate``), with where each came from. A cluster from a family's datasheet and the dense peak
table is ``perf.datasheet.cluster_of``'s (this module reads nothing of ``measure/``: a study rebuilding a recorded
cluster, the sweep's ``--prune-predicted``, stays off the run path).

Figures and their sources (docs/plan.md, "Hardware"; ``perf/published_runs.yaml``'s ``hardware:`` quotes them):
memory and HBM bandwidth, the NVIDIA V100, A100, H100, H200 and AMD MI300X datasheets; intra-node busbw,
all_reduce over one node's GPUs: 8 H100 ~480 GB/s with NVLS (NVIDIA/nccl-tests#212, #290), 8 A100 80GB
~200 GB/s (nccl-tests#149), 4 V100 SXM2 16GB 125 GB/s (BigScience's all_reduce_bench on a Jean Zay node,
bigscience experiments/bandwidth/single_node_16gb_all_reduce_bench.txt); per-GPU network, the node's
InfiniBand/Omni-Path rate shared by its GPUs at ~90% of line rate (NDR 400 Gb/s: 46-48 GB/s per NIC,
nccl-tests#290).

The 2026 parts (none has a published training run here, so none has a fitted ``achieved``: the NVIDIA ones take
the H100's, MI355X the MI300X's; give ``--achieved`` or ``--calibrate`` a run record of yours):
- **B200** (HGX, 8 per host): 179 GiB usable (nvidia-smi's total on an HGX B200, docs.vultr.com's hardware
  overview; 192 GiB of HBM3e built, glennklockwood.com/garden/processors/B200), 8 TB/s; all_reduce busbw over
  8 B200 830 GB/s measured (NVIDIA/nccl#1807: "Ours is 830+"), NVLink 5 at 900 GB/s a direction; one 400 Gb/s
  ConnectX-7 per GPU (NVIDIA/nccl-tests#389's 8xB200 nodes) at 90%; host copies at 50 GB/s, 40% of PCIe Gen6
  x16's 128 GB/s a direction (as the H100's 25 is of Gen5's 64).
- **B300** (HGX Blackwell Ultra): 288 GB of HBM3e (glennklockwood.com/garden/processors/B300), 8 TB/s; NVLink 5
  and host copies as the B200's; one 800 Gb/s ConnectX-8 per GPU.
- **GB200** (NVL72 rack: 18 hosts of 4 GPUs, one NVLink domain of 72): 186 GB per GPU (13.4 TB over 72),
  8 TB/s; all_reduce busbw over all 72 GPUs 835-847 GB/s at 4-8 GB messages (coreweave/nccl-tests#43, a full
  rack), the figure every group inside the domain gets; one 400 Gb/s NIC per GPU beyond it; host copies
  over NVLink-C2C to the Grace CPU at 180 GB/s, 40% of its 450 a direction.
- **MI355X** (8 per host): 288 GB of HBM3E (AMD), 8 TB/s; intra-node busbw as the MI300X row's (the same seven
  Infinity Fabric links per GPU; not measured here), 400 Gb/s a GPU.

A datasheet's "GB" of memory is taken as GiB (binary chips; nvidia-smi: H100 80 GB = 81,559 MiB, A100 81,920 MiB,
modal-labs/modal-client#2797; a DGX B200's 1,440 GB / 8 = 179 GiB): B300 and MI355X 288 GiB, GB200 186 GiB.

``achieved`` is fitted to published runs (``perf.published``: the median over a family's runs of the fraction
each needs for the model to reproduce its throughput; each run's ratio out of sample, with the median of the
family's other runs, is in docs/plan.md): V100 from BigScience's six Megatron-LM runs on Jean
Zay, A100 from BLOOM-176B, torchtitan's two 64-A100 Llama 3 rows and llm-foundry's five MPT rows, H100 from
torchtitan's two Llama 3.1 8B rows and llm-foundry's eight MPT rows; H200 takes the H100's (the same GH100
compute); MI300X's is not fitted (no published run here), nor are the 2026 parts' (above).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ds_bench.errors import UserError

GiB = 1024 ** 3


@dataclass(frozen=True)
class Device:
    family: str
    """The name the peaks table matches (``measure.peaks.PEAKS``) and ``--device`` takes (case-insensitive)."""
    memory_bytes: int
    hbm_GBps: float
    intra_busbw_GBps: float
    nic_GBps: float
    achieved: float
    reserve_bytes: int = int(2.5 * GiB)
    host_GBps: float = 25.0
    """Host <-> device bytes per second, GB/s (PCIe), for offload traffic."""
    per_node: int = 8
    """GPUs per host (``--gpus-per-node``'s default for this family)."""
    host_memory_bytes: int = 2048 * GiB
    """A host's memory, shared by its GPUs' offloaded states: 2 TB (2 TiB, module docstring), the DGX H100's and
    DGX B200's (NVIDIA DGX datasheets), for every family but GB200 (two Grace CPUs of 480 GB LPDDR5X per 4-GPU
    host); ``plan --host-memory`` gives a cluster's own."""
    unfitted: str = ""
    """Whose ``achieved`` a family with no published run here takes (``H100``); empty: fitted to its own runs."""
    nvlink_domain: int = 0
    """GPUs one NVLink switch fabric joins (``intra_busbw_GBps`` inside it); 0: the host's GPUs. GB200 NVL72: 72
    GPUs over 18 hosts of 4."""


DEVICES: dict[str, Device] = {d.family.lower(): d for d in (
    Device("V100", 16 * GiB, 900, 125, 0.9 * 12.5 * 4 / 4, 0.42, reserve_bytes=int(1.5 * GiB), host_GBps=12),
    Device("V100-32GB", 32 * GiB, 900, 125, 0.9 * 12.5 * 4 / 4, 0.42, reserve_bytes=int(1.5 * GiB), host_GBps=12),
    Device("A100", 80 * GiB, 2039, 200, 0.9 * 25, 0.69),
    Device("A100-40GB", 40 * GiB, 1555, 200, 0.9 * 25, 0.69),
    Device("H100", 80 * GiB, 3350, 480, 0.9 * 50, 0.47),
    Device("H200", 140 * GiB, 4800, 480, 0.9 * 50, 0.47),
    Device("MI300X", 192 * GiB, 5300, 300, 0.9 * 50, 0.35, unfitted="an assumed"),
    Device("B200", 179 * GiB, 8000, 830, 0.9 * 50, 0.47, host_GBps=50, unfitted="the H100's"),
    Device("B300", 288 * GiB, 8000, 830, 0.9 * 100, 0.47, host_GBps=50, unfitted="the H100's"),
    Device("GB200", 186 * GiB, 8000, 835, 0.9 * 50, 0.47, host_GBps=180, host_memory_bytes=960 * GiB,
           unfitted="the H100's", per_node=4, nvlink_domain=72),
    Device("MI355X", 288 * GiB, 8000, 300, 0.9 * 50, 0.35, host_GBps=50, unfitted="the MI300X's"),
)}
"""The families ``--device`` names; another device needs ``--peak-tflops`` and ``--device-memory``."""


@dataclass(frozen=True)
class Cluster:
    nodes: int
    per_node: int
    """Ranks (GPUs) per node."""
    device_type: str
    """``cuda`` or ``cpu``."""
    device: str
    memory_bytes: int
    peak_tflops: float
    """Dense peak of one rank at the plan's precision (or its measured matmul ceiling)."""
    achieved: float
    """Fraction of ``peak_tflops`` a training step's compute achieves."""
    intra_busbw_GBps: dict[str, float]
    """Collective -> busbw of a group inside one node (``all_reduce`` stands for any collective missing)."""
    nic_GBps: float | None
    """Inter-node busbw per rank a group has on each node; None: one node (nothing crosses)."""
    hbm_GBps: float
    """The rank's memory bandwidth (the optimizer step reads and writes its states)."""
    host_GBps: float
    reserve_bytes: int
    sources: dict[str, str] = field(default_factory=dict)
    """Figure -> where it came from (datasheet, a record's run id)."""
    mfu_peak_tflops: float | None = None
    """The datasheet's peak MFU is quoted against when ``peak_tflops`` is a measured ceiling (None: ``peak_tflops``)."""
    curves: dict[str, list[list[float]]] = field(default_factory=dict)
    """``intra:<collective>`` / ``inter:<collective>`` -> [[message bytes, busbw GB/s], ...] a comm record measured
    (inter: per rank a group has on each node): small messages' latency, which one large-message figure hides."""
    host_memory_bytes: int = 0
    """A node's host memory, which its ranks' offloaded states share; 0: not known (not checked)."""
    nvlink_domain: int = 0
    """GPUs one NVLink fabric joins, a multiple of ``per_node`` (0: one node's). A group inside it runs at
    ``intra_busbw_GBps`` even across hosts; beyond it, at the network's share."""

    @property
    def world(self) -> int:
        return self.nodes * self.per_node

    @property
    def domain(self) -> int:
        """Ranks one fast (intra-node or NVLink) fabric joins: the NVLink domain, else a node, at most the world."""
        return min(self.world, max(self.nvlink_domain, self.per_node))

    def busbw(self, collective: str, per_node: int, spans_nodes: bool, message_bytes: float | None = None) -> float:
        """GB/s a group's ``collective`` reaches: inside a node the node's busbw; across nodes the network share of
        the group's ``per_node`` ranks on each node (groups side by side each run on their own share; busbw is
        bus bytes per rank, NVIDIA/nccl-tests doc/PERFORMANCE.md), at most the intra-node figure. With a measured
        curve and the message size, the busbw measured at that size (``at_size``) instead of the largest's."""
        intra = self.intra_busbw_GBps.get(collective) or self.intra_busbw_GBps.get("all_reduce") or 0.0
        curve = self._curve("intra", collective)
        if curve and message_bytes:
            intra = at_size(curve, message_bytes)
        if not spans_nodes or self.nic_GBps is None:
            return intra
        share = self.nic_GBps
        across = self._curve("inter", collective)
        if across and message_bytes:
            share = at_size(across, message_bytes)
        return min(intra or float("inf"), max(1, per_node) * share)

    def _curve(self, scope: str, collective: str) -> list[list[float]] | None:
        return self.curves.get(f"{scope}:{collective}") or self.curves.get(f"{scope}:all_reduce")

    def with_figures(self, **figures) -> Cluster:
        return replace(self, **figures)

    def missing(self) -> str | None:
        """What the cluster lacks to time a multi-rank step (a busbw inside a node; across nodes, the network's),
        as the words of a one-line error; None when nothing."""
        if self.world > 1 and not (self.intra_busbw_GBps or self.curves):
            return "no busbw inside a node"
        if self.nodes > 1 and not self.nic_GBps:
            return "no busbw across nodes"
        return None

    def to_dict(self) -> dict:
        """Every figure, as a ``plan`` record's ``cluster`` holds it (``from_dict`` reads it back)."""
        return {"nodes": self.nodes, "per_node": self.per_node, "device_type": self.device_type,
                "device": self.device, "memory_bytes": self.memory_bytes, "peak_tflops": self.peak_tflops,
                "achieved": self.achieved, "intra_busbw_GBps": dict(self.intra_busbw_GBps), "nic_GBps": self.nic_GBps,
                "hbm_GBps": self.hbm_GBps, "host_GBps": self.host_GBps, "reserve_bytes": self.reserve_bytes,
                "sources": dict(self.sources), "mfu_peak_tflops": self.mfu_peak_tflops,
                "curves": {k: [list(p) for p in v] for k, v in self.curves.items()},
                "nvlink_domain": self.nvlink_domain, "host_memory_bytes": self.host_memory_bytes}

    @classmethod
    def from_dict(cls, d: dict) -> Cluster:
        """The cluster a ``to_dict`` (a ``plan`` record's ``cluster``) describes; ``host_GBps``, which records
        before it did not hold, from the device's family row (else ``Device``'s default). A ``ValueError``
        naming the figures missing."""
        required = ("nodes", "per_node", "device_type", "device", "memory_bytes", "peak_tflops", "achieved",
                    "hbm_GBps", "reserve_bytes")
        missing = [k for k in required if d.get(k) is None]
        if missing:
            raise ValueError(f"the cluster lacks {', '.join(missing)}")
        row = device_row(str(d["device"]))
        host = d.get("host_GBps") or (row.host_GBps if row else Device.host_GBps)
        return cls(int(d["nodes"]), int(d["per_node"]), str(d["device_type"]), str(d["device"]),
                   int(d["memory_bytes"]), float(d["peak_tflops"]), float(d["achieved"]),
                   {str(k): float(v) for k, v in (d.get("intra_busbw_GBps") or {}).items()},
                   None if d.get("nic_GBps") is None else float(d["nic_GBps"]), float(d["hbm_GBps"]), float(host),
                   int(d["reserve_bytes"]), {str(k): str(v) for k, v in (d.get("sources") or {}).items()},
                   None if d.get("mfu_peak_tflops") is None else float(d["mfu_peak_tflops"]),
                   {str(k): [[float(a), float(b)] for a, b in v] for k, v in (d.get("curves") or {}).items()},
                   int(d.get("host_memory_bytes") or 0), int(d.get("nvlink_domain") or 0))


def at_size(curve: list[list[float]], message_bytes: float) -> float:
    """The busbw a measured curve ([[bytes, GB/s], ...] by size) gives a message: interpolated linearly in log size
    between the two sizes around it; below the smallest, the smallest's; above the largest, the largest's."""
    import math

    points = sorted(curve)
    if message_bytes <= points[0][0]:
        return points[0][1]
    for (s0, b0), (s1, b1) in zip(points, points[1:]):
        if message_bytes <= s1:
            f = (math.log(message_bytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return b0 + f * (b1 - b0)
    return points[-1][1]


CPU_ACHIEVED = 0.47
"""Fraction of its measured matmul ceiling (``ds-bench roofline``) a CPU rank's training step achieves: docs/plan.md
says on which runs it was measured."""
CPU_RESERVE = int(0.6 * GiB)
"""What a CPU rank holds before its model (torch, DeepSpeed, the process group), when no run record says."""


def device_row(name: str) -> Device | None:
    """The family row of ``--device`` (its key) or of a device's full name (``NVIDIA H100 80GB HBM3``: the longest
    family named in it as a whole word)."""
    import re

    if name.lower() in DEVICES:
        return DEVICES[name.lower()]
    for key in sorted(DEVICES, key=len, reverse=True):
        if re.search(rf"(?<![\w-]){re.escape(key)}(?![\w])", name.lower()):
            return DEVICES[key]
    return None


def cpu_cluster(nodes: int, per_node: int, memory_bytes: int, peak: float | None, busbw: dict[str, float],
                copy_GBps: float | None, reserve_bytes: int | None, achieved: float | None) -> Cluster:
    """CPU ranks: no datasheet, so the peak is the measured matmul ceiling (or ``--peak-tflops``) and the busbw
    the measured gloo figures; a ``UserError`` saying how to measure what is missing."""
    if peak is None:
        raise UserError("--device cpu: CPU ranks have no datasheet peak; measure one (ds-bench roofline, then "
                        "--calibrate results/roofline.jsonl) or give --peak-tflops")
    if nodes * per_node > 1 and not busbw:
        raise UserError("--device cpu: no busbw for CPU ranks; measure it (ds-bench comm on the same ranks, then "
                        "--calibrate results/comm.jsonl)")
    return Cluster(nodes, per_node, "cpu", "cpu", memory_bytes, peak, achieved or CPU_ACHIEVED, dict(busbw), None,
                   copy_GBps or 10.0, copy_GBps or 10.0, reserve_bytes or CPU_RESERVE,
                   {"achieved": "--achieved" if achieved else "CPU constant (docs/plan.md)"})

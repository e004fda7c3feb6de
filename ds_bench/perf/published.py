"""``ds-bench plan``'s model held against published training runs (pure apart from reading its data file).

Owns ``published_runs.yaml`` (package data beside this module: each run's source, quote, hardware, model shape,
layout, precision and measured figure) and its evaluation: each run's ``Transformer`` (``perf.shapes.custom``,
the vocabulary as the run padded it), its ``Cluster`` (the ``perf.devices`` family's datasheet peak, HBM and
reserve, overridden by the data's ``hardware:`` figures: memory, nccl-tests-level intra-node busbw, the
per-GPU share of the network, each with its source) and its ``Candidate`` (FSDP runs: engine ``fsdp`` stage 3;
Megatron-LM runs: ``deepspeed`` stage 0, its optimizer being unpartitioned; BLOOM's Megatron-DeepSpeed
BF16_Optimizer: stage 1). ``tp_style="megatron"`` (Megatron's 2 + 2 all-reduces per block) for tensor-parallel
runs. The Megatron runs combine AutoTP with a pipeline, which ds_bench's legality table refuses for its own
DeepSpeed runs, so every run is evaluated by calling ``perf.step.step`` and ``perf.memory.memory`` directly,
never ``perf.space.search``.

- **achieved**: the one achieved-fraction constant per device family (``perf.devices.DEVICES``) is the median,
  over that family's runs here, of the fraction each run needs for the model to reproduce its throughput
  exactly (``fitted_achieved``; ``tests/test_perf_published.py`` holds ``DEVICES`` to it). A run's check is out
  of sample (``out_of_sample_achieved``): its predicted throughput with the median of the *other* runs of its
  family (leave-one-out), so no run is checked against a constant it helped set.
- **largest fit** (runs whose source calls the model the largest that fits): the most blocks at the run's width,
  heads and layout whose ``perf.memory`` total is within the device memory (headroom 0: the published models
  ran at their limit), a multiple of the pipeline stages (the BigScience authors scaled both the blocks and the
  width; blocks are what a pipeline divides). Megatron-LM's (2021) fp16 optimizer keeps 20 bytes per parameter,
  not ZeRO-0's 16: fp16 parameters and gradients (2 + 2), fp32 main gradients copied from them before the
  step (4: the runs' own timer line has ``optimizer-copy-to-main-grad``), fp32 master parameters (4) and Adam's
  moments (8); the data gives it per run (``states_bytes_per_param``), applied here, not in ``perf.memory``.
  Megatron 2021 has no fused attention: those runs keep the scores (``eager``).
- **memory** (runs that publish it): predicted with the run's own checkpointing: torchtitan's "selective"
  (op-level) checkpointing is ds_bench's ``--selective-checkpointing`` (``workloads.checkpoint_policy``), its
  recomputed matmuls timed too.
"""

from __future__ import annotations

import dataclasses
import statistics
from functools import lru_cache
from pathlib import Path

from ds_bench.config.layout import Layout
from ds_bench.perf import memory as mem
from ds_bench.perf import step as timing
from ds_bench.perf.candidate import Candidate
from ds_bench.perf.datasheet import cluster_of
from ds_bench.perf.devices import DEVICES, GiB, Cluster
from ds_bench.perf.shapes import Transformer, custom

DATA = Path(__file__).with_name("published_runs.yaml")


@lru_cache(maxsize=1)
def load() -> dict:
    import yaml

    return yaml.safe_load(DATA.read_text())


def runs() -> list[dict]:
    return load()["runs"]


def run(run_id: str) -> dict:
    return next(r for r in runs() if r["id"] == run_id)


def hardware(r: dict) -> dict:
    return load()["hardware"][r["hardware"]]


def family(r: dict) -> str:
    return hardware(r)["device"]


def shape(r: dict, layers: int | None = None) -> Transformer:
    m = r["model"]
    s = custom(m["label"], layers or m["layers"], m["hidden"], m["heads"], kv_heads=m.get("kv_heads"),
               ffn=m.get("ffn"), vocab=m["vocab"], tied=m["tied"], mlp=m["mlp"], seq_len=r["seq_len"],
               dropout=m.get("dropout", True))
    return dataclasses.replace(s, positions=m["positions"]) if "positions" in m else s


def cluster(r: dict, achieved: float | None = None) -> Cluster:
    hw, precision = hardware(r), r["layout"]["precision"]
    base = cluster_of(hw["device"], r["nodes"], hw["per_node"], precision, memory_bytes=int(hw["memory_GiB"] * GiB))
    intra = hw["intra_busbw_GBps"]
    intra = dict(intra) if isinstance(intra, dict) else {"all_reduce": float(intra)}
    sources = {**base.sources, **hw["sources"]}
    return base.with_figures(intra_busbw_GBps=intra, nic_GBps=hw["nic_GBps"] if r["nodes"] > 1 else None,
                             hbm_GBps=hw.get("hbm_GBps", base.hbm_GBps), sources=sources,
                             achieved=base.achieved if achieved is None else achieved)


def candidate(r: dict) -> Candidate:
    lay = r["layout"]
    layout = Layout(stage=lay["stage"], offload="none", precision=lay["precision"], micro_batch=lay["micro_batch"],
                    grad_accum=lay["grad_accum"], engine=lay["engine"], pipeline_stages=lay.get("pp", 1),
                    tensor_parallel=lay.get("tp", 1))
    return Candidate(layout, lay["checkpointing"] in ("full", "selective"), selective=lay["checkpointing"] == "selective")


def sequences(r: dict) -> int:
    c = candidate(r)
    return c.replicas(cluster(r).world) * c.layout.micro_batch * c.layout.grad_accum


def tp_style(r: dict) -> str:
    return "megatron" if r["layout"].get("tp", 1) > 1 else "autotp"


def predict_step(r: dict, achieved: float | None = None) -> timing.Step:
    return timing.step(shape(r), candidate(r), r["seq_len"], sequences(r), cluster(r, achieved), tp_style(r))


def tokens_per_s_per_gpu(r: dict, achieved: float | None = None) -> float:
    cl = cluster(r, achieved)
    return sequences(r) * r["seq_len"] / cl.world / predict_step(r, achieved).total_s


def published_tokens_per_s_per_gpu(r: dict) -> float:
    measured = r["measured"]
    if "tokens_per_s_per_gpu" in measured:
        return float(measured["tokens_per_s_per_gpu"])
    return sequences(r) * r["seq_len"] / cluster(r).world / (measured["iteration_ms"] / 1e3)


def needed_achieved(r: dict) -> float:
    """The achieved fraction at which the model reproduces the run's published throughput (bisection: the
    predicted throughput rises with it); 1.0 when even the whole peak falls short."""
    target, lo, hi = published_tokens_per_s_per_gpu(r), 1e-3, 1.0
    if tokens_per_s_per_gpu(r, hi) < target:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tokens_per_s_per_gpu(r, mid) < target else (lo, mid)
    return (lo + hi) / 2


def fitted_achieved() -> dict[str, tuple[float, list[str]]]:
    """Family -> (the median of its runs' needed fractions, the runs that set it)."""
    by: dict[str, list[dict]] = {}
    for r in runs():
        by.setdefault(family(r), []).append(r)
    return {f: (statistics.median(needed_achieved(r) for r in rs), [r["id"] for r in rs]) for f, rs in by.items()}


def out_of_sample_achieved(r: dict) -> float:
    """The median needed fraction of the family's runs other than ``r`` (leave-one-out); a family's only run takes
    the family's constant (``perf.devices``)."""
    others = [needed_achieved(o) for o in runs() if family(o) == family(r) and o["id"] != r["id"]]
    return statistics.median(others) if others else DEVICES[family(r).lower()].achieved


def memory(r: dict, layers: int | None = None) -> mem.Memory:
    """``perf.memory.memory`` of the run, its states at the layout's ``states_bytes_per_param`` where the data
    gives one (Megatron-LM's fp16 optimizer: 20, module docstring) instead of ZeRO-0's 16."""
    c, s = candidate(r), shape(r, layers)
    m = mem.memory(s, c, r["seq_len"], cluster(r), eager=r["layout"].get("eager", False),
                   loss=r["layout"].get("loss", "upcast"))
    per_param = r["layout"].get("states_bytes_per_param")
    if per_param is None:
        return m
    params = mem.stage_shape(s, c.layout.pipeline_stages).params / c.layout.tensor_parallel
    return dataclasses.replace(m, states=int(per_param * params))


def largest_fit(r: dict) -> tuple[int, float]:
    """(blocks, parameters) of the largest model at the run's width and layout whose predicted memory is within
    the device's (headroom 0), in steps of the pipeline stages."""
    p, capacity = r["layout"].get("pp", 1), cluster(r).memory_bytes
    layers = p
    while memory(r, layers=layers + p).total <= capacity:
        layers += p
    return layers, shape(r, layers).params if memory(r, layers=layers).total <= capacity else 0.0


def row(r: dict) -> dict:
    published, predicted = published_tokens_per_s_per_gpu(r), tokens_per_s_per_gpu(r, out_of_sample_achieved(r))
    lay, cl = r["layout"], cluster(r)
    layout = " ".join(w for w in (f"TP{lay.get('tp', 1)}" if lay.get("tp", 1) > 1 else "",
                                  f"PP{lay.get('pp', 1)}" if lay.get("pp", 1) > 1 else "",
                                  f"DP{candidate(r).replicas(cl.world)}",
                                  "FSDP" if lay["engine"] == "fsdp" else f"ZeRO-{lay['stage']}",
                                  f"mbs {lay['micro_batch']} x {lay['grad_accum']}", lay["precision"],
                                  f"ckpt {lay['checkpointing']}") if w)
    out = {"id": r["id"], "hardware": f"{cl.world} x {family(r)} {hardware(r)['memory_GiB']} GiB ({r['hardware']})",
           "model": f"{r['model']['label']} ({shape(r).params / 1e9:.1f}B), seq {r['seq_len']}", "layout": layout,
           "published": published, "predicted": predicted, "ratio": predicted / published,
           "needed_achieved": needed_achieved(r), "source": source_text(r)}
    if "iteration_ms" in r["measured"]:
        out["published_ms"] = r["measured"]["iteration_ms"]
        out["predicted_ms"] = predict_step(r, out_of_sample_achieved(r)).total_s * 1e3
    if r.get("fit", {}).get("largest"):
        layers, params = largest_fit(r)
        out["fit"] = (f"{r['fit']['published']}; predicted largest {params / 1e9:.1f}B ({layers} blocks), "
                      f"{r['model']['layers']} blocks need {memory(r).total / GiB:.1f} of "
                      f"{cl.memory_bytes / GiB:.0f} GiB")
    if "fit" not in out:
        out["fit"] = f"predicted {memory(r).total / GiB:.1f} of {cl.memory_bytes / GiB:.0f} GiB"
    if "memory_GiB" in r["measured"]:
        out["fit"] = f"published {r['measured']['memory_GiB']} GiB; predicted {memory(r).total / GiB:.1f}"
    return out


def source_text(r: dict) -> str:
    s = r["source"]
    where = f"{s['repo']} {s['path']}"
    return f"{where} @{s['commit'][:8]}" if "commit" in s else f"{where} ({s.get('url', s.get('revision', ''))})"


def table() -> list[dict]:
    return [row(r) for r in runs()]

"""The figures page of ``make gpu-check`` (``tools/gpu_check.py``): one markdown page from the records a GPU
check left in its folder. Pure: record dicts in (JSON lines as decoded), text out; reading the folder, the
clock and the driver is the caller's.

Which run is which: the GPU tier's tests tag their runs ``tag(name)`` (``gpu-check:gpt2-small-best``); the
newest record of a tag wins (a folder written twice keeps both). The page has, each row present even when its
record is missing (it then says so, as it says a failed run's error):

- a header naming the date, the command, the GPU (records' ``hardware.device``, the caller's driver and memory)
  and the versions the runs recorded (Python, torch, CUDA, NCCL, deepspeed, transformers);
- the language models (``LM_MODELS``), the default run beside the best options' run: tokens/s, MFU (of the
  datasheet peak, ``ds_bench.measure.peaks``) and best / default;
- ResNet-50: images/s, TFLOP/s, MFU;
- the measured ceiling: the newest ``ds-bench roofline`` record's matmul TFLOP/s per dtype against the datasheet
  peak, and its copy GB/s;
- capacity: the newest ``ds-bench capacity`` search's answer per layout (largest member that trained, the next
  and why not).
"""

from __future__ import annotations

from ds_bench.machine.jit_ops import optimizer_op
from ds_bench.measure.peaks import peak_tflops

TAG_PREFIX = "gpu-check:"
LM_MODELS = {"gpt2-small": "GPT-2 small", "llama3.2-1b": "Llama 3.2-1B"}
"""Language models of the table: name in the tags -> label."""
VARIANTS = ("default", "best")
RESNET = "resnet50"
GIB = 2**30
MISSING = "missing"


def tag(name: str) -> str:
    """The ``--tag`` of the GPU tier's run ``name`` (``gpt2-small-default``, ``resnet50``...)."""
    return f"{TAG_PREFIX}{name}"


def lm_name(model: str, variant: str) -> str:
    return f"{model}-{variant}"


DEEPCOMPILE_STAGES = (1, 3)


def deepcompile_name(stage: int, on: bool) -> str:
    return f"gpt2-small-z{stage}-{'deepcompile' if on else 'eager'}"


def page(records: list[dict], *, date: str, command: str, machine: dict | None = None,
         notes: tuple[str, ...] = ()) -> str:
    """The whole page: header, then each table. ``machine``: what the records do not hold (``driver``,
    ``memory_mib``, ``gpu``: nvidia-smi's); ``notes``: lines the caller adds (how long each part took)."""
    runs = tagged_runs(records)
    parts = [header(records, date, command, machine or {}), *(f"- {n}" for n in notes), "",
             "## Language models: defaults against the best options", "", *lm_table(runs), "",
             "## ResNet-50", "", *resnet_table(runs), "",
             "## Measured ceiling (`ds-bench roofline`)", "", *roofline_table(records), "",
             "## Capacity (`ds-bench capacity`): the largest model that trained, per layout", "",
             *capacity_table(records), "",
             "## DeepCompile (`--deepcompile`) against eager, GPT-2 small", "", *deepcompile_table(runs), ""]
    return "\n".join(parts)


def tagged_runs(records: list[dict]) -> dict[str, dict]:
    """Tag -> the newest run record of that tag (records in the order written)."""
    out = {}
    for r in records:
        if r.get("kind", "run") == "run" and str(r.get("tag") or "").startswith(TAG_PREFIX):
            out[r["tag"]] = r
    return out


def header(records: list[dict], date: str, command: str, machine: dict) -> str:
    runs = [r for r in records if r.get("kind", "run") in ("run", "roofline") and r.get("versions")]
    newest = runs[-1] if runs else {}
    v = newest.get("versions") or {}
    device = _device(records) or machine.get("gpu") or "unknown GPU"
    memory = f", {machine['memory_mib']:,} MiB" if machine.get("memory_mib") else ""
    driver = f"driver {machine['driver']}" if machine.get("driver") else "driver unknown"
    software = ", ".join(f"{label} {v[key]}" for key, label in (("python", "Python"), ("torch", "torch"),
                                                               ("cuda", "CUDA"), ("nccl", "NCCL"),
                                                               ("deepspeed", "deepspeed"),
                                                               ("transformers", "transformers")) if v.get(key))
    lines = [f"# GPU check, {date}: {device}", "",
             f"- command: `{command}`",
             f"- hardware: {device}{memory}, {driver}",
             f"- software: {software or 'no record says'}"]
    if newest.get("git_sha"):
        lines.append(f"- ds_bench at {newest['git_sha'][:12]}")
    return "\n".join(lines)


def _device(records: list[dict]) -> str | None:
    for r in reversed(records):
        device = (r.get("hardware") or {}).get("device")
        if device and (r.get("hardware") or {}).get("device_type") == "cuda":
            return device
    return None


def lm_table(runs: dict[str, dict]) -> list[str]:
    head = ["model", "default", "tokens/s", "MFU", "best", "tokens/s", "MFU", "best / default"]
    rows = []
    for model, label in LM_MODELS.items():
        default, best = (runs.get(tag(lm_name(model, v))) for v in VARIANTS)
        seq = next(((r.get("config") or {}).get("seq_len") for r in (default, best) if r), None)
        cells = [f"{label}, seq {seq}" if seq else label]
        for variant, r in zip(VARIANTS, (default, best)):
            cells += [options(r, lm_name(model, variant)), _figure(r, "tokens_per_s", "{:,.0f}"), _mfu(r)]
        cells.append(_ratio(default, best, "tokens_per_s"))
        rows.append(cells)
    return [*_markdown(head, rows),
            "", "MFU: model FLOPs (PaLM's 6N + 12LHQT per token) over the datasheet dense peak of the run's precision "
                "(`ds_bench/measure/peaks.py`); options as the record says they ran."]


def resnet_table(runs: dict[str, dict]) -> list[str]:
    r = runs.get(tag(RESNET))
    row = ["ResNet-50, 224 x 224", options(r, RESNET), _figure(r, "samples_per_s", "{:,.0f}"),
           _figure(r, "tflops_per_device", "{:.1f}"), _mfu(r), _gib(r)]
    return _markdown(["model", "options", "images/s", "TFLOP/s", "MFU", "peak GiB"], [row])


def options(r: dict | None, name: str) -> str:
    """What run ``name`` ran with, from its record; or why there is no figure."""
    if r is None:
        return f"{MISSING}: no run tagged {tag(name)}"
    if r.get("status") not in (None, "ok"):
        return f"failed: {r.get('error') or r.get('status')}"
    compiled = "compiled" if r.get("compile") else "eager"
    attn = r.get("attn_implementation")
    parts = [f"mbs {r.get('micro_batch')}", f"{r.get('precision')} ZeRO-{r.get('zero_stage')}",
             *([attn] if attn else []), compiled, optimizer_label(r)]
    return ", ".join(str(p) for p in parts)


def optimizer_label(r: dict) -> str:
    """DeepSpeed's own optimizer ops by the rule that loads them (``jit_ops.optimizer_op``), else the record's."""
    op = optimizer_op(r.get("ds_config") or {})
    if op == "fused_adam":
        return "DeepSpeed FusedAdam"
    if op is not None:
        return f"DeepSpeed {op} (offloaded)"
    described = r.get("optimizer") or {}
    name = str(described.get("type") or "optimizer ?").removeprefix("torch.optim.")
    return f"torch {name}{' fused' if described.get('fused') else ''}"


def roofline_table(records: list[dict]) -> list[str]:
    """Rank 0's rows of the newest roofline record (one GPU: the only rank)."""
    found = [r for r in records if r.get("kind") == "roofline"]
    if not found:
        return [f"{MISSING}: no roofline record"]
    rows = []
    for row in found[-1].get("results") or []:
        if row.get("test") not in ("matmul", "copy") or row.get("rank", 0) != 0:
            continue
        if row["test"] == "copy":
            rows.append(["copy", row["dtype"], _bytes(row["size"]), f"{_rate(row['median'])} GB/s",
                         f"{_rate(row['low'])}-{_rate(row['high'])}", "-"])
            continue
        peak, _ = peak_tflops(row.get("device") or "", "cuda", row["dtype"])
        share = f"{row['median'] / peak:.0%} of {peak:g}" if peak else "-"
        rows.append(["matmul", row["dtype"], f"n = {row['size']}", f"{_rate(row['median'])} TFLOP/s",
                     f"{_rate(row['low'])}-{_rate(row['high'])}", share])
    return _markdown(["test", "dtype", "size", "median", "min-max", "datasheet peak"], rows)


def _rate(x: float) -> str:
    return f"{x:,.1f}" if x >= 10 else f"{x:.3g}"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def capacity_table(records: list[dict]) -> list[str]:
    found = [r for r in records if r.get("kind") == "capacity"]
    if not found:
        return [f"{MISSING}: no capacity record"]
    newest = found[-1].get("capacity")
    by_layout = {r.get("layout"): r for r in found if r.get("capacity") == newest}
    rows = []
    for layout, r in by_layout.items():
        largest, nxt = r.get("largest") or {}, r.get("next") or {}
        params = f"{largest['params'] / 1e6:,.1f}M" if largest.get("params") else "-"
        peak = largest.get("peak_mem_bytes")
        room = f"{peak / GIB:.1f} / {r['capacity_bytes'] / GIB:.1f}" if peak and r.get("capacity_bytes") else "-"
        rows.append([layout, largest.get("member") or f"none ({r.get('status')}: {r.get('reason') or '-'})", params,
                     room, nxt.get("member") or "none larger", nxt.get("why") or "-"])
    return _markdown(["layout", "largest that trained", "params", "peak / capacity GiB", "next size", "why not"], rows)


def _figure(r: dict | None, key: str, fmt: str) -> str:
    value = _metric(r, key)
    return "-" if value is None else fmt.format(value)


def _metric(r: dict | None, key: str):
    if r is None or r.get("status") not in (None, "ok"):
        return None
    return (r.get("metrics") or {}).get(key)


def _mfu(r: dict | None) -> str:
    mfu = _metric(r, "mfu")
    return "-" if mfu is None else f"{mfu * 100:.1f}%"


def _gib(r: dict | None) -> str:
    peak = _metric(r, "peak_mem_bytes")
    return "-" if peak is None else f"{peak / GIB:.1f}"


def _ratio(default: dict | None, best: dict | None, key: str) -> str:
    a, b = _metric(default, key), _metric(best, key)
    return f"{b / a:.2f}x" if a and b else "-"


def _markdown(head: list[str], rows: list[list[str]]) -> list[str]:
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |"

    return [line(head), "|" + "---|" * len(head), *(line(row) for row in rows)]


def deepcompile_table(runs: dict[str, dict]) -> list[str]:
    """Per ZeRO stage: eager and DeepCompile tokens/s, the speedup, and the last step's loss of each (parity: the
    same weights, batches and steps)."""
    rows = []
    for stage in DEEPCOMPILE_STAGES:
        eager, on = (runs.get(tag(deepcompile_name(stage, v))) for v in (False, True))
        rows.append([f"ZeRO-{stage}", *(_figure(r, "tokens_per_s", "{:,.0f}") for r in (eager, on)),
                     _ratio(eager, on, "tokens_per_s"), *(_figure(r, "loss_last", "{:.4f}") for r in (eager, on)),
                     *(options(r, deepcompile_name(stage, v)) if r is None or r.get("status") not in (None, "ok")
                       else "ok" for r, v in ((eager, False), (on, True)))])
    return _markdown(["stage", "eager tokens/s", "DeepCompile tokens/s", "DeepCompile / eager", "eager loss",
                      "DeepCompile loss", "eager run", "DeepCompile run"], rows)

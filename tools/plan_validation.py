"""``ds-bench plan`` against measurement on this machine's CPU ranks: for each world size, measure the ranks'
ceiling (``ds-bench roofline``) and busbw (``ds-bench comm``), then ``plan --confirm`` every layout of a small
GPT-2 (ZeRO 0-3, a pipeline), Llama (AutoTP, Ulysses) and MoE (expert parallelism) that the legality table allows
on those ranks, calibrated with those records, and print predicted beside measured (docs/plan.md quotes it).

    python tools/plan_validation.py --worlds 1,2,4 --out /tmp/planval
    python tools/plan_validation.py --worlds 1,2,4 --out /tmp/planval --table-only   # re-predict, no runs
    python tools/plan_validation.py --worlds 2 --quick         # what tests/test_plan_validation.py runs
    python tools/plan_validation.py --worlds 2 --terms         # each memory option on and off (the test's other)
    python tools/plan_validation.py --worlds 2 --only llama,moe   # AutoTP, Ulysses and experts (the test's third)

``--terms``: one GPT-2 layout (12 blocks) with ALST's tiled MLP and tiled loss each on and off, and with full and
selective checkpointing, at 4,096 tokens per rank (a loss larger than one tile), and a second table: per option,
the predicted and the measured difference in peak memory between the layouts without and with it (the term the
option removes). Each plan run is restricted to one
family of layouts by its axis flags; ``--steps`` steps per run (warm-up
``--warmup``). The table pairs each layout's measured step (the ``--confirm`` run) with the prediction of the model
as it is now (``plan`` run again, no job, from the same calibration), so a change to the model is re-checked
without running anything again (``--table-only``). Exits 1 when a confirm run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SHAPE = {"gpt2": ["--layers", "4", "--hidden", "256", "--heads", "4"],
         "llama": ["--layers", "4", "--hidden", "256", "--heads", "4"],
         "moe": ["--layers", "2", "--hidden", "256", "--heads", "4", "--experts", "4", "--top-k", "2"]}
FIXED = ["--offload", "none", "--activation-checkpointing", "off", "--tiled-mlp", "off", "--tiled-loss", "off", "--seq-len", "256"]


TERMS = ["--layers", "12", "--stages", "1", "--pipeline-stages", "1", "--micro-batch", "4", "--seq-len", "1024",
         "--tiled-mlp", "off,on", "--tiled-loss", "off,on"]
"""The ``--terms`` families: 12 blocks (a term's GiB above the peak's run-to-run noise), 4 sequences of 1,024
tokens per rank (``--global-batch`` set per world); the tiling each way without checkpointing, then full and
selective checkpointing (tiled loss, plain MLP)."""
SELECTIVE = [*TERMS[:10], "--tiled-mlp", "off", "--tiled-loss", "on", "--activation-checkpointing", "on",
             "--selective-checkpointing", "off,on"]
SWITCH_WORDS = ("tiled-mlp", "tiled-loss")


def families(world: int, quick: bool, terms: bool = False, only: tuple[str, ...] = ()) -> list[tuple[str, list[str]]]:
    """(workload, axis flags) of each plan run at ``world`` ranks; ``only``: those workloads' alone."""
    if terms:
        batch = ["--global-batch", str(world * 4 * 1024)]
        return [("gpt2", [*TERMS, *batch]), ("gpt2", [*SELECTIVE, *batch])]
    if only:
        return [f for f in families(world, False) if f[0] in only]
    degrees = [d for d in (1, 2, 4) if world % d == 0]
    pp = ",".join(str(d) for d in degrees if d <= 4)
    stage = "1" if world > 1 else "0"
    out = [("gpt2", ["--stages", "0,1,2,3" if world > 1 else "0", "--pipeline-stages", pp, "--micro-batch", "2"])]
    if not quick:
        out += [("llama", ["--stages", stage, "--tensor-parallel", ",".join(map(str, degrees)),
                           "--sequence-parallel", ",".join(map(str, degrees)), "--micro-batch", "2"]),
                ("moe", ["--stages", stage, "--expert-parallel", ",".join(map(str, degrees)), "--micro-batch", "2"])]
    return out


def run(argv: list[str], log: str) -> int:
    with open(log, "a") as f:
        f.write("$ " + " ".join(argv) + "\n")
        f.flush()
        return subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=3600).returncode


def calibrate(world: int, out: str, log: str) -> str:
    path = os.path.join(out, f"calibration_w{world}.jsonl")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "-m", "ds_bench"]
    run([*torchrun, "roofline", "--dtypes", "fp32", "--results", path], log)
    if world > 1:
        run([*torchrun, "comm", "--collectives", "all_reduce,all_gather,reduce_scatter,all_to_all,send_recv",
             "--max-bytes", "32MiB", "--iters", "10", "--results", path], log)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", default="2")
    p.add_argument("--out", default="/tmp/plan_validation")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="GPT-2 layouts only")
    p.add_argument("--terms", action="store_true", help="the memory options on and off only (module docstring)")
    p.add_argument("--only", default="", help="these workloads' families alone, e.g. llama,moe")
    p.add_argument("--table-only", action="store_true", help="no runs: the table of what --out holds")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log, status, rows = os.path.join(args.out, "log.txt"), 0, []
    for world in [int(w) for w in args.worlds.split(",")]:
        cal = os.path.join(args.out, f"calibration_w{world}.jsonl") if args.table_only else calibrate(world, args.out,
                                                                                                      log)
        only = tuple(w for w in args.only.split(",") if w)
        for i, (workload, axes) in enumerate(families(world, args.quick, args.terms, only)):
            name = f"{workload}{i}" if args.terms and i else workload  # --terms: two gpt2 families
            results = os.path.join(args.out, f"plan_{name}_w{world}.jsonl")
            argv = [sys.executable, "-m", "ds_bench", "plan", "--workload", workload, *SHAPE[workload], *FIXED,
                    "--global-batch", str(world * 4 * 256), *axes, "--device", "cpu", "--nproc", str(world),
                    "--calibrate", cal, "--launcher", "torchrun", "--top", "99"]
            if not args.table_only:
                status |= run([*argv, "--confirm", "99", "--steps", str(args.steps), "--warmup", str(args.warmup),
                               "--results", results], log) != 0
            predicted = os.path.join(args.out, f"predicted_{name}_w{world}.jsonl")
            if os.path.exists(predicted):
                os.remove(predicted)
            run([*argv, "--results", predicted], log)
            rows += table_rows(results, predicted, world, workload)
    print("| ranks | model | layout | predicted step ms | measured step ms | predicted/measured | predicted GiB | "
          "measured GiB |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    ratios = [float(r[5]) for r in rows if r[5] != "-"]
    if ratios:
        print(f"\nmedian predicted/measured {statistics.median(ratios):.2f} over {len(ratios)} layouts, "
              f"range {min(ratios):.2f}-{max(ratios):.2f}")
    if args.terms:
        print("\n| ranks | option | layout without it | predicted GiB saved | measured GiB saved |\n"
              "| --- | --- | --- | --- | --- |")
        for r in term_rows(rows):
            print("| " + " | ".join(r) + " |")
    return 1 if status else 0


def term_rows(rows: list[list[str]]) -> list[list[str]]:
    """Per memory option and layout without it: the predicted and measured peak memory it saves (GiB), from the
    rows of the same layout with and without the option's word; full checkpointing against selective (what full
    saves over selective)."""
    by_label = {(r[0], r[2]): r for r in rows}
    out = []
    for (world, label), sel in by_label.items():
        full = by_label.get((world, label.replace(" ckpt-selective", " ckpt")))
        if label.endswith(" ckpt-selective") and full and "-" not in (full[7], sel[7]):
            out.append([world, "ckpt (not selective)", label, f"{float(sel[6]) - float(full[6]):.2f}",
                        f"{float(sel[7]) - float(full[7]):.2f}"])
    for (world, label), off in by_label.items():
        words = label.split()
        for word in SWITCH_WORDS:
            if word in words:
                continue
            on_words = [w for w in words if w not in SWITCH_WORDS] + [w for w in SWITCH_WORDS if w in words or w == word]
            on = by_label.get((world, " ".join(on_words)))
            if on is None or "-" in (off[7], on[7]):
                continue
            out.append([world, word, label, f"{float(off[6]) - float(on[6]):.2f}", f"{float(off[7]) - float(on[7]):.2f}"])
    return out


def table_rows(results: str, predicted: str, world: int, workload: str) -> list[list[str]]:
    """The measured rows of ``results`` (the newest plan with --confirm), each with its prediction in ``predicted``."""
    if not os.path.isfile(results) or not os.path.isfile(predicted):
        return []
    confirmed = {row["label"]: row.get("confirmed") or {} for row in _newest(results)["ranked"]}
    record = _newest(predicted)
    out = []
    for row in record["ranked"]:
        c = confirmed.get(row["label"], {})
        if c.get("step_s"):
            c = {**c, "ratio": row["step_s"] / c["step_s"]}
        measured = c.get("step_s")
        out.append([str(world), f"{workload} {record['size']}", row["label"], f"{row['step_s'] * 1e3:,.0f}",
                    f"{measured * 1e3:,.0f}" if measured else c.get("status", "-"),
                    f"{c['ratio']:.2f}" if c.get("ratio") else "-", f"{row['memory_bytes'] / 2**30:.2f}",
                    f"{c['peak_mem_bytes'] / 2**30:.2f}" if c.get("peak_mem_bytes") else "-"])
    return out


def _newest(path: str) -> dict:
    return [json.loads(line) for line in open(path) if line.strip()][-1]


if __name__ == "__main__":
    sys.exit(main())

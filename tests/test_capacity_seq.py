"""``ds-bench capacity --scale seq`` and the studies' long-context axes.

Pure, on inline inputs: the sequence search (doubling from the start, bisecting to the granularity, every length
a multiple of the sequence-parallel degrees; the start already out of memory; the maximum reached; a predicted
length not run), the memory prediction per token (``perf.seq_memory``), the switch axes (``--tiled-mlp``,
``--tiled-loss``) and the sweep's ``--seq-len`` list, the members and the table. In-process: the plans
(``--dry-run``) of a sweep and a capacity search over them. One real search (CI, ~30 s on 2 cores): a 2-block
Llama under Ulysses over 2 CPU ranks with both tilings, 256 then 512 tokens, ending at ``--max-seq-len``.

Measured with a cap (not a test: 14 probes, 5.5 min here): ``--sequence-parallel 1,2`` at ZeRO-3 fp32 under
1.2 GiB per rank, from 256 to 16384: SP=1 trains 1,024 tokens (1,280 out of memory), SP=2 2,304 (2,560 out of
memory); every prediction after two probes within 0.1% of the measured peak (docs/commands/capacity.md).
"""

from __future__ import annotations

import argparse

import pytest

from ds_bench import cli
from ds_bench.capacity import search
from ds_bench.capacity.family import seq_member
from ds_bench.capacity.seq_search import Lengths, answer, next_length
from ds_bench.config.layout import Layout
from ds_bench.engines.tiling import LOSS_TILE_BYTES
from ds_bench.config.study_flags import add_switch_arguments, switches_of
from ds_bench.perf.grid import families
from ds_bench.perf import seq_memory
from ds_bench.record.schema import CapacityRecord
from ds_bench.report import capacity_table
from ds_bench.sweep.common_args import common_run_args, seq_axis
from tests.conftest import ds_bench, explain, records, size_of


def run_lengths(lengths: Lengths, fits_up_to: int, predicted_from: int | None = None):
    """Drive the search against a model that trains sequences up to ``fits_up_to`` tokens, lengths from
    ``predicted_from`` predicted not to fit (pure): the answer and the lengths probed, in order."""
    known, probed = {}, []
    while (t := next_length(lengths, known)) is not None:
        if predicted_from is not None and t >= predicted_from:
            known[t] = search.PREDICTED
            continue
        probed.append(t)
        known[t] = "ok" if t <= fits_up_to else "oom"
    return answer(lengths, known), probed


def test_the_sequence_doubles_then_bisects_to_the_granularity():
    found, probed = run_lengths(Lengths(1024, 1 << 20, 256), fits_up_to=5000)
    assert probed == [1024, 2048, 4096, 8192, 6144, 5120, 4608, 4864]
    assert (found.largest, found.next, found.why) == (4864, 5120, "oom")


def test_the_start_already_out_of_memory_ends_the_search():
    found, probed = run_lengths(Lengths(1024, 1 << 20, 256), fits_up_to=1000)
    assert probed == [1024] and (found.largest, found.next, found.why) == (None, 1024, "oom")


def test_the_maximum_is_probed_as_it_is_and_ends_the_doubling():
    found, probed = run_lengths(Lengths(1024, 3000, 256), fits_up_to=10**9)
    assert probed == [1024, 2048, 3000] and (found.largest, found.next, found.why) == (3000, None, None)
    found, probed = run_lengths(Lengths(1024, 3000, 256), fits_up_to=2500)
    assert probed == [1024, 2048, 3000, 2304, 2560] and (found.largest, found.next) == (2304, 2560)


def test_every_length_is_a_multiple_of_the_sequence_parallel_degrees():
    lengths = Lengths(768, 100_000, 256, multiple=3)
    assert (lengths.step, lengths.top) == (768, 99_999)
    found, probed = run_lengths(lengths, fits_up_to=20_000)
    assert all(t % 3 == 0 for t in probed) and found.largest == 19_968 and found.next - found.largest <= 768


def test_a_length_predicted_not_to_fit_is_not_run():
    found, probed = run_lengths(Lengths(1024, 1 << 20, 256), fits_up_to=10**9, predicted_from=6000)
    assert probed == [1024, 2048, 4096, 5120, 5632, 5888]
    assert (found.largest, found.next, found.why) == (5888, 6144, "predicted")


FP32_Z3 = Layout(3, "none", "fp32", 1)


def test_the_loss_is_the_ranks_tokens_by_the_vocabulary_or_one_tile():
    sp2 = Layout(3, "none", "bf16", 1, sequence_parallel=2)
    assert seq_memory.tokens_per_rank(sp2, 1024) == 512
    assert seq_memory.loss_bytes(sp2, 1024, 1000) == 512 * 1000 * 12
    tiled = Layout(3, "none", "bf16", 1, sequence_parallel=2, tiled_loss=True)
    assert seq_memory.loss_bytes(tiled, 1024, 1000) == 512 * 1000 * 12  # one tile holds it all
    # 131,072 tokens x 128,256 rows of fp32 logits: 251 tiles of 523 tokens (ds_bench.engines.tiling.loss_tiles)
    assert seq_memory.loss_bytes(tiled, 262_144, 128_256) == 523 * 128_256 * 12
    assert seq_memory.loss_bytes(sp2, 262_144, 128_256) == 131_072 * 128_256 * 12  # 188 GiB without tiles
    assert seq_memory.loss_bytes(tiled, 1 << 20, 128_256) <= 3 * LOSS_TILE_BYTES + 128_256 * 12


def test_the_prediction_is_per_token_above_the_states_and_the_loss():
    def probe(seq_len, per_token=50_000, fixed=2_000_000):  # 1 MB baseline, 10 MB states, vocabulary 1000
        return seq_memory.SeqProbe(seq_len, 1_000_000 + 10_000_000 + fixed + per_token * seq_len + seq_len * 12_000,
                                   1_000_000, 10_000_000)

    assert probe(1000).peak_bytes == 75_000_000 and probe(2000).peak_bytes == 137_000_000
    two = seq_memory.calibrate([probe(2000), probe(1000)], FP32_Z3, 1000)
    assert (two.bytes_per_token, two.fixed_bytes, two.source) == (50_000, 2_000_000, "seq 1000, seq 2000")
    assert seq_memory.predict_peak(two, FP32_Z3, 4000, 1000, 10_000_000) == 261_000_000
    one = seq_memory.calibrate([probe(1000)], FP32_Z3, 1000)  # the fixed cost read as per token: too high
    assert (one.bytes_per_token, one.fixed_bytes) == (52_000, 0)
    assert seq_memory.predict_peak(one, FP32_Z3, 4000, 1000, 10_000_000) == 267_000_000
    assert seq_memory.calibrate([], FP32_Z3, 1000) is None
    assert seq_memory.predict_peak(None, FP32_Z3, 4000, 1000, 10_000_000) is None


def test_a_member_is_the_model_at_one_length():
    llama = seq_member("llama", ("--layers", "2", "--hidden", "64", "--heads", "4"), 8192)
    assert (llama.name, llama.seq_len, llama.vocab, llama.run_args) == (
        "seq 8192", 8192, 50257, ("--layers", "2", "--hidden", "64", "--heads", "4"))
    assert seq_member("llama", ("--size", "llama3.2-1b"), 4096).params == 1_235_814_400
    gpt2 = [seq_member("gpt2", ("--size", "tiny"), t).params for t in (512, 1024, 4096)]
    assert gpt2[0] == gpt2[1] < gpt2[2]  # learned positions past GPT-2's 1,024


def test_the_switch_axes_are_generic_and_deepspeeds():
    p = argparse.ArgumentParser()
    add_switch_arguments(p)
    off = {"tiled_mlp": (False,), "tiled_loss": (False,), "optimizer": ("",), "master_states": ("",), "sp_path": ("",),
           "deepcompile": (False,)}
    assert switches_of(p.parse_args([])) == off
    switches = switches_of(p.parse_args(["--tiled-mlp", "off,on", "--tiled-loss", "on"]))
    assert switches == {**off, "tiled_mlp": (False, True), "tiled_loss": (True,)}
    fams = families((3,), ("none",), ("fp32",), (1,), ("deepspeed", "ddp"), {"sequence_parallel": (1, 2)},
                    switches=switches)
    assert [f.family_label() for f in fams] == [
        "z3 off=none fp32 tiled-loss", "z3 off=none fp32 tiled-mlp tiled-loss", "sp2 z3 off=none fp32 tiled-loss",
        "sp2 z3 off=none fp32 tiled-mlp tiled-loss", "ddp z0 off=none fp32"]
    assert fams[3].run_flags() == ["--sequence-parallel", "2", "--tiled-mlp", "--tiled-loss"]


def test_the_sweeps_seq_len_is_an_axis_with_several_values_and_a_run_argument_with_one():
    assert (seq_axis("1024,4096"), seq_axis("1024"), seq_axis(1024), seq_axis(None)) == ((1024, 4096), (0,), (0,), (0,))
    one = argparse.Namespace(workload="gpt2", size="tiny", seq_len="256", data=None)
    assert common_run_args(one, ["--lr", "0.01"]) == ("--size", "tiny", "--seq-len", "256", "--lr", "0.01")
    several = argparse.Namespace(workload="gpt2", size="tiny", seq_len="256,512", data=None)
    assert common_run_args(several, []) == ("--size", "tiny")
    keys = [f.with_micro_batch(2).key for f in families((1,), ("none",), ("fp32",), (1,), seq_lens=(256, 512))]
    assert keys == ["z1 off=none fp32 mbs=2 seq=256", "z1 off=none fp32 mbs=2 seq=512"]
    # a point with its own sequence (--point '... seq=N') runs it, not the sweep's one --seq-len (run arguments win)
    from ds_bench.sweep.common_args import seq_arg as _seq_arg, without_seq as _without_seq

    assert _without_seq(("--size", "tiny", "--seq-len", "256", "--lr", "1")) == ("--size", "tiny", "--lr", "1")
    assert _without_seq(("--seq-len=256",)) == () and _seq_arg(("--seq-len", "256", "--seq-len=512")) == "512"


def test_a_run_seq_len_with_its_unit_after_the_dash_dash_reaches_the_points(tmp_path, capsys):
    """``-- --seq-len 1k`` is a count as ``ds-bench run`` reads it; the sweep's legality rules read it alike."""
    from ds_bench.machine.compute_node import ComputeNode
    from ds_bench.sweep import driver
    from ds_bench.sweep.spec import from_args

    args = cli.parse(["sweep", "--workload", "gpt2", "--ds-config", "zero2.json", "--stages", "0", "--micro-batch", "1",
                      "--results", str(tmp_path / "s.jsonl"), "--dry-run", "--", "--seq-len", "1k"])
    spec, base = from_args(args, list(args.run_args), ComputeNode(gpus=0, native_bf16=True, cpus=2, memory_bytes=2**34))
    sweep = driver.Sweep(spec, base)
    assert sweep.with_seq(spec.families()[0].with_micro_batch(1)).seq_len == 1024


def test_one_seq_len_keeps_the_sweeps_run_arguments_and_several_are_points(tmp_path, capsys):
    from ds_bench.machine.compute_node import ComputeNode
    from ds_bench.sweep.spec import from_args

    cpu_node = ComputeNode(gpus=0, native_bf16=False, cpus=2, memory_bytes=24 * 2**30)

    argv = ["sweep", "--workload", "llama", "--size", "tiny", "--ds-config", "zero3.json", "--precision", "fp32",
            "--micro-batch", "1", "--nproc", "2", "--results", str(tmp_path / "s.jsonl")]
    spec, _ = from_args(cli.parse([*argv, "--seq-len", "256"]), [], cpu_node)
    assert (spec.run_args, spec.seq_lens) == (("--size", "tiny", "--seq-len", "256"), (0,))
    code = cli.main([*argv, "--seq-len", "256,1001", "--sequence-parallel", "1,2", "--tiled-loss", "off,on",
                     "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "  sp2 z3 off=none fp32 seq=256 tiled-loss\n" in out and "  z3 off=none fp32 seq=1001\n" in out
    assert "  sp2 z3 off=none fp32 seq=1001  skipped: --sequence-parallel 2 does not divide --seq-len 1001" in out
    assert not (tmp_path / "s.jsonl").exists()


def test_the_capacity_plan_lists_the_layouts_and_the_lengths(tmp_path, capsys):
    code = cli.main(["capacity", "--ds-config", "zero3.json", "--workload", "llama", "--size", "tiny", "--scale",
                     "seq", "--seq-len", "1536", "--max-seq-len", "65536", "--sequence-parallel", "1,2",
                     "--tiled-mlp", "off,on", "--precision", "fp32", "--nproc", "2", "--results",
                     str(tmp_path / "c.jsonl"), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    layouts = ["z3 off=none fp32 mbs=1", "z3 off=none fp32 mbs=1 tiled-mlp", "sp2 z3 off=none fp32 mbs=1",
               "sp2 z3 off=none fp32 mbs=1 tiled-mlp"]
    assert "layouts:\n" + "".join(f"  {k}\n" for k in layouts) in out
    assert ("sequence lengths of --size tiny (3.3M parameters): doubled from 1536 to at most 65536, then bisected "
            "to a granularity of 256 (multiples of 2: every --sequence-parallel degree of a layout not skipped divides them)"
            ) in out
    assert "longest sequence of llama tiny: from 1536" in out and not (tmp_path / "c.jsonl").exists()


def test_a_layout_the_ranks_cannot_hold_is_skipped_and_does_not_set_the_lengths(tmp_path, capsys):
    """Issue 45: SP=3 on 2 ranks cannot run, so the lengths are multiples of the runnable layouts' degrees only
    (512 is accepted: no SP=3 probe is made) and the SP=3 layout is skipped, saying why; every layout impossible
    is bad input (tests/test_bad_inputs.py)."""
    code = cli.main(["capacity", "--ds-config", "zero1.json", "--workload", "llama", "--size", "tiny", "--scale", "seq",
                     "--seq-len", "512", "--sequence-parallel", "1,2,3", "--precision", "fp32", "--nproc", "2",
                     "--results", str(tmp_path / "c.jsonl"), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert ("  sp3 z1 off=none fp32 mbs=1  skipped: --sequence-parallel 3 does not divide the world size 2: every "
            "data-parallel replica needs a whole sequence-parallel group\n") in out
    assert "  sp2 z1 off=none fp32 mbs=1\n" in out and "(multiples of 2: " in out


def test_a_skipped_layout_the_ranks_cannot_hold_has_no_data_parallel_degree_in_the_table():
    """Issue 45: the row of SP=3 on 2 ranks said ``sp3 dp0``."""
    point = Layout(1, "none", "fp32", 1, sequence_parallel=3).to_dict()
    record = CapacityRecord.model_validate({
        "kind": "capacity", "capacity": "c", "world_size": 2, "data_parallel_size": 0, "point": point,
        "status": "skipped", "reason": "--sequence-parallel 3 does not divide the world size 2", "scale": "seq"})
    assert capacity_table.layout_text(record) == "sp3 z1 off=none fp32 mbs=1"
    whole = record.model_copy(update={"world_size": 6, "data_parallel_size": 2})
    assert capacity_table.layout_text(whole) == "sp3 dp2 z1 off=none fp32 mbs=1"


def test_the_table_names_lengths():
    point = Layout(3, "none", "fp32", 1, sequence_parallel=2).to_dict()
    record = CapacityRecord.model_validate({
        "kind": "capacity", "capacity": "c", "world_size": 2, "data_parallel_size": 1, "point": point, "status": "ok",
        "scale": "seq", "family": "longest sequence of llama tiny",
        "largest": {"member": "seq 2304", "seq_len": 2304, "params": 3_347_840, "peak_mem_bytes": 2**30},
        "next": {"member": "seq 2560", "seq_len": 2560, "why": "oom"}, "capacity_bytes": int(1.2 * 2**30)})
    text = capacity_table.table([record])
    assert "longest sequence" in text and "next length" in text and "largest that ran" not in text
    assert "sp2 dp1 z3 off=none fp32 mbs=1  2304" in text and "2560" in text and "oom" in text
    ended = record.model_copy(update={"next": None})
    assert "(--max-seq-len)" in capacity_table.table([ended])


@pytest.mark.dist
@pytest.mark.full  # LayoutSearch's real probes run in make test (tests/test_capacity.py); this is --scale seq's
def test_a_real_search_finds_the_longest_sequence_that_ran(tmp_path):
    """Ulysses over 2 CPU ranks with ALST's tiled MLP and loss, ZeRO-3 fp32, a 2 x 64 x 4 Llama: 256 tokens, then
    512, the maximum; each probe a real run with the layout's flags, the answer the longest that ran."""
    results = tmp_path / "c.jsonl"
    proc = ds_bench("capacity", "--ds-config", "zero3.json", "--workload", "llama", "--layers", "2", "--hidden", "64",
                    "--heads", "4", "--scale", "seq", "--seq-len", "256", "--max-seq-len", "512", "--sequence-parallel",
                    "2", "--tiled-mlp", "on", "--tiled-loss", "on", "--precision", "fp32", "--nproc", "2",
                    "--launcher", "torchrun", "--steps", "2", "--warmup", "1", "--results", str(results),
                    "--master-port", "29874", "--timeout", "3m", timeout=600, HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, explain(proc)
    recs, runs = records(results), records(results.with_suffix(".runs.jsonl"))
    (summary,) = [r for r in recs if r["kind"] == "capacity"]
    probes = {p["index"]: p for p in recs if p["kind"] == "capacity_probe"}
    assert sorted(probes) == [256, 512] and all(p["status"] == "ok" for p in probes.values()), probes
    assert summary["scale"] == "seq" and summary["status"] == "ok" and summary["next"] is None, summary
    assert summary["largest"]["member"] == "seq 512" and summary["largest"]["seq_len"] == 512
    assert summary["layout"] == "sp2 z3 off=none fp32 mbs=1 tiled-mlp tiled-loss" and summary["data_parallel_size"] == 1
    assert probes[512]["predicted_mem_bytes"] and probes[256]["predicted_mem_bytes"] is None  # calibrated on 256
    by_run = {r["run_id"]: r for r in runs}
    for t, p in probes.items():
        run = by_run[p["run_id"]]
        assert p["seq_len"] == run["config"]["seq_len"] == t and size_of(run, "sequence_parallel") == 2
        assert set(run["memory_options"]) == {"tiled_mlp", "tiled_loss"}, run["memory_options"]
    table = proc.stdout.split("results:")[0]
    assert "longest sequence" in table and "sp2 dp1 z3 off=none fp32 mbs=1 tiled-mlp tiled-loss  512" in table, table
    assert "(--max-seq-len)" in table

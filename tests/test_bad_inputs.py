"""Bad input, systematically: every case exits 2 with one ``ds-bench: error:`` line naming the flag, key
or file, no traceback, no results file, and never reaches the process group.

Cases run in-process through ``ds_bench.cli.main`` (a subprocess costs ~4 s here). A case that
wrongly passes validation hits ``process_group.init_distributed`` (or a launcher), which raise here.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ds_bench import cli
from tests.conftest import PASSED, stop_past_checks

REPO = Path(__file__).resolve().parent.parent
ZERO2 = json.loads((REPO / "ds_configs" / "zero2.json").read_text())


@dataclass(frozen=True)
class Case:
    argv: object  # tmp_path -> argv
    pattern: str
    env: dict = field(default_factory=dict)
    """Environment variables the case sets (``TORCHDYNAMO_DISABLE=0``: conftest sets 1, which ``--compile`` refuses first)."""


def cfg_with(**changes) -> dict:
    """zero2.json with dotted keys set (``a__b`` for ``a.b``); a value of ... removes the key."""
    cfg = copy.deepcopy(ZERO2)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = cfg
        for part in parents:
            node = node.setdefault(part, {})
        if value is ...:
            node.pop(last, None)
        else:
            node[last] = value
    return cfg


def run(*flags: str, cfg=None, raw=None):
    """A ``run`` argv; ``cfg`` (a dict) or ``raw`` (str/bytes) is written as the config file."""
    def argv(tmp: Path) -> list[str]:
        path = str(REPO / "ds_configs" / "zero2.json")
        if cfg is not None or raw is not None:
            target = tmp / "c.json"
            content = json.dumps(cfg) if cfg is not None else raw
            target.write_bytes(content if isinstance(content, bytes) else content.encode())
            path = str(target)
        base = {"--workload": "mnist", "--ds-config": path, "--steps": "3", "--warmup": "1",
                "--results": str(tmp / "r.jsonl")}
        given = set(flags)
        return ["run", *[x for k, v in base.items() if k not in given for x in (k, v)],
                *[f.replace("{tmp}", str(tmp)) for f in flags]]
    return argv


def cmd(*args: str):
    return lambda tmp: [a.replace("{tmp}", str(tmp)) for a in args]


def hostfile(text: str, *rest: str, launcher: str = "deepspeed"):
    def argv(tmp: Path) -> list[str]:
        (tmp / "hf").write_text(text)
        return ["launch", launcher, "--hostfile", str(tmp / "hf"), "--dry-run", *rest]
    return argv


def with_folders(argv, *paths: str, marker: str | None = None):
    """``argv`` (a builder) after making folders under {tmp}; ``marker`` goes into the last one as the
    checkpoint marker (``ds_bench.measure.checkpoint_disk``)."""
    def build(tmp: Path) -> list[str]:
        for p in paths:
            (tmp / p).mkdir(parents=True)
        if marker is not None:
            (tmp / paths[-1] / "ds_bench_checkpoint.json").write_text(marker)
        return argv(tmp)
    return build


NUM = r"must be (a positive integer|positive|an integer >= 0|>= 0|a finite number)"
class OneCasePerName(dict):
    """The cases by name; naming a case twice fails at import (it silently replaced the first one)."""

    def __setitem__(self, name, case):
        if name in self:
            raise KeyError(f"bad-input case {name!r} is defined twice")
        super().__setitem__(name, case)


CASES: dict[str, Case] = OneCasePerName()

# --- every numeric run flag: zero, negative, non-numeric, absurd -----------------------------------
for flag, zero_ok in [("--steps", False), ("--warmup", True), ("--micro-batch", False),
                      ("--image-size", False), ("--num-classes", False), ("--peak-tflops", False), ("--lr", False),
                      ("--slow-rank-threshold", False), ("--busbw", False)]:
    if not zero_ok:
        CASES[f"{flag} 0"] = Case(run(flag, "0"), re.escape(flag) + r".*(must|greater)")
    CASES[f"{flag} negative"] = Case(run(flag, "-3"), re.escape(flag) + r".*must")
    CASES[f"{flag} non-numeric"] = Case(run(flag, "lots"), re.escape(flag.lstrip("-")) + r".*invalid (int|float) value")
for flag in ("--peak-tflops", "--lr", "--slow-rank-threshold", "--busbw"):
    CASES[f"{flag} inf"] = Case(run(flag, "inf"), re.escape(flag) + r" must be .*finite.*got inf")
    CASES[f"{flag} nan"] = Case(run(flag, "nan"), re.escape(flag) + r" must be .*got nan")
CASES["--steps fractional"] = Case(run("--steps", "2.5"), r"--steps.*invalid int value: '2\.5'")
CASES["--seed non-numeric"] = Case(run("--seed", "x"), r"--seed.*invalid int value")
CASES["--steps equal --warmup"] = Case(run("--steps", "4", "--warmup", "4"), r"--steps \(4\) must be greater than --warmup")
CASES["--warmup above --steps"] = Case(run("--steps", "2", "--warmup", "5"), r"--steps \(2\) must be greater")
CASES["--workload unknown"] = Case(run("--workload", "bert"), r"--workload 'bert' is unknown; known: .*gpt2")
CASES["--size for mnist"] = Case(run("--size", "huge"), r"--size is not used by workload mnist")
CASES["--size unknown gpt2"] = Case(run("--workload", "gpt2", "--size", "galactic"), r"--size 'galactic' is not a size")
GPT2 = ("--workload", "gpt2")
CASES["--layers alone"] = Case(run(*GPT2, "--layers", "4"), r"needs --layers, --hidden and --heads together; missing --hidden, --heads")
CASES["--heads missing"] = Case(run(*GPT2, "--layers", "4", "--hidden", "64"), r"custom shape .*missing --heads")
CASES["--hidden not divisible"] = Case(run(*GPT2, "--layers", "4", "--hidden", "66", "--heads", "4"),
                                       r"--hidden 66 is not divisible by --heads 4")
CASES["--layers 0"] = Case(run(*GPT2, "--layers", "0", "--hidden", "64", "--heads", "4"), r"--layers must be a positive integer, got 0")
CASES["--heads negative"] = Case(run(*GPT2, "--layers", "2", "--hidden", "64", "--heads", "-4"), r"--heads must be a positive integer")
CASES["--hidden non-numeric"] = Case(run(*GPT2, "--hidden", "wide"), r"hidden.*invalid int value: 'wide'")
CASES["custom shape with --size"] = Case(run(*GPT2, "--size", "tiny", "--layers", "2", "--hidden", "64", "--heads", "4"),
                                         r"--layers/--hidden/--heads give the shape: not with --size")
CASES["--layers for mnist"] = Case(run("--layers", "2"), r"--layers: workload mnist has no custom shapes")
CASES["--attn unknown"] = Case(run(*GPT2, "--attn", "flash"), r"--attn 'flash' is unknown; known: sdpa, eager, flash_attention_2")
if importlib.util.find_spec("flash_attn") is None:  # a CUDA machine may have it
    CASES["--attn flash_attention_2 without flash-attn"] = Case(run(*GPT2, "--attn", "flash_attention_2"),
                                                               r"--attn flash_attention_2 needs the flash-attn package")
CASES["--channels-last for mnist"] = Case(run("--channels-last", "--engine", "ddp"),
                                         r"--channels-last: workload mnist has no 2-D convolutions")
CASES["--channels-last with DeepSpeed"] = Case(run("--workload", "resnet", "--channels-last"),
                                              r"--channels-last with --engine deepspeed: only DDP trains NHWC weights")
CASES["--compile without warm-up"] = Case(run("--compile", "--warmup", "0"), r"--compile needs --warmup 1 or more")
CASES["--compile with dynamo disabled"] = Case(run("--compile"), r"--compile with TORCHDYNAMO_DISABLE set")  # conftest sets it
CASES["--optimizer unknown"] = Case(run(*GPT2, "--optimizer", "lion"), r"--optimizer 'lion' is unknown; known: adamw, muon")
CASES["--master-states unknown"] = Case(run(*GPT2, "--master-states", "fp8"),
                                        r"--master-states 'fp8' is unknown; known: fp32, bf16, bf16-weights")
CASES["--sp-path unknown"] = Case(run(*GPT2, "--sp-path", "ring"), r"--sp-path 'ring' is unknown; known: ulysses, autosp")
CASES["Muon config clipping at ZeRO-1"] = Case(
    run(*GPT2, cfg=cfg_with(zero_optimization__stage=1, gradient_clipping=1.0,
                            optimizer={"type": "Muon", "params": {"muon_lr": 0.02, "adam_lr": 1e-3}})),
    r"c\.json: gradient_clipping 1\.0 with optimizer Muon at ZeRO stage 1: DeepSpeed clips Muon's orthogonalised update")
CASES["Muon config ZeRO-3 reduce scatter"] = Case(
    run(*GPT2, cfg=cfg_with(zero_optimization__stage=3, gradient_clipping=0,
                            optimizer={"type": "Muon", "params": {"muon_lr": 0.02, "adam_lr": 1e-3}})),
    r"c\.json: zero_optimization\.reduce_scatter must be false with optimizer Muon at ZeRO stage 3")
CASES["bf16 master weights alone without offload"] = Case(
    run(*GPT2, cfg=cfg_with(bf16__bf16_master_weights_and_grads=True)),
    r"bf16\.bf16_master_weights_and_grads without bf16\.bf16_optimizer_states needs zero_optimization\.offload_optimizer")
CASES["--deepcompile on CPU ranks"] = Case(run(*GPT2, "--deepcompile", "--ds-config", "ds_configs/zero1.json"),
                                           r"--deepcompile on CPU ranks: DeepCompile is CUDA-only",
                                           env={"TORCHDYNAMO_DISABLE": "0"})
CASES["--sp-path autosp without a group"] = Case(run(*GPT2, "--sp-path", "autosp"),
                                                 r"--sp-path autosp needs --sequence-parallel 2 or more",
                                                 env={"TORCHDYNAMO_DISABLE": "0"})
CASES["zenflow with torch_adam"] = Case(
    run(*GPT2, cfg=cfg_with(zero_optimization__offload_optimizer={"device": "cpu"},
                            zero_optimization__zenflow={"topk_ratio": 0.1})),
    r"c\.json: optimizer\.params\.torch_adam with zero_optimization\.zenflow: ZenFlow builds its own AdamW")
CASES["--attn for mnist"] = Case(run("--attn", "sdpa"), r"--attn: workload mnist has no attention \(gpt2 and llama have\)")
CASES["--attn eager with a pipeline"] = Case(run(*GPT2, "--attn", "eager", "--pipeline-stages", "1", "--ds-config",
                                                 "ds_configs/zero1.json"),
                                             r"--attn eager with --pipeline-stages 1: .* no attention mask")
PP = ("--workload", "gpt2", "--size", "tiny", "--seq-len", "32", "--pipeline-stages")
CASES["--pipeline-stages 0"] = Case(run(*PP, "0"), r"--pipeline-stages must be a positive integer, got 0")
CASES["--pipeline-stages negative"] = Case(run(*PP, "-2"), r"--pipeline-stages must be a positive integer, got -2")
CASES["--pipeline-stages non-numeric"] = Case(run(*PP, "two"), r"pipeline-stages.*invalid int value: 'two'")
CASES["--pipeline-stages not dividing"] = Case(run(*PP, "2", "--ds-config", "ds_configs/zero1.json"),
                                               r"--pipeline-stages 2 does not divide the world size 1")
CASES["pipeline zero 2"] = Case(run(*PP, "1"), r"--pipeline-stages 1 with ZeRO stage 2: DeepSpeed's pipeline engine allows ZeRO stage 0 or 1")
CASES["pipeline zero 3"] = Case(run(*PP, "1", "--ds-config", "ds_configs/zero3.json"), r"--pipeline-stages 1 with ZeRO stage 3: DeepSpeed's pipeline")
CASES["pipeline offload"] = Case(run(*PP, "1", cfg=cfg_with(zero_optimization__stage=1, zero_optimization__offload_optimizer={"device": "cpu"})),
                                 r"--pipeline-stages 1 with offload=optimizer: DeepSpeed's pipeline engine does not offload")
CASES["pipeline engine ddp"] = Case(run(*PP, "1", "--engine", "ddp"), r"--engine ddp with --pipeline-stages 1: the pipeline is DeepSpeed's")
CASES["pipeline engine fsdp"] = Case(run(*PP, "1", "--engine", "fsdp"), r"--engine fsdp with --pipeline-stages")
CASES["pipeline mnist"] = Case(run("--pipeline-stages", "1", "--ds-config", "ds_configs/zero1.json"),
                               r"--pipeline-stages 1: this workload has no pipeline model")
CASES["pipeline breakdown"] = Case(run(*PP, "1", "--breakdown", "--ds-config", "ds_configs/zero1.json"),
                                   r"--breakdown with --pipeline-stages 1: it times the phases")
CASES["pipeline checkpoint"] = Case(run(*PP, "1", "--checkpoint", "{tmp}/ckpt", "--ds-config", "ds_configs/zero1.json"),
                                    r"--checkpoint with --pipeline-stages 1: not measured yet")
TP = ("--workload", "llama", "--size", "tiny", "--seq-len", "32", "--ds-config", "ds_configs/zero1.json", "--tensor-parallel")
CASES["--tensor-parallel 0"] = Case(run(*TP, "0"), r"--tensor-parallel must be a positive integer, got 0")
CASES["--tensor-parallel non-numeric"] = Case(run(*TP, "two"), r"tensor-parallel.*invalid int value: 'two'")
CASES["--tensor-parallel not dividing"] = Case(run(*TP, "2"), r"--tensor-parallel 2 does not divide the world size 1")
CASES["--tensor-parallel gpt2"] = Case(run("--workload", "gpt2", "--size", "tiny", "--tensor-parallel", "1"),
                                       r"--tensor-parallel: DeepSpeed's AutoTP cannot shard workload gpt2")
CASES["--tensor-parallel engine ddp"] = Case(run(*TP, "1", "--engine", "ddp"), r"--engine ddp with --tensor-parallel")
CASES["--tensor-parallel with a pipeline"] = Case(run(*TP, "1", "--pipeline-stages", "1"),
                                                  r"--tensor-parallel 1 with --pipeline-stages 1: AutoTP does not combine with DeepSpeed's pipeline")
CASES["--tensor-parallel with --checkpoint"] = Case(run(*TP, "1", "--checkpoint", "{tmp}/ckpt"),
                                                    r"--checkpoint with --tensor-parallel 1: not measured yet")
SP = ("--workload", "llama", "--size", "tiny", "--seq-len", "32", "--ds-config", "ds_configs/zero1.json")
"""A run ``--sequence-parallel`` and the tiling options may take (one rank: S=1 engages Ulysses' rules)."""
CASES["--sequence-parallel 0"] = Case(run(*SP, "--sequence-parallel", "0"), r"--sequence-parallel must be a positive integer, got 0$")
CASES["--sequence-parallel non-numeric"] = Case(run(*SP, "--sequence-parallel", "two"),
                                                r"argument --sequence-parallel: invalid int value: 'two'$")
CASES["--sequence-parallel not dividing"] = Case(run(*SP, "--sequence-parallel", "2"),
                                                 r"--sequence-parallel 2 does not divide the world size 1: every data-parallel "
                                                 r"replica needs a whole sequence-parallel group$")
CASES["--sequence-parallel mnist"] = Case(run("--sequence-parallel", "1", "--ds-config", "ds_configs/zero1.json"),
                                          r"--sequence-parallel: workload mnist is not a causal language model \(llama is\)$")
CASES["--sequence-parallel gpt2"] = Case(run("--workload", "gpt2", "--size", "tiny", "--sequence-parallel", "1",
                                             "--ds-config", "ds_configs/zero1.json"),
                                         r"--sequence-parallel: DeepSpeed-Ulysses' HF wrapper cannot shard workload gpt2 "
                                         r"\(llama it can\): it returns the attention output as \[batch, tokens, width\]")
CASES["--sp-path autosp with dynamo off"] = Case(run(*SP, "--sequence-parallel", "2", "--sp-path", "autosp"),
                                                 r"--sp-path autosp with TORCHDYNAMO_DISABLE set in the environment",
                                                 env={"TORCHDYNAMO_DISABLE": "1"})
CASES["--tiled-loss with fp16"] = Case(run(*SP, "--tiled-loss", "--set", "bf16.enabled=false", "--set", "fp16.enabled=true"),
                                       r"--tiled-loss with fp16: DeepSpeed's TiledFusedLogitsLoss takes the LM head's "
                                       r"gradient in forward")
CASES["--checkpoint-offload without checkpointing"] = Case(run(*SP, "--checkpoint-offload"),
                                                           r"--checkpoint-offload needs --activation-checkpointing")
CASES["--selective-checkpointing without checkpointing"] = Case(
    run(*SP, "--selective-checkpointing"), r"--selective-checkpointing needs --activation-checkpointing")
CASES["--checkpoint-offload on CPU ranks"] = Case(run(*SP, "--checkpoint-offload", "--activation-checkpointing"),
                                                  r"--checkpoint-offload on CPU ranks: their activations are in host "
                                                  r"memory already")
CASES["--sequence-parallel engine ddp"] = Case(run(*SP, "--sequence-parallel", "1", "--engine", "ddp"),
                                               r"--engine ddp with --sequence-parallel 1: sequence parallelism is DeepSpeed-Ulysses "
                                               r"here \(--engine deepspeed\)$")
CASES["--sequence-parallel with a pipeline"] = Case(run(*PP, "1", "--sequence-parallel", "1",
                                                        "--ds-config", "ds_configs/zero1.json"),
                                                    r"--sequence-parallel 1 with --pipeline-stages 1: DeepSpeed's pipeline engine "
                                                    r"takes no sequence-parallel groups$")
CASES["--sequence-parallel with AutoTP"] = Case(run(*SP, "--sequence-parallel", "1", "--tensor-parallel", "1"),
                                                r"--sequence-parallel 1 with --tensor-parallel 1: DeepSpeed's Ulysses groups "
                                                r"\(parallel_state_sp\) have no tensor-parallel dimension")
CASES["--sequence-parallel attn eager"] = Case(run(*SP, "--sequence-parallel", "1", "--attn", "eager"),
                                               r"--attn eager with --sequence-parallel 1: Ulysses drops the 4-D attention mask "
                                               r"eager needs .*; use --attn sdpa or flash_attention_2$")
CASES["--sequence-parallel with --checkpoint"] = Case(run(*SP, "--sequence-parallel", "1", "--checkpoint", "{tmp}/ckpt"),
                                                      r"--checkpoint with --sequence-parallel 1: not measured yet$")
CASES["--sequence-parallel with --compile"] = Case(run(*SP, "--sequence-parallel", "1", "--compile"),
                                                   r"--compile with --sequence-parallel 1: not measured yet$",
                                                   env={"TORCHDYNAMO_DISABLE": "0"})
THREE_RANKS = {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": "29999"}
"""Rank 0 of 3 from the environment: S=3 divides the world, and what the model's heads say is reached."""
CASES["--sequence-parallel not dividing the heads"] = Case(
    run("--workload", "llama", "--size", "tiny", "--seq-len", "33", "--sequence-parallel", "3", "--ds-config",
        "ds_configs/zero1.json"), r"--sequence-parallel 3 does not divide the model's 4 attention "
    r"heads: Ulysses gives every rank of a group an equal share of the heads$", env=THREE_RANKS)
CASES["--sequence-parallel with KV heads it cannot split"] = Case(
    run("--workload", "llama", "--size", "llama3.2-3b", "--seq-len", "33", "--sequence-parallel", "3", "--ds-config",
        "ds_configs/zero1.json"), r"--sequence-parallel 3 with the model's 8 KV heads: Ulysses needs the KV heads to "
    r"divide S \(they are replicated\) or S to divide them$", env=THREE_RANKS)
CASES["--tiled-mlp engine ddp"] = Case(run(*SP, "--tiled-mlp", "--engine", "ddp"),
                                       r"--engine ddp with --tiled-mlp: DeepSpeed's tiled compute hands each weight's gradient "
                                       r"to ZeRO once, .*DDP and FSDP have no such hook \(--engine deepspeed\)$")
CASES["--tiled-loss mnist"] = Case(run("--tiled-loss", "--ds-config", "ds_configs/zero1.json"),
                                   r"--tiled-loss: workload mnist is not a causal language model \(gpt2 and llama are\)$")
CASES["--tiled-mlp with --compile"] = Case(run(*SP, "--tiled-mlp", "--compile"), r"--tiled-mlp with --compile: not measured yet$",
                                           env={"TORCHDYNAMO_DISABLE": "0"})
CASES["autotp_size in the config"] = Case(run(*TP[:-1], "--set", "tensor_parallel.autotp_size=2"),
                                         r"tensor_parallel.autotp_size 2: give it as --tensor-parallel 2 instead")
CASES["llama unknown size"] = Case(run("--workload", "llama", "--size", "llama2-7b"),
                                   r"--size 'llama2-7b' is not a size of workload llama; known: tiny, llama3.2-1b")
CASES["llama --model with --size"] = Case(run("--workload", "llama", "--size", "tiny", "--model", "{tmp}"),
                                          r"--size and --model are exclusive")
CASES["llama --model without config"] = Case(run("--workload", "llama", "--model", "{tmp}"),
                                             r"--model .*: no config.json \(expected a folder written by save_pretrained\)")
CASES["--partition alone"] = Case(run("--workload", "gpt2", "--partition", "uniform"), r"--partition needs --pipeline-stages")
CASES["--partition unknown"] = Case(run(*PP, "1", "--partition", "profile"), r"--partition 'profile': expected parameters, uniform or type:REGEX")
CASES["--partition bad regex"] = Case(run(*PP, "1", "--partition", "type:(block"), r"--partition 'type:\(block': not a regular expression")
CASES["--data missing"] = Case(run("--data", "{tmp}/nothing"), r"--data .*nothing: no such file or folder")
CASES["--data folder without idx files"] = Case(run("--data", "{tmp}"), r"no train-images-idx3-ubyte")
CASES["--steps not above --warmup"] = Case(run("--steps", "5", "--warmup", "5"), r"--steps \(5\) must be greater than --warmup \(5\)")
CASES["--set key typo"] = Case(run("--set", "zero_optimization.stage3_param_persitence_threshold=1"),
                               r"did you mean stage3_param_persistence_threshold\?")
CASES["--connect-timeout without a unit, the whole line"] = Case(
    run("--connect-timeout", "30"), r"^ds-bench: error: --connect-timeout 30: give a unit, e.g. 30s or 30m \(s, m, h, d\)$")
CASES["--model missing"] = Case(run("--workload", "gpt2", "--model", "{tmp}/nope"), r"--model .*nope: not a folder")
CASES["--comm-results missing"] = Case(run("--comm-results", "{tmp}/none.jsonl"), r"--comm-results .*none\.jsonl: no such file")
CASES["--iface missing"] = Case(run("--iface", "nosuch0"), r"interface 'nosuch0' .* does not exist")
CASES["unknown flag"] = Case(run("--stepz", "3"), r"unrecognized arguments: --stepz 3")
CASES["-- after run"] = Case(run("--", "--steps", "3"), r"arguments after '--' are not used here")

# --- mixture of experts: the flags' values and the model's experts (the layouts they make are the legality
# table's, walked in tests/test_legality.py: EP against the world, DDP/FSDP, AutoTP, a pipeline, Ulysses, ZeRO 0/3)
MOE = ("--workload", "moe", "--size", "tiny", "--seq-len", "32", "--ds-config", "ds_configs/zero1.json")
FOUR_RANKS = {**THREE_RANKS, "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}
"""Rank 0 of 4: EP=4 divides the world, so what the model's experts say is reached."""
CASES["--expert-parallel 0"] = Case(run(*MOE, "--expert-parallel", "0"), r"--expert-parallel must be a positive integer, got 0$")
CASES["--expert-parallel non-numeric"] = Case(run(*MOE, "--expert-parallel", "two"),
                                              r"argument --expert-parallel: invalid int value: 'two'$")
CASES["--expert-parallel not dividing the experts"] = Case(
    run(*MOE, "--experts", "6", "--expert-parallel", "4"),
    r"--expert-parallel 4 does not divide the model's 6 experts: every rank of a group holds an equal share$",
    env=FOUR_RANKS)
CASES["--experts 0"] = Case(run(*MOE, "--experts", "0"), r"--experts must be a positive integer, got 0$")
CASES["--top-k 0"] = Case(run(*MOE, "--top-k", "0"), r"--top-k must be a positive integer, got 0$")
CASES["--top-k above the experts"] = Case(run(*MOE, "--top-k", "5"), r"--top-k 5 is above the model's 4 experts$")
CASES["--top-k above --experts"] = Case(run(*MOE, "--experts", "2", "--top-k", "3"), r"--top-k 3 is above the model's 2 experts$")
CASES["--top-k 1 on the MoE layer"] = Case(run(*MOE, "--top-k", "1"),
                                           r"--top-k 1 with DeepSpeed's MoE layer: its top-1 gate weighs an expert's output "
                                           r"by the gate probability, Mixtral's by 1 \(renormalised\), so the model would "
                                           r"not be Mixtral; use --top-k 2 or more$")
CASES["--moe-path unknown"] = Case(run(*MOE, "--moe-path", "tutel"), r"--moe-path 'tutel': expected auto, autoep, moe-layer, hf$")
CASES["--capacity-factor negative"] = Case(run(*MOE, "--capacity-factor", "-1"),
                                           r"--capacity-factor must be a finite number >= 0 \(0: no token dropping\), got -1\.0$")
CASES["--capacity-factor inf"] = Case(run(*MOE, "--capacity-factor", "inf"), r"--capacity-factor must be a finite .*got inf$")
CASES["--capacity-factor non-numeric"] = Case(run(*MOE, "--capacity-factor", "big"),
                                              r"argument --capacity-factor: invalid float value: 'big'$")
CASES["--aux-loss-weight nan"] = Case(run(*MOE, "--aux-loss-weight", "nan"), r"--aux-loss-weight must be a finite number >= 0, got nan$")
CASES["--aux-loss-weight negative"] = Case(run(*MOE, "--aux-loss-weight", "-0.1"),
                                           r"--aux-loss-weight must be a finite number >= 0, got -0\.1$")
CASES["--capacity-factor with DDP"] = Case(run(*MOE, "--engine", "ddp", "--capacity-factor", "1.0"),
                                           r"--capacity-factor with --engine ddp: HF's own MoE blocks, which DDP and FSDP "
                                           r"train, drop no tokens; the capacity is DeepSpeed's MoE layer's")
CASES["--moe-path with FSDP"] = Case(run(*MOE, "--engine", "fsdp", "--set", "zero_optimization.stage=3",
                                         "--moe-path", "moe-layer"),
                                     r"--moe-path moe-layer with --engine fsdp: DDP and FSDP train HF's own MoE blocks")
CASES["--capacity-factor with HF's blocks"] = Case(run(*MOE, "--moe-path", "hf", "--capacity-factor", "1.0"),
                                                  r"--capacity-factor 1 with HF's own MoE blocks: they drop no tokens")
CASES["--moe-path hf with EP 2"] = Case(run(*MOE, "--moe-path", "hf", "--expert-parallel", "2"),
                                        r"--moe-path hf with --expert-parallel 2: HF's own blocks hold every expert",
                                        env=FOUR_RANKS)
CASES["--moe-path hf with Ulysses"] = Case(run(*MOE, "--moe-path", "hf", "--sequence-parallel", "2"),
                                           r"--moe-path hf with --sequence-parallel 2: not measured yet \(DeepSpeed's "
                                           r"MoE layer composes with Ulysses: --moe-path moe-layer\)$", env=FOUR_RANKS)
CASES["moe text data above the vocabulary"] = Case(
    run("--workload", "moe", "--size", "mixtral-8x7b", "--ds-config", "ds_configs/zero1.json", "--data", "requirements.txt"),
    r"--data .*: text is read with GPT-2's 50257-token BPE, above mixtral-8x7b's 32000-token vocabulary")
CASES["--expert-parallel on gpt2"] = Case(run("--workload", "gpt2", "--size", "tiny", "--expert-parallel", "2"),
                                          r"--expert-parallel: workload gpt2 has no experts \(moe has\)$")
CASES["moe flags on llama"] = Case(run("--workload", "llama", "--size", "tiny", "--top-k", "2", "--capacity-factor", "1"),
                                   r"--top-k/--capacity-factor: workload llama has no experts \(moe has\)$")
CASES["moe --model"] = Case(run("--workload", "moe", "--model", "{tmp}"), r"--model with --workload moe: pretrained MoE "
                                                                          r"weights are not loaded yet")
CASES["moe custom shape with --size"] = Case(run(*MOE, "--layers", "2", "--hidden", "64", "--heads", "4"),
                                             r"--layers/--hidden/--heads give the shape: not with --size$")
CASES["moe --tiled-mlp"] = Case(run(*MOE, "--tiled-mlp"), r"--tiled-mlp with --workload moe: not measured yet")

# --- checkpoints (the folder they name, {tmp}/ckpt, must not be created) -----------------------------
CKPT = ("--checkpoint", "{tmp}/ckpt")
CASES["--checkpoint-every 0"] = Case(run(*CKPT, "--checkpoint-every", "0"), r"--checkpoint-every must be a positive integer, got 0")
CASES["--checkpoint-every negative"] = Case(run(*CKPT, "--checkpoint-every", "-2"), r"--checkpoint-every must be a positive integer")
CASES["--checkpoint-every text"] = Case(run(*CKPT, "--checkpoint-every", "often"), r"checkpoint-every.*invalid int value")
CASES["--checkpoint-every alone"] = Case(run("--checkpoint-every", "2"), r"--checkpoint-every needs --checkpoint DIR")
CASES["--checkpoint-every beyond steps"] = Case(run(*CKPT, "--checkpoint-every", "5"),
                                                r"--checkpoint-every 5: no step of this run \(1\.\.3\) is a multiple of it")
CASES["--checkpoint a file"] = Case(lambda tmp: ((tmp / "f").write_text("x"), run("--checkpoint", "{tmp}/f")(tmp))[1],
                                    r"--checkpoint .*/f: is not a folder; expected a folder to save checkpoints in")
CASES["--checkpoint under a file"] = Case(lambda tmp: ((tmp / "f").write_text("x"), run("--checkpoint", "{tmp}/f/ck")(tmp))[1],
                                          r"--checkpoint .*/f/ck: .*/f is not a folder")
CASES["--checkpoint under /proc"] = Case(run("--checkpoint", "/proc/ds-bench-ckpt"),
                                         r"--checkpoint /proc/ds-bench-ckpt: cannot create files in /proc")
CASES["--checkpoint tag exists"] = Case(with_folders(run("--checkpoint", "{tmp}/ck"), "ck/global_step3"),
                                        r"--checkpoint .*/ck: global_step3 already exists; ds_bench overwrites no checkpoint")
CASES["--resume missing"] = Case(run("--resume", "{tmp}/ckpt"), r"--resume .*/ckpt: not a folder; expected the --checkpoint DIR")
CASES["--resume no checkpoint"] = Case(with_folders(run("--resume", "{tmp}/ck"), "ck/global_step2"),
                                       r"--resume .*/ck: no complete checkpoint in it; expected global_step<k>/ds_bench_checkpoint\.json")
SEED7 = '{"tag": "global_step2", "step": 2, "workload": "mnist", "seed": 7}'
CASES["--resume other seed"] = Case(with_folders(run("--resume", "{tmp}/ck"), "ck/global_step2", marker=SEED7),
                                    r"--resume .*/ck: global_step2 was saved with --seed 7, this run has 0; a resumed run needs the same")

# --- the config file itself -------------------------------------------------------------------------
CASES["config missing"] = Case(run("--ds-config", "{tmp}/absent.json"), r"--ds-config .*absent\.json: file not found")
CASES["config is a folder"] = Case(run("--ds-config", "{tmp}"), r"--ds-config .*: is a folder; expected a DeepSpeed JSON")
CASES["config empty"] = Case(run(raw=""), r"c\.json:1:1: invalid JSON: Expecting value")
CASES["config malformed"] = Case(run(raw='{"train_batch_size": 8 "bf16": {}}'), r"c\.json:1:\d+: invalid JSON")
CASES["config trailing comma"] = Case(run(raw='{"bf16": {"enabled": true,}}'), r"c\.json:1:\d+: invalid JSON")
CASES["config a list"] = Case(run(raw="[1, 2]"), r"c\.json: a DeepSpeed config must be a JSON object, got list")
CASES["config a string"] = Case(run(raw='"zero2"'), r"c\.json: a DeepSpeed config must be a JSON object, got str")
CASES["config binary"] = Case(run(raw=b"\xff\xfe\x00\x01"), r"c\.json: not UTF-8 text")

# --- top level and batch ----------------------------------------------------------------------------
CASES["top-level typo"] = Case(run(cfg=cfg_with(gradient_acumulation_steps=2)),
                               r"unknown DeepSpeed key gradient_acumulation_steps \(did you mean gradient_accumulation_steps\?\)")
CASES["batch negative"] = Case(run(cfg=cfg_with(train_batch_size=-8)), r"train_batch_size must be a positive integer")
CASES["batch string"] = Case(run(cfg=cfg_with(train_micro_batch_size_per_gpu="eight")),
                             r"train_micro_batch_size_per_gpu must be a positive integer")
CASES["batch mismatch"] = Case(run(cfg=cfg_with(train_batch_size=100, train_micro_batch_size_per_gpu=16,
                                                gradient_accumulation_steps=1)), r"train_batch_size \(100\) must equal")
CASES["auto without rule"] = Case(run(cfg=cfg_with(aio__block_size="auto")), r"no rule to resolve \"auto\" for aio\.block_size")
CASES["allreduce op"] = Case(run(cfg=cfg_with(gradient_allreduce_op="max")), r"DeepSpeed rejects this config: Invalid gradient_allreduce_op")

# --- ZeRO and offload -------------------------------------------------------------------------------
CASES["zero stage 4"] = Case(run(cfg=cfg_with(zero_optimization__stage=4)), r"zero_optimization\.stage must be 0, 1, 2 or 3, got 4")
CASES["zero stage string"] = Case(run(cfg=cfg_with(zero_optimization__stage="two")), r"zero_optimization\.stage must be 0, 1, 2 or 3, got 'two'")
CASES["zero stage bool"] = Case(run(cfg=cfg_with(zero_optimization__stage=True)), r"zero_optimization\.stage must be 0, 1, 2 or 3")
CASES["zero not an object"] = Case(run(cfg=cfg_with(zero_optimization="stage2")), r"zero_optimization must be a JSON object")
CASES["zero typo"] = Case(run(cfg=cfg_with(zero_optimization__overlap_com=True)),
                          r"zero_optimization\.overlap_com \(did you mean overlap_comm\?\)")
CASES["zero bool field"] = Case(run(cfg=cfg_with(zero_optimization__overlap_comm="sometimes")),
                                r"zero_optimization\.overlap_comm must be a valid boolean")
CASES["zero bucket negative"] = Case(run(cfg=cfg_with(zero_optimization__allgather_bucket_size=-1)),
                                     r"zero_optimization\.allgather_bucket_size .*greater than or equal to 0")
CASES["zero bucket string"] = Case(run(cfg=cfg_with(zero_optimization__allgather_bucket_size="big")),
                                   r"zero_optimization\.allgather_bucket_size must be a valid integer")
CASES["offload device gpu"] = Case(run(cfg=cfg_with(zero_optimization__offload_optimizer={"device": "gpu"})),
                                   r"zero_optimization\.offload_optimizer\.device must be 'none', 'cpu' or 'nvme', got 'gpu'")
CASES["offload device number"] = Case(run(cfg=cfg_with(zero_optimization__offload_optimizer={"device": 1})),
                                      r"zero_optimization\.offload_optimizer\.device must be")
CASES["offload typo"] = Case(run(cfg=cfg_with(zero_optimization__offload_optimizer={"device": "cpu", "pin_memroy": True})),
                             r"zero_optimization\.offload_optimizer\.pin_memroy \(did you mean pin_memory\?\)")
CASES["offload not an object"] = Case(run(cfg=cfg_with(zero_optimization__offload_optimizer="cpu")),
                                      r"zero_optimization\.offload_optimizer")
CASES["offload ratio range"] = Case(run(cfg=cfg_with(zero_optimization__offload_optimizer={"device": "cpu", "ratio": 2})),
                                    r"zero_optimization\.offload_optimizer\.ratio .*less than or equal to 1")
CASES["partial offload stage 2"] = Case(run(cfg=cfg_with(zero_optimization__offload_optimizer={"device": "cpu", "ratio": 0.5})),
                                        r"zero_optimization: Partial offloading only supported for ZeRO Stage 3")
CASES["param offload device"] = Case(run(cfg=cfg_with(zero_optimization__stage=3, zero_optimization__offload_param={"device": "disk"})),
                                     r"zero_optimization\.offload_param\.device must be 'none', 'cpu' or 'nvme', got 'disk'")
CASES["param offload typo"] = Case(run(cfg=cfg_with(zero_optimization__stage=3, zero_optimization__offload_param={"devise": "cpu"})),
                                   r"zero_optimization\.offload_param\.devise \(did you mean device\?\)")
CASES["param offload buffer type"] = Case(run(cfg=cfg_with(zero_optimization__stage=3,
                                                           zero_optimization__offload_param={"device": "cpu", "buffer_count": "many"})),
                                          r"zero_optimization\.offload_param\.buffer_count must be a valid integer")
CASES["param offload stage 2"] = Case(run(cfg=cfg_with(zero_optimization__offload_param={"device": "cpu"})),
                                      r"offload=all with ZeRO stage 2: zero_optimization\.offload_param needs ZeRO stage 3")
CASES["optimizer offload stage 0"] = Case(run(cfg=cfg_with(zero_optimization__stage=0, zero_optimization__offload_optimizer={"device": "cpu"})),
                                          r"offload=optimizer with ZeRO stage 0: offloading \(zero_optimization\.offload_\*\) needs")
CASES["nvme without path"] = Case(run(cfg=cfg_with(zero_optimization__offload_optimizer={"device": "nvme"})),
                                  r"zero_optimization\.offload_optimizer\.nvme_path is required")

# --- precision --------------------------------------------------------------------------------------
CASES["bf16 enabled string"] = Case(run(cfg=cfg_with(bf16__enabled="yes please")), r"bf16\.enabled must be a valid boolean")
CASES["bf16 typo"] = Case(run(cfg=cfg_with(bf16__enable=True)), r"bf16\.enable \(did you mean enabled\?\)")
CASES["bf16 not an object"] = Case(run(cfg=cfg_with(bf16=True)), r"bf16 must be a JSON object, got True")
CASES["bf16 and bfloat16"] = Case(run(cfg=cfg_with(bfloat16={"enabled": True})), r"both \"bf16\" and its legacy alias \"bfloat16\"")
CASES["bfloat16 and fp16"] = Case(run(cfg=cfg_with(bf16=..., bfloat16={"enabled": True}, fp16={"enabled": True})),
                                  r"fp16\.enabled and bf16\.enabled are both true")
CASES["bf16 optimizer states alone"] = Case(run(cfg=cfg_with(bf16__bf16_optimizer_states=True)),
                                            r"bf16\.bf16_optimizer_states requires bf16\.bf16_master_weights_and_grads")
CASES["bf16 master weights stage 0"] = Case(run(cfg=cfg_with(zero_optimization__stage=0, bf16__bf16_master_weights_and_grads=True, bf16__bf16_optimizer_states=True)),
                                            r"bf16\.bf16_master_weights_and_grads is only supported with ZeRO stage 1, 2 or 3")
CASES["fp16 on cpu"] = Case(run(cfg=cfg_with(bf16=..., fp16={"enabled": True})), r"fp16 on CPU ranks: DeepSpeed's CPU accelerator has no fp16")
CASES["fp16 loss scale string"] = Case(run(cfg=cfg_with(bf16=..., fp16={"enabled": False, "loss_scale": "dynamic"})),
                                       r"fp16\.loss_scale must be")
CASES["fp16 typo"] = Case(run(cfg=cfg_with(fp16={"enabled": False, "initial_scale_pow": 16})),
                          r"fp16\.initial_scale_pow \(did you mean initial_scale_power\?\)")

# --- optimizer --------------------------------------------------------------------------------------
CASES["optimizer unknown"] = Case(run(cfg=cfg_with(optimizer__type="AdamX")), r"optimizer\.type 'AdamX' is not an optimizer DeepSpeed knows.*adamw")
CASES["optimizer wrong case torch"] = Case(run(cfg=cfg_with(optimizer={"type": "sgd", "params": {"lr": 0.1}})),
                                           r"optimizer\.type 'sgd' is not an optimizer.*SGD")
CASES["optimizer type missing"] = Case(run(cfg=cfg_with(optimizer={"params": {"lr": 0.1}})), r"optimizer\.type must name an optimizer")
CASES["optimizer not an object"] = Case(run(cfg=cfg_with(optimizer="AdamW")), r"optimizer must be a JSON object")
CASES["optimizer typo"] = Case(run(cfg=cfg_with(optimizer__tpye="AdamW")), r"optimizer\.tpye \(did you mean type\?\)")
CASES["optimizer params list"] = Case(run(cfg=cfg_with(optimizer__params=[0.001])), r"optimizer\.params must be a JSON object")
CASES["lr string"] = Case(run(cfg=cfg_with(optimizer__params__lr="fast")), r"optimizer\.params\.lr must be a number, got 'fast'")
CASES["lr negative"] = Case(run(cfg=cfg_with(optimizer__params__lr=-0.1)), r"optimizer\.params\.lr must be >= 0")
CASES["betas short"] = Case(run(cfg=cfg_with(optimizer__params__betas=[0.9])), r"optimizer\.params\.betas must be a list of 2 numbers")
CASES["betas range"] = Case(run(cfg=cfg_with(optimizer__params__betas=[0.9, 1.5])), r"optimizer\.params\.betas must be numbers in \[0, 1\)")
CASES["eps string"] = Case(run(cfg=cfg_with(optimizer__params__eps="tiny")), r"optimizer\.params\.eps must be a number")
CASES["weight decay bool"] = Case(run(cfg=cfg_with(optimizer__params__weight_decay=True)), r"optimizer\.params\.weight_decay must be a number")
CASES["optimizer param typo"] = Case(run(cfg=cfg_with(optimizer__params__weight_decays=0.1)),
                                     r"optimizer\.params\.weight_decays is not a parameter of torch\.optim.*AdamW \(did you mean weight_decay\?\)")
CASES["sgd param of adam"] = Case(run(cfg=cfg_with(optimizer={"type": "SGD", "params": {"lr": 0.1, "betas": [0.9, 0.99]}})),
                                  r"optimizer\.params\.betas is not a parameter of torch\.optim\..*SGD")
CASES["max_grad_norm"] = Case(run(cfg=cfg_with(optimizer__params__max_grad_norm=1.0)), r"optimizer\.params\.max_grad_norm .*gradient_clipping")
CASES["amsgrad string"] = Case(run(cfg=cfg_with(optimizer__params__amsgrad="no")), r"optimizer\.params\.amsgrad must be true or false")

# --- scheduler --------------------------------------------------------------------------------------
CASES["scheduler unknown"] = Case(run(cfg=cfg_with(scheduler__type="WarmUpLR")),
                                  r"scheduler\.type 'WarmUpLR' is not a scheduler DeepSpeed knows \(did you mean WarmupLR\?\)")
CASES["scheduler type missing"] = Case(run(cfg=cfg_with(scheduler={"params": {}})), r"scheduler\.type None is not a scheduler")
CASES["scheduler not an object"] = Case(run(cfg=cfg_with(scheduler="WarmupLR")), r"scheduler must be a JSON object")
CASES["scheduler typo"] = Case(run(cfg=cfg_with(scheduler__parmas={})), r"scheduler\.parmas \(did you mean params\?\)")
CASES["scheduler param unknown"] = Case(run(cfg=cfg_with(scheduler__params__warmup_steps=10)),
                                        r"scheduler\.params\.warmup_steps is not a parameter of .*WarmupLR")
CASES["scheduler param type"] = Case(run(cfg=cfg_with(scheduler__params__warmup_num_steps="ten")),
                                     r"scheduler\.params\.warmup_num_steps must be an integer, got 'ten'")
CASES["scheduler param type str"] = Case(run(cfg=cfg_with(scheduler__params__warmup_type=3)),
                                         r"scheduler\.params\.warmup_type must be a string")
CASES["scheduler required missing"] = Case(run(cfg=cfg_with(scheduler={"type": "OneCycle", "params": {"cycle_min_lr": 0.0}})),
                                           r"scheduler\.params\.cycle_max_lr is required by .*OneCycle")
CASES["torch scheduler param"] = Case(run(cfg=cfg_with(scheduler={"type": "StepLR", "params": {"step": 10}})),
                                      r"scheduler\.params\.step is not a parameter of .*StepLR")

# --- --set ------------------------------------------------------------------------------------------
CASES["--set without ="] = Case(run("--set", "zero_optimization.stage"), r"--set 'zero_optimization\.stage': expected KEY=VALUE")
CASES["--set empty key"] = Case(run("--set", "=3"), r"--set '=3': expected KEY=VALUE")
CASES["--set empty part"] = Case(run("--set", "zero_optimization..stage=3"), r"expected KEY=VALUE")
CASES["--set through scalar"] = Case(run("--set", "train_batch_size.x=1"), r"--set 'train_batch_size\.x=1': train_batch_size is not a JSON object")
CASES["--set wrong type stage"] = Case(run("--set", "zero_optimization.stage=three"), r"zero_optimization\.stage must be 0, 1, 2 or 3, got 'three'")
CASES["--set wrong type bool"] = Case(run("--set", "bf16.enabled=maybe"), r"bf16\.enabled must be a valid boolean")
CASES["--set wrong type lr"] = Case(run("--set", "optimizer.params.lr=fast"), r"optimizer\.params\.lr must be a number")
CASES["--set typo"] = Case(run("--set", "zero_optimization.stage3_param_persitence_threshold=1"),
                           r"did you mean stage3_param_persistence_threshold\?")
CASES["--set offload device"] = Case(run("--set", "zero_optimization.offload_optimizer.device=gpu"),
                                     r"zero_optimization\.offload_optimizer\.device must be 'none', 'cpu' or 'nvme'")

# --- hostfiles and filters (launch) -----------------------------------------------------------------
CASES["hostfile missing"] = Case(cmd("launch", "deepspeed", "--hostfile", "{tmp}/none", "--dry-run"), r"hostfile .*none: not found")
CASES["hostfile folder"] = Case(cmd("launch", "deepspeed", "--hostfile", "{tmp}", "--dry-run"), r"hostfile .*: cannot read")
CASES["hostfile empty"] = Case(hostfile("# nothing\n"), r"hf: no hosts found")
CASES["hostfile no slots"] = Case(hostfile("node01\n"), r"hf:1: missing slots in 'node01'")
CASES["hostfile zero slots"] = Case(hostfile("node01 slots=0\n"), r"hf:1: zero slots")
CASES["hostfile negative slots"] = Case(hostfile("node01 slots=-2\n"), r"hf:1: negative slots")
CASES["hostfile text slots"] = Case(hostfile("node01 slots=four\n"), r"hf:1: slots must be an integer")
CASES["hostfile bad host"] = Case(hostfile("node_01 slots=2\n"), r"hf:1: bad hostname 'node_01'")
CASES["hostfile duplicate"] = Case(hostfile("n1 slots=2\nn1 slots=2\n"), r"hf:2: duplicate host 'n1'")
CASES["hostfile binary"] = Case(lambda tmp: ((tmp / "hf").write_bytes(b"\xff\xfe"),
                                            ["launch", "mpirun", "--hostfile", str(tmp / "hf"), "--dry-run"])[1],
                                r"hostfile .*hf: cannot read \(not UTF-8 text\)")
CASES["include unknown host"] = Case(hostfile("n1 slots=2\n", "--include", "n9"), r"--include: host 'n9' is not in the hostfile")
CASES["include slot range"] = Case(hostfile("n1 slots=2\n", "--include", "n1:5"), r"--include: slot 5 out of range")
CASES["include slot text"] = Case(hostfile("n1 slots=2\n", "--include", "n1:a"), r"--include: slot 'a' for host 'n1' is not an integer")
CASES["exclude everything"] = Case(hostfile("n1 slots=2\n", "--exclude", "n1"), r"--exclude: 'n1' removes every slot")
CASES["include and exclude"] = Case(hostfile("n1 slots=2\n", "--include", "n1", "--exclude", "n1:0"), r"--include and --exclude are mutually exclusive")
CASES["include empty entry"] = Case(hostfile("n1 slots=2\n", "--include", "n1@"), r"--include: empty host or slot list")
CASES["include without hostfile"] = Case(cmd("launch", "torchrun", "--include", "n1", "--dry-run"), r"--include filters the hosts of a hostfile")

# --- launch arguments -------------------------------------------------------------------------------
CASES["launch nnodes 0"] = Case(cmd("launch", "torchrun", "--nnodes", "0", "--dry-run"), r"--nnodes must be a positive integer, got 0")
CASES["launch nproc -1"] = Case(cmd("launch", "torchrun", "--nproc-per-node", "-1", "--dry-run"), r"--nproc-per-node must be a positive integer, got -1")
CASES["launch port 70000"] = Case(cmd("launch", "torchrun", "--master-port", "70000", "--dry-run"), r"--master-port must be a TCP port in 1\.\.65535, got 70000")
CASES["launch port 0"] = Case(cmd("launch", "torchrun", "--master-port", "0", "--dry-run"), r"--master-port must be a TCP port")
CASES["launch node rank"] = Case(cmd("launch", "torchrun", "--nnodes", "2", "--node-rank", "2", "--dry-run"),
                                 r"--node-rank must be below the number of nodes \(2\), got 2")
CASES["launch node rank negative"] = Case(cmd("launch", "torchrun", "--node-rank", "-1", "--dry-run"), r"--node-rank must be an integer >= 0")
CASES["launch unknown launcher"] = Case(cmd("launch", "pdsh", "--dry-run"), r"invalid choice: 'pdsh'")
CASES["launch mpirun needs hostfile"] = Case(cmd("launch", "mpirun", "--dry-run"), r"launch mpirun: --hostfile is required")
CASES["launch mpi for torchrun"] = Case(cmd("launch", "torchrun", "--mpi", "pmix", "--dry-run"), r"--mpi is an srun option")
CASES["launch bad run args"] = Case(cmd("launch", "torchrun", "--dry-run", "--", "run", "--workload", "mnist",
                                        "--ds-config", "x.json", "--stepz", "3"),
                                    r"the ds-bench command after '--'.*unrecognized arguments: --stepz")
CASES["launch nnodes text"] = Case(cmd("launch", "srun", "--nnodes", "two", "--dry-run"), r"--nnodes.*invalid int value")

CASES["run memory cap unit"] = Case(cmd("run", "--workload", "mnist", "--ds-config", "ds_configs/zero1.json",
                                        "--cpu-mem-limit", "lots"), r"--cpu-mem-limit 'lots': expected a size such as 4GiB")
CASES["run memory cap in bytes"] = Case(run("--cpu-mem-limit", "512"),
                                        r"^ds-bench: error: --cpu-mem-limit 512: give a unit, e.g. 512GiB or 512MiB \(a bare "
                                        r"number is not taken as bytes\)$")
CASES["run memory cap below held"] = Case(run("--cpu-mem-limit", "300MiB"),
                                          r"^ds-bench: error: --cpu-mem-limit 314572800 bytes \(300\.0 MiB\) is below what "
                                          r"this process already holds: \d+ MiB .*; give at least \d+ MiB$")
# --- sweep (and bench, its preset), report, doctor -------------------------------------------------
SWEEP = ("sweep", "--results", "{tmp}/r.jsonl")
MNIST = ("--workload", "mnist", "--ds-config", "ds_configs/zero1.json")
CASES["sweep --optimizer unknown"] = Case(cmd(*SWEEP, "--optimizer", "adamw,sgd"),
                                          r"--optimizer 'adamw,sgd': 'sgd' is not one of default, adamw, muon")
CASES["sweep --offload unknown"] = Case(cmd(*SWEEP, "--offload", "zenflo"),
                                        r"--offload 'zenflo': 'zenflo' is not one of none, optimizer, all, zenflow")
CASES["sweep nproc 0"] = Case(cmd(*SWEEP, "--nproc", "0"), r"--nproc must be a positive integer, got 0")
CASES["bench nproc -3"] = Case(cmd("bench", "--results", "{tmp}/r.jsonl", "--nproc", "-3"), r"--nproc must be a positive integer, got -3")
CASES["sweep steps below warmup"] = Case(cmd(*SWEEP, "--steps", "2", "--warmup", "5"), r"--steps \(2\) must be greater than --warmup \(5\)")
CASES["sweep steps 0"] = Case(cmd(*SWEEP, "--steps", "0"), r"--steps must be a positive integer, got 0")
CASES["sweep warmup negative"] = Case(cmd(*SWEEP, "--warmup", "-1"), r"--warmup must be an integer >= 0, got -1")
CASES["sweep port"] = Case(cmd(*SWEEP, "--master-port", "99999"), r"--master-port must be a TCP port in 1\.\.65535")
CASES["sweep repeats 0"] = Case(cmd(*SWEEP, "--repeats", "0"), r"--repeats must be a positive integer, got 0")
CASES["sweep max micro-batch 0"] = Case(cmd(*SWEEP, "--max-micro-batch", "0"), r"--max-micro-batch must be a positive integer")
SWEEP_GPT2 = (*SWEEP, "--workload", "gpt2", "--ds-config", "zero1.json")
CASES["sweep deepspeed not a release"] = Case(cmd(*SWEEP, *MNIST, "--deepspeed", "latest"),
                                             r"^ds-bench: error: --deepspeed latest: expected release versions such as "
                                             r"0\.18\.4, or installed$")
CASES["sweep deepspeed too old"] = Case(cmd(*SWEEP, *MNIST, "--deepspeed", "0.14.5,installed"),
                                       r"--deepspeed 0\.14\.5: older than the oldest release ds-bench runs on, 0\.16\.0")
CASES["sweep torch installed twice"] = Case(cmd(*SWEEP, *MNIST, "--torch", "2.13.0,installed"),
                                           r"--torch 2\.13\.0,installed: installed is 2\.13\.0 here, listed twice")
CASES["sweep transformers range"] = Case(cmd(*SWEEP, *MNIST, "--transformers", ">=4.46"),
                                        r"--transformers >=4\.46: expected release versions")
CASES["sweep attn for mnist"] = Case(cmd(*SWEEP, "--workload", "mnist", "--ds-config", "zero1.json", "--attn", "eager"),
                                     r"--attn: workload mnist has no attention \(gpt2 and llama have\)")
CASES["sweep tensor-parallel for gpt2"] = Case(cmd(*SWEEP_GPT2, "--tensor-parallel", "1,2"),
                                               r"--tensor-parallel: DeepSpeed's AutoTP cannot shard workload gpt2")
CASES["sweep tensor-parallel after --"] = Case(cmd(*SWEEP_GPT2, "--", "--tensor-parallel", "2"),
                                               r"run argument --tensor-parallel after '--': the sweep sets it per point")
CASES["sweep attn unknown"] = Case(cmd(*SWEEP_GPT2, "--attn", "sdpa,flash"),
                                  r"--attn 'sdpa,flash': 'flash' is not one of sdpa, eager, flash_attention_2$")
CASES["sweep compile value"] = Case(cmd(*SWEEP_GPT2, "--compile", "yes"), r"--compile 'yes': 'yes' is not one of off, on$")
CASES["sweep compile without warm-up"] = Case(cmd(*SWEEP_GPT2, "--compile", "off,on", "--warmup", "0"),
                                              r"--warmup \(with --compile on\) must be a positive integer, got 0")
CASES["sweep compile with dynamo disabled"] = Case(cmd(*SWEEP_GPT2, "--compile", "on"),
                                                   r"--compile on with TORCHDYNAMO_DISABLE set")  # conftest sets it
CASES["sweep compile after --"] = Case(cmd(*SWEEP_GPT2, "--", "--compile"),
                                       r"run argument --compile after '--': the sweep sets it per point")
CASES["sweep tiled-mlp maybe"] = Case(cmd(*SWEEP_GPT2, "--tiled-mlp", "maybe"), r"--tiled-mlp 'maybe': 'maybe' is not one of off, on")
CASES["sweep tiled-loss after --"] = Case(cmd(*SWEEP_GPT2, "--", "--tiled-loss"),
                                          r"run argument --tiled-loss after '--': the sweep sets it per point")
CASES["sweep tiled-mlp for mnist"] = Case(cmd(*SWEEP, *MNIST, "--tiled-mlp", "off,on"),
                                          r"--tiled-mlp: workload mnist is not a causal language model")
CASES["sweep sequence-parallel for mnist"] = Case(cmd(*SWEEP, *MNIST, "--sequence-parallel", "1,2"),
                                                  r"--sequence-parallel: workload mnist is not a causal language model")
CASES["sweep seq-len 0"] = Case(cmd(*SWEEP_GPT2, "--seq-len", "256,0"), r"--seq-len must be a positive integer, got 0$")
CASES["sweep seq-len text"] = Case(cmd(*SWEEP_GPT2, "--seq-len", "long"), r"--seq-len 'long': expected a count such as 8192, 8k")
CASES["sweep every point beyond the ranks"] = Case(
    cmd(*SWEEP, "--workload", "llama", "--ds-config", "zero1.json", "--sequence-parallel", "3,5", "--nproc", "2",
        "--micro-batch", "1", "--", "--size", "tiny"),
    r"no point of this study can run at 2 rank\(s\): --sequence-parallel 3 does not divide the world size 2: .*; "
    r"--sequence-parallel 5 does not divide the world size 2: ")
CASES["sweep seq-len after -- beside its own"] = Case(cmd(*SWEEP_GPT2, "--seq-len", "64,128", "--", "--seq-len", "32"),
                                                      r"run argument --seq-len after '--': the sweep sets it per point")

def with_plan_file(*args: str, world: tuple[int, int] | None = (1, 2)):
    """A sweep argv whose ``{tmp}/plan.jsonl`` holds one gpt2 tiny ``plan`` record on ``world`` (nodes, ranks per
    node), or (None) only a record of another kind."""
    def build(tmp: Path) -> list[str]:
        from ds_bench.perf.devices import cpu_cluster
        from ds_bench.record import store
        from ds_bench.record.plan_schema import PlanRecord
        from ds_bench.record.schema import DoctorRecord

        if world is None:
            store.append_record(str(tmp / "plan.jsonl"), DoctorRecord(kind="doctor", problems=["none"]))
        else:
            cluster = cpu_cluster(*world, 8 * 1024 ** 3, 0.5, {"all_reduce": 2.0}, 10.0, None, None)
            store.append_record(str(tmp / "plan.jsonl"), PlanRecord(
                kind="plan", status="ok", workload="gpt2", size="tiny", params=1, seq_len=128, global_batch_tokens=1024,
                sequences=8, precision="fp32", cluster=cluster.to_dict(), run_id="20260101T000000-abcdef01"))
        return cmd(*args)(tmp)
    return build


PRUNE = ("--size", "tiny", "--micro-batch", "1,2", "--nproc", "2", "--prune-predicted", "{tmp}/plan.jsonl")
CASES["sweep prune-predicted without a plan record"] = Case(
    with_plan_file(*SWEEP_GPT2, *PRUNE, world=None),
    r"^ds-bench: error: --prune-predicted \S+/plan\.jsonl: no plan record in it \(ds-bench plan --results")
CASES["sweep prune-predicted for another world"] = Case(
    with_plan_file(*SWEEP_GPT2, *PRUNE, world=(2, 4)),
    r"--prune-predicted \S+/plan\.jsonl: no plan record for gpt2 tiny on 2 rank\(s\); the newest, "
    r"20260101T000000-abcdef01, has world size 8 = 2 nodes x 4 \(the sweep's 2\)$")
CASES["sweep prune-predicted missing file"] = Case(cmd(*SWEEP_GPT2, *PRUNE),
                                                  r"--prune-predicted \S+/plan\.jsonl: file not found")
CASES["sweep prune-predicted with mnist"] = Case(
    with_plan_file(*SWEEP, *MNIST, "--prune-predicted", "{tmp}/plan.jsonl"),
    r"--prune-predicted: workload mnist is not one ds-bench plan models \(gpt2, llama, moe\)")
CASES["sweep prune-predicted with micro-batch auto"] = Case(
    with_plan_file(*SWEEP_GPT2, *PRUNE, "--micro-batch", "auto"), r"--prune-predicted with --micro-batch auto: ")
CASES["sweep prune-keep 0"] = Case(with_plan_file(*SWEEP_GPT2, *PRUNE, "--prune-keep", "0"),
                                   r"--prune-keep must be a positive integer, got 0")
CASES["sweep unknown workload"] = Case(cmd(*SWEEP, "--workload", "bert", "--ds-config", "zero1.json"), r"--workload 'bert' is unknown")
CASES["sweep workload without config"] = Case(cmd(*SWEEP, "--workload", "mnist"), r"--ds-config is required with --workload")
CASES["sweep missing config"] = Case(cmd(*SWEEP, "--workload", "mnist", "--ds-config", "nope.json"), r"--ds-config nope\.json: file not found")
CASES["sweep bad config"] = Case(lambda tmp: ((tmp / "b.json").write_text('{"zero_optimization": '),
                                              ["sweep", "--results", str(tmp / "r.jsonl"), "--workload", "mnist",
                                               "--ds-config", str(tmp / "b.json")])[1],
                                 r"b\.json:1:\d+: invalid JSON")
CASES["sweep stage 5"] = Case(cmd(*SWEEP, *MNIST, "--stages", "0,5"), r"--stages '0,5': '5' is not one of 0, 1, 2, 3")
CASES["sweep stages empty item"] = Case(cmd(*SWEEP, *MNIST, "--stages", "0,,1"), r"--stages '0,,1': expected a comma-separated list")
CASES["sweep stage text"] = Case(cmd(*SWEEP, *MNIST, "--stages", "two"), r"--stages 'two': 'two' is not an integer")
CASES["sweep offload disk"] = Case(cmd(*SWEEP, *MNIST, "--offload", "none,disk"), r"--offload 'none,disk': 'disk' is not one of none, optimizer, all")
CASES["sweep precision fp8"] = Case(cmd(*SWEEP, *MNIST, "--precision", "fp8"), r"--precision 'fp8': 'fp8' is not one of fp32, bf16, fp16")
CASES["sweep micro-batch 0"] = Case(cmd(*SWEEP, *MNIST, "--micro-batch", "0,2"), r"--micro-batch '0,2': '0' must be a positive integer")
CASES["sweep micro-batch text"] = Case(cmd(*SWEEP, *MNIST, "--micro-batch", "big"), r"--micro-batch 'big': 'big' is not an integer")
CASES["sweep grad-accum 0"] = Case(cmd(*SWEEP, *MNIST, "--grad-accum", "0"), r"--grad-accum '0': '0' must be a positive integer")
CASES["sweep timeout 0"] = Case(cmd(*SWEEP, *MNIST, "--timeout", "0s"), r"--timeout '0s': must be at least 1 ms")
CASES["sweep timeout unit"] = Case(cmd(*SWEEP, *MNIST, "--timeout", "5x"), r"--timeout '5x': expected a duration such as 90s, 15m, 1h or 1d")
CASES["sweep nodes without slurm"] = Case(cmd(*SWEEP, *MNIST, "--nodes", "2"),
                                          r"--nodes is for Slurm jobs: add --executor slurm \(or leave it out\)")
CASES["sweep slurm with hostfile"] = Case(cmd(*SWEEP, *MNIST, "--executor", "slurm", "--hostfile", "hostfiles/example_2nodes_4gpus"),
                                          r"--hostfile with --executor slurm: each job's hosts are its allocation")
CASES["sweep compute-node without KEY=VALUE"] = Case(
    cmd(*SWEEP, *MNIST, "--compute-node", "4gpus"),
    r"--compute-node '4gpus': '4gpus' is not KEY=VALUE with a key of gpus, gpu, gpu-memory, bf16, cpus, memory")
CASES["capacity compute-node bf16 word"] = Case(
    cmd("capacity", "--ds-config", "zero1.json", "--family", "gpt3", "--compute-node", "bf16=yes"),
    r"--compute-node 'bf16=yes': bf16=yes: expected native or emulated")
CASES["scaling compute-node memory"] = Case(
    cmd("scaling", "--workload", "mnist", "--ds-config", "zero1.json", "--ranks", "1,2", "--compute-node",
        "memory=lots"), r"--compute-node memory 'lots': expected a size such as 4GiB")
CASES["plan compute-node gpu on CPU nodes"] = Case(
    cmd("plan", "--workload", "gpt2", "--compute-node", "gpu=H100"),
    r"--compute-node: gpu=H100 on nodes with no GPU known: give gpus=N too")
CASES["sweep slurm no controller"] = Case(
    cmd(*SWEEP, *MNIST, "--executor", "slurm"),
    r"--executor slurm: (no Slurm controller answers here \(sinfo: .+\)|`sinfo` not found: run the study where)")
CASES["sweep slurm queue-timeout"] = Case(cmd(*SWEEP, *MNIST, "--executor", "slurm", "--queue-timeout", "soon"),
                                          r"--queue-timeout 'soon': expected a duration such as 90s, 15m, 1h or 1d")
CASES["sweep slurm gpus negative"] = Case(cmd(*SWEEP, *MNIST, "--executor", "slurm", "--gpus-per-node", "-1"),
                                          r"--gpus-per-node must be an integer >= 0, got -1")
CASES["sweep slurm launcher"] = Case(cmd(*SWEEP, *MNIST, "--executor", "slurm", "--launcher", "torchrun"),
                                     r"--launcher torchrun with --executor slurm: each job starts its ranks with srun")
CASES["capacity slurm max-jobs 0"] = Case(cmd("capacity", "--ds-config", "zero1.json", "--executor", "slurm", "--max-jobs",
                                              "0", "--results", "{tmp}/c.jsonl"), r"--max-jobs must be a positive integer, got 0")
CASES["scaling slurm with ranks"] = Case(cmd("scaling", "--workload", "mnist", "--ds-config", "zero1.json", "--executor",
                                             "slurm", "--ranks", "1,2", "--results", "{tmp}/s.jsonl"),
                                         r"--executor slurm: give --nodes, e.g. --nodes 1,2")
CASES["scaling nproc without slurm"] = Case(cmd("scaling", "--workload", "mnist", "--ds-config", "zero1.json", "--ranks",
                                                "1,2", "--nproc", "2", "--results", "{tmp}/s.jsonl"),
                                            r"--nproc is for --executor slurm")
CASES["sweep headroom 100"] = Case(cmd(*SWEEP, *MNIST, "--headroom", "100"), r"--headroom must be a percentage in \[0, 100\), got 100")
CASES["sweep memory cap unit"] = Case(cmd(*SWEEP, *MNIST, "--cpu-mem-limit", "3XB"), r"--cpu-mem-limit '3XB': expected a size")
CASES["sweep bad point"] = Case(cmd(*SWEEP, *MNIST, "--point", "z9 mbs=4"), r"--point 'z9 mbs=4': 'z9' is not ddp\|fsdp, z0\.\.z3")
CASES["sweep engine unknown"] = Case(cmd(*SWEEP, *MNIST, "--engines", "deepspeed,megatron"),
                                     r"--engines 'deepspeed,megatron': 'megatron' is not one of deepspeed, ddp, fsdp")
CASES["run engine unknown"] = Case(cmd("run", *MNIST, "--engine", "megatron"),
                                   r"--engine 'megatron' is unknown; known: deepspeed, ddp, fsdp")
CASES["run fsdp stage 0"] = Case(cmd("run", "--workload", "mnist", "--ds-config", "ds_configs/zero0.json", "--engine",
                                     "fsdp"), r"--engine fsdp with ZeRO stage 0: FSDP always shards .* or --engine ddp")
CASES["run ddp offload"] = Case(cmd("run", "--workload", "mnist", "--ds-config", "ds_configs/zero2_offload.json",
                                    "--engine", "ddp"), r"--engine ddp with offload=optimizer: DDP keeps")
CASES["sweep baseline unknown"] = Case(cmd(*SWEEP, *MNIST, "--micro-batch", "4", "--baseline", "z7"),
                                       r"--baseline 'z7': not a point of this sweep; points: z1 off=none (fp32|bf16) mbs=4")
CASES["sweep mpirun without hostfile"] = Case(cmd(*SWEEP, *MNIST, "--launcher", "mpirun"), r"--launcher mpirun needs --hostfile")
CASES["sweep torchrun hostfile"] = Case(cmd(*SWEEP, *MNIST, "--launcher", "torchrun", "--hostfile", "hostfiles/localhost_2"),
                                       r"--hostfile is for --launcher deepspeed or mpirun, not torchrun")
CASES["sweep owned run arg"] = Case(cmd(*SWEEP, *MNIST, "--", "--micro-batch", "4"), r"run argument --micro-batch after '--': the sweep sets it per point")
CASES["sweep bad run args"] = Case(cmd(*SWEEP, *MNIST, "--", "--stepz", "3"), r"run arguments \(--stepz 3\): .*unrecognized arguments: --stepz")
CASES["sweep results folder"] = Case(cmd("sweep", "--results", "{tmp}", *MNIST), r"--results .*: is a folder")
CASES["report missing"] = Case(cmd("report", "{tmp}/none.jsonl"), r"none\.jsonl: no results file")
CASES["report folder"] = Case(cmd("report", "{tmp}"), r": is a folder; expected a results file")
CASES["report not json"] = Case(lambda tmp: ((tmp / "x.jsonl").write_text("hello\n"), ["report", str(tmp / "x.jsonl")])[1],
                                r"x\.jsonl:1: not a JSON line")
CASES["report plot folder missing"] = Case(
    lambda tmp: ((tmp / "x.jsonl").write_text('{"workload": "mnist"}\n'),
                 ["report", str(tmp / "x.jsonl"), "--plot", str(tmp / "no" / "p.png")])[1],
    r"--plot .*p\.png: folder .* does not exist")
BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"
"""The start of a PNG: an ``--expect`` file that is not text."""


def with_file(argv, name: str, content: bytes):
    """``argv`` (a builder) after writing ``content`` to {tmp}/``name``."""
    def build(tmp: Path) -> list[str]:
        (tmp / name).write_bytes(content)
        return argv(tmp)
    return build


REPORT_LINE = '{"kind": "run", "workload": "mnist", "status": "ok", "world_size": 1}\n'.encode()
CASES["report --html folder not writable"] = Case(
    with_file(cmd("report", "{tmp}/x.jsonl", "--html", "/proc/ds_bench_report.html"), "x.jsonl", REPORT_LINE),
    r"^ds-bench: error: --html /proc/ds_bench_report\.html: cannot create a file in folder /proc \(.+\)$")
for command, argv in [("run", run("--expect", "{tmp}/e.yaml")),
                      ("report", cmd("report", "{tmp}/x.jsonl", "--expect", "{tmp}/e.yaml")),
                      ("report --html", cmd("report", "{tmp}/x.jsonl", "--html", "{tmp}/p.html", "--expect", "{tmp}/e.yaml"))]:
    CASES[f"{command} --expect binary"] = Case(
        with_file(with_file(argv, "x.jsonl", REPORT_LINE), "e.yaml", BINARY),
        r"^ds-bench: error: --expect .*/e\.yaml: not UTF-8 text \(byte 0x89 at offset 0\); expected a YAML expectations file$")
CASES["doctor timeout"] = Case(cmd("doctor", "--dist-timeout", "0s"), r"--dist-timeout '0s': must be at least 1 ms$")
CASES["doctor connect timeout"] = Case(cmd("doctor", "--connect-timeout=-1s"), r"--connect-timeout '-1s': must be at least 1 ms")
CASES["doctor iface"] = Case(cmd("doctor", "--iface", "nosuch0"), r"interface 'nosuch0' .* does not exist")
CASES["doctor json folder"] = Case(cmd("doctor", "--json", "{tmp}"), r"--json .*: is a folder")


# --- comm -------------------------------------------------------------------------------------------
def comm(*flags: str):
    return cmd("comm", "--results", "{tmp}/c.jsonl", *flags)


CASES["comm collectives unknown"] = Case(comm("--collectives", "all_reduce,bogus"), r"--collectives 'all_reduce,bogus': expected a comma list of all_reduce")
CASES["comm collectives empty"] = Case(comm("--collectives", ","), r"--collectives ',': expected a comma list")
CASES["comm min-bytes zero"] = Case(comm("--min-bytes", "0"), r"--min-bytes '0': a size must be > 0$")
CASES["comm max-bytes not a size"] = Case(comm("--max-bytes", "lots"), r"--max-bytes 'lots': expected a size such as 4GiB")
CASES["comm max below min"] = Case(comm("--min-bytes", "1KiB", "--max-bytes", "8"), r"--max-bytes \(8\) must be >= --min-bytes \(1024\)")
CASES["comm step-factor 1"] = Case(comm("--step-factor", "1"), r"--step-factor must be an integer >= 2, got 1")
CASES["comm dtype"] = Case(comm("--dtype", "int8"), r"--dtype 'int8': expected one of float32")
CASES["comm iters 0"] = Case(comm("--iters", "0"), r"--iters must be a positive integer, got 0")
CASES["comm warmup negative"] = Case(comm("--warmup", "-1"), r"--warmup must be an integer >= 0, got -1")
CASES["comm expect not a number"] = Case(comm("--expect-busbw", "fast"), r"--expect-busbw 'fast': expected GBPS or COLLECTIVE=GBPS")
CASES["comm expect zero"] = Case(comm("--expect-busbw", "all_gather=0"), r"--expect-busbw 'all_gather=0': expected GBPS")
CASES["comm expect unmeasured"] = Case(comm("--collectives", "all_reduce", "--expect-busbw", "all_gather=5"), r"all_gather is not among the measured collectives \(all_reduce\)")
CASES["comm results folder"] = Case(cmd("comm", "--results", "{tmp}"), r"--results .*: is a folder")
CASES["comm dist-timeout"] = Case(comm("--dist-timeout", "0s"), r"--dist-timeout '0s': must be at least 1 ms$")
CASES["comm slow-link threshold 0"] = Case(comm("--pairs", "--slow-link-threshold", "0"), r"--slow-link-threshold 0: expected a percentage between 0 and 100")
CASES["comm slow-link threshold nan"] = Case(comm("--pairs", "--slow-link-threshold", "nan"), r"--slow-link-threshold nan: expected a percentage")
CASES["comm iface"] = Case(comm("--iface", "nosuch0"), r"interface 'nosuch0' .* does not exist")
CASES["no subcommand"] = Case(cmd(), r"the following arguments are required: command")

# --- scaling ----------------------------------------------------------------------------------------
def scaling(*flags: str, hosts: str | None = None, cfg=None):
    """``ds-bench scaling`` on mnist/zero1 at 1,2 ranks unless ``flags`` say otherwise; ``hosts`` is written
    as {tmp}/hf, ``cfg`` (a dict) as {tmp}/c.json."""
    def argv(tmp: Path) -> list[str]:
        if hosts is not None:
            (tmp / "hf").write_text(hosts)
        if cfg is not None:
            (tmp / "c.json").write_text(json.dumps(cfg))
        base = {"--workload": "mnist", "--ds-config": "zero1.json", "--ranks": "1,2", "--results": str(tmp / "r.jsonl")}
        head, tail = (flags[:flags.index("--")], flags[flags.index("--"):]) if "--" in flags else (flags, ())
        given = set(head)
        return ["scaling", *[x for k, v in base.items() if k not in given for x in (k, v)],
                *[f.replace("{tmp}", str(tmp)) for f in (*head, *tail)]]
    return argv


def _no_ranks(tmp: Path) -> list[str]:
    return [a for a in scaling()(tmp) if a not in ("--ranks", "1,2")]


CASES["scaling ranks 0"] = Case(scaling("--ranks", "0"), r"--ranks '0': '0' must be a positive integer")
CASES["scaling ranks text"] = Case(scaling("--ranks", "2,x"), r"--ranks '2,x': 'x' is not an integer")
CASES["scaling ranks decreasing"] = Case(scaling("--ranks", "2,1"), r"--ranks '2,1': expected increasing counts without repeats")
CASES["scaling ranks repeated"] = Case(scaling("--ranks", "1,2,2"), r"--ranks '1,2,2': expected increasing counts")
CASES["scaling ranks empty item"] = Case(scaling("--ranks", "1,,2"), r"--ranks '1,,2': expected a comma-separated list")
CASES["scaling ranks missing"] = Case(_no_ranks, r"--ranks is required: world sizes on this node")
CASES["scaling nodes without hostfile"] = Case(scaling("--nodes", "1,2"), r"--nodes needs --hostfile")
CASES["scaling hostfile without nodes"] = Case(scaling("--hostfile", "{tmp}/hf", hosts="a slots=2\n"), r"--hostfile needs --nodes")
CASES["scaling nodes beyond hostfile"] = Case(
    lambda tmp: [a for a in scaling("--hostfile", "{tmp}/hf", "--nodes", "1,2,4", hosts="a slots=2\nb slots=2\n")(tmp)
                 if a not in ("--ranks", "1,2")], r"--nodes 1,2,4: the hostfile .*hf has 2 host\(s\) \(a, b\)")
CASES["scaling ranks with nodes"] = Case(scaling("--hostfile", "{tmp}/hf", "--nodes", "1", hosts="a slots=2\n"),
                                         r"--ranks with --nodes: each node runs the ranks its hostfile line gives")
CASES["scaling torchrun hostfile"] = Case(
    lambda tmp: [a for a in scaling("--hostfile", "{tmp}/hf", "--nodes", "1", "--launcher", "torchrun",
                                    hosts="a slots=2\n")(tmp) if a not in ("--ranks", "1,2")],
    r"--hostfile is for --launcher deepspeed or mpirun, not torchrun")
CASES["scaling srun"] = Case(scaling("--launcher", "srun"), r"--launcher srun: scaling starts each point on a part")
CASES["scaling bad layout"] = Case(scaling("--", "--pipeline-stages", "1", "--engine", "ddp"),
                                   r"--engine ddp with --pipeline-stages 1: the pipeline is DeepSpeed's own engine")
CASES["scaling missing config"] = Case(scaling("--ds-config", "nope.json"), r"--ds-config nope\.json: file not found")
CASES["scaling unknown workload"] = Case(scaling("--workload", "bert"), r"--workload 'bert' is unknown")
CASES["scaling timeout 0"] = Case(scaling("--timeout", "0s"), r"--timeout '0s': must be at least 1 ms")
CASES["scaling results folder"] = Case(scaling("--results", "{tmp}"), r"--results .*: is a folder")
CASES["scaling plot folder missing"] = Case(scaling("--plot", "{tmp}/no/p.png"), r"--plot .*p\.png: folder .* does not exist")
CASES["scaling owned run arg"] = Case(scaling("--", "--tag", "x"), r"run argument --tag after '--': ds-bench scaling sets it per point")
CASES["scaling bad run args"] = Case(scaling("--", "--stepz", "3"), r"run arguments after '--' \(--stepz 3\): .*unrecognized arguments")
CASES["scaling strong-scaling config"] = Case(
    scaling("--ds-config", "{tmp}/c.json", cfg=cfg_with(train_batch_size=64, bf16__enabled=False)),
    r"micro-batch x accumulation per device changes with the rank count \(64 x 1 at 1, 32 x 1 at 2\)")

# --- capacity ---------------------------------------------------------------------------------------
def capacity(*flags: str):
    """``ds-bench capacity`` on zero1 with a scaled family unless ``flags`` say otherwise."""
    def argv(tmp: Path) -> list[str]:
        base = {"--ds-config": "zero1.json", "--scale": "layers", "--layers": "3", "--hidden": "64", "--heads": "2",
                "--results": str(tmp / "c.jsonl")}
        head, tail = (flags[:flags.index("--")], flags[flags.index("--"):]) if "--" in flags else (flags, ())
        drop = {"--scale", "--layers", "--hidden", "--heads"} if "--family" in head else set()
        return ["capacity", *[x for k, v in base.items() if k not in set(head) | drop for x in (k, v)],
                *[f.replace("{tmp}", str(tmp)) for f in (*head, *tail)]]
    return argv


CASES["capacity no family"] = Case(lambda tmp: [a for a in capacity()(tmp) if a not in ("--scale", "layers")],
                                   r"give one of --family gpt3 or --scale layers\|hidden")
CASES["capacity unknown family"] = Case(capacity("--family", "llama"), r"--family 'llama' is unknown; known: gpt3")
CASES["capacity unknown scale"] = Case(capacity("--scale", "depth"), r"--scale 'depth' is unknown; known: layers, hidden")
CASES["capacity partial shape"] = Case(lambda tmp: [a for a in capacity()(tmp) if a not in ("--heads", "2")],
                                       r"--scale layers needs the base shape: --heads missing")
CASES["capacity hidden not divisible"] = Case(capacity("--heads", "3"), r"--hidden 64 is not divisible by --heads 3")
CASES["capacity micro-batch 0"] = Case(capacity("--micro-batch", "0"), r"--micro-batch must be a positive integer, got 0")
CASES["capacity max-scale 0"] = Case(capacity("--max-scale", "0"), r"--max-scale must be a positive integer, got 0")
CASES["capacity stages text"] = Case(capacity("--stages", "0,x"), r"--stages '0,x': 'x' is not an integer")
CASES["capacity pipeline stages 0"] = Case(capacity("--pipeline-stages", "0"), r"--pipeline-stages '0': '0' must be a positive")
CASES["capacity offload unknown"] = Case(capacity("--offload", "disk"), r"--offload 'disk': 'disk' is not one of none")
CASES["capacity missing config"] = Case(capacity("--ds-config", "nope.json"), r"--ds-config nope\.json: file not found")
CASES["capacity torchrun hostfile"] = Case(capacity("--launcher", "torchrun", "--hostfile", "hostfiles/localhost_2"),
                                          r"--hostfile is for --launcher deepspeed or mpirun, not torchrun")
CASES["capacity mpirun without hostfile"] = Case(capacity("--launcher", "mpirun"), r"--launcher mpirun needs --hostfile")
CASES["capacity owned run arg"] = Case(capacity("--", "--steps", "9"),
                                       r"run argument --steps after '--': ds-bench capacity sets it for every probe")
CASES["capacity bad run args"] = Case(capacity("--", "--stepz", "3"), r"run arguments after '--' \(--stepz 3\): .*unrecognized")
CASES["capacity results folder"] = Case(capacity("--results", "{tmp}"), r"--results .*: is a folder")
CASES["capacity timeout 0"] = Case(capacity("--timeout", "0s"), r"--timeout '0s': must be at least 1 ms")
CASES["capacity tensor parallel gpt2"] = Case(capacity("--tensor-parallel", "1,2"),
                                             r"--tensor-parallel: DeepSpeed's AutoTP cannot shard workload gpt2")
CASES["capacity tensor parallel 0"] = Case(capacity("--workload", "llama", "--tensor-parallel", "0"),
                                           r"--tensor-parallel '0': '0' must be a positive")
CASES["capacity family of another workload"] = Case(capacity("--family", "llama3"),
                                                    r"--family llama3 is a family of workload llama, not gpt2: add --workload llama")
CASES["capacity owned tensor parallel"] = Case(capacity("--workload", "llama", "--", "--tensor-parallel", "2"),
                                               r"run argument --tensor-parallel after '--': ds-bench capacity sets it")
CASES["capacity tiled-mlp maybe"] = Case(capacity("--tiled-mlp", "maybe"), r"--tiled-mlp 'maybe': 'maybe' is not one of off, on")
CASES["capacity owned tiled-loss"] = Case(capacity("--", "--tiled-loss"),
                                          r"run argument --tiled-loss after '--': ds-bench capacity sets it for every probe")
CASES["capacity sequence parallel 0"] = Case(capacity("--sequence-parallel", "1,0"), r"--sequence-parallel '1,0': '0' must be a positive")
SHAPE = ("--layers", "3", "--hidden", "64", "--heads", "2")


def no_shape(argv):
    """``argv`` (a builder) without the capacity helper's base shape."""
    def build(tmp: Path) -> list[str]:
        out = argv(tmp)
        for flag in SHAPE[::2]:
            at = out.index(flag)
            del out[at:at + 2]
        return out
    return build


CASES["capacity seq without a model"] = Case(no_shape(capacity("--scale", "seq")),
                                             r"--scale seq needs the model: --size NAME, or --layers, --hidden and --heads")
CASES["capacity seq size and shape"] = Case(capacity("--scale", "seq", "--size", "tiny"),
                                            r"--size and --layers/--hidden/--heads both name the model of --scale seq")
CASES["capacity seq size unknown"] = Case(no_shape(capacity("--scale", "seq", "--size", "huge")),
                                          r"--size 'huge' is not a size of workload gpt2; known: .*tiny")
CASES["capacity seq granularity 0"] = Case(capacity("--scale", "seq", "--seq-granularity", "0"),
                                           r"--seq-granularity must be a positive integer, got 0")
CASES["capacity seq maximum below start"] = Case(capacity("--scale", "seq", "--seq-len", "2048", "--max-seq-len", "1024"),
                                                 r"--max-seq-len 1024 is below --seq-len 2048")
CASES["capacity seq start not sharded evenly"] = Case(
    capacity("--workload", "llama", "--scale", "seq", "--seq-len", "1001", "--sequence-parallel", "1,2"),
    r"--seq-len 1001 is not a multiple of 2 \(the --sequence-parallel degrees\)")
CASES["capacity seq every layout beyond the ranks"] = Case(  # issue 45: was "--seq-len 512 is not a multiple of 3"
    no_shape(capacity("--workload", "llama", "--size", "tiny", "--scale", "seq", "--seq-len", "512",
                      "--sequence-parallel", "3", "--nproc", "2")),
    r"no layout of this study can run at 2 rank\(s\): --sequence-parallel 3 does not divide the world size 2: ")
CASES["capacity every layout beyond the ranks"] = Case(  # issue 45: was a "pp3 dp0" row, exit 1
    capacity("--pipeline-stages", "3", "--nproc", "2"),
    r"no layout of this study can run at 2 rank\(s\): --pipeline-stages 3 does not divide the world size 2: ")
CASES["capacity size without seq"] = Case(no_shape(capacity("--size", "tiny")), r"--size is for --scale seq")
CASES["capacity max-seq-len without seq"] = Case(capacity("--max-seq-len", "4096"), r"--max-seq-len is for --scale seq")


# --- compare ----------------------------------------------------------------------------------------
def compare(*argv: str):
    """``ds-bench compare`` with ``{base}`` and ``{other}`` results files written in ``tmp``."""
    def args(tmp: Path) -> list[str]:
        line = {"kind": "run", "workload": "gpt2", "status": "ok", "world_size": 1, "metrics": {"samples_per_s": 1.0}}
        (tmp / "b.jsonl").write_text(json.dumps(line) + "\n")
        (tmp / "o.jsonl").write_text(json.dumps({**line, "workload": "mnist"}) + "\n")
        files = {"tmp": str(tmp), "base": str(tmp / "b.jsonl"), "other": str(tmp / "o.jsonl")}
        return ["compare", *[a.format(**files) for a in argv]]
    return args


CASES["compare missing file"] = Case(compare("{tmp}/none.jsonl", "{base}"), r"BASE .*none.jsonl: no results file")
CASES["compare folder"] = Case(compare("{base}", "{tmp}"), r"NEW .*: is a folder")
CASES["compare nothing in common"] = Case(compare("{base}", "{other}"), r"nothing to compare: .* hold no measurement")
CASES["compare threshold negative"] = Case(compare("{base}", "{base}", "--threshold", "-1"),
                                           r"--threshold -1: expected a percentage")
CASES["compare no new and no stacks"] = Case(compare("{base}"), r"NEW is missing: give a second results file, or "
                                                                  r"--stacks A,B")
CASES["compare stacks one label"] = Case(compare("{base}", "--stacks", "ds0.18.4"),
                                         r"--stacks ds0\.18\.4: expected two stack labels, BASE_STACK,NEW_STACK")
CASES["compare stacks alone with one"] = Case(compare("{base}", "--stacks"),
                                             r"--stacks: .* holds 0 stack\(s\) \(none\); two are compared")
CASES["compare stacks unknown"] = Case(compare("{base}", "--stacks", "ds0.18.4,ds0.19.8"),
                                       r"--stacks ds0\.18\.4,ds0\.19\.8: .* has no sweep point or scaling of stack ds0\.18\.4; its "
                                       r"stacks: none")
CASES["compare alpha 2"] = Case(compare("{base}", "{base}", "--alpha", "2"), r"--alpha 2: expected a probability")


# --- plan ------------------------------------------------------------------------------------------
def plan(*argv: str):
    """``ds-bench plan`` recording to ``r.jsonl`` in ``tmp`` (``{tmp}`` in an argument is that folder)."""
    return lambda tmp: ["plan", "--results", str(tmp / "r.jsonl"), *[a.format(tmp=tmp) for a in argv]]


CASES["plan unknown device"] = Case(plan("--device", "TPU9"),
                                    r"--device TPU9: not a known family \(V100.*\); give --peak-tflops and --device-memory")
CASES["plan precision the device lacks"] = Case(plan("--device", "V100"),
                                               r"--device V100: V100 has no bf16 peak .*another --precision")
CASES["plan unknown device without busbw"] = Case(
    plan("--device", "TPU9", "--peak-tflops", "100", "--device-memory", "80GiB", "--gpus-per-node", "8"),
    r"--device TPU9: no busbw inside a node for 1 x 8 ranks; measure it")
CASES["plan peak nan"] = Case(plan("--device", "H100", "--peak-tflops", "nan"), r"--peak-tflops must be a positive number")
CASES["plan confirm more than top"] = Case(plan("--device", "H100", "--gpus-per-node", "1", "--confirm", "5", "--top", "3"),
                                           r"--confirm 5 is more than --top 3")
CASES["plan gpus-per-node 0"] = Case(plan("--device", "H100", "--gpus-per-node", "0"),
                                     r"--gpus-per-node 0: the planned cluster's devices per node, at least 1")
CASES["plan expert-parallel for a dense model"] = Case(
    plan("--device", "H100", "--expert-parallel", "1,2"),
    r"--expert-parallel: workload llama has no experts \(moe has\)$")
CASES["plan device-memory without a unit"] = Case(
    plan("--device", "TPU9", "--peak-tflops", "100", "--device-memory", "80", "--gpus-per-node", "8"),
    r"--device-memory 80: give a unit, e.g. 80GiB")
CASES["plan confirm a fused loss"] = Case(plan("--workload", "gpt2", "--size", "tiny", "--device", "cpu", "--loss", "fused",
                                             "--confirm", "1"),
                                        r"--confirm with --loss fused: ds_bench's runs compute the upcast loss")
CASES["plan confirm a fused norm"] = Case(plan("--workload", "llama", "--size", "tiny", "--device", "cpu", "--norm",
                                              "fused", "--confirm", "1"),
                                         r"--confirm with --norm fused: ds_bench's runs train HF's eager RMSNorm")
CASES["plan confirm with dropout"] = Case(plan("--workload", "gpt2", "--size", "tiny", "--device", "cpu", "--dropout",
                                              "on", "--confirm", "1"),
                                         r"--confirm with --dropout on: ds-bench's models are built without dropout")
CASES["plan host memory on cpu ranks"] = Case(plan("--device", "cpu", "--host-memory", "64GiB"),
                                              r"--host-memory: CPU ranks offload nothing")
CASES["plan selective without checkpointing"] = Case(
    plan("--device", "H100", "--selective-checkpointing", "on", "--activation-checkpointing", "off"),
    r"--selective-checkpointing on with --activation-checkpointing off: selective checkpointing is a kind of")
CASES["plan selective alone for moe"] = Case(plan("--device", "H100", "--workload", "moe", "--selective-checkpointing", "on"),
                                             r"--selective-checkpointing on: plan models it for gpt2 and llama")
CASES["plan norm unknown"] = Case(plan("--norm", "apex"), r"--norm: invalid choice: 'apex'")
CASES["plan loss unknown"] = Case(plan("--loss", "liger"), r"--loss: invalid choice: 'liger'")
CASES["plan nvlink domain not whole nodes"] = Case(plan("--device", "GB200", "--nvlink-domain", "6"),
                                                   r"--nvlink-domain 6: GPUs one NVLink fabric joins, a whole number "
                                                   r"of nodes of --gpus-per-node 4 \(e.g. 4\)")
CASES["plan nvlink domain on cpu"] = Case(plan("--device", "cpu", "--nvlink-domain", "8"),
                                          r"--nvlink-domain 8: CPU ranks have no NVLink")
CASES["plan scale layers confirm a named size"] = Case(
    plan("--workload", "gpt2", "--size", "tiny", "--device", "cpu", "--scale", "layers", "--confirm", "1"),
    r"--confirm with --scale layers runs each answer as a custom shape: give the model as --layers, --hidden and "
    r"--heads")
CASES["plan scale unknown"] = Case(plan("--scale", "width"), r"--scale: invalid choice: 'width'")
CASES["plan checkpoint offload maybe"] = Case(plan("--device", "H100", "--checkpoint-offload", "maybe"),
                                             r"--checkpoint-offload 'maybe': 'maybe' is not one of off, on")
CASES["plan host memory without a unit"] = Case(plan("--device", "H100", "--host-memory", "2"),
                                               r"--host-memory 2: give a unit")
CASES["plan dropout maybe"] = Case(plan("--dropout", "maybe"), r"--dropout: invalid choice: 'maybe'")
CASES["plan selective checkpointing maybe"] = Case(plan("--device", "H100", "--selective-checkpointing", "maybe"),
                                                   r"--selective-checkpointing 'maybe': 'maybe' is not one of off, on")
CASES["plan nodes 0"] = Case(plan("--device", "H100", "--nodes", "0"), r"--nodes must be a positive integer, got 0$")
CASES["plan achieved 2"] = Case(plan("--device", "H100", "--achieved", "2"), r"--achieved must be in \(0, 1\]")
CASES["plan batch not whole sequences"] = Case(plan("--device", "H100", "--global-batch", "1000"),
                                               r"--global-batch 1000 tokens is not a whole number of "
                                               r"--seq-len 2048 sequences")
CASES["plan batch no layout divides"] = Case(
    plan("--device", "H100", "--gpus-per-node", "2", "--workload", "gpt2", "--size", "small", "--global-batch", "1024",
         "--pipeline-stages", "1"), r"--global-batch 1024 tokens \(1 sequences of 1024\) divides into no layout")
CASES["plan batch no layout divides at a fixed micro-batch"] = Case(
    plan("--device", "H100", "--workload", "gpt2", "--size", "tiny", "--seq-len", "1024", "--global-batch", "8k",
         "--micro-batch", "4", "--tensor-parallel", "1", "--pipeline-stages", "1", "--sequence-parallel", "1"),
    r"give a multiple of the data-parallel degrees x micro-batch, e\.g\. 32768 tokens$")
CASES["plan model fits no layout"] = Case(
    plan("--device", "V100", "--gpus-per-node", "1", "--size", "llama3.1-70b", "--seq-len", "8192",
         "--global-batch", "8192", "--precision", "fp16"), r"llama3.1-70b \(70.6B parameters\) fits no layout on 1 x 1 V100 .*the least any "
                                    r"layout needs is [0-9.]+ GiB per device")
CASES["plan every degree beyond the world"] = Case(
    plan("--device", "H100", "--gpus-per-node", "2", "--sequence-parallel", "3", "--confirm", "1"),
    r"no candidate layout is left on 1 x 2 H100: --sequence-parallel 3 does not divide the world size 2: every "
    r"data-parallel replica needs a whole sequence-parallel group$")
CASES["plan cpu without peak"] = Case(plan("--device", "cpu"), r"CPU ranks have no datasheet peak")
CASES["plan calibrate missing"] = Case(plan("--device", "H100", "--calibrate", "{tmp}/none.jsonl"),
                                       r"--calibrate .*none.jsonl: no such file")
CASES["plan confirm across nodes here"] = Case(plan("--device", "H100", "--nodes", "2", "--confirm", "1"),
                                               r"--confirm runs the plan's layouts on these ranks")
CASES["plan size unknown"] = Case(plan("--device", "H100", "--size", "llama9"), r"--size llama9: llama sizes are")


# --- every flag with a unit: one parser each kind (ds_bench.config.parsers; docs/README.md, "Units") -------------
def count_not_bytes(flag: str) -> str:
    return (f"{flag} '4MB': a count takes no byte unit; give 4M (= 4,194,304: k, M, G are 2^10-based) or a plain "
            "number such as 4000000")


def not_a_count(flag: str, text: str) -> str:
    return f"{flag} {text!r}: expected a count such as 8192, 8k or 4M (k, M, G = 2^10, 2^20, 2^30)"


def no_duration_unit(flag: str, number: str) -> str:
    return f"{flag} {number}: give a unit, e.g. {number}s or {number}m (s, m, h, d)"


def no_memory_unit(flag: str, number: str) -> str:
    return f"{flag} {number}: give a unit, e.g. {number}GiB or {number}MiB (a bare number is not taken as bytes)"


def not_a_size(flag: str, text: str) -> str:
    return (f"{flag} {text!r}: expected a size such as 4GiB, 512MiB, 64KB or a number of bytes (KiB, MiB, GiB and K, "
            "M, G are 2^10-based; KB, MB, GB 10^3-based)")


TINY_CAP = "--cpu-mem-limit '512KiB' is 524,288 bytes: below 64 MiB no rank starts; give e.g. 4GiB"
SLURM = ("--executor", "slurm")
UNIT_CASES = {
    "run --seq-len 4MB": (run("--seq-len", "4MB"), count_not_bytes("--seq-len")),
    "run --seq-len text": (run("--seq-len", "8q"), not_a_count("--seq-len", "8q")),
    "run --seq-len not whole": (run("--seq-len", "0.3k"), "--seq-len '0.3k' is 307.2: expected a whole number"),
    "run --seq-len 0": (run("--seq-len", "0"), "--seq-len must be a positive integer, got 0"),
    "run --seq-len negative": (run("--seq-len", "-3"), "--seq-len must be a positive integer, got -3"),
    "run --dist-timeout bare": (run("--dist-timeout", "20"), no_duration_unit("--dist-timeout", "20")),
    "run --dist-timeout inf": (run("--dist-timeout", "inf"),
                               "--dist-timeout 'inf': expected a duration such as 90s, 15m, 1h or 1d"),
    "run --connect-timeout 0s": (run("--connect-timeout", "0s"), "--connect-timeout '0s': must be at least 1 ms"),
    "run --step-timeout bare": (run("--step-timeout", "20"), no_duration_unit("--step-timeout", "20")),
    "run --step-timeout nan": (run("--step-timeout", "nan"),
                               "--step-timeout 'nan': expected a duration such as 90s, 15m, 1h or 1d"),
    "run --cpu-mem-limit bare": (run("--cpu-mem-limit", "1.1"), no_memory_unit("--cpu-mem-limit", "1.1")),
    "run --cpu-mem-limit tiny": (run("--cpu-mem-limit", "512KiB"), TINY_CAP),
    "plan --seq-len text": (plan("--device", "H100", "--seq-len", "8q"), not_a_count("--seq-len", "8q")),
    "plan --global-batch 4MB": (plan("--device", "H100", "--global-batch", "4MB"), count_not_bytes("--global-batch")),
    "plan --device-memory bare": (plan("--device", "TPU9", "--peak-tflops", "100", "--device-memory", "80"),
                                  no_memory_unit("--device-memory", "80")),
    "plan --cpu-mem-limit bare": (plan("--device", "H100", "--cpu-mem-limit", "1.1"), no_memory_unit("--cpu-mem-limit", "1.1")),
    "plan --timeout bare": (plan("--device", "H100", "--timeout", "20"), no_duration_unit("--timeout", "20")),
    "capacity --seq-len 4MB": (capacity("--seq-len", "4MB"), count_not_bytes("--seq-len")),
    "capacity --max-seq-len 4MB": (capacity("--scale", "seq", "--max-seq-len", "4MB"), count_not_bytes("--max-seq-len")),
    "capacity --seq-granularity text": (capacity("--scale", "seq", "--seq-granularity", "fine"),
                                        not_a_count("--seq-granularity", "fine")),
    "capacity --cpu-mem-limit bare": (capacity("--cpu-mem-limit", "1.1"), no_memory_unit("--cpu-mem-limit", "1.1")),
    "capacity --cpu-mem-limit tiny": (capacity("--cpu-mem-limit", "512KiB"), TINY_CAP),
    "capacity --timeout bare": (capacity("--timeout", "20"), no_duration_unit("--timeout", "20")),
    "sweep --seq-len list with 4MB": (cmd(*SWEEP_GPT2, "--seq-len", "1k,4MB"), count_not_bytes("--seq-len")),
    "sweep --max-micro-batch text": (cmd(*SWEEP, *MNIST, "--max-micro-batch", "many"), not_a_count("--max-micro-batch", "many")),
    "sweep --cpu-mem-limit bare": (cmd(*SWEEP, *MNIST, "--cpu-mem-limit", "1.1"), no_memory_unit("--cpu-mem-limit", "1.1")),
    "sweep --timeout bare": (cmd(*SWEEP, *MNIST, "--timeout", "20"), no_duration_unit("--timeout", "20")),
    "sweep slurm --timeout bare": (cmd(*SWEEP, *MNIST, *SLURM, "--timeout", "20"), no_duration_unit("--timeout", "20")),
    "sweep slurm --queue-timeout bare": (cmd(*SWEEP, *MNIST, *SLURM, "--queue-timeout", "12"),
                                         no_duration_unit("--queue-timeout", "12")),
    "scaling --timeout bare": (scaling("--timeout", "20"), no_duration_unit("--timeout", "20")),
    "comm --min-bytes text": (comm("--min-bytes", "4XB"), not_a_size("--min-bytes", "4XB")),
    "comm --max-bytes 1e9": (comm("--max-bytes", "1e9"), not_a_size("--max-bytes", "1e9")),
    "comm --dist-timeout bare": (comm("--dist-timeout", "60"), no_duration_unit("--dist-timeout", "60")),
    "comm --connect-timeout bare": (comm("--connect-timeout", "5"), no_duration_unit("--connect-timeout", "5")),
    "doctor --dist-timeout bare": (cmd("doctor", "--dist-timeout", "60"), no_duration_unit("--dist-timeout", "60")),
    "roofline --copy-bytes text": (cmd("roofline", "--copy-bytes", "8q"), not_a_size("--copy-bytes", "8q")),
    "roofline --tokens 4MB": (cmd("roofline", "--gpt2", "small", "--tokens", "4MB"), count_not_bytes("--tokens")),
    "roofline --min-time bare": (cmd("roofline", "--min-time", "0.3"), no_duration_unit("--min-time", "0.3")),
    "roofline --connect-timeout bare": (cmd("roofline", "--connect-timeout", "5"), no_duration_unit("--connect-timeout", "5")),
    "roofline --dist-timeout bare": (cmd("roofline", "--dist-timeout", "60"), no_duration_unit("--dist-timeout", "60")),
    "roofline --sizes 4MB": (cmd("roofline", "--sizes", "1k,4MB"), count_not_bytes("--sizes")),
    "doctor --connect-timeout bare": (cmd("doctor", "--connect-timeout", "5"), no_duration_unit("--connect-timeout", "5")),
    "plan slurm --queue-timeout bare": (plan("--device", "H100", *SLURM, "--queue-timeout", "12"),
                                        no_duration_unit("--queue-timeout", "12")),
    "capacity slurm --queue-timeout bare": (capacity(*SLURM, "--queue-timeout", "12"), no_duration_unit("--queue-timeout", "12")),
    "scaling slurm --queue-timeout bare": (
        lambda tmp: [a for a in scaling(*SLURM, "--nodes", "1", "--queue-timeout", "12")(tmp) if a not in ("--ranks", "1,2")],
        no_duration_unit("--queue-timeout", "12")),
}
for name, (argv, line) in UNIT_CASES.items():
    CASES[f"unit: {name}"] = Case(argv, "^ds-bench: error: " + re.escape(line) + "$")
CASES["unit: launch's run --step-timeout bare"] = Case(
    cmd("launch", "torchrun", "--dry-run", "--", "run", "--workload", "mnist", "--ds-config", "x.json", "--step-timeout", "20"),
    r"^ds-bench: error: the ds-bench command after '--' \(.*\): " + re.escape(no_duration_unit("--step-timeout", "20")) + "$")
CASES["unit: sweep's run --dist-timeout bare"] = Case(
    cmd(*SWEEP, *MNIST, "--", "--dist-timeout", "20"),
    r"^ds-bench: error: run arguments \(--dist-timeout 20\): " + re.escape(no_duration_unit("--dist-timeout", "20")) + "$")


@pytest.fixture
def no_side_effects(monkeypatch):
    """Anything past validation fails loudly instead of joining a process group or launching."""
    stop_past_checks(monkeypatch)
    from ds_bench.machine import memory

    monkeypatch.setattr(memory, "cap_process_memory", lambda *_a, **_k: None)  # never on the test process
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DS_BENCH_IFACE"):
        monkeypatch.delenv(var, raising=False)


def test_a_case_named_twice_is_refused():
    cases = OneCasePerName()
    cases["x"] = 1
    with pytest.raises(KeyError, match="'x' is defined twice"):
        cases["x"] = 2


@pytest.mark.parametrize("name", CASES, ids=list(CASES))
def test_bad_input(name, tmp_path, capsys, no_side_effects, monkeypatch):
    case = CASES[name]
    for var, value in case.env.items():
        monkeypatch.setenv(var, value)
    code = cli.main(case.argv(tmp_path))
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("ds-bench: error:")]
    assert code == 2, f"exit {code}\n{err[-3000:]}"
    assert len(errors) == 1, err
    assert "Traceback" not in err and PASSED not in err, err
    assert re.search(case.pattern, errors[0]), errors[0]
    assert not (tmp_path / "r.jsonl").exists() and not (tmp_path / "ckpt").exists()


def test_a_memory_cap_above_what_is_held_reaches_the_join(tmp_path, capsys, no_side_effects):
    """The other side of "run memory cap below held": a cap with room passes the check."""
    code = cli.main(run("--cpu-mem-limit", "64GiB")(tmp_path))
    err = capsys.readouterr().err
    assert code != 2 and PASSED in err and "--cpu-mem-limit" not in err, err


@pytest.mark.parametrize("command", ["roofline", "comm"])
def test_a_results_folder_not_made_yet_reaches_the_join(command, tmp_path, capsys, no_side_effects):
    """As ``run`` and the studies: ``--results results/x.jsonl`` where ``results/`` does not exist yet (a fresh clone)
    passes the checks, the folder made with the record (issue 45: docs/plan.md's recipe stopped there, exit 2)."""
    code = cli.main([command, "--results", str(tmp_path / "new" / "r.jsonl")])
    err = capsys.readouterr().err
    assert code != 2 and PASSED in err and "--results" not in err, err


def test_autoep_names_the_versions_that_fail_together(tmp_path, capsys, no_side_effects):
    """``--moe-path autoep`` where the installed DeepSpeed's AutoEP presets and transformers do not work together
    (deepspeed 0.19.8 with transformers 5.x): refused before joining, naming both installed versions."""
    from importlib.metadata import version

    from ds_bench.engines.degrees import expert_parallel

    if expert_parallel.autoep_mismatch() is None:
        pytest.skip("AutoEP works with the installed DeepSpeed and transformers: a real autoep run should test it")
    code = cli.main(run(*MOE, "--moe-path", "autoep")(tmp_path))
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("ds-bench: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err and PASSED not in err, err
    assert errors[0].startswith("ds-bench: error: --moe-path autoep: ")
    assert f"deepspeed {version('deepspeed')}'s AutoEP" in errors[0] and f"transformers {version('transformers')}" in errors[0]
    assert errors[0].endswith("use --moe-path moe-layer (or auto)")
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("nodelist", ["node[01-", "node[02-01]"])
def test_acceptance_sbatch_names_a_malformed_nodelist(nodelist, tmp_path):
    """``run_scripts/acceptance.sbatch`` without ``scontrol`` expands SLURM_JOB_NODELIST itself: a malformed
    one is one line naming it (``ds_bench.cluster.slurm``), exit 2, no traceback, nothing written."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "SLURM_JOB_NODELIST": nodelist,
           "SLURM_SUBMIT_DIR": str(REPO), "OUT": str(tmp_path / "out"), "PATH": "/usr/bin:/bin"}  # no scontrol
    done = subprocess.run(["bash", str(REPO / "run_scripts" / "acceptance.sbatch")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done
    assert done.stderr.splitlines() == [f"ds-bench: error: SLURM_JOB_NODELIST={nodelist!r}: not a Slurm host list; "
                                        "expected e.g. 'node01' or 'node[01-04,07]'"], done.stderr
    assert not (tmp_path / "out").exists()

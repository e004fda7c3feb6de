"""What each feature needs of the stack: the DeepSpeed (or transformers) release it first works with, as measured,
so that an older stack refuses it in one line instead of failing inside DeepSpeed (pure).

Each ``NeedsRelease`` names the feature by its flag, the package and release, and the evidence: what the release
before fails with (docs/stacks.md, measured on this project's CPU machine with ``ds-bench run`` in a stack
environment, ``ds_bench.machine.stack_envs``). ``too_old(layout, where)`` is the first such refusal for a layout
on the versions ``where`` names (a study's stack), else on this environment's; ``ds_bench.config.legality``
says it before the legality table's own rules (what a stack cannot run at all comes first), so ``ds-bench run``
refuses it before joining (exit 2) and a study skips the point with the same sentence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ds_bench.config.layout import Layout
from ds_bench.config.legality_rules import Where
from ds_bench.config.stacks import older_than, version_in


@dataclass(frozen=True)
class NeedsRelease:
    feature: str
    """How the refusal names it, ``str.format``-ed with the layout's fields: ``--sequence-parallel {sequence_parallel}``."""
    applies: Callable[[Layout, Where], bool]
    package: str
    release: str
    """The oldest release it works with."""
    evidence: str
    """What the release before it does with it (measured: docs/stacks.md)."""

    def says(self, layout: Layout, where: Where) -> str:
        have = version_in(where.versions, self.package)
        return (f"{self.feature.format(**layout.to_dict())} needs {self.package} {self.release} or newer; this stack "
                f"has {self.package} {have} ({self.evidence})")


NEEDS: tuple[NeedsRelease, ...] = (
    NeedsRelease("--sequence-parallel {sequence_parallel}", lambda l, w: l.sequence_parallel > 1, "deepspeed",
                 "0.18.1", "deepspeed 0.17.6's UlyssesSPAttentionHF.register_with_transformers takes a model path, "
                 "not the model: TypeError: stat: path should be string, ... not LlamaForCausalLM; 0.16.9 has no "
                 "DeepSpeed-Ulysses for HF models"),
    NeedsRelease("--tiled-mlp", lambda l, w: l.tiled_mlp, "deepspeed", "0.17.0",
                 "ALST's TiledMLP came in 0.17.0 (runtime/sequence_parallel/ulysses_sp.py)"),
    NeedsRelease("--tiled-loss", lambda l, w: l.tiled_loss, "deepspeed", "0.17.4",
                 "ALST's TiledFusedLogitsLoss came in 0.17.4"),
    NeedsRelease("--tensor-parallel {tensor_parallel} on CPU ranks",
                 lambda l, w: l.tensor_parallel > 1 and w.device_type == "cpu", "deepspeed", "0.18.0",
                 "deepspeed 0.17.6's engine checks its inputs with a broadcast to device '1' on CPU ranks: "
                 "RuntimeError: Invalid device string: '1'; 0.18.0 names the device"),
    NeedsRelease("--tensor-parallel {tensor_parallel}", lambda l, w: l.tensor_parallel > 1, "deepspeed", "0.16.4",
                 "AutoTP training's tensor_parallel.autotp_size came in 0.16.4"),
    NeedsRelease("--workload moe", lambda l, w: w.workload == "moe", "transformers", "5.0.0",
                 "transformers 4.57.6 has no MixtralExperts, the stacked experts ds_bench's MoE layers place: "
                 "ImportError; 5.0.0 runs it"),
    NeedsRelease("--engine fsdp on CPU ranks", lambda l, w: l.engine == "fsdp" and w.device_type == "cpu", "torch",
                 "2.7.0", "torch 2.6.0's FSDP2 records an event on the CPU's stream, which has none before 2.7: "
                 "AttributeError: 'Stream' object has no attribute 'record_event'"),
    NeedsRelease("--optimizer muon at ZeRO-3", lambda l, w: l.optimizer == "muon" and l.stage == 3, "deepspeed",
                 "0.18.9", "0.17.6-0.18.8 assert 'Muon optimizer is not yet compatible with ZeRO Stage 3'"),
    NeedsRelease("--optimizer muon", lambda l, w: l.optimizer == "muon", "deepspeed", "0.17.6",
                 "DeepSpeed's Muon (runtime/zero/muon) came in 0.17.6"),
    NeedsRelease("--master-states {master_states}", lambda l, w: l.master_states in ("bf16", "bf16-weights"),
                 "deepspeed", "0.18.3", "bf16.bf16_master_weights_and_grads and bf16_optimizer_states came in 0.18.3 "
                 "(runtime/precision_config.py)"),
    NeedsRelease("--sp-path autosp", lambda l, w: l.sp_path == "autosp", "deepspeed", "0.18.9",
                 "AutoSP (compile/passes/sp_compile.py) came in 0.18.9"),
    NeedsRelease("--deepcompile at ZeRO-2", lambda l, w: l.deepcompile and l.stage == 2, "deepspeed", "0.19.6",
                 "DeepCompile's ZeRO-2 pass (compile/init_z1_and_2.py) came in 0.19.6; before, 'Currently DeepCompile "
                 "supports stage 1 or 3 only'"),
    NeedsRelease("--deepcompile", lambda l, w: l.deepcompile, "deepspeed", "0.16.6",
                 "DeepCompile (deepspeed/compile) came in 0.16.6"),
    NeedsRelease("offload=zenflow at ZeRO-3", lambda l, w: l.offload == "zenflow" and l.stage == 3, "deepspeed",
                 "0.18.1", "ZenFlow's ZeRO-3 engine (runtime/zenflow/engine_stage3.py) came in 0.18.1"),
    NeedsRelease("offload=zenflow", lambda l, w: l.offload == "zenflow", "deepspeed", "0.17.5",
                 "ZenFlow (runtime/zenflow) came in 0.17.5"),
    NeedsRelease("--checkpoint-offload", lambda l, w: "checkpoint_offload" in w.run_options, "deepspeed", "0.19.6",
                 "ALST's activation checkpoint offload (runtime/activation_checkpointing/offload_activations.py) came "
                 "in 0.19.6"),
)
"""Measured on 2 CPU ranks where the evidence quotes an error (``ds-bench run`` in a stack environment,
2026-11-29); the others read from the releases' sources (the first release holding the module or key)."""


def too_old(layout: Layout, where: Where) -> str | None:
    """The sentence of the first feature of ``layout`` its stack's release is too old for, else None."""
    for need in NEEDS:
        if need.applies(layout, where) and older_than(version_in(where.versions, need.package), need.release):
            return need.says(layout, where)
    return None

"""The registered run switches (``config.switches.Switch``), in key order: ALST's tiled MLP and tiled loss, the
optimizer, the master-state precision, the sequence-parallel path and DeepCompile. A new one is an entry here (and
its ``RunConfig`` flag); the key, the studies' axes, the legality table and the DeepSpeed config read this tuple.

Each refusal names its source: a DeepSpeed assertion verified with ``DEEPSPEED`` on 2 CPU ranks (docs/options.md),
or "not measured yet".
"""

from __future__ import annotations

from ds_bench.config.degrees import DEGREES
from ds_bench.config.degrees.protocol import DEEPSPEED, DegreeRule, active
from ds_bench.config.deepspeed import switch_sections as sections
from ds_bench.config.switches import Switch


def _other_degrees(l, w) -> bool:
    return any(d.active(l, w) for d in DEGREES if d.field != "sequence_parallel")


def _deepspeed_only(field: str, values: tuple, named: str, why: str) -> DegreeRule:
    return DegreeRule(f"{named.format(**{field: values[0]})} is DeepSpeed's",
                      lambda l, w: getattr(l, field) in values and l.engine != "deepspeed",
                      f"--engine {{engine}} with {named}: {why} (--engine deepspeed)", "ds_bench: the torch engines "
                      "build the config's optimizer and precision with torch",
                      {"engine": "ddp", "stage": 0, field: values[0]})


MUON_RULES = (
    _deepspeed_only("optimizer", ("muon",), "--optimizer muon", "DeepSpeed's Muon splits the model into its Muon and "
                    "AdamW halves inside deepspeed.initialize"),
    DegreeRule("Muon and offload", lambda l, w: l.optimizer == "muon" and l.offload != "none",
               "--optimizer muon with offload={offload}: not measured yet", "not measured yet",
               {"optimizer": "muon", "offload": "optimizer"}),
    DegreeRule("Muon and the parallel degrees", lambda l, w: l.optimizer == "muon" and any(
        d.active(l, w) for d in DEGREES), "--optimizer muon with {degrees}: not measured yet", "not measured yet",
               {"optimizer": "muon", "tensor_parallel": 2}),
)

STATES_RULES = (
    _deepspeed_only("master_states", ("bf16", "bf16-weights"), "--master-states {master_states}",
                    "DeepSpeed's low-precision master states"),
    DegreeRule("bf16 master states are a bf16 run's", lambda l, w: l.master_states in ("bf16", "bf16-weights")
               and l.precision != "bf16", "--master-states {master_states} with {precision}: the master states are "
               "kept in bf16 only in a bf16 run (bf16.enabled); use --precision bf16",
               f"{DEEPSPEED}, runtime/precision_config.py", {"master_states": "bf16"}),
    DegreeRule("bf16 master states need ZeRO", lambda l, w: l.master_states in ("bf16", "bf16-weights")
               and l.stage == 0, "--master-states {master_states} with ZeRO stage 0: DeepSpeed keeps low-precision "
               "master states in ZeRO's optimizer only (stage 1, 2 or 3)", f"{DEEPSPEED}, runtime/engine.py",
               {"master_states": "bf16", "precision": "bf16", "stage": 0}),
    DegreeRule("bf16 master weights alone need CPU offload", lambda l, w: l.master_states == "bf16-weights"
               and l.offload == "none", "--master-states bf16-weights without optimizer offload: DeepSpeed asserts "
               "bf16 master weights with fp32 optimizer states require ZeRO-Offload with DeepSpeedCPUAdam; use "
               "--master-states bf16 (optimizer states in bf16 too) or offload=optimizer",
               f"{DEEPSPEED}, runtime/zero/stage_1_and_2.py: 'requires ZeRO-1 Offload with DeepSpeedCPUAdam'",
               {"master_states": "bf16-weights", "precision": "bf16"}),
    DegreeRule("bf16 optimizer states and offload", lambda l, w: l.master_states == "bf16" and l.offload != "none",
               "--master-states bf16 with offload={offload}: DeepSpeed needs a DeepSpeedCPUAdam built with "
               "fp32_optimizer_states=False there; not measured yet",
               f"{DEEPSPEED}, runtime/base_optimizer.py: 'bf16_optimizer_states with ZeRO-Offload requires "
               "DeepSpeedCPUAdam constructed with fp32_optimizer_states=False'",
               {"master_states": "bf16", "precision": "bf16", "offload": "optimizer"}),
)

AUTOSP_RULES = (
    DegreeRule("AutoSP needs a sequence-parallel group", lambda l, w: l.sp_path == "autosp"
               and l.sequence_parallel < 2, "--sp-path autosp needs --sequence-parallel 2 or more: it is how that "
               "degree shards the sequence", "arithmetic", {"sp_path": "autosp"}),
    DegreeRule("AutoSP at ZeRO 0 and 1", lambda l, w: l.sp_path == "autosp" and l.stage > 1,
               "--sp-path autosp with ZeRO stage {stage}: DeepSpeed's AutoSP pass runs at ZeRO 0 and 1 only; at 2 "
               "and 3 its engine compiles the model without it (no sequence sharding)",
               f"{DEEPSPEED}, runtime/engine.py: 'Currently AutoSP does not compose with ZeRO stage 2 and 3. "
               "Falling back to the torch compiler.'", {"sp_path": "autosp", "sequence_parallel": 2, "stage": 2}),
    DegreeRule("AutoSP and other degrees", lambda l, w: l.sp_path == "autosp" and _other_degrees(l, w),
               "--sp-path autosp with {degrees}: not measured yet", "not measured yet",
               {"sp_path": "autosp", "sequence_parallel": 2, "expert_parallel": 2}),
    DegreeRule("AutoSP and tiling", lambda l, w: l.sp_path == "autosp" and (l.tiled_mlp or l.tiled_loss),
               "--sp-path autosp with {tiles}: ALST's tiled modules are not graphs AutoSP's pass shards; use the "
               "Ulysses path (--sp-path ulysses)", "not measured yet",
               {"sp_path": "autosp", "sequence_parallel": 2, "tiled_mlp": True}),
    DegreeRule("AutoSP compiles with sdpa", lambda l, w: l.sp_path == "autosp" and l.attn not in ("", "sdpa"),
               "--sp-path autosp with --attn {attn}: AutoSP's pass rewrites the sdpa call of the traced graph; use "
               "--attn sdpa", f"{DEEPSPEED}, compile/passes/sp_compile.py matches scaled_dot_product_attention",
               {"sp_path": "autosp", "sequence_parallel": 2, "attn": "eager"}),
)

DEEPCOMPILE_RULES = (
    _deepspeed_only("deepcompile", (True,), "--deepcompile", "DeepCompile is DeepSpeed's engine.compile()"),
    DegreeRule("DeepCompile needs ZeRO", lambda l, w: l.deepcompile and l.stage == 0,
               "--deepcompile with ZeRO stage 0: DeepCompile schedules ZeRO's collectives (stages 1, 2 and 3); at "
               "stage 0 DeepSpeed falls back to the torch compiler (use --compile)",
               f"{DEEPSPEED}, runtime/engine.py: 'Currently DeepCompile supports ZeRO stage 1, 2, or 3 only'",
               {"deepcompile": True, "stage": 0}),
    DegreeRule("DeepCompile and --compile", lambda l, w: l.deepcompile and (l.compile or l.sp_path == "autosp"),
               "--deepcompile with --compile or --sp-path autosp: DeepCompile is one engine.compile() of its own; "
               "give one", "ds_bench: one compile section per config", {"deepcompile": True, "compile": True}),
    DegreeRule("DeepCompile and the parallel degrees", lambda l, w: l.deepcompile and any(
        d.active(l, w) for d in DEGREES), "--deepcompile with {degrees}: not measured yet", "not measured yet",
               {"deepcompile": True, "pipeline_stages": 2}),
    DegreeRule("DeepCompile needs CUDA", lambda l, w: l.deepcompile and w.device_type == "cpu",
               "--deepcompile on CPU ranks: DeepCompile is CUDA-only (is_deepcompile_supported() needs a CUDA device "
               "and its dc op includes ATen/cuda headers: 'cuda.h' not found); plain --compile runs here",
               f"{DEEPSPEED}, compile/util.py is_deepcompile_supported", {"deepcompile": True}),
)


SWITCHES = (
    Switch("tiled_mlp", "tiled-mlp", "DeepSpeed's TiledMLP (ALST): each block's MLP computed in sequence tiles, its "
                                     "activations recomputed in backward", long_context=True, planned=True),
    Switch("tiled_loss", "tiled-loss", "DeepSpeed's TiledFusedLogitsLoss (ALST): the LM head and loss computed in "
                                       "sequence tiles, no full-vocabulary logits tensor",
           long_context=True, planned=True),
    Switch("optimizer", "opt", "the optimizer: AdamW, or DeepSpeed's Muon (hidden matrices) with AdamW (the rest)",
           choices=("adamw", "muon"), flag="--optimizer", numerics=True, rules=MUON_RULES, edit=sections.optimizer_edit,
           of_config=sections.optimizer_of),
    Switch("master_states", "states", "the precision of the master weights, their gradients and the optimizer "
                                      "state in a bf16 run: fp32 (mixed precision), bf16 (all three), bf16-weights "
                                      "(the master weights and gradients)",
           choices=("fp32", "bf16", "bf16-weights"), flag="--master-states", numerics=True, rules=STATES_RULES,
           edit=sections.master_states_edit, of_config=sections.master_states_of),
    Switch("sp_path", "sp-path", "how --sequence-parallel shards: ulysses (DeepSpeed-Ulysses on the HF attention) or "
                                 "autosp (DeepSpeed's AutoSP compiler pass)",
           choices=("ulysses", "autosp"), plain="ulysses", numerics=True, rules=AUTOSP_RULES, edit=sections.autosp_edit,
           of_config=sections.autosp_of),
    Switch("deepcompile", "deepcompile", "DeepSpeed's DeepCompile (compile.deepcompile: ZeRO's collectives scheduled "
                                         "in the compiled graph; CUDA)", rules=DEEPCOMPILE_RULES,
           edit=sections.deepcompile_edit, of_config=sections.deepcompile_of),
)


def apply(ds_cfg: dict, flags) -> dict:
    """``ds_cfg`` with every switch ``flags`` (a ``RunConfig``) sets written in (pure)."""
    import copy

    out = copy.deepcopy(ds_cfg)
    for s in SWITCHES:
        value = s.normal(getattr(flags, s.field, None))
        if value and s.edit is not None:
            s.edit(out, value)
    return out


__all__ = ["SWITCHES", "Switch", "apply", "active"]

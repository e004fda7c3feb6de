"""What each run switch writes into a DeepSpeed config, and reads back from one (pure, on dicts).

- ``--optimizer muon``: DeepSpeed's Muon (``runtime/zero/muon``; Jordan et al. 2024, "Muon: an optimizer for hidden
  layers"): the 2-D hidden weights take Muon's orthogonalised momentum step at ``muon_lr``, every other parameter
  an AdamW step at ``adam_lr`` (the config's ``lr``; DeepSpeed tags each parameter ``use_muon`` itself). It sets
  ``gradient_clipping`` to 0: under ZeRO 1-3 DeepSpeed clips the orthogonalised update rather than the gradient
  (norm ~20 a matrix, a ~50x smaller step: docs/options.md#muon), and at ZeRO-3 ``reduce_scatter`` off ("Muon and
  reduce scatter cannot be used together", ``runtime/zero/stage3.py``). ``--optimizer adamw``: AdamW with the
  config's learning rate and weight decay.
- ``--master-states bf16``: ``bf16.bf16_master_weights_and_grads`` and ``bf16.bf16_optimizer_states``
  (``runtime/precision_config.py``): the fp32 master partition, its gradients and Adam's two moments in bf16;
  ``bf16-weights`` the first alone; ``fp32`` neither.
- ``--sp-path autosp``: ``compile.deepcompile`` with the ``autosp`` pass (``compile/passes/sp_compile.py``).
- ``--deepcompile``: ``compile.deepcompile`` (DeepSpeed chooses its ZeRO passes by stage).
- ZenFlow is an offload mode (``off=zenflow``, ``derive``): ``zenflow_section``.
"""

from __future__ import annotations

from ds_bench.errors import UserError

MUON_LR = 0.02
"""Muon's learning rate for the hidden matrices (Jordan et al.'s and DeepSpeed's example value)."""
MUON_MOMENTUM = 0.95
ZENFLOW_DEFAULTS = {"topk_ratio": 0.1, "update_interval": 4, "full_warm_up_rounds": 0, "overlap_step": True}
"""ZenFlow's settings when the base config has none: DeepSpeedExamples' ``zf_config.json`` (the top 10% of gradient
columns stepped on the device every step, the rest on the CPU every 4th, overlapped)."""


def _section(cfg: dict, *keys: str) -> dict:
    """``cfg[k1][k2]...`` where each is a JSON object, else {} (a config as read, not yet checked: a malformed one is
    named by ``prepare.resolve``'s checks, not here)."""
    node = cfg
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _number(value, default):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def optimizer_edit(cfg: dict, value: str) -> None:
    params = dict(_section(cfg, "optimizer", "params"))
    lr = params.get("lr", "auto")
    weight_decay = _number(params.get("weight_decay"), 0.0)
    if value == "adamw":
        if str(_section(cfg, "optimizer").get("type", "")).lower() not in ("adam", "adamw"):
            cfg["optimizer"] = {"type": "AdamW", "params": {"lr": lr, "weight_decay": weight_decay}}
        return
    cfg["optimizer"] = {"type": "Muon", "params": {"muon_lr": MUON_LR, "adam_lr": lr, "momentum": MUON_MOMENTUM,
                                                   "weight_decay": weight_decay, "torch_adam": True}}
    cfg["gradient_clipping"] = 0.0
    zero = _section(cfg, "zero_optimization")
    if zero.get("stage") == 3:
        cfg["zero_optimization"] = {**zero, "reduce_scatter": False}


def optimizer_of(cfg: dict) -> str:
    return "muon" if str(_section(cfg, "optimizer").get("type", "")).lower() == "muon" else ""


def master_states_edit(cfg: dict, value: str) -> None:
    cfg["bf16"] = {**_section(cfg, "bf16"), "bf16_master_weights_and_grads": value in ("bf16", "bf16-weights"),
                   "bf16_optimizer_states": value == "bf16"}


def master_states_of(cfg: dict) -> str:
    bf16 = _section(cfg, "bf16")
    if bf16.get("bf16_master_weights_and_grads") is True:
        return "bf16" if bf16.get("bf16_optimizer_states") is True else "bf16-weights"
    return ""


def autosp_edit(cfg: dict, value: str) -> None:
    cfg["compile"] = {**_section(cfg, "compile"), "deepcompile": True, "passes": ["autosp"]}


def autosp_of(cfg: dict) -> str:
    passes = _section(cfg, "compile").get("passes")
    return "autosp" if isinstance(passes, list) and "autosp" in passes else ""


def deepcompile_edit(cfg: dict, value: bool) -> None:
    cfg["compile"] = {**_section(cfg, "compile"), "deepcompile": True}


def deepcompile_of(cfg: dict) -> bool:
    return _section(cfg, "compile").get("deepcompile") is True and not autosp_of(cfg)


def zenflow_section(kept: dict | None) -> dict:
    """ZenFlow's settings: the base config's own where it has them, else ``ZENFLOW_DEFAULTS``."""
    return {**ZENFLOW_DEFAULTS, **(kept or {})}


def clipping(cfg: dict) -> float:
    """``gradient_clipping`` as DeepSpeed reads it: 1.0 when unset (``runtime/constants.py``) or ``auto``."""
    value = cfg.get("gradient_clipping", 1.0)
    return 1.0 if value == "auto" else float(_number(value, 1.0))


def check_muon(cfg: dict, path: str) -> None:
    """DeepSpeed's Muon as a config names it: ZeRO 1-3 clip its orthogonalised update, not the gradient (the step
    ~50x smaller: docs/options.md#muon), so clipping must be off there; ZeRO-3 needs ``reduce_scatter`` off."""
    zero = _section(cfg, "zero_optimization")
    stage = zero.get("stage") if isinstance(zero.get("stage"), int) else 0
    if stage >= 1 and clipping(cfg) > 0:
        raise UserError(f"{path}: gradient_clipping {clipping(cfg)} with optimizer Muon at ZeRO stage {stage}: "
                        "DeepSpeed clips Muon's orthogonalised update there (norm ~20 a matrix), a ~50x smaller step "
                        "than ZeRO-0's; set \"gradient_clipping\": 0 (docs/options.md#muon)")
    if stage == 3 and zero.get("reduce_scatter", True) is not False:
        raise UserError(f"{path}: zero_optimization.reduce_scatter must be false with optimizer Muon at ZeRO stage "
                        "3 (DeepSpeed: 'Muon and reduce scatter cannot be used together')")

"""How one DeepSpeed JSON config maps onto PyTorch DDP and FSDP2 (pure: a config in, ``TorchSettings`` out).

One config file describes the run for every engine (the "Engines" table of docs/engines-and-layouts.md is
this module in prose):

- optimizer: the config's ``optimizer`` section as torch builds it (Adam/AdamW, whatever
  ``torch_adam`` says, become ``torch.optim.AdamW``, or ``Adam`` with ``adam_w_mode: false``; any
  ``torch.optim`` name as is); DeepSpeed-only optimizers (Lamb, Lion, 1-bit ...) are rejected. No
  section: ``torch.optim.AdamW(lr)``, ds_bench's default for DeepSpeed too.
- scheduler: the same class DeepSpeed builds (``deepspeed.runtime.lr_schedules`` or torch's), stepped
  after every optimizer step; ``gradient_clipping`` -> ``clip_grad_norm_`` at the boundary;
  ``gradient_accumulation_steps`` -> gradient sync only on the last micro-step, loss / gas.
- precision: DDP uses ``torch.autocast`` (fp32 weights; fp16 adds a ``GradScaler`` from the
  config's ``initial_scale_power`` / ``loss_scale_window``); FSDP a ``MixedPrecisionPolicy`` with
  ``param_dtype`` the compute dtype and ``reduce_dtype`` the config's ``communication_data_type``
  (unset: the compute dtype, as DeepSpeed communicates).
- ZeRO stage: DDP replicates (every stage runs as ZeRO-0 would; recorded as stage 0). FSDP: stage 3
  -> ``reshard_after_forward=True``; stage 2 -> ``False`` (parameters stay gathered from forward
  to backward, FSDP1's SHARD_GRAD_OP); stages 0 and 1 are rejected (FSDP always shards parameters
  and gradients). Parameter offload -> ``CPUOffloadPolicy``; optimizer-only offload is rejected
  (FSDP2 offloads parameters, gradients and the optimizer step together).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ds_bench.config.deepspeed.optim import ADAM_POPPED, torch_optimizers
from ds_bench.config.deepspeed.prepare import precision_of, zero_stage
from ds_bench.config.deepspeed.sections import offload_device
from ds_bench.errors import UserError


@dataclass(frozen=True)
class TorchSettings:
    """What a DDP or FSDP run does with a resolved DeepSpeed config."""

    engine: str
    precision: str
    """fp32 | bf16 | fp16: the compute dtype (autocast for DDP, param_dtype for FSDP)."""
    reduce_precision: str
    """dtype gradients are reduced in."""
    zero_stage: int
    """The ZeRO stage this run is equivalent to: 0 for DDP, the config's (2 or 3) for FSDP."""
    grad_accum: int
    gradient_clipping: float
    optimizer: str
    """``torch.optim`` class name."""
    optimizer_params: dict = field(default_factory=dict)
    scheduler: str | None = None
    scheduler_params: dict = field(default_factory=dict)
    reshard_after_forward: bool | None = None
    """FSDP only."""
    cpu_offload: bool = False
    """FSDP only: ``CPUOffloadPolicy``."""
    loss_scale: dict | None = None
    """fp16 only: ``GradScaler`` init_scale and growth_interval."""

    def describe(self) -> dict:
        return asdict(self)


def torch_settings(engine: str, ds_cfg: dict, default_lr: float, where: str) -> TorchSettings:
    """The DDP/FSDP settings of a resolved config; ``UserError`` (naming ``where`` and the key) when the
    config asks for something the engine has no equivalent of."""
    if engine not in ("ddp", "fsdp"):
        raise ValueError(f"no torch plan for engine {engine!r}")
    precision = precision_of(ds_cfg)
    optimizer, optimizer_params = torch_optimizer(ds_cfg, default_lr, f"--engine {engine}: {where}")
    scheduler = ds_cfg.get("scheduler") or {}
    return TorchSettings(
        engine=engine, precision=precision, reduce_precision=_reduce_precision(engine, ds_cfg, precision),
        zero_stage=_stage(engine, ds_cfg, where), grad_accum=int(ds_cfg.get("gradient_accumulation_steps", 1)),
        gradient_clipping=float(ds_cfg.get("gradient_clipping") or 0.0),
        optimizer=optimizer, optimizer_params=optimizer_params,
        scheduler=scheduler.get("type"), scheduler_params=dict(scheduler.get("params") or {}),
        reshard_after_forward=(zero_stage(ds_cfg) == 3) if engine == "fsdp" else None,
        cpu_offload=engine == "fsdp" and offload_device(ds_cfg, "offload_param") == "cpu",
        loss_scale=_loss_scale(ds_cfg) if precision == "fp16" else None)


def _stage(engine: str, ds_cfg: dict, where: str) -> int:
    """The ZeRO stage the engine runs as (the stages and offloads DDP and FSDP refuse: ``config.legality``)."""
    if engine == "ddp":
        return 0
    offload_opt, offload_param = offload_device(ds_cfg, "offload_optimizer"), offload_device(ds_cfg, "offload_param")
    if "nvme" in (offload_opt, offload_param):
        raise UserError(f"--engine fsdp: {where}: offload to nvme has no FSDP equivalent; use device cpu")
    return zero_stage(ds_cfg)


def torch_optimizer(ds_cfg: dict, default_lr: float, where: str) -> tuple[str, dict]:
    """(torch.optim class name, its keyword arguments) for the config's optimizer section."""
    section = ds_cfg.get("optimizer")
    if not section:
        return "AdamW", {"lr": default_lr, "fused": True}  # as ds_bench's default for DeepSpeed (config.deepspeed.optim)
    name, params = section.get("type", ""), dict(section.get("params") or {})
    if name.lower() in ("adam", "adamw"):
        adam_w = name.lower() == "adamw" or params.get("adam_w_mode", True)
        return ("AdamW" if adam_w else "Adam"), {k: v for k, v in params.items() if k not in ADAM_POPPED}
    if name in torch_optimizers():
        return name, params
    raise UserError(f"{where}: optimizer.type {name!r} is DeepSpeed's own; DDP and FSDP take Adam, AdamW or a "
                    "torch.optim class (SGD, Adagrad, ...)")


def _reduce_precision(engine: str, ds_cfg: dict, precision: str) -> str:
    if engine == "ddp":
        return "fp32"  # autocast keeps fp32 weights, so gradients and their all-reduce are fp32
    named = str(ds_cfg.get("communication_data_type") or "").lower()
    return {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16", "bf16": "bf16",
            "bfloat16": "bf16"}.get(named, precision)


def _loss_scale(ds_cfg: dict) -> dict:
    fp16 = ds_cfg.get("fp16") or {}
    static = fp16.get("loss_scale") or 0
    if static:
        return {"init_scale": float(static), "growth_interval": 2**31 - 1}  # never grows: DeepSpeed's static scale
    return {"init_scale": 2.0 ** fp16.get("initial_scale_power", 16), "growth_interval": fp16.get("loss_scale_window", 1000)}

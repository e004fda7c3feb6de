"""Optimizers and LR schedulers: what DeepSpeed builds from a config, checked before it does, and
the default optimizer ds_bench supplies when the config names none.

Names follow ``deepspeed.runtime.engine``: ``_is_supported_optimizer`` accepts DeepSpeed's own
names (``deepspeed.runtime.config.DEEPSPEED_OPTIMIZERS``, any case) and any ``torch.optim`` class
(exact case); ``_configure_basic_optimizer`` picks a class (``optimizer_class``) and passes it
``optimizer.params``, so every param is checked against that class's ``__init__``.
``_scheduler_from_config`` takes a ``deepspeed.runtime.lr_schedules`` name, else a
``torch.optim.lr_scheduler`` one, and passes ``scheduler.params`` likewise (``optimizer`` aside).

Without an ``optimizer`` section DeepSpeed trains with the client optimizer the script passes:
ds_bench passes ``torch.optim.AdamW(lr, fused=True)`` (one kernel over all parameters: the same update
as the default per-parameter loop, to rounding; measured on 25M fp32 parameters, AMD EPYC AVX2: 19 ms a
step against 120 ms unfused and 83 ms ``foreach``), or ``DeepSpeedCPUAdam(lr)`` with optimizer offload,
where DeepSpeed refuses any other (``zero_force_ds_cpu_optimizer``). A config section asks for the fused
kernel itself with ``"torch_adam": true, "fused": true``.
"""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from typing import Any

from ds_bench.config.deepspeed.sections import offload_device
from ds_bench.config.deepspeed.switch_sections import check_muon
from ds_bench.errors import UserError

DEFAULT_SOURCE = "ds_bench default"
# Keys DeepSpeed pops from optimizer.params before building an Adam-family optimizer.
ADAM_POPPED = frozenset({"torch_adam", "adam_w_mode", "fp32_optimizer_states"})


def torch_optimizers() -> list[str]:
    import torch

    return sorted(n for n, c in vars(torch.optim).items()
                  if isinstance(c, type) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer)


def optimizer_names() -> list[str]:
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    return sorted(DEEPSPEED_OPTIMIZERS) + torch_optimizers()


def offloads_optimizer(cfg: dict) -> bool:
    """DeepSpeed's ``zero_use_cpu_optimizer``: optimizer offload to cpu or nvme."""
    return offload_device(cfg, "offload_optimizer") in ("cpu", "nvme")


def optimizer_class(name: str, params: dict, offload: bool, where: str) -> tuple[Any, frozenset[str]]:
    """(class DeepSpeed will build, params DeepSpeed consumes itself); class None: not checked."""
    import torch

    lname = name.lower()
    if lname in ("adam", "adamw"):
        if params.get("torch_adam"):
            adam_w = lname == "adamw" or params.get("adam_w_mode", True)
            return (torch.optim.AdamW if adam_w else torch.optim.Adam), ADAM_POPPED
        from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam

        # DeepSpeedCPUAdam gets adamw_mode and fp32_optimizer_states from DeepSpeed, FusedAdam adam_w_mode.
        return (DeepSpeedCPUAdam, ADAM_POPPED | {"adamw_mode"}) if offload else (FusedAdam, ADAM_POPPED)
    if lname == "adagrad":
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        return (DeepSpeedCPUAdagrad if offload else torch.optim.Adagrad), frozenset()
    if lname == "lamb":
        from deepspeed.ops.lamb import FusedLamb

        return FusedLamb, frozenset()
    if lname == "lion":
        from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

        return (DeepSpeedCPULion if offload else FusedLion), frozenset()
    if lname in ("muadam", "muadamw", "musgd"):
        try:
            import mup
        except ImportError:
            raise UserError(f"{where}.type {name}: DeepSpeed builds it from the mup package, which is not "
                            "installed (pip install mup)") from None
        return getattr(mup, {"muadam": "MuAdam", "muadamw": "MuAdamW", "musgd": "MuSGD"}[lname]), frozenset()
    if lname == "muon":
        return None, frozenset()
    if name in torch_optimizers():
        return getattr(torch.optim, name), frozenset()
    raise UserError(f"{where}.type {name!r} is not an optimizer DeepSpeed knows; DeepSpeed's own (any case): "
                    f"{', '.join(optimizer_names()[:_n_ds()])}; torch.optim (exact case): "
                    f"{', '.join(torch_optimizers())}")


def _n_ds() -> int:
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    return len(DEEPSPEED_OPTIMIZERS)


def scheduler_classes() -> dict[str, Any]:
    import torch
    from deepspeed.runtime import lr_schedules

    found = {n: getattr(lr_schedules, n) for n in lr_schedules.VALID_LR_SCHEDULES}
    base = torch.optim.lr_scheduler.LRScheduler
    found.update({n: c for n, c in vars(torch.optim.lr_scheduler).items() if isinstance(c, type)
                  and issubclass(c, base) and c is not base and not n.startswith("_") and n not in found})
    return found


def check_optimizer(cfg: dict, path: str) -> None:
    """The optimizer section against what ``deepspeed.initialize`` would build (none: a default)."""
    if "optimizer" not in cfg:
        return
    opt = _section(cfg, "optimizer", path)
    name = opt.get("type")
    if not isinstance(name, str) or not name:
        raise UserError(f"{path}: optimizer.type must name an optimizer, e.g. \"AdamW\", got {name!r} "
                        "(or leave out the optimizer section: ds_bench then supplies torch.optim.AdamW)")
    params = _params(opt, "optimizer", path)
    if "max_grad_norm" in params:
        raise UserError(f"{path}: optimizer.params.max_grad_norm is not supported by DeepSpeed; "
                        "use the top-level \"gradient_clipping\" instead")
    if name.lower() == "muon":
        check_muon(cfg, path)
    cls, popped = optimizer_class(name, params, offloads_optimizer(cfg), f"{path}: optimizer")
    if cls is not None:
        check_params(cls, {k: v for k, v in params.items() if k not in popped}, "optimizer.params", path,
                     skip=("params", "model_params"))
    lr = params.get("lr")
    if _is_number(lr) and lr < 0:
        raise UserError(f"{path}: optimizer.params.lr must be >= 0, got {lr!r}")
    betas = params.get("betas")
    if isinstance(betas, list) and not all(_is_number(b) and 0 <= b < 1 for b in betas):
        raise UserError(f"{path}: optimizer.params.betas must be numbers in [0, 1), got {betas!r}")


def check_scheduler(cfg: dict, path: str) -> None:
    if "scheduler" not in cfg:
        return
    sched = _section(cfg, "scheduler", path)
    name = sched.get("type")
    known = scheduler_classes()
    if name not in known:
        near = difflib.get_close_matches(str(name), list(known), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise UserError(f"{path}: scheduler.type {name!r} is not a scheduler DeepSpeed knows{hint}; DeepSpeed's: "
                        f"{', '.join(known)}")
    check_params(known[name], _params(sched, "scheduler", path), "scheduler.params", path, skip=("optimizer",))


def _section(cfg: dict, key: str, path: str) -> dict:
    node = cfg[key]
    if not isinstance(node, dict):
        raise UserError(f"{path}: {key} must be a JSON object with \"type\" and \"params\", got {node!r}")
    return node


def _params(node: dict, key: str, path: str) -> dict:
    params = node.get("params", {})
    if not isinstance(params, dict):
        raise UserError(f"{path}: {key}.params must be a JSON object, got {params!r}")
    return params


def check_params(cls: Any, given: dict, where: str, path: str, skip: tuple[str, ...] = ()) -> None:
    """Every given param is a parameter of ``cls.__init__`` with a value of its type; none missing."""
    sig = inspect.signature(cls.__init__)
    params = {n: p for n, p in list(sig.parameters.items())[1:] if n not in skip
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    label = f"{cls.__module__}.{cls.__name__}"
    open_ended = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    for key, value in given.items():
        if key not in params:
            if open_ended:
                continue
            near = difflib.get_close_matches(key, list(params), n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise UserError(f"{path}: {where}.{key} is not a parameter of {label}{hint}; it takes: "
                            f"{', '.join(params) or 'none'}")
        expected = expected_type(params[key])
        if expected is not None and not expected[1](value):
            raise UserError(f"{path}: {where}.{key} must be {expected[0]}, got {value!r}")
    missing = [n for n, p in params.items() if p.default is p.empty and n not in given]
    if missing:
        raise UserError(f"{path}: {where}.{missing[0]} is required by {label}")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _simple_kinds(annotation: Any) -> set[str]:
    """Names of the plain types an annotation allows (unions unpacked, string annotations read)."""
    if isinstance(annotation, str):
        return {part.strip() for part in annotation.split("|")}
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return {k for a in typing.get_args(annotation) for k in _simple_kinds(a)}
    return {getattr(annotation, "__name__", "")}


def expected_type(p: inspect.Parameter) -> tuple[str, Any] | None:
    """(what to say, predicate) for a parameter, from its annotation, else its default; None: unknown."""
    kinds = _simple_kinds(p.annotation) if p.annotation is not p.empty else set()
    default, nullable = p.default, p.default is None
    ok_none = (lambda v: v is None) if nullable else (lambda v: False)
    if "bool" in kinds or (not kinds and isinstance(default, bool)):
        return "true or false", lambda v: isinstance(v, bool) or ok_none(v)
    if kinds & {"float", "int"} and "str" not in kinds:
        if "float" not in kinds:
            return "an integer", lambda v: (isinstance(v, int) and not isinstance(v, bool)) or ok_none(v)
        return "a number", lambda v: _is_number(v) or ok_none(v)
    if not kinds and _is_number(default):
        return "a number", _is_number
    if "str" in kinds and not kinds & {"float", "int"} or (not kinds and isinstance(default, str)):
        return "a string", lambda v: isinstance(v, str) or ok_none(v)
    if isinstance(default, (tuple, list)) and all(_is_number(x) for x in default):
        n = len(default)
        return f"a list of {n} numbers", lambda v: (isinstance(v, list) and len(v) == n
                                                     and all(_is_number(x) for x in v))
    return None


def default_optimizer(cfg: dict, params, lr: float):
    """The client optimizer for ``deepspeed.initialize``: None when the config names one. ``params``: tensors, or
    parameter groups (dicts with ``params``)."""
    if "optimizer" in cfg:
        return None
    if offloads_optimizer(cfg):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=lr)
    import torch

    params = list(params)
    flat = [p for group in params for p in group["params"]] if params and isinstance(params[0], dict) else params
    return torch.optim.AdamW(params, lr=lr, fused=_fusable(flat))


FUSED_DEVICES = ("cpu", "cuda", "xpu", "mps")
"""Devices torch's fused AdamW kernel runs on (torch/optim/optimizer.py, ``_get_fused_kernel_supported_devices``)."""


def _fusable(params: list) -> bool:
    return bool(params) and all(p.device.type in FUSED_DEVICES and p.is_floating_point() for p in params)


def describe(cfg: dict, device_type: str = "cpu") -> dict:
    """Record field: where the optimizer came from and what it is (``fused``: ds_bench's AdamW on ``device_type``)."""
    if "optimizer" in cfg:
        section = cfg["optimizer"] or {}
        out = {"source": "ds_config", "type": section.get("type")}
        params = section.get("params") or {}
        if str(out["type"]).lower() in ("adam", "adamw") and params.get("torch_adam"):
            out["fused"] = bool(params.get("fused"))  # torch's kernel; without torch_adam DeepSpeed's own ops
        return out
    if offloads_optimizer(cfg):
        return {"source": DEFAULT_SOURCE, "type": "deepspeed.ops.adam.DeepSpeedCPUAdam"}
    return {"source": DEFAULT_SOURCE, "type": "torch.optim.AdamW", "fused": device_type in FUSED_DEVICES}

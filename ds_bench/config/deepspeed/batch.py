"""The batch arithmetic of a DeepSpeed config: ``train_batch_size`` = micro-batch x gradient
accumulation x data-parallel world size, any two giving the third, and what to say when a config's
numbers do not fit this run's world (``mismatch``: the way out, one line). Pure: no DeepSpeed import.
"""

from __future__ import annotations

from ds_bench.errors import UserError

DEFAULT_MICRO_BATCH = 32


def resolve_batch(cfg: dict, world: int, run_micro_batch: int | None, path: str) -> None:
    """Fill in ``cfg``'s three batch keys for ``world`` data-parallel ranks ("auto" or missing ones
    derived); ``run_micro_batch`` (``--micro-batch``) wins over the config's."""
    given_micro = _int_or_none(cfg, "train_micro_batch_size_per_gpu", path)
    gas = _int_or_none(cfg, "gradient_accumulation_steps", path)
    total = _int_or_none(cfg, "train_batch_size", path)
    micro = run_micro_batch or given_micro
    if micro is None:
        micro = total // ((gas or 1) * world) if total and total % ((gas or 1) * world) == 0 else DEFAULT_MICRO_BATCH
    given_gas = gas is not None
    if gas is None:
        gas = total // (micro * world) if total and total % (micro * world) == 0 else 1
    if total is None:
        total = micro * gas * world
    if total != micro * gas * world:
        raise UserError(f"{path}: {mismatch(total, micro, gas, world, micro_given=(run_micro_batch or given_micro) is not None, gas_given=given_gas)}")
    cfg.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=gas, train_batch_size=total)


def mismatch(total: int, micro: int, gas: int, world: int, micro_given: bool, gas_given: bool) -> str:
    """Why ``total`` is not ``micro`` x ``gas`` x ``world``, what it was written for, and the ways to run
    it here (the ``--set`` values given are the ones ``resolve_batch`` then accepts)."""
    here = micro * gas * world
    out = (f"train_batch_size ({total}) must equal train_micro_batch_size_per_gpu ({micro}) x "
           f"gradient_accumulation_steps ({gas}) x world size ({world}) = {here}: ")
    if micro_given and gas_given and total % (micro * gas) == 0:
        out += f"it implies micro-batch {micro} x accumulation {gas} x world size {total // (micro * gas)}"
    else:
        parts = [f"micro-batch {micro}"] * micro_given + [f"accumulation {gas}"] * gas_given + [f"world size {world}"]
        out += f"it cannot be split over this world size ({' x '.join(parts)} does not divide {total})"
    out += (f"; to run micro-batch {micro} x accumulation {gas} at world size {world} here, drop train_batch_size "
            f"or --set train_batch_size=auto (it becomes {here})")
    if micro_given and total % (micro * world) == 0:
        out += f", or keep {total} with --set gradient_accumulation_steps={total // (micro * world)}"
    return out


def _int_or_none(cfg: dict, key: str, path: str) -> int | None:
    value = cfg.get(key)
    if value is None or value == "auto":
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserError(f"{path}: {key} must be a positive integer or \"auto\", got {value!r}")
    return value

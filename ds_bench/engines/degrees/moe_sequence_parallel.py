"""DeepSpeed's MoE layer under DeepSpeed-Ulysses (``--workload moe`` with ``--sequence-parallel S``): what the two
degrees need to compose, checked before joining (``expert_parallel.with_sequence_parallel``) and applied once the Ulysses groups exist (``compose``,
from ``ds_bench.engines.deepspeed_engine.initialize``).

Why an override is needed (deepspeed 0.19.8, ``config.degrees.protocol.DEEPSPEED``): Ulysses' mpu,
``deepspeed/runtime/sequence_parallel/parallel_state_sp.py``, names its sequence-parallel group the model-parallel
one (``get_model_parallel_world_size = get_sequence_parallel_world_size``). ``deepspeed.initialize(mpu=...)`` keeps
it as ``deepspeed.utils.groups.mpu``, and the MoE layer reads its tensor-parallel size through
``deepspeed/utils/bwc.py`` ``bwc_tensor_model_parallel_world_size(groups.mpu)``: in ``deepspeed/moe/sharded_moe.py``
(the gates pad the capacity to a multiple of it; ``MOELayer.forward`` keeps 1/S of the capacity slots,
``drop_tokens``, and all-gathers the experts' output back, ``gather_tokens``) and in ``deepspeed/moe/mappings.py``
(those two). Tensor-parallel ranks hold the same tokens, so that is right for Megatron's mpu; Ulysses' ranks hold
different slices of a sequence, so the layer drops half its routes and gathers outputs of other tokens: gloo fails
(``ProcessGroupGloo::allgather: invalid tensor size``, even at EP = 1), NCCL trains wrong. DeepSpeed's own
``groups._get_model_parallel_world_size`` already answers 1 for Ulysses' mpu (it has ``initialize_sequence_parallel``);
``bwc`` does not. Reproduction without ds_bench: ``docs/repro/moe_ulysses_allgather.py``.

The override: the name ``bwc_tensor_model_parallel_world_size`` as ``sharded_moe`` and ``mappings`` see it (their
module globals, nothing else) answers 1 when the mpu is Ulysses' and asks DeepSpeed's own function otherwise, so a
Megatron mpu is untouched. Installed only for a model with DeepSpeed MoE layers under an Ulysses mpu; ``restore``
puts DeepSpeed's back. Measured (issue 44; ``tests/test_moe_sequence_parallel.py``): tiny Mixtral, fp32, ZeRO-1,
capacity factor 0: SP=2 x EP=2 on 4 ranks and SP=2 with EP=2 on the same 2 ranks give one rank's losses.

Per rank, as under data parallelism: the gate, its capacity (``--capacity-factor``) and its load-balancing loss see
the rank's own tokens, here its slice of a sequence; the aux loss is averaged over the group
(``sequence_parallel.group_mean``). Another DeepSpeed version is refused by the legality table
(``config.degrees.pairs``); ``compose`` also checks the function it overrides is still there and shaped as measured.
"""

from __future__ import annotations

import importlib
import inspect

from ds_bench.engines import moe_layer

NAME = "bwc_tensor_model_parallel_world_size"
MODULES = ("deepspeed.moe.sharded_moe", "deepspeed.moe.mappings")
"""The modules whose binding of ``NAME`` the override replaces (module docstring)."""

_originals: dict[str, object] = {}
"""Module name -> DeepSpeed's function, while the override is installed."""


def is_ulysses(mpu) -> bool:
    """Ulysses' mpu, as DeepSpeed itself tells it from Megatron's (``groups._get_model_parallel_world_size``)."""
    return mpu is not None and hasattr(mpu, "initialize_sequence_parallel")


def compose(mpu, model) -> bool:
    """Install the override when ``model`` has DeepSpeed MoE layers and ``mpu`` is Ulysses' (before
    ``deepspeed.initialize``); whether it is installed."""
    if not (is_ulysses(mpu) and moe_layer.moe_blocks(model)):
        return False
    install()
    return True


def install() -> None:
    """Rebind ``NAME`` in ``MODULES`` (idempotent). ``RuntimeError`` where DeepSpeed's function is not the one
    measured: absent, or not taking ``mpu`` alone (the legality table refuses other versions before this)."""
    for name in MODULES:
        module = importlib.import_module(name)
        current = getattr(module, NAME, None)
        if name in _originals:
            continue
        if current is None or list(inspect.signature(current).parameters) != ["mpu"]:
            raise RuntimeError(f"{name}.{NAME} is not DeepSpeed 0.19.8's (mpu=None): the MoE layer under Ulysses "
                               "cannot be given a tensor-parallel size of 1 (ds_bench.engines.degrees.moe_sequence_parallel)")
        _originals[name] = current
        setattr(module, NAME, _one_under_ulysses(current))


def restore() -> None:
    """DeepSpeed's own function back in ``MODULES``."""
    for name, original in list(_originals.items()):
        setattr(importlib.import_module(name), NAME, original)
        del _originals[name]


def installed() -> bool:
    return bool(_originals)


def _one_under_ulysses(original):
    def tensor_model_parallel_world_size(mpu=None):
        """1 under Ulysses' mpu (its ranks hold different tokens); DeepSpeed's answer otherwise."""
        return 1 if is_ulysses(mpu) else original(mpu)

    tensor_model_parallel_world_size.__wrapped__ = original
    return tensor_model_parallel_world_size

"""The on/off options of a layout beyond its parallel degrees (``Switch``), registered once (``SWITCHES``): the key,
the ``ds-bench run`` flags, the studies' axes and the legality table read this tuple."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Switch:
    """An on/off memory option of a layout: a ``Layout`` bool field."""

    field: str
    word: str
    """The key's word when on (``tiled-mlp``) and its ``ds-bench run`` flag (``--tiled-mlp``); the studies' axis
    flag of the same name takes ``off``, ``on`` or ``off,on``."""
    what: str


SWITCHES = (
    Switch("tiled_mlp", "tiled-mlp", "DeepSpeed's TiledMLP (ALST): each block's MLP computed in sequence tiles, its "
                                     "activations recomputed in backward"),
    Switch("tiled_loss", "tiled-loss", "DeepSpeed's TiledFusedLogitsLoss (ALST): the LM head and loss computed in "
                                       "sequence tiles, no full-vocabulary logits tensor"),
)
"""The long-context memory options (``ds_bench.engines.tiling``), in key order."""

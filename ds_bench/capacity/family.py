"""The model family ``ds-bench capacity`` searches along, smallest first (pure).

- ``gpt3``: the GPT-3 paper's shapes (``ds_bench.workloads.gpt2``'s ``gpt3-*`` sizes), in order;
- ``--scale layers``: the base shape (``--layers L --hidden H --heads A``) with k x L layers,
  k = 1 .. ``--max-scale``;
- ``--scale hidden``: k x H wide with k x A heads (the head width stays H / A), k = 1 .. ``--max-scale``.

Each member carries the ``ds-bench run`` arguments that build it and its parameter count
(``workloads.gpt2.parameter_count``: HF GPT-2, tied head), which the memory prediction needs before
anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ds_bench.workloads import gpt2

FAMILIES = ("gpt3",)
SCALES = ("layers", "hidden")


@dataclass(frozen=True)
class Member:
    name: str
    """``gpt3-1.3b``, or ``L x H x A`` for a scaled shape."""
    run_args: tuple[str, ...]
    layers: int
    hidden: int
    heads: int
    params: int
    largest_layer_params: int
    """The token embedding, V x H: GPT-2's largest single parameter (the sweep's prediction uses it
    for ZeRO-3's gathered layer)."""


def member(name: str, run_args: tuple[str, ...], layers: int, hidden: int, heads: int, seq_len: int) -> Member:
    positions = max(gpt2.MIN_POSITIONS, seq_len)
    return Member(name, run_args, layers, hidden, heads, gpt2.parameter_count(layers, hidden, gpt2.VOCAB, positions),
                  max(gpt2.VOCAB, positions, 4 * hidden) * hidden)


def named_family(family: str, seq_len: int) -> list[Member]:
    """The named sizes of ``family`` (``gpt3``), smallest first."""
    out = [member(name, ("--size", name), *shape, seq_len) for name, shape in gpt2.SHAPES.items()
           if name.startswith(f"{family}-")]
    return sorted(out, key=lambda m: m.params)


def scaled_family(scale: str, layers: int, hidden: int, heads: int, max_scale: int, seq_len: int) -> list[Member]:
    """The base shape grown k = 1 .. ``max_scale`` times along ``scale``."""
    out = []
    for k in range(1, max_scale + 1):
        shape = (k * layers, hidden, heads) if scale == "layers" else (layers, k * hidden, k * heads)
        args = ("--layers", str(shape[0]), "--hidden", str(shape[1]), "--heads", str(shape[2]))
        out.append(member(" x ".join(map(str, shape)), args, *shape, seq_len))
    return out

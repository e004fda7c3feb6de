"""The model family ``ds-bench capacity`` searches along, smallest first (pure).

- ``gpt3``: the GPT-3 paper's shapes (``ds_bench.workloads.gpt2_shapes``' ``gpt3-*`` sizes), in order;
- ``--scale layers``: the base shape (``--layers L --hidden H --heads A``) with k x L layers,
  k = 1 .. ``--max-scale``;
- ``--scale hidden``: k x H wide with k x A heads (the head width stays H / A), k = 1 .. ``--max-scale``.

Each member carries the ``ds-bench run`` arguments that build it and its parameter count
(``workloads.gpt2_shapes.gpt2_param_count``: HF GPT-2, tied head), which the memory prediction needs before
anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ds_bench.workloads.gpt2_shapes import SHAPES, VOCAB, Shape, custom_shape, gpt2_param_count, named_shape

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


def member(name: str, run_args: tuple[str, ...], shape: Shape) -> Member:
    return Member(name, run_args, shape.n_layer, shape.n_embd, shape.n_head,
                  gpt2_param_count(shape.n_layer, shape.n_embd, VOCAB, shape.n_positions),
                  max(VOCAB, shape.n_positions, 4 * shape.n_embd) * shape.n_embd)


def named_family(family: str, seq_len: int) -> list[Member]:
    """The named sizes of ``family`` (``gpt3``), smallest first."""
    out = [member(name, ("--size", name), named_shape(name, seq_len)) for name in SHAPES
           if name.startswith(f"{family}-")]
    return sorted(out, key=lambda m: m.params)


def scaled_family(scale: str, layers: int, hidden: int, heads: int, max_scale: int, seq_len: int) -> list[Member]:
    """The base shape grown k = 1 .. ``max_scale`` times along ``scale``."""
    out = []
    for k in range(1, max_scale + 1):
        shape = (k * layers, hidden, heads) if scale == "layers" else (layers, k * hidden, k * heads)
        args = ("--layers", str(shape[0]), "--hidden", str(shape[1]), "--heads", str(shape[2]))
        out.append(member(" x ".join(map(str, shape)), args, custom_shape(*shape, seq_len)))
    return out

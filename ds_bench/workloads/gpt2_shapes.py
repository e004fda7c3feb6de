"""GPT-2-architecture model shapes: the named sizes (GPT-2's own and the GPT-3 paper's), custom shapes
(``--layers L --hidden H --heads A``), and the parameter count of a shape.

GPT-2 sizes are HF GPT-2's (Radford et al. 2019; vocabulary 50,257, tied LM head). GPT-3 sizes are
Brown et al. 2020, "Language Models are Few-Shot Learners", table 2.1 (n_layers, d_model, n_heads),
built with the GPT-2 architecture (dense attention, as the GPT benchmark this issue follows uses them;
the paper's alternating sparse attention is left out) and a 2,048-token context (the paper's n_ctx):

    name        layers  d_model  heads  d_head   note
    gpt3-125m   12      768      12     64
    gpt3-350m   24      1024     16     64
    gpt3-760m   24      1536     16     96
    gpt3-1.3b   24      2048     16     128      the table says 24 heads of 128: 24 x 128 != 2048;
                                                 16 heads keeps its d_head (2048 / 128 = 16)
    gpt3-2.7b   32      2560     32     80
    gpt3-6.7b   32      4096     32     128
    gpt3-13b    40      5120     40     128      the table says d_model 5140: 40 x 128 = 5120 (5140 is
                                                 not divisible by 40); 5120 keeps its heads and d_head

Parameters of a GPT-2-architecture model (``gpt2_param_count``, exactly what HF ``GPT2LMHeadModel``
holds, the LM head tied to the token embedding): per block ln_1 2d + attention (qkv 3d^2 + 3d, output
d^2 + d) + ln_2 2d + MLP (d x 4d + 4d, 4d x d + d) = 12 d^2 + 13 d; plus the token and position
embeddings (V + P) d and the final LayerNorm 2d:  N = L (12 d^2 + 13 d) + (V + P) d + 2 d.
"""

from __future__ import annotations

from dataclasses import dataclass

from ds_bench.errors import UserError

VOCAB = 50257
MIN_POSITIONS = 1024  # GPT-2's n_ctx
GPT3_POSITIONS = 2048  # GPT-3's n_ctx (table 2.1)

# name: (n_layer, n_embd, n_head)
GPT2_SHAPES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 64, 2),
    "small": (12, 768, 12),
    "medium": (24, 1024, 16),
    "large": (36, 1280, 20),
    "xl": (48, 1600, 25),
}
GPT3_SHAPES: dict[str, tuple[int, int, int]] = {
    "gpt3-125m": (12, 768, 12),
    "gpt3-350m": (24, 1024, 16),
    "gpt3-760m": (24, 1536, 16),
    "gpt3-1.3b": (24, 2048, 16),
    "gpt3-2.7b": (32, 2560, 32),
    "gpt3-6.7b": (32, 4096, 32),
    "gpt3-13b": (40, 5120, 40),
}
SHAPES: dict[str, tuple[int, int, int]] = {**GPT2_SHAPES, **GPT3_SHAPES}
SHAPE_FLAGS = ("--layers", "--hidden", "--heads")


@dataclass(frozen=True)
class Shape:
    """A model shape: blocks, width, attention heads, and positions (the context it is built for)."""

    n_layer: int
    n_embd: int
    n_head: int
    n_positions: int
    label: str
    """What the record's ``size`` says: the size name, or ``L{layers}-H{hidden}-A{heads}`` for a custom one."""


def named_shape(size: str, seq_len: int) -> Shape:
    """The shape of a named size, with room for ``seq_len`` positions."""
    n_layer, n_embd, n_head = SHAPES[size]
    floor = GPT3_POSITIONS if size in GPT3_SHAPES else MIN_POSITIONS
    return Shape(n_layer, n_embd, n_head, max(floor, seq_len), size)


def custom_shape(layers: int, hidden: int, heads: int, seq_len: int) -> Shape:
    """``--layers L --hidden H --heads A`` (checked by ``check_custom_shape``), GPT-2's 1,024 positions or more."""
    return Shape(layers, hidden, heads, max(MIN_POSITIONS, seq_len), f"L{layers}-H{hidden}-A{heads}")


def check_custom_shape(layers: int | None, hidden: int | None, heads: int | None) -> bool:
    """True when a custom shape is given; a ``UserError`` when it is partial or inconsistent."""
    given = (layers, hidden, heads)
    if all(v is None for v in given):
        return False
    missing = [flag for flag, v in zip(SHAPE_FLAGS, given) if v is None]
    if missing:
        raise UserError(f"a custom shape needs --layers, --hidden and --heads together; missing {', '.join(missing)}")
    for flag, value in zip(SHAPE_FLAGS, given):
        if value <= 0:
            raise UserError(f"{flag} must be a positive integer, got {value}")
    if hidden % heads:
        raise UserError(f"--hidden {hidden} is not divisible by --heads {heads}: each head needs an equal "
                        f"share of the width (e.g. --heads {_near_divisor(hidden, heads)})")
    return True


def gpt2_param_count(n_layer: int, d_model: int, vocab: int = VOCAB, positions: int = MIN_POSITIONS) -> int:
    """Parameters of a GPT-2-architecture model, tied LM head: L (12 d^2 + 13 d) + (V + P) d + 2 d (module docstring)."""
    return n_layer * (12 * d_model * d_model + 13 * d_model) + (vocab + positions) * d_model + 2 * d_model


def _near_divisor(hidden: int, heads: int) -> int:
    """The divisor of ``hidden`` closest to ``heads``, to suggest."""
    return min((a for a in range(1, hidden + 1) if hidden % a == 0), key=lambda a: (abs(a - heads), a))


def gemms(n_embd: int, tokens: int, vocab: int = VOCAB) -> list[tuple[str, int, int, int]]:
    """The matrix products of one GPT-2 block and the LM head for ``tokens`` = micro-batch x sequence, as
    (name, m, k, n) of an (m x k) @ (k x n) product (pure): each forward product, then backward's two, the
    input gradient (m x n) @ (n x k) and the weight gradient (k x m) @ (m x n), as autograd computes them.
    Attention's score and value products (per head, sequence-long) are left out: SDPA fuses them."""
    forward = [("qkv", tokens, n_embd, 3 * n_embd), ("attn_proj", tokens, n_embd, n_embd),
               ("mlp_fc", tokens, n_embd, 4 * n_embd), ("mlp_proj", tokens, 4 * n_embd, n_embd),
               ("lm_head", tokens, n_embd, vocab)]
    out = []
    for name, m, k, n in forward:
        out += [(name, m, k, n), (f"{name}.dgrad", m, n, k), (f"{name}.wgrad", k, m, n)]
    return out

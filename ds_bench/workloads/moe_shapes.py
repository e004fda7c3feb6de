"""Mixture-of-experts model shapes (Mixtral and Qwen3-MoE: Llama's attention and norms, every block's MLP
replaced by E SwiGLU experts of which a router picks k per token): the published sizes, their total and
active parameter counts, and their training FLOPs per token (pure).

The sizes are the ``config.json`` files published with the models (HuggingFace ``mistralai/...``, ``Qwen/...``):

    name           arch       layers  hidden  heads  kv  head dim  expert MLP  experts  top-k  vocabulary  head
    mixtral-8x7b   mixtral    32      4096    32     8   128       14336       8        2      32000       own
    mixtral-8x22b  mixtral    56      6144    48     8   128       16384       8        2      32768       own
    qwen3-30b-a3b  qwen3_moe  48      2048    32     4   128       768         128      8      151936      own

(Mixtral: ``rope_theta`` 1e6, ``rms_norm_eps`` 1e-5, router aux-loss weight 0.02; Qwen3-MoE: ``rope_theta`` 1e6,
``rms_norm_eps`` 1e-6, top-k weights renormalised, q and k RMS-normed per head, aux-loss weight 0.001.)
``tiny`` (Mixtral, 2 x 64, 4 heads, 2 KV heads, 4 experts of MLP 128, top-2, GPT-2's 50,257-token vocabulary)
is for tests.

Parameters (``param_count``, exactly what HF ``MixtralForCausalLM`` / ``Qwen3MoeForCausalLM`` hold): per block
the attention as Llama's, 2 d (h k) + 2 d (g k) (h heads, g KV heads, k head dim; no biases), the router E d,
E experts of 3 d f each (gate, up and down projections, f the expert MLP width), two RMSNorm weights 2 d
(Qwen3-MoE: + 2 k for the q and k norms); plus the embedding V d, the final norm d and the LM head V d:
N = L (2 d h k + 2 d g k + E d + 3 E d f + 2 d [+ 2 k]) + 2 V d + d. Active parameters count k of the E
experts: N_active = N - L (E - k) 3 d f. This gives 46,702,792,704 / 140,630,071,296 / 30,532,122,624 total and
12,879,925,248 / 39,161,468,928 / 3,353,032,704 active for the three sizes (the model cards' 46.7B / 12.9B,
141B / 39B, 30.5B / 3.3B).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

GPT2_VOCAB = 50257
ROPE_THETA = 1e6
DEFAULT_SIZE = "mixtral-8x7b"
DEFAULT_EXPERTS, DEFAULT_TOP_K = 8, 2
"""A custom shape's router without ``--experts`` / ``--top-k``: Mixtral's."""


@dataclass(frozen=True)
class MoEShape:
    arch: str
    """``mixtral`` or ``qwen3_moe``: the HF model class (``MixtralForCausalLM``, ``Qwen3MoeForCausalLM``)."""
    n_layer: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    expert_intermediate: int
    """f: one expert's SwiGLU width."""
    experts: int
    top_k: int
    vocab: int
    rms_norm_eps: float = 1e-5
    aux_loss_weight: float = 0.02
    """The published router aux-loss coefficient (``router_aux_loss_coef``)."""

    @property
    def qk_norm(self) -> bool:
        return self.arch == "qwen3_moe"


SHAPES: dict[str, MoEShape] = {
    "tiny": MoEShape("mixtral", 2, 64, 4, 2, 16, 128, 4, 2, GPT2_VOCAB),
    "mixtral-8x7b": MoEShape("mixtral", 32, 4096, 32, 8, 128, 14336, 8, 2, 32000),
    "mixtral-8x22b": MoEShape("mixtral", 56, 6144, 48, 8, 128, 16384, 8, 2, 32768),
    "qwen3-30b-a3b": MoEShape("qwen3_moe", 48, 2048, 32, 4, 128, 768, 128, 8, 151936, 1e-6, 0.001),
}


def custom_shape(layers: int, hidden: int, heads: int, experts: int, top_k: int) -> MoEShape:
    """``--layers L --hidden H --heads A --experts E --top-k K``: Mixtral's architecture, multi-head attention,
    each expert the SwiGLU width LLaMA's rule gives (``llama_shapes.swiglu_width``), GPT-2's vocabulary."""
    from ds_bench.workloads.llama_shapes import swiglu_width

    return MoEShape("mixtral", layers, hidden, heads, heads, hidden // heads, swiglu_width(hidden), experts, top_k,
                    GPT2_VOCAB)


def with_router(shape: MoEShape, experts: int | None, top_k: int | None) -> MoEShape:
    """A named size with ``--experts`` / ``--top-k`` changed (None: the size's own)."""
    return dataclasses.replace(shape, experts=experts or shape.experts, top_k=top_k or shape.top_k)


def run_shape(size: str | None, layers: int | None, hidden: int | None, heads: int | None, experts: int | None,
              top_k: int | None) -> MoEShape:
    """The shape a moe run's flags build: ``--layers/--hidden/--heads`` (all three given, checked by the caller) with
    ``--experts`` / ``--top-k`` or Mixtral's 8 and 2; else ``--size`` (default ``DEFAULT_SIZE``, a key of
    ``SHAPES``) with its router changed by them."""
    if None not in (layers, hidden, heads):
        return custom_shape(layers, hidden, heads, experts or DEFAULT_EXPERTS, top_k or DEFAULT_TOP_K)
    return with_router(SHAPES[size or DEFAULT_SIZE], experts, top_k)


def largest_layer_params(s: MoEShape) -> int:
    """The largest single module's parameters as the run record counts them (under DeepSpeed's MoE layer, one
    expert per module): the embedding or LM head V d, else an expert's fused gate-up projection 2 f d, the
    router E d or the query projection h k d."""
    return max(s.vocab, 2 * s.expert_intermediate, s.experts, s.heads * s.head_dim) * s.hidden


def custom_label(s: MoEShape) -> str:
    return f"L{s.n_layer}-H{s.hidden}-A{s.heads}-E{s.experts}-K{s.top_k}"


def expert_params(s: MoEShape) -> int:
    """One expert's parameters: gate, up and down projections, 3 d f."""
    return 3 * s.hidden * s.expert_intermediate


def _attention_params(s: MoEShape) -> int:
    q_width, kv_width = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return 2 * s.hidden * q_width + 2 * s.hidden * kv_width


def param_count(s: MoEShape) -> int:
    """Every parameter of the model (module docstring's formula)."""
    block = _attention_params(s) + s.experts * s.hidden + s.experts * expert_params(s) + 2 * s.hidden
    block += 2 * s.head_dim if s.qk_norm else 0
    return s.n_layer * block + 2 * s.vocab * s.hidden + s.hidden


def expert_param_count(s: MoEShape) -> int:
    """The parameters expert parallelism shards: every block's E experts."""
    return s.n_layer * s.experts * expert_params(s)


def active_param_count(s: MoEShape) -> int:
    """Parameters one token uses: all but the E - k experts the router does not pick."""
    return param_count(s) - s.n_layer * (s.experts - s.top_k) * expert_params(s)


def active_matmul_params(s: MoEShape) -> int:
    """N_active of the 6 N term: every weight that multiplies a token's activations: attention projections, the
    router, k experts, the LM head. Not counted: the embedding (a gather) and the norms (element-wise)."""
    block = _attention_params(s) + s.experts * s.hidden + s.top_k * expert_params(s)
    return s.n_layer * block + s.vocab * s.hidden


def flops_per_token(s: MoEShape, seq_len: int) -> float:
    """Training model FLOPs per token: 6 N_active + 12 L H Q T: Kaplan et al. 2020's 6 N over the parameters a
    token actually multiplies (a sparse model's compute follows its active, not its total, parameters: Fedus et
    al. 2022, Switch Transformers, sec. 2; Megatron-Core's MoE FLOPs count k experts per token the same way) and
    PaLM's attention term (``llama_shapes.flops_per_token``: H heads of width Q, sequence T, the whole T x T
    counted). The dispatch and combine are data movement, no FLOPs."""
    return 6.0 * active_matmul_params(s) + 12.0 * s.n_layer * s.heads * s.head_dim * seq_len


def hardware_flops_per_token(s: MoEShape, seq_len: int) -> float:
    """With activation checkpointing of every block: + one forward of the blocks (the LM head is not recomputed)."""
    blocks = active_matmul_params(s) - s.vocab * s.hidden
    return flops_per_token(s, seq_len) + 2.0 * blocks + 4.0 * s.n_layer * s.heads * s.head_dim * seq_len

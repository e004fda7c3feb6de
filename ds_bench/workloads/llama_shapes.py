"""Llama-architecture model shapes (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention):
the published sizes, their parameter count, and their training FLOPs per token (pure).

The sizes are the ``config.json`` files Meta publishes with the models (HuggingFace ``meta-llama/...``):

    name           layers  hidden  heads  kv heads  head dim  MLP (intermediate)  vocabulary  LM head
    llama3.2-1b    16      2048    32     8         64        8192                128256      tied
    llama3.2-3b    28      3072    24     8         128       8192                128256      tied
    llama3.1-8b    32      4096    32     8         128       14336               128256      own
    llama3.1-70b   80      8192    64     8         128       28672               128256      own

all with ``rope_theta`` 500000 and ``rms_norm_eps`` 1e-5 (the long-context rope scaling is left out:
it changes no shape and no FLOP). ``tiny`` (2 x 64, 4 heads, 2 KV heads, MLP 128) is for tests, with
GPT-2's 50,257-token vocabulary: models from scratch read text through GPT-2's BPE
(``ds_bench.data.tokenizer``; a published size keeps its own 128,256 rows, of which GPT-2's ids use the first).

Parameters (``param_count``, exactly what HF ``LlamaForCausalLM`` holds): per block the q and output
projections 2 d (h k), the k and v projections 2 d (g k) (h heads, g KV heads, k head dim; no biases),
the SwiGLU MLP's gate, up and down projections 3 d f, two RMSNorm weights 2 d; plus the embedding V d,
the final norm d and an untied LM head V d:  N = L (2 d h k + 2 d g k + 3 d f + 2 d) + V d + d [+ V d].
This gives 1,235,814,400 / 3,212,749,824 / 8,030,261,248 / 70,553,706,496 for the four sizes (the
model cards' 1.24B, 3.21B, 8.03B, 70.6B).
"""

from __future__ import annotations

from dataclasses import dataclass

GPT2_VOCAB = 50257
LLAMA3_VOCAB = 128256
ROPE_THETA = 500000.0
RMS_NORM_EPS = 1e-5


@dataclass(frozen=True)
class LlamaShape:
    n_layer: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    """Whether the LM head shares the embedding's weight (a parameter once, a matmul per token still)."""


SHAPES: dict[str, LlamaShape] = {
    "tiny": LlamaShape(2, 64, 4, 2, 16, 128, GPT2_VOCAB, True),
    "llama3.2-1b": LlamaShape(16, 2048, 32, 8, 64, 8192, LLAMA3_VOCAB, True),
    "llama3.2-3b": LlamaShape(28, 3072, 24, 8, 128, 8192, LLAMA3_VOCAB, True),
    "llama3.1-8b": LlamaShape(32, 4096, 32, 8, 128, 14336, LLAMA3_VOCAB, False),
    "llama3.1-70b": LlamaShape(80, 8192, 64, 8, 128, 28672, LLAMA3_VOCAB, False),
}


def custom_shape(layers: int, hidden: int, heads: int) -> LlamaShape:
    """``--layers L --hidden H --heads A`` (checked by ``gpt2_shapes.check_custom_shape``): multi-head attention
    (as many KV heads as heads), the MLP width LLaMA's rule gives, 2/3 x 4 H rounded up to a multiple of 256
    (Touvron et al. 2023; ``multiple_of`` in Meta's reference ``model.py``), GPT-2's vocabulary, tied head."""
    return LlamaShape(layers, hidden, heads, heads, hidden // heads, swiglu_width(hidden), GPT2_VOCAB, True)


def swiglu_width(hidden: int, multiple_of: int = 256) -> int:
    return multiple_of * -(-(8 * hidden // 3) // multiple_of)


def custom_label(s: LlamaShape) -> str:
    return f"L{s.n_layer}-H{s.hidden}-A{s.heads}"


def param_count(s: LlamaShape) -> int:
    """Parameters of ``LlamaForCausalLM`` of shape ``s`` (module docstring's formula)."""
    q_width, kv_width = s.heads * s.head_dim, s.kv_heads * s.head_dim
    block = 2 * s.hidden * q_width + 2 * s.hidden * kv_width + 3 * s.hidden * s.intermediate + 2 * s.hidden
    return s.n_layer * block + s.vocab * s.hidden + s.hidden + (0 if s.tied else s.vocab * s.hidden)


def matmul_params(s: LlamaShape) -> int:
    """N of the 6N term: every weight that multiplies each token's activations: the blocks' projections
    (q, k, v, output; gate, up, down) and the LM head (tied or not, it is a matmul per token). Not
    counted: the embedding lookup (a gather) and the RMSNorm weights (element-wise)."""
    q_width, kv_width = s.heads * s.head_dim, s.kv_heads * s.head_dim
    block = 2 * s.hidden * q_width + 2 * s.hidden * kv_width + 3 * s.hidden * s.intermediate
    return s.n_layer * block + s.vocab * s.hidden


def flops_per_token(s: LlamaShape, seq_len: int) -> float:
    """Training model FLOPs per token: 6 N + 12 L H Q T (PaLM, Chowdhery et al. 2022, appendix B: H
    heads of width Q, sequence length T).

    6 N: 2 FLOPs per weight and token forward, x 3 for training (``ds_bench.workloads.flops``).
    Grouped-query attention shares each K/V head among h / g query heads: it shrinks the k and v
    projections (in N: 2 d g k, not 2 d h k) but not the attention products, which every query
    head computes against the whole sequence (Q K^T and A V, 2 Q T each per head and token forward,
    4 L H Q T forward, x 3). SwiGLU's three projections are in N (3 d f per block).

    Causal masking does not halve 12 L H Q T here: the whole T x T score matrix is counted, as PaLM,
    torchtitan and ``FlopCounterMode`` count it, though only its lower half is useful work and
    FlashAttention computes about that half; Megatron-LM's current formula halves it
    (``ds_bench.workloads.flops``, "Attention": what that does to MFU at long sequences).
    """
    return 6.0 * matmul_params(s) + 12.0 * s.n_layer * s.heads * s.head_dim * seq_len


def hardware_flops_per_token(s: LlamaShape, seq_len: int) -> float:
    """With activation checkpointing of every block: + one forward of the blocks (the LM head is not
    recomputed), as ``flops.gpt2_hardware_flops_per_token`` counts it for GPT-2."""
    blocks = matmul_params(s) - s.vocab * s.hidden
    return flops_per_token(s, seq_len) + 2.0 * blocks + 4.0 * s.n_layer * s.heads * s.head_dim * seq_len

"""A transformer's shape as the performance model reads it, for every language model ds_bench trains (GPT-2 and
GPT-3 shapes, Llama, Mixtral / Qwen3-MoE) and for published runs' models (pure).

One ``Transformer`` holds what the model needs: blocks, width, heads and KV heads, the MLP's kind and width, the
vocabulary, whether the head is tied, the experts. Its counts are the workloads' own formulas, restated over the
one shape (``tests/test_perf_shapes.py`` checks them equal to ``gpt2_shapes``, ``llama_shapes``, ``moe_shapes``
for every named size):

- parameters: GPT-2 (``gelu``: two MLP projections with biases, LayerNorms, learned positions, tied head)
  L (4 d^2 + 4 d + 2 d f + f + d + 4 d) + (V + P) d + 2 d; Llama (``swiglu``) L (2 d h k + 2 d g k + 3 d f + 2 d)
  + V d + d [+ V d untied]; MoE: Llama's attention, a router E d and E SwiGLU experts 3 d f_e per block, untied;
- matmul parameters N (the 6 N term): the blocks' projections (k of E experts for a MoE, plus the router) and
  the LM head;
- FLOPs per token: 6 N + 12 L h k T (PaLM, Chowdhery et al. 2022, app. B); with activation checkpointing one
  more forward of the blocks, 2 N_blocks + 4 L h k T.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ds_bench.errors import UserError

MLP_KINDS = ("gelu", "swiglu")



NEWTON_SCHULZ_STEPS = 5
"""Muon's quintic Newton-Schulz iterations per step (Jordan et al. 2024; DeepSpeed's ``muon_update`` default)."""

@dataclass(frozen=True)
class Transformer:
    label: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    """The MLP's (one expert's, for a MoE) intermediate width f."""
    vocab: int
    tied: bool
    mlp: str = "swiglu"
    experts: int = 0
    top_k: int = 0
    positions: int = 0
    """Learned position embeddings (GPT-2); 0: rotary."""
    qk_norm: bool = False
    dropout: bool = False
    """Dropout masks kept for backward (1 byte per element): Megatron's GPT and the published GPT-style runs train
    with dropout; ds-bench's models have none."""
    norm_kernel: str = "eager"
    """How an RMSNorm runs (``perf.memory.norm_bytes``): ``eager``, HF's op by op in fp32 (what ``ds-bench run``
    trains), or ``fused``, one kernel (Apex, Transformer Engine, Liger, a compiled block)."""
    workload: str = "llama"

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def attention_params(self) -> int:
        d = self.hidden
        biases = 4 * d if self.mlp == "gelu" else 0
        return 2 * d * self.q_width + 2 * d * self.kv_width + biases

    def mlp_params(self) -> int:
        """One block's MLP: its two GELU projections (with biases), its SwiGLU, or its router and E experts."""
        d, f = self.hidden, self.ffn
        if self.experts:
            return self.experts * d + self.experts * 3 * d * f
        return 2 * d * f + f + d if self.mlp == "gelu" else 3 * d * f

    def norm_params(self) -> int:
        return (4 if self.mlp == "gelu" else 2) * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

    def block_params(self) -> int:
        return self.attention_params() + self.mlp_params() + self.norm_params()

    def embedding_params(self) -> int:
        """Token (and position) embeddings and, untied, the LM head: what is not in a block."""
        head = 0 if self.tied else self.vocab * self.hidden
        final_norm = (2 if self.mlp == "gelu" else 1) * self.hidden
        return (self.vocab + self.positions) * self.hidden + head + final_norm

    @property
    def params(self) -> int:
        return self.layers * self.block_params() + self.embedding_params()

    @property
    def expert_params(self) -> int:
        """The parameters expert parallelism shards: every block's experts."""
        return self.layers * self.experts * 3 * self.hidden * self.ffn if self.experts else 0

    @property
    def largest_layer_params(self) -> int:
        """The largest single module (a gathered-layer buffer): the embedding, else one projection (GPT-2's fused
        q, k, v; a MoE expert's fused gate and up, ``moe_shapes.largest_layer_params``)."""
        if self.experts:
            return max(self.vocab, 2 * self.ffn, self.experts, self.q_width) * self.hidden
        widths = (self.ffn, 3 * self.hidden) if self.mlp == "gelu" else (self.ffn, self.q_width)
        return max(self.vocab, *widths) * self.hidden

    @property
    def muon_params(self) -> int:
        """The parameters DeepSpeed's Muon steps (``deepspeed.set_optimizer_flags``): every matrix of the blocks (the
        attention's, the MLP's or the router's and experts'); biases, norms, embeddings and the LM head take AdamW."""
        d, f = self.hidden, self.ffn
        attention = 2 * d * self.q_width + 2 * d * self.kv_width
        mlp = self.experts * d + self.experts * 3 * d * f if self.experts else (2 if self.mlp == "gelu" else 3) * d * f
        return self.layers * (attention + mlp)

    def newton_schulz_flops(self) -> float:
        """FLOPs of Muon's orthogonalisation of every matrix it steps, once per optimizer step (Jordan et al. 2024;
        ``NEWTON_SCHULZ_STEPS`` quintic iterations): an m x n matrix (m <= n) takes per iteration A = X X^T (2 m^2 n),
        B = b A + c A^2 (2 m^3) and X = a X + B X (2 m^2 n), 4 m^2 n + 2 m^3. ZeRO 1-3 split the matrices over the
        data-parallel ranks (``perf.step.optimizer_s``)."""
        d, f = self.hidden, self.ffn
        matrices = [(d, self.q_width), (d, self.kv_width), (d, self.kv_width), (self.q_width, d)]
        matrices += [(d, f)] * (3 * (self.experts or 1))
        per_block = sum(4 * min(a, b) ** 2 * max(a, b) + 2 * min(a, b) ** 3 for a, b in matrices)
        return NEWTON_SCHULZ_STEPS * self.layers * per_block

    def matmul_params(self) -> int:
        """N of the 6 N term: every weight that multiplies a token (k experts of E, and the router)."""
        d, f = self.hidden, self.ffn
        attention = 2 * d * self.q_width + 2 * d * self.kv_width
        if self.experts:
            mlp = self.experts * d + self.top_k * 3 * d * f
        else:
            mlp = (2 if self.mlp == "gelu" else 3) * d * f
        return self.layers * (attention + mlp) + self.vocab * d

    def flops_per_token(self, seq_len: int, recompute: bool = False, tiled_mlp: bool = False,
                        selective: bool = False) -> float:
        """Training FLOPs per token (module docstring); ``recompute``: with activation checkpointing's extra
        forward of the blocks (``selective``: of the matmuls it does not save, ``selective_recomputed_params``, and
        no attention core); ``tiled_mlp``: with DeepSpeed's TiledMLP, whose backward computes each dense MLP's
        forward again, tile by tile (also under checkpointing: the recomputed block's MLP is tiled too). All are
        hardware FLOPs; MFU still counts the model FLOPs."""
        attention = 12.0 * self.layers * self.q_width * seq_len
        model = 6.0 * self.matmul_params() + attention
        if tiled_mlp and not self.experts:
            model += 2.0 * self.layers * (2 if self.mlp == "gelu" else 3) * self.hidden * self.ffn
        if not recompute:
            return model
        if selective:
            return model + 2.0 * self.layers * self.selective_recomputed_params()
        return model + 2.0 * (self.matmul_params() - self.vocab * self.hidden) + attention / 3

    def selective_recomputed_params(self) -> int:
        """One block's matmul weights selective checkpointing computes again (``workloads.checkpoint_policy``:
        the 2nd, 4th ... matmul): GPT-2's attention and MLP output projections; Llama's k, o and up projections."""
        d = self.hidden
        if self.mlp == "gelu":
            return d * self.q_width + self.ffn * d
        return d * self.kv_width + self.q_width * d + d * self.ffn

    def selective_saved_width(self, tp: int = 1) -> float:
        """Elements per token one block keeps under selective checkpointing (``workloads.checkpoint_policy``), its
        input included: GPT-2 its input, qkv, the MLP's first projection and the attention output; Llama its input,
        q, v, the gate, the down projection's output and the attention output (TP's shares of the split ones)."""
        d = self.hidden
        if self.mlp == "gelu":
            return d + (self.q_width + 2 * self.kv_width + self.ffn + self.q_width) / tp
        return 2 * d + (2 * self.q_width + self.kv_width + self.ffn) / tp


def custom(label: str, layers: int, hidden: int, heads: int, *, kv_heads: int | None = None, ffn: int | None = None,
           vocab: int = 50257, tied: bool = True, mlp: str = "gelu", seq_len: int = 1024, dropout: bool = True,
           experts: int = 0, top_k: int = 0) -> Transformer:
    """A shape given by its numbers (a published run's model): GELU (GPT-style, learned positions ``seq_len``,
    4 d MLP) or SwiGLU (rotary, LLaMA's width rule)."""
    if mlp not in MLP_KINDS:
        raise UserError(f"mlp {mlp!r}: expected one of {', '.join(MLP_KINDS)}")
    if hidden % heads:
        raise UserError(f"hidden {hidden} is not divisible by heads {heads}")
    if ffn is None:
        ffn = 4 * hidden if mlp == "gelu" else 256 * -(-(8 * hidden // 3) // 256)
    return Transformer(label, layers, hidden, heads, kv_heads or heads, hidden // heads, ffn, vocab, tied, mlp,
                       experts, top_k, seq_len if mlp == "gelu" else 0, dropout=dropout and mlp == "gelu",
                       workload="gpt2" if mlp == "gelu" else ("moe" if experts else "llama"))


def of_workload(workload: str, size: str | None, layers: int | None, hidden: int | None, heads: int | None,
                seq_len: int, experts: int | None = None, top_k: int | None = None) -> Transformer:
    """The shape ``ds-bench run --workload W [--size S | --layers --hidden --heads]`` builds, for gpt2, llama and
    moe; a ``UserError`` naming the flag for anything else."""
    if workload == "gpt2":
        from ds_bench.workloads import gpt2_shapes as g

        custom_given = g.check_custom_shape(layers, hidden, heads)
        if not custom_given and (size or "small") not in g.SHAPES:
            raise UserError(f"--size {size}: gpt2 sizes are {', '.join(g.SHAPES)}")
        s = g.custom_shape(layers, hidden, heads, seq_len) if custom_given else g.named_shape(size or "small", seq_len)
        return Transformer(s.label, s.n_layer, s.n_embd, s.n_head, s.n_head, s.n_embd // s.n_head, 4 * s.n_embd,
                           g.VOCAB, True, "gelu", positions=s.n_positions, workload="gpt2")
    if workload == "llama":
        from ds_bench.workloads import gpt2_shapes as g
        from ds_bench.workloads import llama_shapes as ll

        if g.check_custom_shape(layers, hidden, heads):
            s, label = ll.custom_shape(layers, hidden, heads), f"L{layers}-H{hidden}-A{heads}"
        elif (size or "llama3.2-1b") in ll.SHAPES:
            s, label = ll.SHAPES[size or "llama3.2-1b"], size or "llama3.2-1b"
        else:
            raise UserError(f"--size {size}: llama sizes are {', '.join(ll.SHAPES)}")
        return Transformer(label, s.n_layer, s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, s.vocab,
                           s.tied, "swiglu", workload="llama")
    if workload == "moe":
        from ds_bench.workloads import gpt2_shapes as g
        from ds_bench.workloads import moe_shapes as m

        custom_given = g.check_custom_shape(layers, hidden, heads)
        if not custom_given and (size or m.DEFAULT_SIZE) not in m.SHAPES:
            raise UserError(f"--size {size}: moe sizes are {', '.join(m.SHAPES)}")
        s = m.run_shape(None if custom_given else size, layers, hidden, heads, experts, top_k)
        label = m.custom_label(s) if custom_given else size or m.DEFAULT_SIZE
        return Transformer(label, s.n_layer, s.hidden, s.heads, s.kv_heads, s.head_dim, s.expert_intermediate,
                           s.vocab, False, "swiglu", s.experts, s.top_k, qk_norm=s.qk_norm, workload="moe")
    raise UserError(f"--workload {workload}: plan models the language models: gpt2, llama, moe")


def with_layers(shape: Transformer, layers: int) -> Transformer:
    return replace(shape, layers=layers)

"""One rank's memory under a candidate layout, at any scale (pure): the model states ZeRO leaves it, the
activations it keeps for backward, the loss's logits, and what the process holds beyond the model.

    memory = reserve + states + activations + logits

- **states**: ``perf.states.model_states_bytes`` (the ZeRO paper's formulas and DeepSpeed's own estimators, as
  the sweep predicts them), over the parameters of the rank's pipeline stage (the blocks' 1/P and the
  embeddings, on the first and last stage) and the ranks ZeRO partitions them over (world / P). DDP counts as
  ZeRO-0, FSDP as ZeRO-3 (``reshard_after_forward``) or ZeRO-2.
- **activations** = what the forward keeps for backward (``kept_bytes``) + one block's backward beside it
  (``backward_phase_bytes``). Per block and micro-batch, for tau = micro-batch x T / SP tokens on the rank and
  T-way tensor parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", sec. 4.1, eq. 1-2, generalised from their 2-byte elements to E bytes, grouped KV heads, SwiGLU and
  experts): block and MLP inputs and the two norms' inputs 4 E tau h (not split by TP), q, k, v and the
  attention output E tau (2 h_q + 2 h_kv) / t, the MLP's intermediates (GELU: 2 f, SwiGLU: 4 f; a MoE: 4 f for
  each of the k experts a token visits, and its router's fp32 logits) E tau f / t, the attention's and the MLP's
  output dropout masks 2 tau h bytes where the model has dropout; attention scores only for eager attention,
  E a/(t S) T^2 b (+ mask and dropout output with dropout); a fused kernel (sdpa, flash) keeps O(T). HF's eager
  RMSNorm keeps 4 bytes an element more (``norm_bytes``). Dropout is the model's (``Transformer.dropout``:
  Megatron's GPT trains with it; ds-bench's GPT-2, Llama and MoE without).
  With DeepSpeed's TiledMLP (``--tiled-mlp``, ALST) the MLP keeps only its input (already counted): its
  intermediates are recomputed tile by tile in backward, one tile's live at a time (not counted).
  With activation checkpointing a block keeps only its input (E tau h) and one block's whole working set is
  live again in backward; with ALST's checkpoint offload (``--checkpoint-offload``, DeepSpeed's
  ``CheckpointHiddenStatesOffload``) those inputs wait in host memory, two in flight on the device (the one being
  copied and the one in use), the copies on a side stream assumed hidden behind the compute. Selective
  checkpointing (``--selective-checkpointing``, ``workloads.checkpoint_policy``) keeps per token the widths
  ``Transformer.selective_saved_width`` gives (its input, every other matmul's output, the attention's) and one
  block's working set, as full checkpointing does. A 1F1B pipeline's first stage holds P micro-batches of its
  L/P blocks in flight (their sec. 4.2.3): L blocks' worth; without a pipeline, one micro-batch of all L.
  Beside the block in backward, its gradients (``backward_bytes``). Checked against the bytes torch allocates
  for ds-bench's own GPT-2, Llama and MoE blocks (``tests/test_activation_memory.py``).
- **logits**: the loss's [tokens x vocabulary / t] tensors on the last stage, ``perf.loss_memory.loss_bytes``
  of the loss's implementation (``upcast``, HF's and ds_bench's: 12 bytes per element; ``fused``: 2 E), or of
  one tile with ``--tiled-loss``, beyond the block's backward phase: the loss's tensors are freed before the
  first block's backward begins, so the peak is kept + max(loss, backward phase).
- **reserve**: the device family's (``perf.devices``) or this cluster's measured baseline.
- **host** (apart from the total): what offload keeps of the states in the node's host memory once training runs
  (``perf.states.offloaded_bytes``: 16 or 18 bytes per parameter of the rank's partition) and the offloaded
  checkpoints, which the node's ranks share (``Cluster.host_memory_bytes``).
Not modelled: allocator fragmentation beyond the reserve, communication buckets beyond DeepSpeed's estimator
factor, the peak of building the model (ZeRO-3 without ``zero_init`` builds it whole on every rank).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ds_bench.config.layout import Layout
from ds_bench.perf.candidate import Candidate
from ds_bench.perf.devices import Cluster
from ds_bench.perf.loss_memory import loss_bytes
from ds_bench.perf.seq_memory import tokens_per_rank
from ds_bench.perf.shapes import Transformer
from ds_bench.perf.states import ELEMENT_BYTES, ModelShape, model_states_bytes, offloaded_bytes


@dataclass(frozen=True)
class Memory:
    states: int
    activations: int
    logits: int
    reserve: int
    host: int = 0
    """Host memory the rank's offloaded states and offloaded checkpoints take (GPU ranks; on CPU ranks the states
    are in ``states``)."""

    @property
    def total(self) -> int:
        return self.states + self.activations + self.logits + self.reserve


def stage_shape(shape: Transformer, stages: int) -> ModelShape:
    """What the largest pipeline stage holds: 1/P of the blocks and the embeddings (the first stage's token
    embedding; a tied head is the same tensor again on the last stage)."""
    blocks = -(-shape.layers // stages) * shape.block_params()
    expert = -(-shape.layers // stages) * shape.experts * 3 * shape.hidden * shape.ffn if shape.experts else 0
    embeddings = shape.embedding_params() if stages == 1 else (shape.vocab + shape.positions) * shape.hidden
    muon = -(-shape.layers // stages) * (shape.muon_params // shape.layers) if shape.layers else 0
    return ModelShape(blocks + embeddings, shape.largest_layer_params, expert, muon)


def states_bytes(shape: Transformer, candidate: Candidate, cluster: Cluster, host: bool = False) -> int:
    """The rank's model states on its device (``host``: what offload keeps of them in host memory instead; 0 on
    CPU ranks, whose device is the host)."""
    layout = candidate.layout
    p = layout.pipeline_stages
    stage = 0 if layout.engine == "ddp" else layout.stage
    as_deepspeed = dataclasses.replace(layout, engine="deepspeed", stage=stage, pipeline_stages=1)
    per_node = max(1, min(cluster.per_node, cluster.world // p))
    if host:
        on_host = offloaded_bytes(stage_shape(shape, p), as_deepspeed, cluster.world // p, per_node)
        return 0 if cluster.device_type == "cpu" else on_host
    return model_states_bytes(stage_shape(shape, p), as_deepspeed, cluster.world // p, per_node, cluster.device_type)


def tokens(layout: Layout, seq_len: int) -> float:
    """tau: one micro-batch's tokens on a rank, micro-batch x T / SP."""
    return layout.micro_batch * seq_len / layout.sequence_parallel


def block_bytes(shape: Transformer, candidate: Candidate, seq_len: int, eager: bool) -> float:
    """One block's activations for one micro-batch (module docstring), bytes."""
    layout = candidate.layout
    e = ELEMENT_BYTES[layout.precision]
    t, s = layout.tensor_parallel, layout.sequence_parallel
    tau = tokens(layout, seq_len)
    h, f = shape.hidden, shape.ffn
    mask = 1 if shape.dropout else 0
    kept_whole = 4 * e * tau * h + 2 * mask * tau * h
    attention = e * tau * (2 * shape.q_width + 2 * shape.kv_width) / t
    if shape.experts:
        mlp = e * tau * shape.top_k * (h + 4 * f) + 4 * tau * shape.experts
    elif layout.tiled_mlp:
        mlp = 0.0
    else:
        mlp = e * tau * (2 if shape.mlp == "gelu" else 4) * f / t
    scores = 0.0
    if eager:
        scores = (e + (1 + e) * mask) * shape.heads / (t * s) * seq_len ** 2 * layout.micro_batch
    return kept_whole + attention + mlp + scores + norm_bytes(shape, e, tau, t)


def norm_bytes(shape: Transformer, e: int, tau: float, t: int) -> float:
    """What an RMSNorm model's norms keep beyond their inputs (counted above, E bytes an element). HF's
    ``LlamaRMSNorm`` (and Mixtral's, Qwen3's; transformers ``modeling_llama.py``: ``hidden_states.to(torch.float32)``,
    ``* torch.rsqrt(variance)``, ``self.weight * hidden_states.to(input_dtype)``), the ``eager`` norm, keeps the fp32
    copy of its input (4 bytes) and the normalised input (E) where one fused kernel keeps its input (E): 4 bytes an
    element more, two norms a block; Qwen3's q and k norms keep 4 + E (fused: E) per q and k element, which the
    attention's count does not hold. GPT-2's LayerNorm is one kernel (``native_layer_norm``) either way.
    Measured: ``tests/test_activation_memory.py``."""
    if shape.mlp == "gelu":
        return 0.0
    per_element = 4 if shape.norm_kernel == "eager" else 0
    qk = (per_element + e) * (shape.q_width + shape.kv_width) / t if shape.qk_norm else 0.0
    return tau * (2 * per_element * shape.hidden + qk)


def backward_bytes(shape: Transformer, candidate: Candidate, seq_len: int) -> float:
    """The gradients live beside the activations at a block's backward peak, one micro-batch: the residual
    stream's (E tau h) and the MLP intermediate's (E tau f / t; a MoE's k experts, k f), or with the tiled MLP
    (whose gradients are a tile's) the attention's dq, dk and dv, E tau (h_q + 2 h_kv) / t. Measured with HF's
    GPT-2 and Llama blocks (``tests/test_activation_memory.py``): 3.5-4.5 E tau h and 5-9 E tau h against the
    formula's 5 and 4.5."""
    layout = candidate.layout
    e, t = ELEMENT_BYTES[layout.precision], layout.tensor_parallel
    tau = tokens(layout, seq_len)
    if layout.tiled_mlp and not shape.experts:
        width = (shape.q_width + 2 * shape.kv_width) / t
    else:
        width = max(shape.top_k, 1) * shape.ffn / (1 if shape.experts else t)
    return e * tau * (shape.hidden + width)


def kept_bytes(shape: Transformer, candidate: Candidate, seq_len: int, eager: bool = False) -> float:
    """What the forward leaves for backward on the busiest rank: L blocks' worth of one micro-batch (with a 1F1B
    pipeline, its first stage's P micro-batches in flight of L/P blocks), or with checkpointing their inputs (two in
    flight with the checkpoint offload), or selective checkpointing's saved widths."""
    layout = candidate.layout
    layers = -(-shape.layers // layout.pipeline_stages) * min(layout.pipeline_stages, layout.grad_accum)
    if candidate.selective:
        e = ELEMENT_BYTES[layout.precision]
        tau = tokens(layout, seq_len)
        return layers * e * tau * shape.selective_saved_width(layout.tensor_parallel)
    if candidate.checkpoint_offload:
        return 2 * input_bytes(shape, candidate, seq_len)
    if candidate.checkpointing:
        return layers * input_bytes(shape, candidate, seq_len)
    return layers * block_bytes(shape, candidate, seq_len, eager)


def backward_phase_bytes(shape: Transformer, candidate: Candidate, seq_len: int, eager: bool = False) -> float:
    """What one block's backward adds to the kept activations: its gradients (``backward_bytes``) and, with
    checkpointing, its recomputed working set."""
    working = backward_bytes(shape, candidate, seq_len)
    return working + (block_bytes(shape, candidate, seq_len, eager) if candidate.checkpointing else 0.0)


def activation_bytes(shape: Transformer, candidate: Candidate, seq_len: int, eager: bool = False) -> int:
    """The activations' peak on the busiest rank: the kept ones and one block's backward beside them."""
    return int(kept_bytes(shape, candidate, seq_len, eager) + backward_phase_bytes(shape, candidate, seq_len, eager))


def input_bytes(shape: Transformer, candidate: Candidate, seq_len: int) -> float:
    """One block's input for one micro-batch: what activation checkpointing keeps of the block, E tau h."""
    layout = candidate.layout
    return ELEMENT_BYTES[layout.precision] * tokens(layout, seq_len) * shape.hidden


def offloaded_activation_bytes(shape: Transformer, candidate: Candidate, seq_len: int) -> int:
    """With the checkpoint offload, the checkpointed inputs host memory holds: every block's but the two in flight."""
    if not candidate.checkpoint_offload:
        return 0
    layers = -(-shape.layers // candidate.layout.pipeline_stages)
    return int(max(0, layers - 2) * input_bytes(shape, candidate, seq_len))


def logits_bytes(shape: Transformer, candidate: Candidate, seq_len: int, loss: str = "upcast") -> int:
    layout = candidate.layout
    vocab = -(-shape.vocab // layout.tensor_parallel)
    return loss_bytes(tokens_per_rank(layout, seq_len), vocab, layout.precision, loss, layout.tiled_loss)


def memory(shape: Transformer, candidate: Candidate, seq_len: int, cluster: Cluster, eager: bool = False,
           loss: str = "upcast") -> Memory:
    """One rank's memory (module docstring); ``loss``: how the untiled loss is computed (``perf.loss_memory``).
    The loss's tensors are gone before the first block's backward begins, so they count only above that phase's
    (the logits term is what they need beyond it)."""
    phase = backward_phase_bytes(shape, candidate, seq_len, eager)
    activations = int(kept_bytes(shape, candidate, seq_len, eager) + phase)
    return Memory(states_bytes(shape, candidate, cluster), activations,
                  max(0, logits_bytes(shape, candidate, seq_len, loss) - int(phase)), cluster.reserve_bytes,
                  states_bytes(shape, candidate, cluster, host=True)
                  + offloaded_activation_bytes(shape, candidate, seq_len))

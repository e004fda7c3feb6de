"""What every causal-LM workload shares (GPT-2, Llama): token batches, the loss, activation checkpointing.

Data: ``--data synthetic`` (uniform random tokens over the model's vocabulary, a pool of
``SYNTHETIC_POOL`` batches per rank, cycled) or a text / JSON-lines file or folder (``ds_bench.data.text``:
tokenized once with the real GPT-2 BPE of ``ds_bench.data.tokenizer``, or a ``--model`` folder's own
tokenizer, cached, packed into full ``--seq-len`` sequences, sharded across ranks; read and counted
by ``load_data`` before the process group is joined). The loss is HF's causal-LM loss on the
batch's own tokens (labels = inputs, shifted inside the model); a sequence-parallel or ``--tiled-loss`` run's
is the same mean taken over its ranks' slices (``ds_bench.engines.degrees.sequence_parallel``, ``ds_bench.engines.tiling``).
A subclass sets ``self.config`` (the HF config), ``self.seq_len`` and ``self.files`` in its constructor.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import torch
from torch import nn

from ds_bench.data import text
from ds_bench.engines import tiling
from ds_bench.engines.degrees import sequence_parallel
from ds_bench.errors import UserError
from ds_bench.workloads import hf_init
from ds_bench.workloads.base import Batch, Workload, check_enough, cycle_pool, shard_epochs

SYNTHETIC_POOL = 8  # distinct synthetic batches per rank, cycled
FINETUNE_LR = 5e-5  # HF Trainer's default learning rate
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json",
                "pytorch_model.bin", "pytorch_model.bin.index.json")
DEFAULT_ATTENTION = "sdpa"
"""Batches are packed full sequences and pass no attention mask, so SDPA takes its causal path (``is_causal``)
and may use its flash / memory-efficient kernels (a mask would keep it on the math kernel)."""


class CausalLMWorkload(Workload):
    sample_unit = "sequences"
    attention = True
    long_context = True
    seq_len: int
    files: list[str] | None
    seqs: torch.Tensor | None = None
    """[n, seq_len] packed tokens, set by ``load_data``."""
    n_tokens = 0
    tokenizer_source: str | None = None
    """What tokenized ``--data`` (the record's ``tokenizer``): the ``--model`` folder, or ``gpt2-bpe`` (the
    GPT-2 BPE of ``ds_bench.data.tokenizer``); None for synthetic tokens."""

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    @property
    def attention_shape(self) -> tuple[int, int, int, int]:
        """(layers, attention heads, KV heads, head width) of the model."""
        raise NotImplementedError

    @property
    def attention_heads(self) -> tuple[int, int]:
        return self.attention_shape[1:3]

    def sequence_parallel_all_to_alls(self) -> int:
        """Ulysses' all-to-alls per micro-step (measured: ``ds_bench.measure.layout_comm``): per layer 4 in forward
        (q, k and v gathered to whole sequences of H/S heads, the attention output scattered back) and 4 in
        backward (their gradients), 4 more with activation checkpointing (the forward, recomputed)."""
        return (8 + (4 if self.cfg.activation_checkpointing else 0)) * self.attention_shape[0]

    def sequence_parallel_all_to_all_elements(self, micro_batch: int, size: int) -> int:
        """Elements one rank sends into Ulysses' all-to-alls per micro-step: per layer and pass, its slice
        (micro-batch x T/S tokens) of q and the output (H heads) and of k and v (max(KV, S) heads: fewer KV
        heads than S are replicated first), each head ``head width`` wide; (S-1)/S of it leaves the rank."""
        layers, heads, kv_heads, head_dim = self.attention_shape
        per_pass = (2 * heads + 2 * max(kv_heads, size)) * head_dim * micro_batch * (self.seq_len // size)
        return self.sequence_parallel_all_to_alls() // 4 * per_pass

    def load_data(self, world_size: int, micro_batch: int) -> None:
        """Load the tokenizer, tokenize (or read the cache), pack, and count sequences."""
        if self.files is None:
            return
        if self.seqs is None:
            stream = text.token_stream(self.files, self._tokenizer(), self.cfg.data, self.cfg.dist_timeout_s)
            self.n_tokens, self.seqs = len(stream), text.pack(stream, self.seq_len)
        n = len(self.seqs)
        tokens = "GPT-2 tokens" if self.tokenizer_source == "gpt2-bpe" else "tokens of the --model folder's tokenizer"
        check_enough(n, world_size, micro_batch,
                     f"--data {self.cfg.data}: {self.n_tokens} {tokens} make {n} sequence(s) of "
                     f"--seq-len {self.seq_len}", f" ({world_size * micro_batch * self.seq_len} tokens)")

    def batches(self, rank: int, world_size: int, micro_batch: int) -> Iterator[Batch]:
        if self.files is None:
            return cycle_pool(self._synthetic_pool(rank, micro_batch))
        self.load_data(world_size, micro_batch)
        return self._text_batches(rank, world_size, micro_batch)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """HF's causal-LM loss; a batch sharded for sequence parallelism or ``--tiled-loss`` (its ``shift_labels``,
        ``ds_bench.engines.degrees.sequence_parallel.shard``) takes the token sum of its slice and the group's mean."""
        if "shift_labels" in batch:
            weighted = tiling.token_sum(model, batch, sequence_parallel.token_weight(batch), self.cfg.tiled_loss)
            return sequence_parallel.group_loss(weighted, batch)
        ids = batch["input_ids"]
        if batch.get("autosp"):
            return _autosp_loss(model, ids)
        return model(input_ids=ids, labels=ids, use_cache=False, return_dict=True).loss

    def model_class(self) -> type:
        """The HF ``...ForCausalLM`` class (imported when called: transformers' model modules are slow to import)."""
        raise NotImplementedError

    def weight_std(self):
        """The init's weight std by HF module name (``hf_init.gpt2_std``, ``hf_init.constant_std``)."""
        raise NotImplementedError

    def build_model(self) -> nn.Module:
        """``--model``'s weights, else from scratch: HF's init scheme, each parameter drawn from a generator of
        its own seeded by (``--seed``, its name), so every layout (partitioned under ZeRO-3's ``zero.Init``,
        sharded by AutoTP, a pipeline's stages) starts from the same weights (``ds_bench.workloads.hf_init``);
        activation checkpointing and the tiled MLP if asked."""
        model_class = self.model_class()
        if self.cfg.model_path is not None:
            model = model_class.from_pretrained(self.cfg.model_path, config=self.config,
                                                attn_implementation=self.config._attn_implementation)
        else:
            with hf_init.hf_init_skipped():
                model = model_class(self.config)
            hf_init.initialize(model, self.cfg.seed, self.weight_std())
        model.loss_type = "ForCausalLM"  # the loss HF picks anyway, named so it does not warn
        if self.cfg.activation_checkpointing:
            enable_checkpointing(model, self.cfg.selective_checkpointing)
        if self.cfg.tiled_mlp:
            tiling.tile_mlps(model)
        return model

    def _synthetic_pool(self, rank: int, micro_batch: int) -> list[Batch]:
        gen = torch.Generator().manual_seed(self.cfg.seed * 1000 + rank)
        return [{"input_ids": torch.randint(0, self.config.vocab_size, (micro_batch, self.seq_len), generator=gen)}
                for _ in range(SYNTHETIC_POOL)]

    def _tokenizer(self):
        from ds_bench.data.tokenizer import has_tokenizer, load_gpt2_tokenizer

        tokenizer = load_gpt2_tokenizer(self.cfg.model_path)
        own = self.cfg.model_path is not None and has_tokenizer(self.cfg.model_path)
        self.tokenizer_source = self.cfg.model_path if own else "gpt2-bpe"
        if len(tokenizer) > self.config.vocab_size:
            raise UserError(f"tokenizer has {len(tokenizer)} tokens but the model's vocabulary is "
                            f"{self.config.vocab_size}: give --model a folder whose tokenizer matches")
        return tokenizer

    def _text_batches(self, rank: int, world_size: int, micro_batch: int) -> Iterator[Batch]:
        for idx in shard_epochs(len(self.seqs), rank, world_size, micro_batch, self.cfg.seed):
            yield {"input_ids": self.seqs[idx]}



class LlamaFamilyWorkload(CausalLMWorkload):
    """Llama's attention, norms and init (Llama, and the mixtures of experts built on them: Mixtral, Qwen3-MoE):
    ``self.shape`` has ``n_layer``, ``hidden``, ``heads``, ``kv_heads`` and ``head_dim``; ``self.config`` is HF's."""

    @property
    def hidden_size(self) -> int:
        return self.shape.hidden

    @property
    def attention_shape(self) -> tuple[int, int, int, int]:
        return self.shape.n_layer, self.shape.heads, self.shape.kv_heads, self.shape.head_dim

    def weight_std(self):
        """HF Llama's, Mixtral's and Qwen3-MoE's: ``initializer_range`` (0.02) for every weight, experts included."""
        return hf_init.constant_std(self.config.initializer_range)

    def model_settings(self, model: nn.Module) -> dict[str, str]:
        return {"attn_implementation": self.config._attn_implementation, "activation_function": self.config.hidden_act,
                "tokenizer": self.tokenizer_source}


def check_pretrained_folder(path: str, model_type: str) -> None:
    """``--model PATH``: a folder written by ``save_pretrained``, of ``model_type``, with weights."""
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise UserError(f"--model {path}: no config.json (expected a folder written by save_pretrained)")
    try:
        with open(config_file, encoding="utf-8") as f:
            found = json.load(f).get("model_type")
    except (OSError, ValueError) as e:
        raise UserError(f"--model {path}: cannot read config.json ({e})") from None
    if found != model_type:
        raise UserError(f"--model {path}: config.json has model_type {found!r}, this workload needs {model_type!r}")
    if not any(os.path.isfile(os.path.join(path, f)) for f in WEIGHT_FILES):
        raise UserError(f"--model {path}: no weights ({' or '.join(WEIGHT_FILES[::2])})")


def enable_checkpointing(model: nn.Module, selective: bool = False) -> None:
    """Recompute every block in the backward pass (non-reentrant torch.utils.checkpoint); ``selective``: only what
    ``workloads.checkpoint_policy`` does not save."""
    kwargs = {"use_reentrant": False}
    if selective:
        from ds_bench.workloads.checkpoint_policy import selective_context

        kwargs["context_fn"] = selective_context
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x; the old name warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _autosp_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """HF's loss of a whole batch under AutoSP (``ds_bench.engines.degrees.sequence_parallel``): the inputs, labels
    and positions marked dynamic along the sequence for DeepSpeed's pass, which keeps this rank's slice of each."""
    from deepspeed.compile.passes.sp_compile import prepare_autosp_inputs

    labels = ids.clone()
    positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand_as(ids).contiguous()
    prepare_autosp_inputs(ids, labels, positions, None, seq_dim=1)
    return model(input_ids=ids, labels=labels, position_ids=positions, use_cache=False, return_dict=True).loss
